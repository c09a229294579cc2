"""A small model with one layer made sensitive to int8 on purpose, for the fallback and the search."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

WIDTH = 256
SENSITIVE = "fc2"


def make_sensitive_mlp(*, width: int = WIDTH, seed: int = 0) -> onnx.ModelProto:
    """X [N, width] -> three MatMul layers -> Y [N, 8]. fc2's weight holds one huge value in a row that fc1 never
    feeds (fc1's column there is zero, and so is its ReLU output): the float model does not feel it, but a
    per-tensor int8 scale sized for it rounds every other weight of fc2 to zero. fc1 and fc3 quantize well."""
    rng = np.random.default_rng(seed)
    w1 = (rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32)
    w1[:, 0] = 0.0  # fc1's first output is always 0 ...
    w2 = (rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32)
    w2[0, 0] = 400.0  # ... so this weight never reaches the output, yet it sets a per-tensor scale
    w3 = (rng.standard_normal((width, 8)) / np.sqrt(width)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["X", "W1"], ["H1a"], name="fc1"),
             helper.make_node("Relu", ["H1a"], ["H1"], name="relu1"),
             helper.make_node("MatMul", ["H1", "W2"], ["H2a"], name=SENSITIVE),
             helper.make_node("Relu", ["H2a"], ["H2"], name="relu2"),
             helper.make_node("MatMul", ["H2", "W3"], ["Y"], name="fc3")]
    graph = helper.make_graph(
        nodes, "sensitive_mlp", [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", width])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", 8])],
        initializer=[numpy_helper.from_array(a, n) for n, a in (("W1", w1), ("W2", w2), ("W3", w3))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    onnx.checker.check_model(model, full_check=True)
    return model


@pytest.fixture(scope="session")
def sensitive_mlp(tmp_path_factory):
    """(the model file, its feeds)."""
    path = tmp_path_factory.mktemp("sensitive_mlp") / "mlp.onnx"
    onnx.save_model(make_sensitive_mlp(), str(path))
    feeds = {"X": np.random.default_rng(1).standard_normal((64, WIDTH)).astype(np.float32)}
    return path, feeds
