"""The small real models the tests build, each defined once.

- `make_linear_model`: the fusion study's own input (`tracker.studies.fusion`), Y = Add(MatMul(X, Add(A, EyeLike(A))),
  B); the tests take it from here rather than from the study, so that a test says it uses a fixture.
- `string_model`: string inputs through ai.onnx.ml LabelEncoders; the outside probes feed it too, so it is defined
  in `benchmarks/probe_common.py` (a probe runs outside pytest and cannot import `tests`).
- `custom_op_model`: an op of a custom domain that no runtime has a kernel for.
- `with_matmul_chain`: a one-input, one-output model made clearly slower, its outputs bit for bit the same.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from probe_common import string_model  # benchmarks/probe_common.py (pytest pythonpath)

from tracker.studies.fusion import make_linear_model

__all__ = ["custom_op_model", "make_linear_model", "string_model", "with_matmul_chain"]


def custom_op_model() -> onnx.ModelProto:
    """Y = my.domain.Foo(X): valid for the ONNX checker, but no runtime has a kernel for Foo."""
    graph = helper.make_graph(
        [helper.make_node("Foo", ["X"], ["Y"], name="foo", domain="my.domain")],
        "custom",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2])],
    )
    opsets = [helper.make_opsetid("", 18), helper.make_opsetid("my.domain", 1)]
    return helper.make_model(graph, opset_imports=opsets)


def with_matmul_chain(model: onnx.ModelProto, *, length: int, seed: int = 1) -> onnx.ModelProto:
    """`model` (one input [N, F], one output) with a chain of `length` MatMuls by random F x F weights computed from its
    input, and its output plus `chain - chain`: the same values, bit for bit, after `length` more products.

    Each weight is its own random initializer, so ONNX Runtime can neither share nor fold them, as it does the copies of
    `benchmarks/calibration.with_extra_work` that read their inputs through equal constants. The input is not changed.
    """
    slower = onnx.ModelProto()
    slower.CopyFrom(model)
    graph = slower.graph
    (x,), (y,) = graph.input, graph.output
    width = x.type.tensor_type.shape.dim[1].dim_value
    rng = np.random.default_rng(seed)
    previous = x.name
    for k in range(length):
        weight = (rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32)  # keeps the chain's scale
        graph.initializer.append(numpy_helper.from_array(weight, f"chain_w{k}"))
        graph.node.append(helper.make_node("MatMul", [previous, f"chain_w{k}"], [f"chain{k}"], name=f"chain{k}"))
        previous = f"chain{k}"
    for node in graph.node:
        node.output[:] = [f"{y.name}_before" if o == y.name else o for o in node.output]
    graph.node.append(helper.make_node("Sub", [previous, previous], ["chain_zero"], name="chain_zero"))
    graph.node.append(helper.make_node("Add", [f"{y.name}_before", "chain_zero"], [y.name], name="same_outputs"))
    return slower
