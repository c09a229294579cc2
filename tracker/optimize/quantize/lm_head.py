"""Which precision a language model's lm_head runs in after quantization.

The lm_head (hidden -> vocabulary) is the largest single weight of a small LM: gpt2-small's is tied to the token
embedding, 38.6 M parameters, 154 MB in fp32, read on every decode step. A quantizer that misses it (a tied weight read
through a Transpose is not an initializer it sees) leaves a third of the model's bytes in fp32, so each quantization
entry says what became of it.
"""

from __future__ import annotations

import onnx

# The product that makes the logits, by op type: the precision of its weight.
PRODUCT_PRECISION = {
    "MatMulNBits": "int4",
    "MatMulInteger": "int8",
    "DynamicQuantizeMatMul": "int8",
    "QLinearMatMul": "int8",
    "QGemm": "int8",
    "MatMul": "fp32",
    "Gemm": "fp32",
    "FusedMatMul": "fp32",
}
# Ops between the lm_head's product and the logits output that only move, reshape or offset values.
_PASS_THROUGH = {"Reshape", "Add", "Transpose", "Squeeze", "Unsqueeze", "Cast", "Identity", "Flatten",
                 "DequantizeLinear", "Mul"}
LOGITS = "logits"


def lm_head_precision(model: onnx.ModelProto, output: str = LOGITS) -> str | None:
    """The precision of the product that computes `output` ("int4", "int8", "fp32"), found by walking back from the
    output through reshapes and bias adds; None when the model has no such output or no product makes it.

    A float product whose weight is itself the output of DequantizeLinear (a QDQ graph) counts as "int8".
    """
    producer = {out: node for node in model.graph.node for out in node.output}
    name = output if any(o.name == output for o in model.graph.output) else None
    seen = 0
    while name is not None and name in producer and seen < 16:
        node = producer[name]
        if node.op_type in PRODUCT_PRECISION:
            precision = PRODUCT_PRECISION[node.op_type]
            weight = producer.get(node.input[1]) if len(node.input) > 1 else None
            if precision == "fp32" and weight is not None and weight.op_type == "DequantizeLinear":
                return "int8"
            return precision
        if node.op_type not in _PASS_THROUGH:
            return None
        name, seen = node.input[0], seen + 1
    return None


def lm_head_params(model: onnx.ModelProto) -> dict[str, str]:
    """`quantization.lm_head` = the lm_head's precision, for a model with a `logits` output; nothing otherwise."""
    precision = lm_head_precision(model)
    return {} if precision is None else {"quantization.lm_head": precision}
