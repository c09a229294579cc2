"""Attention with a past as ORT's GroupQueryAttention, whose KV cache can live in one buffer for past and present.

A decode-ready graph fused by `attention_fused` runs each layer's attention as a `MultiHeadAttention` with a past: the
kernel copies the whole past into a new present at every step (~38 MB read and written per token at a past of 512 on
gpt2-small). ONNX Runtime's `GroupQueryAttention` takes the past in a buffer of any capacity, with the valid length
given apart (`seqlens_k`, `total_sequence_length`); when the decode loop binds past and present to the same buffer
(`tracker.measure.generation.binding`), the kernel writes only the new positions. This entry rewrites each such
`MultiHeadAttention` into a `GroupQueryAttention` (causal, as the decoder's own mask is: its mask input is dropped; where
a `Split` cut one product into query, key and value, as GPT-2's c_attn, the attention reads that product packed), and
makes the graph read the past's length from `total_sequence_length` instead of the past's shape, so positions stay
right when the past is a larger buffer. The model gains the two inputs; `DecoderSession` feeds them.

A LLaMA-family graph, where onnxscript fuses the attention without its past (the past concatenated and the rotary
positions applied outside), gets one GroupQueryAttention per layer that does both, over one packed q/k/v product
(`rotary_gqa`).
"""

from __future__ import annotations

from pathlib import Path

import onnx
from onnx import TensorProto, helper

from tracker.base.vocabulary import Kind
from tracker.measure.generation.decoder import SEQLENS_K, TOTAL_SEQUENCE_LENGTH
from tracker.optimize.attention.rotary_gqa import rewrite_rotary_layers
from tracker.optimize.base import Candidate, Context, GraphLookups, drop_dead_nodes
from tracker.optimize.entry import FunctionEntry
from tracker.optimize.model_files import copy_model, prepare_output, save_proto

NAME = "shared_kv"
_MS = "com.microsoft"
_PAST = "past_key_values."
_FORMS = ("a MultiHeadAttention with a past (GPT-2's), or one whose past is concatenated outside with LLaMA's "
          "rotate-half rotary on plain inverse frequencies")


def shared_kv(source: Path, target_dir: Path, context: Context) -> Candidate:
    """Rewrites every layer's fused attention of a decode-ready model (`attention_fused`'s) as a
    `GroupQueryAttention`; a model where one layer does not match is copied unchanged (`applied` False)."""
    target = prepare_output(source, target_dir, NAME)
    model = onnx.load_model(str(source), load_external_data=True)
    rewritten = rewrite_attention(model)
    if not rewritten:
        copy_model(source, target)
        return Candidate(path=target, applied=False, fusions={"GroupQueryAttention": 0}, fully_optimized=None,
                         precision="fp32", notes=(f"not every layer's attention is {_FORMS} (fuse attention first: "
                                                  "attention_fused+shared_kv): nothing rewritten",))
    save_proto(model, target)
    rotary = any(a.name == "do_rotary" and a.i for n in model.graph.node if n.op_type == "GroupQueryAttention"
                 for a in n.attribute)
    what = ("MultiHeadAttention with its past concatenated and LLaMA's rotary positions outside, rewritten as "
            "GroupQueryAttention doing the rotary itself over one packed q/k/v product" if rotary else
            "MultiHeadAttention with a past rewritten as GroupQueryAttention")
    return Candidate(
        path=target, applied=True, fusions={"GroupQueryAttention": rewritten, "MultiHeadAttention": 0},
        fully_optimized=None, precision="fp32",
        notes=(f"{rewritten} {what} (causal; the past may be a buffer larger than its length, given by the new inputs "
               f"{SEQLENS_K!r} and {TOTAL_SEQUENCE_LENGTH!r})",),
        params={"attention.kv_cache": "GroupQueryAttention, past and present may share a buffer",
                "attention.rotary": "in GroupQueryAttention" if rotary else "none or outside the attention"},
    )


