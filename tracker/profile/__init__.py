"""Reads ONNX Runtime profiles into a kernel-invocation table and aggregates it; no MLflow, no onnxruntime."""

from tracker.base.lazy import lazy_getattr

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

__getattr__ = lazy_getattr(__name__, _EXPORTS)
