"""int8: dynamic quantization of the MatMul weights (`onnxruntime.quantization.quantize_dynamic`, QInt8)."""

from __future__ import annotations

from pathlib import Path

from tracker.optimize.base import (
    Candidate,
    Context,
    Entry,
    count_ops,
    ort_fused_counts,
    prepare_output,
    transformer,
)
from tracker.optimize.ort_optimizer import BASIC_OPT_LEVEL, optimizer_params, run_ort_optimizer

QUANTIZED_OPS = ("MatMulInteger", "DynamicQuantizeLinear", "DynamicQuantizeMatMul")


def int8_dynamic(source: Path, target_dir: Path, context: Context) -> Candidate:
    """Quantizes the ORT-optimized (opt_level 1) graph: int8 weights, activations quantized per run.

    Why not the source graph: the dynamo export ties lm_head to the embedding through a Transpose, so
    its largest weight (vocab x hidden) is not an initializer the quantizer can see; ORT's opt_level 1
    folds the Transpose into a plain (untied) initializer, which is quantized like the others.
    """
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    info = context.require_info("int8_dynamic")
    target = prepare_output(source, target_dir, "int8_dynamic")
    optimized = run_ort_optimizer(source, info, opt_level=BASIC_OPT_LEVEL)
    fusions = ort_fused_counts(optimized.get_fused_operator_statistics())
    fully = bool(optimized.is_fully_optimized(fusions))
    quantize_dynamic(
        optimized.model,
        target,
        weight_type=QuantType.QInt8,
        # ONNX shape inference cannot type the outputs of the fused com.microsoft ops; without a
        # default the quantizer fails ("Unable to find data type for weight_name=...").
        extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
    )
    quantized = count_ops(onnx.load_model(str(target), load_external_data=False), QUANTIZED_OPS)
    matmuls = quantized["MatMulInteger"] + quantized["DynamicQuantizeMatMul"]
    notes = (
        f"quantize_dynamic applied to the ORT opt_level {BASIC_OPT_LEVEL} graph (fused, lm_head untied), "
        "not to the source graph",
        f"{matmuls} MatMul weights quantized to int8",
    )
    return Candidate(
        path=target,
        applied=matmuls > 0,
        fusions=fusions,
        fully_optimized=fully,
        precision="int8",
        notes=notes,
        params={
            **optimizer_params(info, BASIC_OPT_LEVEL),
            "quantization.method": "dynamic",
            "quantization.weight_type": "QInt8",
            "quantization.per_channel": "false",
            "quantization.quantized_matmuls": str(matmuls),
        },
    )


ENTRY = Entry("int8_dynamic", "transform", "ORT's optimizer at opt_level 1, then int8 MatMul weights (dynamic quantization)",
              int8_dynamic, transformer)
