"""Reads ONNX Runtime profiles into a kernel-invocation table and aggregates it; no MLflow, no onnxruntime."""

from importlib import import_module

# Public names and their modules, imported on first use: a worker process (`tracker.profile.worker`) and
# `tracker.profile.columns` must not pay for importing pandas.
_EXPORTS = {
    "Profile": "tracker.profile.parse",
    "ProfileChunk": "tracker.profile.parse",
    "parse_profile": "tracker.profile.parse",
    "parse_profile_bytes": "tracker.profile.parse",
    "iter_profile_chunks": "tracker.profile.parse",
    "keep_runs": "tracker.profile.aggregate",
    "summarize": "tracker.profile.aggregate",
    "top_n": "tracker.profile.aggregate",
    "diff_summaries": "tracker.profile.aggregate",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'tracker.profile' has no attribute {name!r}")
    return getattr(import_module(_EXPORTS[name]), name)
