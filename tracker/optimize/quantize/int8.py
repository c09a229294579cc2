"""int8: dynamic quantization of the weights (`onnxruntime.quantization.quantize_dynamic`): int8 weights,
activations quantized on every run; its knobs are `quantize_dynamic`'s."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import onnx

from tracker.base.vocabulary import Kind
from tracker.optimize.base import Candidate, Context, count_ops, has_matmul_weights, ir_model
from tracker.optimize.entry import Entry, knob
from tracker.optimize.model_files import prepare_output
from tracker.optimize.quantize.lm_head import lm_head_params
from tracker.optimize.quantize.prepare import pre_process_for, prepared

QUANTIZED_OPS = ("MatMulInteger", "DynamicQuantizeLinear", "DynamicQuantizeMatMul")
# "all": what quantize_dynamic quantizes when not told (MatMul, Gemm, Gather of embeddings, Attention, Conv...).
OP_TYPES = ("all", "MatMul", "MatMul,Gemm")
# The weighted ops among "all" (the others quantize_dynamic takes, Gather and Attention, are left to it).
WEIGHT_OPS = ("MatMul", "Gemm", "Conv")
_PRE_PROCESSED = {"ort_optimizer": "optimized by ORT's transformer optimizer at opt_level 1 (fused)",
                  "quant_pre_process": "pre-processed by quant_pre_process (ORT's basic optimizations)"}


@dataclass(frozen=True)
class Int8Dynamic(Entry):
    """int8 weights, activations quantized per run, on the graph pre-processed once (`prepare.prepared`).

    Why the pre-processed graph, not the source: a weight read through a Transpose (GPT-2's dynamo export ties
    lm_head to the embedding that way) is not an initializer the quantizer can see; ORT's opt_level 1 (or
    `quant_pre_process` on a graph that is not a known transformer) folds it into a plain initializer.

    Knobs: `per_channel` (a scale per output channel: what a trained encoder needs, FACTS), `reduce_range`
    (7-bit weights, for CPUs without VNNI), `weight_type` (S8 or U8 weights against U8 activations),
    `op_types`, and `exclude` (nodes of the pre-processed graph left in fp32: the sensitivity fallback's).
    """

    name: str = "int8_dynamic"
    per_channel: bool = knob(False, (False, True), short="pc")
    reduce_range: bool = knob(False, (False, True), short="rr")
    weight_type: str = knob("QInt8", ("QInt8", "QUInt8"), short="w")
    op_types: str = knob("all", OP_TYPES, short="ops")
    exclude: tuple[str, ...] = knob((), None, search=((),), short="fp32", key="nodes_to_exclude")

    kind = Kind.TRANSFORM
    inserts_ops = True
    summary = "ORT's optimizer at opt_level 1, then int8 MatMul weights (dynamic quantization)"

    def __post_init__(self) -> None:
        self.check_knobs()

    def requires(self, model: onnx.ModelProto, context: Context) -> str | None:
        return has_matmul_weights(model, context)

    def pre_processing(self, source: Path, context: Context) -> str:
        """How the source is prepared (`prepare.HOWS`): ORT's optimizer for a known transformer."""
        return pre_process_for(source, context)

    @property
    def weight_ops(self) -> tuple[str, ...]:
        """The weighted op types it quantizes (what `exclude` may name)."""
        return WEIGHT_OPS if self.op_types == "all" else tuple(self.op_types.split(","))

    def make(self, source: Path, target_dir: Path, context: Context) -> Candidate:
        from onnxruntime.quantization import QuantType, quantize_dynamic

        target = prepare_output(source, target_dir, self.name)
        tied = transposed_weights(onnx.load_model(str(source), load_external_data=False))
        with prepared(source, target.parent, context, how=self.pre_processing(source, context),
                      entry=self.name) as ready:
            quantize_dynamic(
                ready.path,
                target,
                weight_type=getattr(QuantType, self.weight_type),
                per_channel=self.per_channel,
                reduce_range=self.reduce_range,
                op_types_to_quantize=None if self.op_types == "all" else self.op_types.split(","),
                nodes_to_exclude=list(self.exclude),
                # ONNX shape inference cannot type the outputs of the fused com.microsoft ops; without a
                # default the quantizer fails ("Unable to find data type for weight_name=...").
                extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
            )
        graph = onnx.load_model(str(target), load_external_data=False)
        quantized = count_ops(graph, QUANTIZED_OPS)
        lm_head = lm_head_params(graph)
        matmuls = quantized["MatMulInteger"] + quantized["DynamicQuantizeMatMul"]
        notes = [
            f"quantize_dynamic applied to the graph {_PRE_PROCESSED[ready.how]}, not to the source graph",
            f"{matmuls} MatMul weights quantized to int8 ({'per channel' if self.per_channel else 'per tensor'}, "
            f"{self.weight_type} weights)",
        ]
        if self.exclude:
            notes.append(f"{len(self.exclude)} node(s) kept in fp32: {', '.join(self.exclude)}")
        if tied:
            notes.append(f"{tied} MatMul weight(s) the source reads through a Transpose (e.g. an lm_head tied to the "
                         f"embedding) are plain initializers after pre-processing, so they are quantized too")
        if lm_head:
            notes.append(f"lm_head (the product that makes the logits) runs in {lm_head['quantization.lm_head']}")
        return Candidate(
            path=target,
            applied=matmuls > 0,
            fusions=ready.fusions,
            fully_optimized=ready.fully_optimized,
            precision="int8",
            notes=tuple(notes),
            params={
                **ready.params,
                "quantization.method": "dynamic",
                "quantization.quantized_matmuls": str(matmuls),
                **lm_head,
            },
        )


def transposed_weights(model: onnx.ModelProto) -> int:
    """How many MatMul/Gemm nodes read their weight (input 1) through a Transpose of an initializer."""
    count, read = 0, ir_model(model)
    for node in read.graph if read is not None else ():  # a graph onnx-ir cannot read (a ZipMap) has no tied lm_head
        if node.op_type not in ("MatMul", "Gemm") or len(node.inputs) < 2 or node.inputs[1] is None:
            continue
        weight = node.inputs[1].producer()
        source = weight.inputs[0] if weight is not None and weight.op_type == "Transpose" else None
        count += source is not None and source.is_initializer()
    return count


ENTRY = Int8Dynamic()
