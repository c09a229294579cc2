"""Attention fusion: onnxscript's ORT fusions (`optimize_for_ort`), which fuse the attention of dynamo exports
(GPT-2 into com.microsoft MultiHeadAttention, BERT-style encoders into Attention) where ORT's own optimizer does
not, plus a repair ORT needs on GPT-2."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from tracker.base.vocabulary import Kind
from tracker.optimize.base import Candidate, Context, info_source, transformer
from tracker.optimize.entry import FunctionEntry
from tracker.optimize.model_files import copy_model, prepare_output

logger = logging.getLogger(__name__)

NAME = "attention_fused"
ATTENTION_OPS = ("MultiHeadAttention", "Attention", "GroupQueryAttention")
FUSED_OPS = (
    *ATTENTION_OPS,
    "SkipLayerNormalization",
    "LayerNormalization",
    "FastGelu",
    "BiasGelu",
    "Gelu",
    "FusedMatMul",
    # LLaMA-family decoders: RMSNorm (plain and with the residual add) and rotary positions.
    "SimplifiedLayerNormalization",
    "SkipSimplifiedLayerNormalization",
    "RotaryEmbedding",
)
_MS_DOMAIN = "com.microsoft"
# Fused ops that onnxscript writes in ONNX's own domain (ORT runs SimplifiedLayerNormalization there too).
_ONNX_DOMAIN_FUSIONS = ("LayerNormalization", "SimplifiedLayerNormalization")
# Inputs that an ONNX op requires to be 2-D: Gemm's A and B.
_RANK2_INPUTS = {"Gemm": (0, 1)}


def attention_fused(source: Path, target_dir: Path, context: Context) -> Candidate:
    """Fuses every attention block with `onnxscript.rewriter.ort_fusions.optimize_for_ort`.

    Where no attention fuses (the legacy TorchScript export's graph does not match onnxscript's
    patterns) nothing is kept: `applied` is False and the output is an unchanged copy of the source.
    """
    import onnx_ir as ir
    from onnxscript.rewriter.ort_fusions import optimize_for_ort

    info = context.require_info(NAME, source)
    target = prepare_output(source, target_dir, NAME)
    # optimize_for_ort rewrites the ir.Model in place; it is our own copy, loaded from the file.
    model, rule_counts = optimize_for_ort(ir.load(source))
    fusions = _count_ms_ops(model)
    attention = sum(fusions[op] for op in ATTENTION_OPS)
    params = {"optimizer.tool": "onnxscript.rewriter.ort_fusions.optimize_for_ort",
              "optimizer.info_source": info_source(context)}
    rules = ", ".join(f"{k}={v}" for k, v in rule_counts.items() if v) or "none"
    if attention == 0:
        copy_model(source, target)
        return Candidate(
            path=target,
            applied=False,
            fusions=dict.fromkeys(FUSED_OPS, 0),
            fully_optimized=None,
            precision="fp32",
            notes=(f"no attention fused (onnxscript rules that matched: {rules}); the output is the unchanged source",),
            params=params,
        )
    repaired = restore_attention_output_reshapes(model, hidden_size=info.hidden_size)
    ir.save(model, target, external_data=f"{target.name}.data")
    _check_fused(target)
    notes = [f"onnxscript rules that matched: {rules}"]
    if repaired:
        notes.append(
            f"re-inserted {repaired} Reshape(s) [batch, seq, hidden] -> [batch*seq, hidden] after fused "
            "attention, which onnxscript 0.7.2 drops (ORT refused the graph: rank 3 into a rank-2 Gemm)"
        )
    logger.info("%s: %s", NAME, {k: v for k, v in fusions.items() if v})
    return Candidate(
        path=target,
        applied=True,
        fusions=fusions,
        fully_optimized=None,
        precision="fp32",
        notes=tuple(notes),
        params={**params, "attention.repaired_reshapes": str(repaired)},
    )


def restore_attention_output_reshapes(model, *, hidden_size: int) -> int:
    """Re-inserts the Reshape that onnxscript 0.7.2 loses after a fused attention; returns how many.

    Why: GPT-2's attention ends in `Transpose -> Reshape([-1, hidden]) -> Gemm(c_proj)` (the dynamo export
    flattens batch and sequence for the Gemm). The MHA fusion replaces the whole chain up to and including
    that Reshape by one MultiHeadAttention whose output is 3-D [batch, seq, hidden], but keeps the Reshape's
    value (declared 2-D) as its output, so the Gemm receives a rank-3 tensor and ORT refuses the model
    ("Input 0 expected to have rank 2 but has rank 3").

    Fix, kept generic: wherever an attention output (always 3-D here: the query is 3-D) is declared 2-D or
    read by an input that must be 2-D, a Reshape to [-1, last dim] is put between the attention and its
    readers. The Reshape takes over the original value (name, declared shape) so nothing else changes.
    Attention outputs that are 3-D and read as 3-D are left alone.

    Args:
        model: an `onnx_ir.Model`, changed in place.
        hidden_size: the last dim of the attention output, when its declared shape does not say.
    """
    import onnx_ir as ir

    repaired = 0
    graph = model.graph
    for node in list(graph):
        if node.domain != _MS_DOMAIN or node.op_type not in ATTENTION_OPS:
            continue
        output = node.outputs[0]
        declared_rank2 = output.shape is not None and len(output.shape) == 2
        read_as_rank2 = any(index in _RANK2_INPUTS.get(user.op_type, ()) for user, index in output.uses())
        if not (declared_rank2 or read_as_rank2):
            continue
        last = output.shape[-1] if output.shape is not None else None
        width = last if isinstance(last, int) else hidden_size
        rows = output.shape[0] if declared_rank2 else None  # e.g. the symbol "seq*batch"
        users = list(output.uses())
        target_shape = ir.tensor(np.array([-1, width], dtype=np.int64))
        shape = ir.Value(name=f"{output.name}_flat_shape", const_value=target_shape)
        graph.register_initializer(shape)
        flat = ir.Value(name=output.name, shape=ir.Shape([rows, width]), type=output.type)
        output.name = f"{flat.name}_3d"
        output.shape = None  # let ORT infer [batch, seq, hidden]
        reshape = ir.node("Reshape", [output, shape], outputs=[flat], name=f"{node.name}_flatten")
        graph.insert_after(node, reshape)
        for user, index in users:
            user.replace_input_with(index, flat)
        if output.is_graph_output():
            graph.outputs[graph.outputs.index(output)] = flat
        repaired += 1
    return repaired


def _check_fused(path: Path) -> None:
    """The fused graph must still pass the ONNX checker (com.microsoft ops are not checked, only wired). ORT's
    SimplifiedLayerNormalization lives in ONNX's own domain, where the checker does not know it: a graph with it
    must load in ONNX Runtime instead."""
    import onnx

    try:
        onnx.checker.check_model(str(path))
    except onnx.checker.ValidationError as e:
        if not any(f"No Op registered for {op} " in str(e) for op in _ONNX_DOMAIN_FUSIONS):
            raise
        import onnxruntime as ort

        ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def _count_ms_ops(model) -> dict[str, int]:
    counts = dict.fromkeys(FUSED_OPS, 0)
    for node in model.graph:
        if node.op_type in counts and (node.domain == _MS_DOMAIN or node.op_type in _ONNX_DOMAIN_FUSIONS):
            counts[node.op_type] += 1
    return counts


ENTRY = FunctionEntry(NAME, Kind.TRANSFORM,
                      "onnxscript's ORT fusions: attention into MultiHeadAttention, layer norms, GELU",
              attention_fused, transformer)
