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
import onnx_ir as ir

from tracker.optimize.base import LAYOUT_OPS, constant_of, made_by, recorded_positions, through_layout

_MS = "com.microsoft"
_PAST = "past_key_values."
# Rows of the rotary tables when the model does not say its positions (`max_positions` in its metadata).
DEFAULT_POSITIONS = 4096


@dataclass(frozen=True)
class _Layer:
    """One layer's attention, as matched: the fused attention node, the present Concats, the projections' outputs
    ([B, S, heads * head_dim], before rotary) and the rotary's inverse frequencies."""

    attention: ir.Node
    concat_key: ir.Node
    concat_value: ir.Node
    query: ir.Value
    key: ir.Value
    value: ir.Value
    inv_freq: np.ndarray


def match_layers(model: ir.Model) -> list[_Layer] | None:
    """Every fused attention's layer matched, or None when one layer does not match (then nothing is rewritten)."""
    pasts = [v for v in model.graph.inputs if v.name and v.name.startswith(_PAST)]
    attentions = [n for n in model.graph if n.op_type == "MultiHeadAttention" and n.domain == _MS]
    if not attentions or len(attentions) * 2 != len(pasts):
        return None
    layers = []
    for node in attentions:
        if any(v is not None for v in node.inputs[6:]):  # a past already inside the attention: not this form
            return None
        concat_key = _present_concat(node.inputs[1], pasts)
        concat_value = _present_concat(node.inputs[2], pasts)
        query = _unrotated(through_layout(node.inputs[0]))
        key = _unrotated(concat_key.inputs[1]) if concat_key is not None else None
        value = through_layout(concat_value.inputs[1]) if concat_value is not None else None
        if concat_key is None or concat_value is None or query is None or key is None or query[1] is None:
            return None
        query_in, key_in = through_layout(query[0]), through_layout(key[0])
        if query_in is None or key_in is None or value is None:
            return None
        layers.append(_Layer(node, concat_key, concat_value, query=query_in, key=key_in, value=value,
                             inv_freq=query[1]))
    return layers


def _present_concat(value: ir.Value | None, pasts: list[ir.Value]) -> ir.Node | None:
    """The `Concat(past, new)` on the sequence axis that makes a present output, reached from the attention's key or
    value input through reshapes, transposes and the heads' repetition (Unsqueeze, Expand)."""
    concat = made_by(through_layout(value, (*LAYOUT_OPS, "Expand", "Unsqueeze")), "Concat")
    if (concat is None or len(concat.inputs) != 2 or not any(concat.inputs[0] is p for p in pasts)
            or not concat.outputs[0].is_graph_output()):
        return None
    return concat if concat.attributes.get_int("axis") in (2, -2) else None


def _unrotated(value: ir.Value | None) -> tuple[ir.Value, np.ndarray | None] | None:
    """For `value = x * cos + concat(-x2, x1) * sin` (LLaMA's rotary): `x` and the inverse frequencies cos and sin
    come from; None for anything else."""
    add = made_by(value, "Add")
    if add is None:
        return None
    muls = [made_by(v, "Mul") for v in add.inputs]
    if any(m is None for m in muls):
        return None
    for plain, rotated in (muls, muls[::-1]):
        assert plain is not None and rotated is not None
        for x, cos in (plain.inputs, plain.inputs[::-1]):
            half = next((v for v in rotated.inputs if _is_rotate_half(v, x)), None)
            if half is None or x is None:
                continue
            sin = rotated.inputs[1] if rotated.inputs[0] is half else rotated.inputs[0]
            inv_freq = _inv_freq(cos, "Cos")
            if inv_freq is None or _inv_freq(sin, "Sin") is None:
                return None
            return x, inv_freq
    return None


def _is_rotate_half(value: ir.Value | None, x: ir.Value | None) -> bool:
    """`value = concat(-x[..., half:], x[..., :half])`, the last axis."""
    concat = made_by(value, "Concat")
    if concat is None or len(concat.inputs) != 2:
        return False
    neg = made_by(concat.inputs[0], "Neg")
    second = made_by(neg.inputs[0], "Slice") if neg is not None else None
    first = made_by(concat.inputs[1], "Slice")
    return second is not None and first is not None and second.inputs[0] is x and first.inputs[0] is x


