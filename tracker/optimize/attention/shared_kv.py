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

import numpy as np
import onnx
import onnx_ir as ir

from tracker.base.vocabulary import Kind
from tracker.measure.generation.decoder import SEQLENS_K, TOTAL_SEQUENCE_LENGTH
from tracker.optimize.attention.rotary_gqa import rewrite_rotary_layers
from tracker.optimize.base import Candidate, Context, constant_of, made_by, rewrite_in_ir
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
    """The rewrite, in place (`SharedKV`, then what no output needs any more goes); returns how many attentions were
    rewritten (0: the model is left as it was)."""
    rewrite = SharedKV()
    rewrite_in_ir(model, rewrite)
    return rewrite.rewritten


class SharedKV(ir.passes.InPlacePass):
    """Every layer's attention with a past as a GroupQueryAttention; `rewritten` counts them (0: nothing changed).

    Two forms are rewritten: GPT-2's, where `attention_fused` made a `MultiHeadAttention` that takes the past itself,
    and the LLaMA family's, where the past is concatenated and the rotary positions applied outside a
    `MultiHeadAttention` without a past (`rotary_gqa`: one GroupQueryAttention with rotary, over packed q/k/v)."""

    def __init__(self) -> None:
        super().__init__()
        self.rewritten = 0

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        self.rewritten = 0
        graph = model.graph
        pasts = [v for v in graph.inputs if v.name and v.name.startswith(_PAST)]
        shapes = [n for n in graph if n.op_type == "Shape" and any(n.inputs[0] is p for p in pasts)]
        if any(_span(n) not in ("0:1", "2:3") for n in shapes):
            return ir.passes.PassResult(model, modified=False)  # a Shape of a past reading more than batch or length
        seqlens = ir.val(SEQLENS_K, ir.DataType.INT32, ["batch"])
        total = ir.val(TOTAL_SEQUENCE_LENGTH, ir.DataType.INT32, [])
        attentions = [n for n in graph if n.op_type == "MultiHeadAttention" and n.domain == _MS
                      and len(n.inputs) >= 8 and any(n.inputs[6] is p for p in pasts)
                      and any(n.inputs[7] is p for p in pasts)]
        if attentions and len(attentions) * 2 == len(pasts):
            if any(n.inputs[3] is not None or n.inputs[4] is not None for n in attentions):
                return ir.passes.PassResult(model, modified=False)  # a bias or a padding mask GQA would not apply
            self.rewritten = _rewrite_with_past(graph, attentions, pasts, seqlens, total)
        else:
            self.rewritten = rewrite_rotary_layers(model, seqlens_k=seqlens, total_sequence_length=total)
        if not self.rewritten:
            return ir.passes.PassResult(model, modified=False)
        graph.inputs.extend([seqlens, total])
        input_ids = next(v for v in graph.inputs if v.name == "input_ids")
        one = ir.val("skv_one", const_value=ir.tensor(np.array([1], np.int64), name="skv_one"))
        graph.register_initializer(one)
        # The past's length and the batch, from the new inputs and input_ids, for every Shape of a past.
        total64 = ir.node("Cast", [total], {"to": int(ir.DataType.INT64)}, name="skv_cast")
        total_1 = ir.node("Reshape", [total64.outputs[0], one], name="skv_reshape")
        seq = ir.node("Shape", [input_ids], {"start": 1, "end": 2}, name="skv_seq")
        past_len = ir.node("Sub", [total_1.outputs[0], seq.outputs[0]], name="skv_past_len")
        batch = ir.node("Shape", [input_ids], {"start": 0, "end": 1}, name="skv_batch")
        graph.insert_before(graph.node(0), [total64, total_1, seq, past_len, batch])
        lengths = {"0:1": batch.outputs[0], "2:3": past_len.outputs[0]}
        for node in shapes:  # each is read by nothing now, and goes with the dead nodes
            node.outputs[0].replace_all_uses_with(lengths[_span(node)])
        return ir.passes.PassResult(model, modified=True)


def _rewrite_with_past(graph: ir.Graph, attentions: list[ir.Node], pasts: list[ir.Value], seqlens: ir.Value,
                       total: ir.Value) -> int:
    """Each `MultiHeadAttention` that takes its past as a `GroupQueryAttention` on the same inputs (GPT-2's form)."""
    dims = pasts[0].shape
    if dims is None or not isinstance(dims[1], int) or not isinstance(dims[3], int):
        return 0
    kv_heads, head_size = dims[1], dims[3]
    for node in attentions:
        heads = node.attributes.get_int("num_heads")
        scale = node.attributes.get_float("scale")
        packed = _packed_qkv(node, [heads * head_size] + [kv_heads * head_size] * 2)
        qkv = [packed, None, None] if packed is not None else list(node.inputs[:3])
        gqa = ir.node("GroupQueryAttention", [*qkv, node.inputs[6], node.inputs[7], seqlens, total],
                      {"num_heads": heads, "kv_num_heads": kv_heads, **({"scale": scale} if scale is not None else {})},
                      domain=_MS, name=f"{node.name}_gqa", num_outputs=len(node.outputs))
        ir.convenience.replace_nodes_and_values(graph, node, [node], [gqa], list(node.outputs), list(gqa.outputs))
    return len(attentions)


def _packed_qkv(node: ir.Node, sizes: list[int]) -> ir.Value | None:
    """The one tensor whose last axis a `Split` cut into the attention's query, key and value, in that order and of
    `sizes` (GPT-2's c_attn product): GroupQueryAttention reads it packed, and the Split goes. None otherwise."""
    split = made_by(node.inputs[0], "Split")
    if split is None or len(split.outputs) != 3 or any(o is not i for o, i in zip(split.outputs, node.inputs[:3])):
        return None
    if split.attributes.get_int("axis", 0) not in (2, -1):  # the query is [batch, seq, hidden]: rank 3
        return None
    given = constant_of(split.inputs[1]) if len(split.inputs) > 1 else None
    if given is not None:
        return split.inputs[0] if [int(x) for x in given] == sizes else None
    return split.inputs[0] if split.attributes.get_int("num_outputs") == 3 and len(set(sizes)) == 1 else None


def _span(node: ir.Node) -> str:
    return f"{node.attributes.get_int('start', 0)}:{node.attributes.get_int('end', 4)}"


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
