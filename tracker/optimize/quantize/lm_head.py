"""Which precision a language model's lm_head runs in after quantization.

The lm_head (hidden -> vocabulary) is the largest single weight of a small LM: gpt2-small's is tied to the token
embedding, 38.6 M parameters, 154 MB in fp32, read on every decode step. A quantizer that misses it (a tied weight read
through a Transpose is not an initializer it sees) leaves a third of the model's bytes in fp32, so each quantization
entry says what became of it.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
from onnx import numpy_helper

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


def lm_head_node(model: onnx.ModelProto, output: str = LOGITS) -> ir.Node | None:
    """The product that computes `output` (the lm_head), found by walking back from the output through reshapes and
    bias adds; None when the model has no such output or no product makes it."""
    value = next((o for o in ir.from_proto(model).graph.outputs if o.name == output), None)
    for _ in range(16):
        node = value.producer() if value is not None else None
        if node is None:
            return None
        if node.op_type in PRODUCT_PRECISION:
            return node
        if node.op_type not in _PASS_THROUGH:
            return None
        value = node.inputs[0]
    return None


def lm_head_precision(model: onnx.ModelProto, output: str = LOGITS) -> str | None:
    """The precision of the product that computes `output` ("int4", "int8", "fp32"; `lm_head_node`), or None.

    A float product whose weight is itself the output of DequantizeLinear (a QDQ graph) counts as "int8"; a
    `MatMulNBits` as its `bits`.
    """
    node = lm_head_node(model, output)
    if node is None:
        return None
    if node.op_type == "MatMulNBits":
        return f"int{node.attributes.get_int('bits', 4)}"
    precision = PRODUCT_PRECISION[node.op_type]
    weight = node.inputs[1] if len(node.inputs) > 1 else None
    made_by = weight.producer() if weight is not None else None
    if precision == "fp32" and made_by is not None and made_by.op_type == "DequantizeLinear":
        return "int8"
    return precision


def lm_head_params(model: onnx.ModelProto) -> dict[str, str]:
    """`quantization.lm_head` = the lm_head's precision, for a model with a `logits` output; nothing otherwise."""
    precision = lm_head_precision(model)
    return {} if precision is None else {"quantization.lm_head": precision}


def untie_fused_products(model: onnx.ModelProto) -> int:
    """Rewrites each `FusedMatMul` whose weight is an initializer read transposed (`transB`, alpha 1: what onnxscript's
    fusions make of an lm_head tied to the embedding) as a plain `MatMul` on a transposed copy of the weight, in place,
    so a quantizer that takes MatMul weights sees it. The copy unties the lm_head from the embedding (the embedding's
    Gather keeps the original). Returns how many were rewritten.
    """
    initializers = {t.name: t for t in model.graph.initializer}
    rewritten = 0
    for node in model.graph.node:
        if node.op_type != "FusedMatMul" or node.domain != "com.microsoft" or len(node.input) != 2:
            continue
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        plain = (attrs.get("alpha", 1.0) == 1.0 and not attrs.get("transA", 0) and not attrs.get("transBatchA", 0)
                 and not attrs.get("transBatchB", 0))
        weight = initializers.get(node.input[1])
        if not plain or weight is None or len(weight.dims) != 2:
            continue
        values = numpy_helper.to_array(weight)
        name = f"{node.input[1]}_untied"
        if attrs.get("transB", 0):
            values = np.ascontiguousarray(values.T)
        model.graph.initializer.append(numpy_helper.from_array(values, name))
        node.op_type, node.domain = "MatMul", ""
        node.input[1] = name
        del node.attribute[:]
        rewritten += 1
    return rewritten


# The dynamo exporter's record of each node's torch module path (`['', 'model', 'model.layers.0.mlp.up_proj', ...]`).
NAME_SCOPES = "pkg.torch.onnx.name_scopes"


def products_of(model: onnx.ModelProto, modules: tuple[str, ...]) -> list[str]:
    """The names of the MatMul/Gemm nodes of `model` made by a torch module whose name ends with one of `modules`
    (`up_proj`, `mlp.down_proj`), read from the dynamo export's `pkg.torch.onnx.name_scopes`; none when the export
    recorded no scopes."""
    if not modules:
        return []
    found = []
    for node in model.graph.node:
        if node.op_type not in ("MatMul", "Gemm"):
            continue
        module = module_of(node)
        if module and any(module == m or module.endswith("." + m) for m in modules):
            found.append(node.name)
    return found


def module_of(node: onnx.NodeProto) -> str:
    """The torch module path that made `node` (`model.layers.3.mlp.down_proj`), from a dynamo export's name scopes;
    "" when the node has none."""
    return _innermost_module(next((p.value for p in node.metadata_props if p.key == NAME_SCOPES), ""))


def _innermost_module(scopes: str) -> str:
    """The module path of a node from its name scopes' text: the last scope but the op's own (`linear_5`)."""
    names = [part.strip().strip("'\"") for part in scopes.strip("[]").split(",") if part.strip()]
    return names[-2] if len(names) >= 2 else ""
