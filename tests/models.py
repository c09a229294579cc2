"""The small real models the tests build, each defined once.

- `make_linear_model`: the fusion study's own input (`tracker.studies.fusion`), Y = Add(MatMul(X, Add(A, EyeLike(A))),
  B); the tests take it from here rather than from the study, so that a test says it uses a fixture.
- `string_model`: string inputs through ai.onnx.ml LabelEncoders; the outside probes feed it too, so it is defined
  in `benchmarks/probe_common.py` (a probe runs outside pytest and cannot import `tests`).
- `custom_op_model`: an op of a custom domain that no runtime has a kernel for.
"""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper
from probe_common import string_model  # benchmarks/probe_common.py (pytest pythonpath)

from tracker.studies.fusion import make_linear_model

__all__ = ["custom_op_model", "make_linear_model", "string_model"]


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
