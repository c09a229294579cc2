"""fp16: ORT's basic optimizations and fusions, then weights and compute in float16 (inputs/outputs stay fp32)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from tracker.base.vocabulary import Kind
from tracker.optimize.base import Candidate, Context, ort_transformer
from tracker.optimize.entry import FunctionEntry
from tracker.optimize.model_files import prepare_output
from tracker.optimize.ort_optimizer import BASIC_OPT_LEVEL, fusion_notes, optimizer_params, save_optimized

if TYPE_CHECKING:
    from onnxruntime.transformers.onnx_model import OnnxModel

_FP16_NOTES = (
    "fp16 weights and compute after ORT opt_level 1; inputs and outputs kept fp32 (keep_io_types)",
    "the CPU provider has few fp16 kernels: ORT inserts Casts around the others at session time",
)


def _to_fp16(optimized: OnnxModel) -> None:
    # Symbolic shape inference (the default) types the com.microsoft ops the fusions just added;
    # ONNX's own shape inference does not know them.
    optimized.convert_float_to_float16(use_symbolic_shape_infer=True, keep_io_types=True)


def ort_opt_fp16(source: Path, target_dir: Path, context: Context) -> Candidate:
    """`ort_opt_basic`, then `OnnxModel.convert_float_to_float16(keep_io_types=True)`.

    `keep_io_types` adds a Cast after each float input and before each float output, so the feeds
    and the logits' dtype are those of the fp32 model and the two can be compared directly.
    """
    info = context.require_info("ort_opt_fp16", source)
    target = prepare_output(source, target_dir, "ort_opt_fp16")
    fusions, fully = save_optimized(source, target, info, opt_level=BASIC_OPT_LEVEL, then=_to_fp16)
    return Candidate(
        path=target,
        applied=True,
        fusions=fusions,
        fully_optimized=fully,
        precision="fp16",
        notes=(*_FP16_NOTES, *fusion_notes(fusions, info)),
        params={**optimizer_params(info, BASIC_OPT_LEVEL, context), "fp16.keep_io_types": "true"},
    )


ENTRY = FunctionEntry("ort_opt_fp16", Kind.TRANSFORM, "ORT's optimizer at opt_level 1, then float16 weights and compute",
              ort_opt_fp16, ort_transformer, inserts_ops=True)
