"""int8: dynamic quantization of the MatMul weights (`onnxruntime.quantization.quantize_dynamic`, QInt8)."""

from __future__ import annotations

from pathlib import Path

import onnx

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

    Why not the source graph: a weight read through a Transpose (GPT-2's dynamo export ties lm_head to the
    embedding that way) is not an initializer the quantizer can see; ORT's opt_level 1 folds the Transpose
    into a plain (untied) initializer, which is quantized like the others.
    """
    from onnxruntime.quantization import QuantType, quantize_dynamic

    info = context.require_info("int8_dynamic", source)
    target = prepare_output(source, target_dir, "int8_dynamic")
    tied = transposed_weights(onnx.load_model(str(source), load_external_data=False))
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
    notes = [
        f"quantize_dynamic applied to the ORT opt_level {BASIC_OPT_LEVEL} graph (fused), not to the source graph",
        f"{matmuls} MatMul weights quantized to int8",
    ]
    if tied:
        notes.append(f"{tied} MatMul weight(s) the source reads through a Transpose (e.g. an lm_head tied to the "
                     f"embedding) are plain initializers after opt_level {BASIC_OPT_LEVEL}, so they are quantized too")
    return Candidate(
        path=target,
        applied=matmuls > 0,
        fusions=fusions,
        fully_optimized=fully,
        precision="int8",
        notes=tuple(notes),
        params={
            **optimizer_params(info, BASIC_OPT_LEVEL, context),
            "quantization.method": "dynamic",
            "quantization.weight_type": "QInt8",
            "quantization.per_channel": "false",
            "quantization.quantized_matmuls": str(matmuls),
        },
    )


def transposed_weights(model: onnx.ModelProto) -> int:
    """How many MatMul/Gemm nodes read their weight (input 1) through a Transpose of an initializer."""
    initializers = {t.name for t in model.graph.initializer}
    producer = {out: node for node in model.graph.node for out in node.output}
    count = 0
    for node in model.graph.node:
        if node.op_type not in ("MatMul", "Gemm") or len(node.input) < 2:
            continue
        weight = producer.get(node.input[1])
        if weight is not None and weight.op_type == "Transpose" and weight.input[0] in initializers:
            count += 1
    return count


ENTRY = Entry("int8_dynamic", "transform", "ORT's optimizer at opt_level 1, then int8 MatMul weights (dynamic quantization)",
              int8_dynamic, transformer)
