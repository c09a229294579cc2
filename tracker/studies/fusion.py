"""Study `fusion`: the hand-written EyeLike + Add -> AddEyeLike fusion (registry entry `add_eyelike`), under
both runtimes.

Model: Y = Add(MatMul(X, Add(A, EyeLike(A))), B), X 4x100, A 100x100 / 10, B 1x100. Attempts:
- reference_baseline / reference_fused: onnx.reference.ReferenceEvaluator, the fused op through a
  custom OpRun (prediction diff must be exactly 0);
- reference_fused_wrong: a deliberately wrong kernel (adds 2*I) that the diff check must reject;
- ort_baseline / ort_fused: ONNX Runtime, the fused op made runnable as a model-local function.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from tracker.api import Study
from tracker.measure.accuracy.output_diff import EXACT, FP32
from tracker.measure.attempt import MeasureConfig
from tracker.measure.runtimes.ort_runtime import SessionConfig
from tracker.optimize.add_eyelike import WRONG_ADD_EYELIKE


def make_linear_model(*, n_features: int = 100, seed: int = 0, opset: int = 18) -> onnx.ModelProto:
    """Builds Y = Add(MatMul(X, Add(A, EyeLike(A))), B), a linear layer whose weight is A + I.

    Args:
        n_features: size of the square weight A (n x n) and of the bias B (1 x n).
        seed: seed of the random normal values of A and B (both scaled by 1/10).
        opset: version of the default ONNX domain.

    Returns:
        A model with input X float [N, n] (symbolic batch "N") and output Y float [N, n], whose nodes
        are named "eye", "add_eye", "matmul" and "add_bias".
    """
    if n_features < 1:
        raise ValueError(f"n_features must be >= 1, got {n_features}")
    rng = np.random.default_rng(seed)
    a = (rng.standard_normal((n_features, n_features)) / 10).astype(np.float32)
    b = (rng.standard_normal((1, n_features)) / 10).astype(np.float32)
    nodes = [
        helper.make_node("EyeLike", ["A"], ["I"], name="eye"),
        helper.make_node("Add", ["A", "I"], ["W"], name="add_eye"),
        helper.make_node("MatMul", ["X", "W"], ["XW"], name="matmul"),
        helper.make_node("Add", ["XW", "B"], ["Y"], name="add_bias"),
    ]
    graph = helper.make_graph(
        nodes,
        "linear_add_eyelike",
        [helper.make_tensor_value_info("X", onnx.TensorProto.FLOAT, ["N", n_features])],
        [helper.make_tensor_value_info("Y", onnx.TensorProto.FLOAT, ["N", n_features])],
        initializer=[onnx.numpy_helper.from_array(a, "A"), onnx.numpy_helper.from_array(b, "B")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    onnx.checker.check_model(model, full_check=True)
    return model


def run(*, experiment: str | None = None, measure: MeasureConfig | None = None,
        session: SessionConfig | None = None, seed: int = 0, cluster: str | None = None,
        register: str | None = None) -> Study:
    """Builds the model from `seed` and logs the five attempts (measured on the Ray cluster at `cluster`, if
    given); with `register`, the best becomes a version of that registered model."""
    model = make_linear_model(n_features=100, seed=seed)
    feeds = {"X": np.random.default_rng(seed).standard_normal((4, 100)).astype(np.float32)}
    session = session or SessionConfig()
    with Study("fusion", feeds=feeds, experiment=experiment, config=measure, cluster=cluster, register=register,
               params={"model": "Add(MatMul(X, Add(A, EyeLike(A))), B)", "X.shape": "4x100"}) as study:
        study.attempt("reference_baseline", model, runtime="reference", tolerance=EXACT,
                      description="unfused model under onnx.reference.ReferenceEvaluator")
        study.optimize("add_eyelike", model, name="reference_fused", runtime="reference", tolerance=EXACT)
        study.optimize("add_eyelike", model, name="reference_fused_wrong", runtime="reference", tolerance=EXACT,
                       new_ops=(WRONG_ADD_EYELIKE,), params={"fusion.kernel": "deliberately wrong: X + 2I"},
                       description="a wrong AddEyeLike kernel: the diff check must fail")
        # ORT and the reference evaluator differ by float rounding (~1e-6): fp32 tolerance across runtimes.
        study.attempt("ort_baseline", model, session=session, tolerance=FP32,
                      description="unfused model under ONNX Runtime (outputs checked against the reference)")
        study.optimize("add_eyelike", model, name="ort_fused", session=session, tolerance=EXACT)
    return study
