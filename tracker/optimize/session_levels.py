"""ONNX Runtime's session-time graph optimizations switched off or on: the same model file, other settings.

These measure what ORT does when it loads a model. `ort_opt_enabled` sets ORT's default level
(ORT_ENABLE_ALL) explicitly, so against a default-settings baseline it is an A/A comparison: it shows the
noise floor of the speed-up on that model.
"""

from __future__ import annotations

from pathlib import Path

from tracker.optimize.base import Candidate, Context, Entry


def _with_level(level: str, note: str):
    def make(source: Path, target_dir: Path, context: Context) -> Candidate:
        return Candidate(path=Path(source), applied=True, fusions={}, fully_optimized=None, precision="fp32",
                         notes=(note,), session={"graph_optimization_level": level})

    return make


DISABLED = Entry("ort_opt_disabled", "session", "ORT's session graph optimizations off (ORT_DISABLE_ALL)",
                 _with_level("disable", "ORT graph optimizations off (ORT_DISABLE_ALL)"))
ENABLED = Entry("ort_opt_enabled", "session", "ORT's session graph optimizations on (ORT_ENABLE_ALL, the default)",
                _with_level("all", "ORT graph optimizations on (ORT_ENABLE_ALL)"))
