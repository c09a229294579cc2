"""LLaMA-family attention with its past and rotary positions as one GroupQueryAttention, over one packed q/k/v product.

After `attention_fused`, a LLaMA-family decode-ready export still spells out, in every layer:
- the rotary positions of q and k (`x * cos + rotate_half(x) * sin`, with cos and sin computed from the positions);
- the KV cache: `present = Concat(past, k)`, then the key/value heads repeated for every query head (Expand);
- three products of the same normalized input, for q, k and v.

onnxscript fuses only the attention itself (a `MultiHeadAttention` without a past). ONNX Runtime's
`GroupQueryAttention` does all of it in one kernel: the KV heads shared by groups of query heads, the past in a buffer
of any capacity (its length given by `seqlens_k` and `total_sequence_length`), and the rotary positions
(`do_rotary`, with cos and sin tables). onnxruntime-genai's model builder writes LLaMA models that way. This module
rewrites each layer so: the three products become one (their weights side by side) whose output GroupQueryAttention
unpacks, and the rotary tables are computed here from the graph's own inverse frequencies.

The match is strict: a layer whose rotary is not LLaMA's `rotate_half` form on the inverse frequencies alone (a scaled
rope, an interleaved one), or whose past is not concatenated on the sequence axis, leaves the whole model as it was.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

from tracker.optimize.base import LAYOUT_OPS, GraphLookups, recorded_positions

_MS = "com.microsoft"
_PAST = "past_key_values."
# Rows of the rotary tables when the model does not say its positions (`max_positions` in its metadata).
DEFAULT_POSITIONS = 4096


@dataclass(frozen=True)
class _Layer:
    """One layer's attention, as matched: the fused attention node, the present Concats, the projections' outputs
    ([B, S, heads * head_dim], before rotary) and the rotary's inverse frequencies."""

    attention: onnx.NodeProto
    concat_key: onnx.NodeProto
    concat_value: onnx.NodeProto
    query: str
    key: str
    value: str
    inv_freq: np.ndarray


def match_layers(model: onnx.ModelProto) -> list[_Layer] | None:
    """Every fused attention's layer matched, or None when one layer does not match (then nothing is rewritten)."""
    graph = GraphLookups(model.graph)
    pasts = {i.name for i in model.graph.input if i.name.startswith(_PAST)}
    attentions = [n for n in model.graph.node if n.op_type == "MultiHeadAttention" and n.domain == _MS]
    if not attentions or len(attentions) * 2 != len(pasts):
        return None
    layers = []
    for node in attentions:
        if len(node.input) > 6 and any(node.input[6:]):  # a past already inside the attention: not this form
            return None
        concat_key = _present_concat(graph, node.input[1], pasts)
        concat_value = _present_concat(graph, node.input[2], pasts)
        query = _unrotated(graph, graph.through_layout(node.input[0]))
        key = _unrotated(graph, concat_key.input[1]) if concat_key is not None else None
        if concat_key is None or concat_value is None or query is None or key is None or query[1] is None:
            return None
        layers.append(_Layer(node, concat_key, concat_value, query=graph.through_layout(query[0]),
                             key=graph.through_layout(key[0]), value=graph.through_layout(concat_value.input[1]),
                             inv_freq=query[1]))
    return layers


def _present_concat(graph: GraphLookups, value: str, pasts: set[str]) -> onnx.NodeProto | None:
    """The `Concat(past, new)` on the sequence axis that makes a present output, reached from the attention's key or
    value input through reshapes, transposes and the heads' repetition (Unsqueeze, Expand)."""
    concat = graph.node(graph.through_layout(value, (*LAYOUT_OPS, "Expand", "Unsqueeze")), "Concat")
    if concat is None or len(concat.input) != 2 or concat.input[0] not in pasts or concat.output[0] not in graph.outputs:
        return None
    axis = next(helper.get_attribute_value(a) for a in concat.attribute if a.name == "axis")
    return concat if axis in (2, -2) else None


def _unrotated(graph: GraphLookups, value: str) -> tuple[str, np.ndarray | None] | None:
    """For `value = x * cos + concat(-x2, x1) * sin` (LLaMA's rotary): `x` and the inverse frequencies cos and sin
    come from; None for anything else."""
    add = graph.node(value, "Add")
    if add is None:
        return None
    muls = [graph.node(v, "Mul") for v in add.input]
    if any(m is None for m in muls):
        return None
    for plain, rotated in (muls, muls[::-1]):
        assert plain is not None and rotated is not None
        for x, cos in (plain.input, plain.input[::-1]):
            half = next((v for v in rotated.input if _is_rotate_half(graph, v, x)), None)
            if half is None:
                continue
            sin = rotated.input[1] if rotated.input[0] == half else rotated.input[0]
            inv_freq = _inv_freq(graph, cos, "Cos")
            if inv_freq is None or _inv_freq(graph, sin, "Sin") is None:
                return None
            return x, inv_freq
    return None


