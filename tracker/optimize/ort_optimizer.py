"""ONNX Runtime's transformer optimizer (`onnxruntime.transformers.optimizer.optimize_model`) at two levels."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from tracker.base.vocabulary import Kind
from tracker.optimize.base import Candidate, Context, ModelInfo, info_source, ort_fused_counts, ort_transformer
from tracker.optimize.entry import FunctionEntry
from tracker.optimize.model_files import needs_external_data, prepare_output

if TYPE_CHECKING:
    from onnxruntime.transformers.onnx_model import OnnxModel

logger = logging.getLogger(__name__)

BASIC_OPT_LEVEL = 1
# Level 2 (ORT_ENABLE_EXTENDED) rather than 99 (ORT_ENABLE_ALL): 99 only adds layout transforms (NCHWc,
# meant for Conv) that ORT itself flags as specific to the machine that saved the graph; on GPT-2 they
# change nothing, and a file logged as an artifact should load on any CPU. The extended fusions ORT
# saves are com.microsoft ops that the CPU (and CUDA) provider run.
# Measured on GPT-2 (tiny and small, ORT 1.32): levels 2 and 99 save the same graph as level 1 (node names
# aside), because at level > 1 optimize_model disables the session fusions that would differ
# (MatMulScale, MatMulAdd, MatmulTranspose, GemmActivation, BiasSoftmax) and its Python fusions do the rest.
EXTENDED_OPT_LEVEL = 2
_EXTENDED_NOTE = (
    "opt_level 2 (not 99: layout transforms are machine-specific and do nothing here); optimize_model "
    "disables the extended fusions that differ from level 1 (MatMulAdd, MatMulScale, ...), so the graph "
    "is expected to equal ort_opt_basic's"
)


def run_ort_optimizer(source: Path, info: ModelInfo, *, opt_level: int):
    """Runs ORT's session-time optimizations at `opt_level`, then its Python fusions for `info.model_type`.

    The source file is only read (ORT opens it by path, so its external data is found beside it).
    `info` must be complete (`Context.require_info` fills in a model type read from the graph).
    Note: `optimize_model` imports torch when `opt_level >= 1` (to look at `torch.version`).

    Returns:
        The optimizer's `OnnxModel` (weights in memory).
    """
    from onnxruntime.transformers.optimizer import optimize_model

    if info.model_type is None:
        raise ValueError("run_ort_optimizer needs info.model_type (Context.require_info fills it in)")
    return optimize_model(
        str(source),
        model_type=info.model_type,
        num_heads=info.num_heads,
        hidden_size=info.hidden_size,
        opt_level=opt_level,
    )


def optimizer_params(info: ModelInfo, opt_level: int, context: Context) -> dict[str, str]:
    """What the optimizer was told, and where `info` came from (`info_source`)."""
    return {
        "optimizer.tool": "onnxruntime.transformers.optimizer",
        "optimizer.opt_level": str(opt_level),
        "optimizer.model_type": str(info.model_type),
        "optimizer.num_heads": str(info.num_heads),
        "optimizer.hidden_size": str(info.hidden_size),
        "optimizer.info_source": info_source(context),
    }


def fusion_notes(fusions: dict[str, int], info: ModelInfo) -> tuple[str, ...]:
    """What a reader of ORT's fusions should know: attention left unfused, or a fusion with a condition."""
    notes = []
    if not sum(fusions.get(op, 0) for op in ("Attention", "MultiHeadAttention")):
        # Measured (ORT 1.32, transformers 5.x): neither the gpt2 nor the bert fusion matches dynamo exports nor
        # TorchScript exports of sdpa attention; the bert one does match TorchScript exports of eager attention.
        notes.append(f"attention not fused by ORT's {info.model_type} optimizer (its attention patterns do not "
                     "match this graph)")
    if fusions.get("EmbedLayerNormalization", 0):
        # Its mask_index output is each row's count of ones: measured on a tiny BERT, right-padded masks match
        # within 1e-6, left padding or zeros inside a sequence change the outputs by ~1e-2.
        notes.append("EmbedLayerNormalization reads attention_mask as sequence lengths: outputs are right only "
                     "for right-padded masks (no zeros before the last one in a row)")
    return tuple(notes)


def save_optimized(
    source: Path, target: Path, info: ModelInfo, *, opt_level: int, then: Callable[[OnnxModel], object] | None = None
) -> tuple[dict[str, int], bool]:
    """Runs ORT's optimizer on `source` (`run_ort_optimizer`), then `then` on the `OnnxModel` it made, and saves
    that model to `target`.

    Returns:
        What ORT fused (op type -> count) and its own verdict on whether the graph is fully optimized, both
        read before `then`.
    """
    optimized = run_ort_optimizer(source, info, opt_level=opt_level)
    fusions = ort_fused_counts(optimized.get_fused_operator_statistics())
    fully = bool(optimized.is_fully_optimized(fusions))
    if then is not None:
        then(optimized)
    # One file unless protobuf's 2 GB forbids it (GPT-2 small is ~500 MB): simpler to log and to load.
    optimized.save_model_to_file(str(target), use_external_data_format=needs_external_data(optimized.model))
    return fusions, fully


def _ort_optimized(
    source: Path, target_dir: Path, context: Context, *, name: str, opt_level: int, notes: tuple[str, ...] = ()
) -> Candidate:
    info = context.require_info(name, source)
    target = prepare_output(source, target_dir, name)
    fusions, fully = save_optimized(source, target, info, opt_level=opt_level)
    logger.info("%s: %s", name, {k: v for k, v in fusions.items() if v})
    return Candidate(
        path=target,
        applied=any(fusions.values()),
        fusions=fusions,
        fully_optimized=fully,
        precision="fp32",
        notes=(*notes, *fusion_notes(fusions, info)),
        params=optimizer_params(info, opt_level, context),
    )


def ort_opt_basic(source: Path, target_dir: Path, context: Context) -> Candidate:
    """ORT basic graph optimizations (constant folding, redundant nodes) plus ORT's Python fusions."""
    return _ort_optimized(source, target_dir, context, name="ort_opt_basic", opt_level=BASIC_OPT_LEVEL)


def ort_opt_extended(source: Path, target_dir: Path, context: Context) -> Candidate:
    """ORT extended graph optimizations (CPU/CUDA fusions) plus ORT's Python fusions."""
    return _ort_optimized(
        source, target_dir, context, name="ort_opt_extended", opt_level=EXTENDED_OPT_LEVEL, notes=(_EXTENDED_NOTE,)
    )


# Two levels of one tool, so one module.
BASIC = FunctionEntry("ort_opt_basic", Kind.TRANSFORM, "ORT's transformer optimizer at opt_level 1, saved as a new model",
              ort_opt_basic, ort_transformer)
EXTENDED = FunctionEntry("ort_opt_extended", Kind.TRANSFORM,
                         "ORT's transformer optimizer at opt_level 2, saved as a new model",
                 ort_opt_extended, ort_transformer)
