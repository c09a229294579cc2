"""The one registry of optimization attempts, of every kind: session settings, tool transforms, hand-written fusions.

Each entry is an `Entry` in a module of its own (two levels of one tool share one): what it applies to and
how it makes a `Candidate` from a source model file. Adding one is a new module plus one line below; the
common test (`tests/optimize/test_registry.py`) then runs it on a small model it applies to. A study runs an
entry with `Study.optimize(name, source, ...)`. The baseline (the source model) is not an entry.
"""

from __future__ import annotations

from pathlib import Path

import onnx

from tracker.optimize import add_eyelike, attention_fusion, fp16, int8, ort_optimizer, session_levels
from tracker.optimize import int4, int8_static, session_options
from tracker.optimize.base import KINDS, Candidate, Context, Entry, ModelInfo

REGISTRY: dict[str, Entry] = {
    entry.name: entry
    for entry in (
        session_levels.DISABLED,
        session_levels.ENABLED,
        session_options.THREADS_1,
        session_options.PARALLEL,
        ort_optimizer.BASIC,
        fp16.ENTRY,
        ort_optimizer.EXTENDED,
        attention_fusion.ENTRY,
        int8.ENTRY,
        int8_static.MINMAX,
        int8_static.PERCENTILE,
        int4.BLOCK32,
        int4.BLOCK128,
        add_eyelike.ENTRY,
    )
}


def get_entry(name: str) -> Entry:
    """The registered entry `name`.

    Raises:
        ValueError: `name` is not registered (the message lists those that are).
    """
    if name not in REGISTRY:
        raise ValueError(f"unknown optimization {name!r}; registered: {', '.join(REGISTRY)}")
    return REGISTRY[name]


def apply(name: str, source: Path, target_dir: Path, context: Context | None = None) -> Candidate:
    """Runs the registered entry `name` on the model file `source`, writing under `target_dir`.

    Raises:
        ValueError: `name` is not registered, or the entry needs what `context` lacks.
    """
    return get_entry(name).make(Path(source), Path(target_dir), context or Context())


def applicable(model: onnx.ModelProto, context: Context) -> dict[str, str | None]:
    """Every entry, with None where it applies to `model` under `context` and the reason where it does not."""
    return {name: entry.why_not(model, context) for name, entry in REGISTRY.items()}


__all__ = ["KINDS", "REGISTRY", "Candidate", "Context", "Entry", "ModelInfo", "applicable", "apply", "get_entry"]