def _inv_freq(value: ir.Value | None, op_type: str) -> np.ndarray | None:
    """The inverse frequencies under `value = Unsqueeze(Cos(Concat(f, f)))` with `f = positions * inv_freq`; None when
    anything else (a scale, a rope variant's own factors) lies on the way."""
    trig = made_by(through_layout(value, ("Unsqueeze", "Cast")), op_type)
    doubled = made_by(trig.inputs[0], "Concat") if trig is not None else None
    if doubled is None or len(doubled.inputs) != 2 or doubled.inputs[0] is not doubled.inputs[1]:
        return None
    product = made_by(doubled.inputs[0], "Mul")
    if product is None:
        return None
    found = [c for c in (constant_of(v) for v in product.inputs) if c is not None]
    return found[0].astype(np.float64).reshape(-1) if len(found) == 1 else None


def rotary_tables(inv_freq: np.ndarray, positions: int) -> tuple[np.ndarray, np.ndarray]:
    """GroupQueryAttention's cos and sin caches: [positions, head_dim / 2], as the graph computes them."""
    angles = np.arange(positions, dtype=np.float64)[:, None] * inv_freq[None, :]
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def rewrite_rotary_layers(model: ir.Model, *, seqlens_k: ir.Value, total_sequence_length: ir.Value) -> int:
    """Rewrites every matched layer in place (`match_layers`); returns how many (0: the model is left as it was).

    The graph's Shapes of the pasts, its new inputs and its dead nodes are the caller's (`shared_kv`)."""
    layers = match_layers(model)
    if not layers:
        return 0
    graph = model.graph
    kv_heads = next((v.shape[1] for v in graph.inputs if v.name and v.name.startswith(_PAST) and v.shape is not None),
                    None)
    if not isinstance(kv_heads, int):  # the pasts' heads are not a static size
        return 0
    positions = recorded_positions(model) or DEFAULT_POSITIONS
    tables: dict[bytes, tuple[ir.Value, ir.Value]] = {}  # one pair of caches per distinct inverse frequencies
    for index, layer in enumerate(layers):
        key = layer.inv_freq.tobytes()
        if key not in tables:
            cos, sin = rotary_tables(layer.inv_freq, positions)
            tables[key] = (_weight(graph, cos, f"rotary_gqa_cos_{len(tables)}"),
                           _weight(graph, sin, f"rotary_gqa_sin_{len(tables)}"))
        packed = _pack(graph, layer, index)
        attrs = layer.attention.attributes
        inputs = [packed[0].outputs[0], None, None] if packed else [layer.query, layer.key, layer.value]
        scale = attrs.get_float("scale")
        gqa = ir.node(
            "GroupQueryAttention",
            [*inputs, layer.concat_key.inputs[0], layer.concat_value.inputs[0], seqlens_k, total_sequence_length,
             *tables[key]],
            {"num_heads": attrs.get_int("num_heads"), "kv_num_heads": kv_heads, "do_rotary": 1, "rotary_interleaved": 0,
             **({"scale": scale} if scale is not None else {})},
            domain=_MS, name=f"{layer.attention.name}_rotary_gqa", num_outputs=3,
        )
        old = [layer.attention.outputs[0], layer.concat_key.outputs[0], layer.concat_value.outputs[0]]
        ir.convenience.replace_nodes_and_values(graph, layer.attention, [layer.attention], [*packed, gqa], old,
                                                list(gqa.outputs))
        graph.remove([layer.concat_key, layer.concat_value], safe=True)
    return len(layers)


def _pack(graph: ir.Graph, layer: _Layer, index: int) -> list[ir.Node]:
    """One MatMul over q, k and v's weights side by side, when the three are MatMuls of one input by 2-D
    initializers; else nothing (the attention then takes the three apart)."""
    products = [made_by(v, "MatMul") for v in (layer.query, layer.key, layer.value)]
    sources = {id(p.inputs[0]) for p in products if p is not None}
    weights = [p.inputs[1] for p in products if p is not None]
    if len(weights) != 3 or len(sources) != 1 or any(
            w is None or not w.is_initializer() or w.const_value is None or len(w.const_value.shape) != 2
            for w in weights):
        return []
    packed = np.concatenate([w.const_value.numpy() for w in weights if w is not None and w.const_value is not None],
                            axis=1)
    source = products[0].inputs[0] if products[0] is not None else None
    name = f"rotary_gqa_qkv_{index}"
    return [ir.node("MatMul", [source, _weight(graph, packed, f"rotary_gqa_qkv_weight_{index}")], name=name,
                    outputs=[ir.val(name)])]


def _weight(graph: ir.Graph, array: np.ndarray, name: str) -> ir.Value:
    """`array` as a new initializer of `graph`, named `name`."""
    value = ir.val(name, const_value=ir.tensor(array, name=name))
    graph.register_initializer(value)
    return value