def _is_rotate_half(graph: GraphLookups, value: str, x: str) -> bool:
    """`value = concat(-x[..., half:], x[..., :half])`, the last axis."""
    concat = graph.node(value, "Concat")
    if concat is None or len(concat.input) != 2:
        return False
    neg = graph.node(concat.input[0], "Neg")
    second = graph.node(neg.input[0], "Slice") if neg is not None else None
    first = graph.node(concat.input[1], "Slice")
    return second is not None and first is not None and second.input[0] == x and first.input[0] == x


def _inv_freq(graph: GraphLookups, value: str, op_type: str) -> np.ndarray | None:
    """The inverse frequencies under `value = Unsqueeze(Cos(Concat(f, f)))` with `f = positions * inv_freq`; None when
    anything else (a scale, a rope variant's own factors) lies on the way."""
    trig = graph.node(graph.through_layout(value, ("Unsqueeze", "Cast")), op_type)
    doubled = graph.node(trig.input[0], "Concat") if trig is not None else None
    if doubled is None or len(doubled.input) != 2 or doubled.input[0] != doubled.input[1]:
        return None
    product = graph.node(doubled.input[0], "Mul")
    if product is None:
        return None
    found = [c for c in (graph.constant(v) for v in product.input) if c is not None]
    return found[0].astype(np.float64).reshape(-1) if len(found) == 1 else None


def rotary_tables(inv_freq: np.ndarray, positions: int) -> tuple[np.ndarray, np.ndarray]:
    """GroupQueryAttention's cos and sin caches: [positions, head_dim / 2], as the graph computes them."""
    angles = np.arange(positions, dtype=np.float64)[:, None] * inv_freq[None, :]
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def rewrite_rotary_layers(model: onnx.ModelProto, *, seqlens_k: str, total_sequence_length: str) -> int:
    """Rewrites every matched layer in place (`match_layers`); returns how many (0: the model is left as it was).

    The graph's Shapes of the pasts, its new inputs and its dead nodes are the caller's (`shared_kv`)."""
    layers = match_layers(model)
    if not layers:
        return 0
    graph = GraphLookups(model.graph)
    kv_heads = next(i.type.tensor_type.shape.dim[1].dim_value for i in model.graph.input if i.name.startswith(_PAST))
    positions = recorded_positions(model) or DEFAULT_POSITIONS
    tables: dict[bytes, tuple[str, str]] = {}  # one pair of caches per distinct inverse frequencies
    nodes = model.graph.node
    for index, layer in enumerate(layers):
        key = layer.inv_freq.tobytes()
        if key not in tables:
            cos, sin = rotary_tables(layer.inv_freq, positions)
            names = (f"rotary_gqa_cos_{len(tables)}", f"rotary_gqa_sin_{len(tables)}")
            model.graph.initializer.extend([numpy_helper.from_array(cos, names[0]),
                                            numpy_helper.from_array(sin, names[1])])
            tables[key] = names
        packed = _pack(graph, layer, index)
        attrs = {a.name: helper.get_attribute_value(a) for a in layer.attention.attribute}
        inputs = [packed[0].output[0], "", ""] if packed else [layer.query, layer.key, layer.value]
        gqa = helper.make_node(
            "GroupQueryAttention",
            [*inputs, layer.concat_key.input[0], layer.concat_value.input[0], seqlens_k, total_sequence_length,
             *tables[key]],
            [layer.attention.output[0], layer.concat_key.output[0], layer.concat_value.output[0]],
            domain=_MS, name=f"{layer.attention.name}_rotary_gqa", num_heads=attrs["num_heads"],
            kv_num_heads=kv_heads, do_rotary=1, rotary_interleaved=0,
            **({"scale": attrs["scale"]} if "scale" in attrs else {}),
        )
        for node in (layer.concat_key, layer.concat_value):
            nodes.remove(node)
        position = list(nodes).index(layer.attention)
        nodes.remove(layer.attention)
        for offset, node in enumerate([*packed, gqa]):
            nodes.insert(position + offset, node)
    return len(layers)


def _pack(graph: GraphLookups, layer: _Layer, index: int) -> list[onnx.NodeProto]:
    """One MatMul over q, k and v's weights side by side, when the three are MatMuls of one input by 2-D
    initializers; else nothing (the attention then takes the three apart)."""
    products = [graph.node(v, "MatMul") for v in (layer.query, layer.key, layer.value)]
    if any(p is None for p in products) or len({p.input[0] for p in products if p is not None}) != 1:
        return []
    weights = [graph.initializers.get(p.input[1]) for p in products if p is not None]
    if any(w is None or len(w.dims) != 2 for w in weights):
        return []
    packed = np.concatenate([numpy_helper.to_array(w) for w in weights if w is not None], axis=1)
    name = f"rotary_gqa_qkv_weight_{index}"
    graph.graph.initializer.append(numpy_helper.from_array(packed, name))
    source = products[0].input[0] if products[0] is not None else ""
    return [helper.make_node("MatMul", [source, name], [f"rotary_gqa_qkv_{index}"], name=f"rotary_gqa_qkv_{index}")]