def rewrite_attention(model: onnx.ModelProto) -> int:
    """The rewrite, in place; returns how many attentions were rewritten (0: the model is left as it was).

    Two forms are rewritten: GPT-2's, where `attention_fused` made a `MultiHeadAttention` that takes the past itself,
    and the LLaMA family's, where the past is concatenated and the rotary positions applied outside a
    `MultiHeadAttention` without a past (`rotary_gqa`: one GroupQueryAttention with rotary, over packed q/k/v)."""
    graph = model.graph
    pasts = [i.name for i in graph.input if i.name.startswith(_PAST)]
    shapes = [n for n in graph.node if n.op_type == "Shape" and n.input[0] in pasts]
    spans = {n.name: _span(n) for n in shapes}
    if any(span not in ("0:1", "2:3") for span in spans.values()):
        return 0  # a Shape of a past that reads more than the batch or the length: left as it is
    attentions = [n for n in graph.node if n.op_type == "MultiHeadAttention" and n.domain == _MS
                  and len(n.input) >= 8 and n.input[6] in pasts and n.input[7] in pasts]
    if attentions and len(attentions) * 2 == len(pasts):
        if any(n.input[3] or n.input[4] for n in attentions):  # a bias or a padding mask GQA would not apply the same
            return 0
        rewritten = _rewrite_with_past(model, attentions, pasts)
    else:
        rewritten = rewrite_rotary_layers(model, seqlens_k=SEQLENS_K, total_sequence_length=TOTAL_SEQUENCE_LENGTH)
    if not rewritten:
        return 0
    new_nodes: list[onnx.NodeProto] = []
    # The past's length and the batch, from the new inputs and input_ids, for every Shape of a past.
    new_nodes += [
        helper.make_node("Cast", [TOTAL_SEQUENCE_LENGTH], ["skv_total64"], to=TensorProto.INT64, name="skv_cast"),
        helper.make_node("Reshape", ["skv_total64", "skv_one"], ["skv_total_1"], name="skv_reshape"),
        helper.make_node("Shape", ["input_ids"], ["skv_seq"], start=1, end=2, name="skv_seq"),
        helper.make_node("Sub", ["skv_total_1", "skv_seq"], ["skv_past_len"], name="skv_past_len"),
        helper.make_node("Shape", ["input_ids"], ["skv_batch"], start=0, end=1, name="skv_batch"),
    ]
    graph.initializer.append(helper.make_tensor("skv_one", TensorProto.INT64, [1], [1]))
    lengths = {"0:1": "skv_batch", "2:3": "skv_past_len"}
    for node in shapes:
        new_nodes.append(helper.make_node("Identity", [lengths[spans[node.name]]], list(node.output),
                                          name=node.name + "_skv"))
        graph.node.remove(node)
    for node in reversed(new_nodes):
        graph.node.insert(0, node)
    graph.input.extend([
        helper.make_tensor_value_info(SEQLENS_K, TensorProto.INT32, ["batch"]),
        helper.make_tensor_value_info(TOTAL_SEQUENCE_LENGTH, TensorProto.INT32, []),
    ])
    drop_dead_nodes(graph)
    return rewritten


def _rewrite_with_past(model: onnx.ModelProto, attentions: list[onnx.NodeProto], pasts: list[str]) -> int:
    """Each `MultiHeadAttention` that takes its past as a `GroupQueryAttention` on the same inputs (GPT-2's form)."""
    graph = model.graph
    past_shape = {i.name: i.type.tensor_type.shape.dim for i in graph.input if i.name in pasts}
    kv_heads, head_size = past_shape[pasts[0]][1].dim_value, past_shape[pasts[0]][3].dim_value
    lookups = GraphLookups(graph)
    for node in attentions:
        heads = next(helper.get_attribute_value(a) for a in node.attribute if a.name == "num_heads")
        scale = [helper.get_attribute_value(a) for a in node.attribute if a.name == "scale"]
        packed = _packed_qkv(lookups, node, [heads * head_size] + [kv_heads * head_size] * 2)
        qkv = [packed, "", ""] if packed else list(node.input[:3])
        gqa = helper.make_node(
            "GroupQueryAttention",
            [*qkv, node.input[6], node.input[7], SEQLENS_K, TOTAL_SEQUENCE_LENGTH],
            list(node.output), domain=_MS, name=node.name + "_gqa", num_heads=heads, kv_num_heads=kv_heads,
            **({"scale": scale[0]} if scale else {}),
        )
        index = list(graph.node).index(node)
        graph.node.remove(node)
        graph.node.insert(index, gqa)
    return len(attentions)


def _packed_qkv(lookups: GraphLookups, node: onnx.NodeProto, sizes: list[int]) -> str | None:
    """The one tensor whose last axis a `Split` cut into the attention's query, key and value, in that order and of
    `sizes` (GPT-2's c_attn product): GroupQueryAttention reads it packed, and the Split goes. None otherwise."""
    split = lookups.node(node.input[0], "Split")
    if split is None or list(split.output) != list(node.input[:3]):
        return None
    attrs = {a.name: helper.get_attribute_value(a) for a in split.attribute}
    if attrs.get("axis", 0) not in (2, -1):  # the query is [batch, seq, hidden]: rank 3
        return None
    given = lookups.constant(split.input[1]) if len(split.input) > 1 and split.input[1] else None
    if given is not None:
        return split.input[0] if [int(x) for x in given] == sizes else None
    return split.input[0] if attrs.get("num_outputs") == 3 and len(set(sizes)) == 1 else None


def _span(node: onnx.NodeProto) -> str:
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    return f"{attrs.get('start', 0)}:{attrs.get('end', 4)}"


def has_attention(model: onnx.ModelProto, context: Context) -> str | None:
    """Attention in the graph, fused (MultiHeadAttention, GroupQueryAttention, Attention) or not (Softmax and
    MatMul): on a forward-only transformer it applies and leaves the model as it is, so chains run in both of a
    study's scenarios."""
    ops = {node.op_type for node in model.graph.node}
    if ops & {"MultiHeadAttention", "GroupQueryAttention", "Attention"} or {"Softmax", "MatMul"} <= ops:
        return None
    return "no attention in the graph (neither a fused attention op nor Softmax and MatMul)"


ENTRY = FunctionEntry(NAME, Kind.TRANSFORM,
                      "attention with a past as GroupQueryAttention, its KV cache able to share one buffer",
                      shared_kv, has_attention)
