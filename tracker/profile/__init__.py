"""Reads ONNX Runtime profiles into a kernel-invocation table and aggregates it; no MLflow, no onnxruntime."""

from tracker.base.lazy import lazy_exports

# Public names, by the module that defines them, imported on first use: a worker process (`tracker.profile.worker`)
# and `tracker.profile.columns` must not pay for importing pandas.
__all__, __getattr__ = lazy_exports(__name__, {
    "tracker.profile.parse": ("Profile", "ProfileChunk", "parse_profile", "parse_profile_bytes", "iter_profile_chunks"),
    "tracker.profile.aggregate": ("keep_runs", "summarize", "top_n", "diff_summaries"),
})
