"""The plan of `tracker optimize` on a model of the user's (`tracker.studies.own`): what it refuses before the
baseline is measured."""

from __future__ import annotations

import numpy as np
import onnx

from tests.commands import QUICK_OPTIMIZE, assert_one_line_error, run_cli, run_names


def test_a_chain_named_past_the_limit_is_refused_in_the_plan_before_the_baseline(store_uri, tmp_path, capsys):
    # Y = X @ W with W a float initializer: int8_dynamic applies, so only the name can refuse the chain.
    x = onnx.helper.make_tensor_value_info("X", onnx.TensorProto.FLOAT, ["N", 16])
    y = onnx.helper.make_tensor_value_info("Y", onnx.TensorProto.FLOAT, ["N", 16])
    weight = onnx.numpy_helper.from_array(np.random.default_rng(0).random((16, 16), dtype=np.float32), "W")
    graph = onnx.helper.make_graph([onnx.helper.make_node("MatMul", ["X", "W"], ["Y"], name="mm")], "mm", [x], [y],
                                   [weight])
    path = tmp_path / "mm.onnx"
    onnx.save_model(onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)]), str(path))
    chain = "int8_dynamic:per_channel=true+" + "+".join(["ort_opt_disabled", "io_binding", "ort_threads_1"] * 3)
    for extra in (["--dry-run"], QUICK_OPTIMIZE):
        code, _, err = run_cli(capsys, "optimize", str(path), "--dim", "N=2", "--attempts", chain, *extra)
        assert_one_line_error(code, err, f"attempt {chain!r} is named", "an attempt name is at most 100")
    assert run_names(store_uri) == []
