"""int4 weight-only quantization: MatMul weights in blocks of 4-bit integers with a float scale each, run by
ORT's `MatMulNBits` (`onnxruntime.quantization.matmul_nbits_quantizer.MatMulNBitsQuantizer`)."""

from __future__ import annotations

import contextlib
import logging
import tempfile
from collections.abc import Iterator
from pathlib import Path

import onnx

from tracker.optimize.base import (
    Candidate,
    Context,
    Entry,
    count_ops,
    float_weights,
    has_matmul_weights,
    prepare_output,
    save_proto,
)
from tracker.optimize.int8_static import LARGE_MODEL_BYTES, model_bytes, pre_process

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


def _quantize_with_block(block_size: int):
    name = f"int4_block{block_size}"

    def make(source: Path, target_dir: Path, context: Context) -> Candidate:
        from onnxruntime.quantization.onnx_model import ONNXModel

        target = prepare_output(source, target_dir, name)
        source_bytes = model_bytes(source)
        # The pre-processed model is an intermediate: it lives and dies in a folder under target_dir.
        with tempfile.TemporaryDirectory(dir=target.parent, prefix=f"{name}.") as work:
            prepared = Path(work) / "pre_processed.onnx"
            pre_process(source, prepared, shape_inference=False, large=source_bytes >= LARGE_MODEL_BYTES)
            model = onnx.load_model(str(prepared), load_external_data=True)
        gemms = count_ops(model, ("Gemm",))["Gemm"]
        # The quantizer takes MatMul only, and torch exports most linear layers as Gemm: ORT's own rewrite
        # (the one quantize_dynamic uses) makes each plain Gemm a MatMul + Add, transposing a transB weight.
        wrapped = ONNXModel(model)
        wrapped.replace_gemm_with_matmul()
        rewritten = gemms - count_ops(wrapped.model, ("Gemm",))["Gemm"]
        with _quiet_quantizer():
            from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

            quantizer = MatMulNBitsQuantizer(
                wrapped.model, bits=4, block_size=block_size, is_symmetric=True, accuracy_level=ACCURACY_LEVEL
            )
            quantizer.process()
        quantized_model = quantizer.model.model
        save_proto(quantized_model, target)

        nbits = [node for node in quantized_model.graph.node if node.op_type == "MatMulNBits"]
        k_of = [next(a.i for a in node.attribute if a.name == "K") for node in nbits]
        left = len(float_weights(quantized_model, ("MatMul", "Gemm")))
        target_bytes = model_bytes(target)
        notes = [
            "pre-processed with ORT's basic graph optimizations (quant_pre_process: constant folding makes "
            "weights behind a Transpose, such as a tied lm_head, initializers the quantizer takes)",
            f"{rewritten} of {gemms} Gemm rewritten as MatMul + Add so their weights can be quantized",
            f"{len(nbits)} MatMul weights quantized to int4 (symmetric, block_size {block_size}, "
            f"accuracy_level {ACCURACY_LEVEL}); {left} MatMul/Gemm float weights left",
            f"model size {source_bytes / 1e6:.2f} MB -> {target_bytes / 1e6:.2f} MB "
            f"({source_bytes / max(target_bytes, 1):.2f}x smaller)",
        ]
        padded = sum(1 for k in k_of if k % block_size)
        if padded:
            notes.append(f"{padded} of them have K not a multiple of {block_size}: their last block is zero-padded")
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
                "quantization.block_size": str(block_size),
                "quantization.symmetric": "true",
                "quantization.accuracy_level": str(ACCURACY_LEVEL),
                "quantization.quantized_matmuls": str(len(nbits)),
            },
        )

    make.__name__ = name
    make.__doc__ = f"int4 weight-only quantization of the MatMul (and plain Gemm) weights, in blocks of {block_size}."
    return make


BLOCK32 = Entry("int4_block32", "quantization",
                "int4 weight-only MatMul weights (MatMulNBits, symmetric blocks of 32, int8 compute)",
                _quantize_with_block(32), has_matmul_weights)
BLOCK128 = Entry("int4_block128", "quantization",
                 "int4 weight-only MatMul weights (MatMulNBits, symmetric blocks of 128, int8 compute)",
                 _quantize_with_block(128), has_matmul_weights)
