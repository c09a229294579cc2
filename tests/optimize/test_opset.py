"""A model at an opset past what the installed ONNX Runtime implements for the ops an entry inserts: the entry runs on
a converted copy, or says why not before making anything, in `--dry-run` too."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from tracker.cli import main
from tracker.optimize import Context, get_entry
from tracker.optimize.opset import _probe, model_opset, opset_problem, ort_opset_limit

NEWEST = onnx.defs.onnx_opset_version()
LIMIT = ort_opset_limit()
needs_gap = pytest.mark.skipif(LIMIT >= NEWEST, reason=f"onnxruntime {ort.__version__} implements onnx's newest "
                                                       f"opset {NEWEST}: no model is past it")


def _linear(opset: int, *extra: onnx.NodeProto) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 4])
    y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", 3])
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32), "W")
    nodes = [helper.make_node("MatMul", ["X", "W"], ["M" if extra else "Y"], name="matmul"), *extra]
    graph = helper.make_graph(nodes, "linear", [x], [y], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _session(model: onnx.ModelProto | str) -> ort.InferenceSession:
    data = model.SerializeToString() if isinstance(model, onnx.ModelProto) else model
    return ort.InferenceSession(data, providers=["CPUExecutionProvider"])


def test_the_limit_is_the_newest_opset_ort_builds_the_inserted_ops_at():
    _session(_probe(LIMIT))  # a known answer: at the limit every inserted op has a kernel
    if LIMIT < NEWEST:
        with pytest.raises(Exception, match="NOT_IMPLEMENTED|Could not find an implementation"):
            _session(_probe(LIMIT + 1))


@needs_gap
@pytest.mark.parametrize("entry", ["int8_static_minmax", "int8_dynamic", "int4_block32"])
def test_an_entry_that_inserts_ops_makes_a_candidate_ort_loads_from_a_model_at_the_newest_opset(entry, tmp_path):
    source = tmp_path / "newest.onnx"
    onnx.save(_linear(NEWEST), str(source))
    feeds = {"X": np.random.default_rng(1).standard_normal((2, 4)).astype(np.float32)}

    candidate = get_entry(entry)(source, tmp_path / "out", Context(feeds=feeds, work=tmp_path / "work"))

    made = onnx.load(str(candidate.path))
    assert model_opset(made) <= LIMIT
    assert f"converted from ai.onnx opset {NEWEST} to {LIMIT} (onnx.version_converter)" in candidate.notes[0]
    out = _session(str(candidate.path)).run(None, feeds)[0]
    assert np.allclose(out, feeds["X"] @ numpy_helper.to_array(onnx.load(str(source)).graph.initializer[0]),
                       atol=0.2)
    assert model_opset(onnx.load(str(source))) == NEWEST, "the source is left as it was"


@needs_gap
def test_a_model_onnx_cannot_bring_down_is_refused_before_anything_is_made_naming_the_opsets():
    # SwiGLU first appears at opset 28: onnx has no earlier version to convert it to.
    model = _linear(NEWEST, helper.make_node("Relu", ["M"], ["Y"]))
    assert opset_problem(model) is None, "a plain model converts"
    swiglu = "SwiGLU" in {s.name for s in onnx.defs.get_all_schemas_with_history() if s.since_version > LIMIT}
    if not swiglu:
        pytest.skip(f"no op of onnx {onnx.__version__} exists only past opset {LIMIT}")
    model = _linear(NEWEST, helper.make_node("SwiGLU", ["M"], ["Y"]))

    reason = get_entry("int8_dynamic").why_not(model, Context())

    assert reason is not None
    assert reason.startswith(f"it is at ai.onnx opset {NEWEST}, past the {LIMIT} the installed onnxruntime "
                             f"{ort.__version__} implements for the ops this entry inserts")
    assert reason.endswith(f"export the model at opset {LIMIT} or lower")
    assert get_entry("ort_opt_disabled").why_not(model, Context()) is None, "a session entry inserts nothing"


@needs_gap
def test_dry_run_says_the_entries_that_insert_ops_run_on_a_converted_copy(tmp_path, capsys):
    onnx.save(_linear(NEWEST), str(tmp_path / "newest.onnx"))

    code = main(["optimize", str(tmp_path / "newest.onnx"), "--dry-run"])

    out = capsys.readouterr().out
    assert code == 0
    assert (f"opset: ai.onnx opset {NEWEST}, past the {LIMIT} the installed onnxruntime {ort.__version__} implements "
            f"for the ops quantization and fp16 insert: those entries run on a copy converted to opset {LIMIT}") in out
