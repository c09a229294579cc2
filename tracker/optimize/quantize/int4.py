"""int4 weight-only quantization: MatMul weights in blocks of 4-bit integers with a float scale each, run by
ORT's `MatMulNBits` (`onnxruntime.quantization.matmul_nbits_quantizer.MatMulNBitsQuantizer`)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import onnx

from tracker.base.vocabulary import Kind
from tracker.optimize.base import Candidate, Context, count_ops, float_weights, has_matmul_weights
from tracker.optimize.entry import Entry, knob
from tracker.optimize.model_files import prepare_output, save_proto
from tracker.optimize.quantize.flatten import fold_flattening_reshapes
from tracker.optimize.quantize.lm_head import lm_head_params, untie_fused_products
from tracker.optimize.quantize.prepare import model_bytes, prepared

# MatMulNBits' accuracy_level 4 computes with int8 activations (quantized per block inside the kernel)
# instead of float32: on GPT-2 small (seq 32, 2 cores) it is 1.47x faster than the baseline where the
# default level is 0.98x, with the same logits difference (FACTS.md, "int4 weight-only on GPT-2").
ACCURACY_LEVEL = 4


@contextlib.contextmanager
def _quiet_quantizer() -> Iterator[None]:
    """The first import of `matmul_nbits_quantizer` calls `logging.basicConfig(level=INFO)`, which would print
    every INFO record of the process to stderr: the root logger is put back as it was. The quantizer's own
    logger (an INFO line per node) is set to WARNING while it runs."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    quantizer_logger = logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer")
    quantizer_level = quantizer_logger.level
    try:
        import onnxruntime.quantization.matmul_nbits_quantizer  # noqa: F401  (its import configures logging)
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
    quantizer_logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        quantizer_logger.setLevel(quantizer_level)


@dataclass(frozen=True)
class Int4(Entry):
    """int4 weight-only MatMul weights (`MatMulNBits`), on the source pre-processed once (`quant_pre_process`,
    without shape inference), with plain Gemms rewritten as MatMul + Add so their weights can be quantized, and
    the Reshapes that only flattened a product's input for its Gemm folded away (`flatten`).

    Knobs: `block_size` (weights per scale), `accuracy_level` (4: int8 compute inside the kernel; 0: fp32),
    `symmetric` (no zero point), `exclude` (nodes of the pre-processed graph left in fp32).
    """

    name: str = "int4_block32"
    block_size: int = knob(32, (16, 32, 64, 128), search=(32, 128), short="b")
    accuracy_level: int = knob(ACCURACY_LEVEL, (0, 1, 2, 3, 4), search=(0, 4), short="acc")
    symmetric: bool = knob(True, (False, True), short="sym")
    exclude: tuple[str, ...] = knob((), None, search=((),), short="fp32", key="nodes_to_exclude")

    kind = Kind.QUANTIZATION

    @property
    def summary(self) -> str:
        return (f"int4 weight-only MatMul weights (MatMulNBits, {'symmetric ' if self.symmetric else ''}blocks of "
                f"{self.block_size}, {'int8' if self.accuracy_level == 4 else f'level {self.accuracy_level}'} "
                "compute)")

    def __post_init__(self) -> None:
        self.check_knobs()

    def requires(self, model: onnx.ModelProto, context: Context) -> str | None:
        return has_matmul_weights(model, context)

    def pre_processing(self, source: Path, context: Context) -> str:
        """How the source is prepared (`prepare.HOWS`): `quant_pre_process` without shape inference."""
        return "quant_pre_process"

    # MatMulNBits takes MatMul weights; plain Gemms are rewritten as MatMul + Add first (what `exclude` may name).
    weight_ops = ("MatMul", "Gemm")

    def make(self, source: Path, target_dir: Path, context: Context) -> Candidate:
        from onnxruntime.quantization.onnx_model import ONNXModel

        target = prepare_output(source, target_dir, self.name)
        source_bytes = model_bytes(source)
        with prepared(source, target.parent, context, how=self.pre_processing(source, context),
                      entry=self.name) as ready:
            model = onnx.load_model(str(ready.path), load_external_data=True)
        gemms = count_ops(model, ("Gemm",))["Gemm"]
        # The quantizer takes MatMul only, and torch exports most linear layers as Gemm: ORT's own rewrite
        # (the one quantize_dynamic uses) makes each plain Gemm a MatMul + Add, transposing a transB weight.
        untied = untie_fused_products(model)
        wrapped = ONNXModel(model)
        wrapped.replace_gemm_with_matmul()
        rewritten = gemms - count_ops(wrapped.model, ("Gemm",))["Gemm"]
        with _quiet_quantizer():
            from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

            quantizer = MatMulNBitsQuantizer(
                wrapped.model, bits=4, block_size=self.block_size, is_symmetric=self.symmetric,
                accuracy_level=self.accuracy_level, nodes_to_exclude=list(self.exclude),
            )
            quantizer.process()
        quantized_model = quantizer.model.model
        folded = fold_flattening_reshapes(quantized_model)
        save_proto(quantized_model, target)

        nbits = [node for node in quantized_model.graph.node if node.op_type == "MatMulNBits"]
        k_of = [next(a.i for a in node.attribute if a.name == "K") for node in nbits]
        left = len(float_weights(quantized_model, ("MatMul", "Gemm")))
        target_bytes = model_bytes(target)
        notes = [
            "pre-processed with ORT's basic graph optimizations (quant_pre_process: constant folding makes "
            "weights behind a Transpose, such as a tied lm_head, initializers the quantizer takes)",
            f"{rewritten} of {gemms} Gemm rewritten as MatMul + Add so their weights can be quantized",
            f"{len(nbits)} MatMul weights quantized to int4 ({'symmetric' if self.symmetric else 'asymmetric'}, "
            f"block_size {self.block_size}, accuracy_level {self.accuracy_level}); {left} MatMul/Gemm float weights "
            "left",
            f"model size {source_bytes / 1e6:.2f} MB -> {target_bytes / 1e6:.2f} MB "
            f"({source_bytes / max(target_bytes, 1):.2f}x smaller)",
        ]
        if folded:
            notes.append(f"{folded} MatMulNBits read their input unflattened: the Reshapes around them (and what "
                         "computed their shapes) dropped")
        if untied:
            notes.append(f"{untied} FusedMatMul with a transposed weight (a tied lm_head, fused) rewritten as MatMul on "
                         "an untied copy of the weight, so it is quantized too")
        if self.exclude:
            notes.append(f"{len(self.exclude)} node(s) kept in fp32: {', '.join(self.exclude)}")
        padded = sum(1 for k in k_of if k % self.block_size)
        if padded:
            notes.append(f"{padded} of them have K not a multiple of {self.block_size}: their last block is "
                         "zero-padded")
        lm_head = lm_head_params(quantized_model)
        if lm_head:
            notes.append(f"lm_head (the product that makes the logits) runs in {lm_head['quantization.lm_head']}")
        if not nbits:
            notes.append("nothing was quantized: the model runs as float, with ORT's basic optimizations")
        return Candidate(
            path=target,
            applied=bool(nbits),
            fusions={"MatMulNBits": len(nbits)},
            fully_optimized=None,
            precision="int4",
            notes=tuple(notes),
            params={
                "quantization.method": "weight_only",
                "quantization.bits": "4",
                "quantization.quantized_matmuls": str(len(nbits)),
                **lm_head,
            },
        )


BLOCK32 = Int4()
BLOCK128 = Int4(name="int4_block128", block_size=128)
