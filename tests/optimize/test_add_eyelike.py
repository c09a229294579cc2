"""Tests of the EyeLike + Add -> AddEyeLike fusion under the reference evaluator and onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from tests.models import make_linear_model
from tracker.measure.runtimes.reference_runtime import run_reference
from tracker.optimize.add_eyelike import (
    DOMAIN,
    WRONG_ADD_EYELIKE,
    AddEyeLike,
    fuse_add_eyelike,
)


@pytest.fixture(scope="module")
def model():
    return make_linear_model(n_features=32, seed=0)


@pytest.fixture(scope="module")
def feeds():
    return {"X": np.random.default_rng(2).standard_normal((8, 32)).astype(np.float32)}


def _ort_run(model, feeds):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)[0]


def test_linear_model_passes_the_checker_and_has_a_symbolic_batch(model):
    onnx.checker.check_model(model, full_check=True)
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "N"
    assert [n.name for n in model.graph.node] == ["eye", "add_eye", "matmul", "add_bias"]


@pytest.mark.parametrize("as_function", [False, True], ids=["plain", "with-function"])
def test_fusion_replaces_one_pattern_and_leaves_the_input_unchanged(model, as_function):
    before = model.SerializeToString()
    result = fuse_add_eyelike(model, as_function=as_function)
    assert model.SerializeToString() == before
    assert result.count == 1
    assert [n.op_type for n in result.model.graph.node] == ["AddEyeLike", "MatMul", "Add"]
    assert (DOMAIN, 1) in {(op.domain, op.version) for op in result.model.opset_import}
    assert len(result.model.functions) == (1 if as_function else 0)
    onnx.checker.check_model(result.model, full_check=True)


def test_fusion_matches_either_operand_order(model):
    swapped = onnx.ModelProto()
    swapped.CopyFrom(model)
    swapped.graph.node[1].input[:] = ["I", "A"]
    assert fuse_add_eyelike(swapped).count == 1


def test_fusion_skips_an_eyelike_read_elsewhere(model):
    shared = onnx.ModelProto()
    shared.CopyFrom(model)
    shared.graph.output.append(onnx.helper.make_tensor_value_info("I", onnx.TensorProto.FLOAT, None))
    result = fuse_add_eyelike(shared)
    assert result.count == 0
    assert result.model.SerializeToString() == shared.SerializeToString()


def test_fused_model_under_the_reference_evaluator_matches_exactly(model, feeds):
    (expected,) = run_reference(model, feeds)
    (got,) = run_reference(fuse_add_eyelike(model).model, feeds, new_ops=[AddEyeLike])
    assert np.abs(got - expected).max() == 0


def test_fused_model_with_its_function_runs_in_onnxruntime_and_matches(model, feeds):
    expected = _ort_run(model, feeds)
    got = _ort_run(fuse_add_eyelike(model, as_function=True).model, feeds)
    assert np.abs(got - expected).max() == 0


def test_onnxruntime_rejects_the_fused_model_without_its_function(model):
    fused = fuse_add_eyelike(model).model
    with pytest.raises(Exception, match="not a registered function/op"):
        ort.InferenceSession(fused.SerializeToString(), providers=["CPUExecutionProvider"])


def test_wrong_kernel_is_caught_by_the_output_diff(model, feeds):
    (expected,) = run_reference(model, feeds)
    (got,) = run_reference(fuse_add_eyelike(model).model, feeds, new_ops=[WRONG_ADD_EYELIKE])
    # x + 2I instead of x + I adds X @ I = X to the output.
    np.testing.assert_allclose(got - expected, feeds["X"], atol=1e-5)
    assert np.abs(got - expected).max() > 0.1


def test_new_ops_take_precedence_over_a_local_function(model, feeds):
    (expected,) = run_reference(model, feeds)
    with_function = fuse_add_eyelike(model, as_function=True).model
    (from_function,) = run_reference(with_function, feeds)
    (from_wrong_kernel,) = run_reference(with_function, feeds, new_ops=[WRONG_ADD_EYELIKE])
    assert np.abs(from_function - expected).max() == 0
    assert np.abs(from_wrong_kernel - expected).max() > 0.1
