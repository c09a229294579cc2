"""Tests of tracker.base.model_io.load_model on real files: non-ONNX files, checker failures, valid models; and what
each command says of a file it cannot load (a model named .json, a missing or cut external data file, an op ONNX Runtime
has no kernel for): one line, before any run."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.commands import QUICK_OPTIMIZE, assert_one_line_error, run_cli, run_names
from tests.models import custom_op_model, make_linear_model
from tracker.base.errors import ModelError
from tracker.base.model_io import check_model, load_model, model_bytes

NOT_ONNX = r"not (a readable|an) ONNX model"


@pytest.fixture(scope="module")
def model() -> onnx.ModelProto:
    return make_linear_model(n_features=8, seed=0)


@pytest.mark.parametrize(
    "content",
    [
        pytest.param(b"name,value\nlatency,3.5\n", id="csv-text"),
        pytest.param(b'[{"cat": "Node", "name": "x_kernel_time"}]', id="json-profile"),
        pytest.param(bytes(np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8)), id="random-bytes"),
        pytest.param(b"", id="empty-file"),
        pytest.param(b"\x00" * 64, id="zero-bytes"),
    ],
)
def test_a_file_that_is_not_onnx_raises_model_error_saying_so(content, tmp_path):
    path = tmp_path / "model.onnx"
    path.write_bytes(content)
    with pytest.raises(ModelError, match=NOT_ONNX) as info:
        load_model(path)
    assert str(path) in str(info.value)


def test_a_missing_file_raises_model_error(tmp_path):
    with pytest.raises(ModelError, match=r"does not exist or is not a file"):
        load_model(tmp_path / "missing.onnx")


def _undefined_input_model() -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("Add", ["X", "Z"], ["Y"], name="add")],  # Z is defined nowhere
        "undefined_input",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def _opset_0_model() -> onnx.ModelProto:
    model = make_linear_model(n_features=4)
    model.opset_import[0].version = 0
    return model


def _opset_before_eyelike_model() -> onnx.ModelProto:
    model = make_linear_model(n_features=4)
    model.opset_import[0].version = 5  # EyeLike exists from opset 9
    return model


def _no_default_opset_model() -> onnx.ModelProto:
    model = make_linear_model(n_features=4)
    del model.opset_import[:]
    return model


def _unknown_op_model() -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("NoSuchOp", ["X"], ["Y"], name="bad")],
        "unknown_op",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(_undefined_input_model, id="node-reading-an-undefined-input"),
        pytest.param(_opset_0_model, id="opset-0"),
        pytest.param(_opset_before_eyelike_model, id="opset-older-than-an-op"),
        pytest.param(_no_default_opset_model, id="no-opset-import"),
        pytest.param(_unknown_op_model, id="unknown-op-type"),
    ],
)
def test_a_model_failing_the_checker_raises_model_error_mentioning_the_checker(make, tmp_path):
    path = tmp_path / "bad.onnx"
    onnx.save_model(make(), str(path))
    with pytest.raises(ModelError, match=r"fails the ONNX checker") as info:
        load_model(path)
    assert str(path) in str(info.value)
    assert isinstance(info.value.__cause__, onnx.checker.ValidationError)


def test_the_checker_can_be_skipped(tmp_path):
    path = tmp_path / "bad.onnx"
    onnx.save_model(_undefined_input_model(), str(path))
    loaded = load_model(path, check=False)
    assert loaded.graph.node[0].input[1] == "Z"


def test_check_model_names_the_source():
    with pytest.raises(ModelError, match=r"^attempt fused fails the ONNX checker"):
        check_model(_undefined_input_model(), source="attempt fused")


def test_a_valid_model_loads_equal_to_what_was_saved(model, tmp_path):
    path = tmp_path / "linear.onnx"
    onnx.save_model(model, str(path))
    loaded = load_model(path)
    assert loaded.SerializeToString() == model.SerializeToString()
    assert model_bytes(loaded) == path.stat().st_size


def test_a_valid_model_with_external_data_loads_with_or_without_its_weights(model, tmp_path):
    path = tmp_path / "linear.onnx"
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    onnx.save_model(copy, str(path), save_as_external_data=True, location="linear.onnx.data", size_threshold=0)

    with_weights = load_model(path)
    without = load_model(path, load_external_data=False)
    assert [t.name for t in without.graph.initializer] == ["A", "B"]
    assert all(not t.raw_data for t in without.graph.initializer)
    np.testing.assert_array_equal(
        onnx.numpy_helper.to_array(with_weights.graph.initializer[0]),
        onnx.numpy_helper.to_array(model.graph.initializer[0]),
    )


def test_model_error_is_a_value_error(tmp_path):
    path = tmp_path / "x.onnx"
    path.write_text("not a model")
    with pytest.raises(ValueError):
        load_model(path)


def _rms_norm_model(*, wired: bool = True) -> onnx.ModelProto:
    """RMSNorm as ORT's optimizers write it: SimplifiedLayerNormalization in ONNX's own domain."""
    node = helper.make_node("SimplifiedLayerNormalization", ["x" if wired else "nowhere", "scale"], ["y"], axis=-1,
                            epsilon=1e-5)
    graph = helper.make_graph([node], "rms", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor("scale", TensorProto.FLOAT, [4], [1.0] * 4)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])


def test_ort_simplified_layer_norm_in_onnx_domain_passes_and_the_rest_is_still_checked(tmp_path):
    path = tmp_path / "rms.onnx"
    onnx.save(_rms_norm_model(), str(path))
    with pytest.raises(onnx.checker.ValidationError, match="No Op registered for SimplifiedLayerNormalization"):
        onnx.checker.check_model(str(path))  # what ONNX's checker alone says of ORT's op
    assert len(load_model(path).graph.node) == 1
    check_model(_rms_norm_model())
    with pytest.raises(ModelError, match="nowhere"):  # its wiring is still checked
        check_model(_rms_norm_model(wired=False), source="broken")


def test_ort_simplified_layer_norm_in_a_model_with_external_weights_is_checked_beside_them(tmp_path):
    path = tmp_path / "rms.onnx"
    model = _rms_norm_model()
    model.graph.initializer[0].CopyFrom(numpy_helper.from_array(np.ones(4, np.float32), "scale"))  # raw, to move out
    onnx.save(model, str(path), save_as_external_data=True, location="rms.onnx.data", size_threshold=0)
    check_model(path, source="rms")  # its weights found beside it, as a model of SmolLM2's size has them
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rms.onnx", "rms.onnx.data"]  # nothing left behind
    (tmp_path / "rms.onnx.data").unlink()
    with pytest.raises(ModelError, match="rms.onnx.data"):  # and the external data is still checked
        check_model(path, source="rms")
    # where the copy cannot be written beside the file: the graph is checked without its external weights
    from tracker.base.model_io import _external_weights_as_inputs, _ort_domain_ops_as_contrib

    onnx.checker.check_model(_external_weights_as_inputs(_ort_domain_ops_as_contrib(path)))


def test_a_protobuf_model_named_json_loads_by_its_content(tmp_path, capsys):
    path = tmp_path / "linear.json"  # onnx alone would read it as ONNX JSON, from the extension
    model = make_linear_model(n_features=8)
    path.write_bytes(model.SerializeToString())
    assert load_model(path).SerializeToString() == model.SerializeToString()
    code, out, _ = run_cli(capsys, "inspect", str(path), "--dim", "N=2")
    assert code == 0 and "MatMul" in out


@pytest.mark.slow
def test_profile_of_a_protobuf_model_named_json_logs_it(store_uri, tmp_path, capsys):
    path = tmp_path / "linear.json"
    path.write_bytes(make_linear_model(n_features=8).SerializeToString())
    code, out, err = run_cli(capsys, "profile", str(path), "--dim", "N=2", "--profile-runs", "3", "--min-seconds", "0",
                             "--name", "from-json")
    assert code == 0, err
    assert run_names(store_uri) == ["from-json"]


def test_profile_of_a_custom_domain_op_fails_before_any_run_naming_the_op(store_uri, tmp_path, capsys):
    path = tmp_path / "custom.onnx"
    onnx.save_model(custom_op_model(), str(path))
    code, _, err = run_cli(capsys, "profile", str(path))
    assert_one_line_error(code, err, "ONNX Runtime cannot load", "no kernel for op 'Foo' of domain 'my.domain'")
    assert run_names(store_uri) == []


@pytest.mark.parametrize("command", ["inspect", "profile"])
def test_a_json_file_that_is_not_a_model_is_a_model_error(store_uri, tmp_path, capsys, command):
    path = tmp_path / "notes.json"
    path.write_text('{"latency_ms": 3.5}')
    code, _, err = run_cli(capsys, command, str(path))
    assert_one_line_error(code, err, "notes.json", "is not a readable ONNX model",
                          "neither an ONNX protobuf nor ONNX json", 'no field named "latency_ms"')
    assert run_names(store_uri) == []


@pytest.mark.parametrize("command", ["inspect", "profile"])
def test_a_missing_external_data_file_is_named(store_uri, tmp_path, capsys, command):
    path = tmp_path / "linear.onnx"
    onnx.save_model(make_linear_model(n_features=8), str(path), save_as_external_data=True,
                    all_tensors_to_one_file=True, location="linear.weights", size_threshold=0)
    (tmp_path / "linear.weights").unlink()
    code, _, err = run_cli(capsys, command, str(path), "--dim", "N=2")
    assert_one_line_error(code, err, "external data that is missing", repr(str(tmp_path / "linear.weights")),
                          "(tensors A, B)")
    assert run_names(store_uri) == []


def _cut_external_data(tmp_path: Path) -> Path:
    """linear.onnx whose weight A claims an offset past the end of linear.weights."""
    path = tmp_path / "linear.onnx"
    onnx.save_model(make_linear_model(n_features=8), str(path), save_as_external_data=True,
                    all_tensors_to_one_file=True, location="linear.weights", size_threshold=0)
    model = onnx.load(str(path), load_external_data=False)
    for entry in model.graph.initializer[0].external_data:
        if entry.key == "offset":
            entry.value = "1000000"
    onnx.save_model(model, str(path))
    return path


@pytest.mark.parametrize("command", ["profile", "optimize", "inspect"])
def test_external_data_past_the_end_of_its_file_is_refused_alike_by_every_command(store_uri, tmp_path, capsys, command):
    path = _cut_external_data(tmp_path)
    quick = QUICK_OPTIMIZE if command == "optimize" else ()
    code, _, err = run_cli(capsys, command, str(path), "--dim", "N=2", *quick)
    assert_one_line_error(code, err, repr(str(path)), "tensor 'A'", "past the end of",
                          repr(str(tmp_path / "linear.weights")), "offset 1000000", "file of 288 bytes")
    assert run_names(store_uri) == []
