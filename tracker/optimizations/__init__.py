"""Optimization attempts: model file in, new model file out. The one registry of attempts lives here.

Each attempt is a `Transform`, `(source, target_dir, info) -> Transformed`, in a module of its own; adding
one is a new module plus one line below. The baseline (the source model) is not a transform.
"""

from __future__ import annotations

from pathlib import Path

from tracker.optimizations.attention_fusion import attention_fused
from tracker.optimizations.base import ModelInfo, Transform, Transformed
from tracker.optimizations.fp16 import ort_opt_fp16
from tracker.optimizations.int8 import int8_dynamic
from tracker.optimizations.ort_optimizer import ort_opt_basic, ort_opt_extended

REGISTRY: dict[str, Transform] = {
    "ort_opt_basic": ort_opt_basic,
    "ort_opt_fp16": ort_opt_fp16,
    "ort_opt_extended": ort_opt_extended,
    "attention_fused": attention_fused,
    "int8_dynamic": int8_dynamic,
}


def apply(name: str, source: Path, target_dir: Path, info: ModelInfo) -> Transformed:
    """Runs the registered attempt `name` on the model file `source`, writing under `target_dir`.

    Raises:
        ValueError: `name` is not registered.
    """
    if name not in REGISTRY:
        raise ValueError(f"unknown optimization {name!r}; registered: {', '.join(REGISTRY)}")
    return REGISTRY[name](Path(source), Path(target_dir), info)


__all__ = ["REGISTRY", "ModelInfo", "Transform", "Transformed", "apply"]
