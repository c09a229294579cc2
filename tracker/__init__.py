"""Make ONNX model optimization measurable: every attempt becomes an MLflow run you can compare."""

from importlib import import_module

# Public names and their modules, imported on first use so `tracker summarize` does not pay for
# importing MLflow.
_EXPORTS = {
    "Study": "tracker.api",
    "log_attempt": "tracker.api",
    "Attempt": "tracker.measure.attempt",
    "AttemptResult": "tracker.measure.attempt",
    "MeasureConfig": "tracker.measure.attempt",
    "TimingConfig": "tracker.measure.latency",
    "SessionConfig": "tracker.measure.ort_runtime",
    "Tolerance": "tracker.measure.output_diff",
    "EXACT": "tracker.measure.output_diff",
    "FP32": "tracker.measure.output_diff",
    "FP16": "tracker.measure.output_diff",
    "INT8": "tracker.measure.output_diff",
    "parse_profile": "tracker.profile.parse",
    "summarize": "tracker.profile.aggregate",
    "diff_summaries": "tracker.profile.aggregate",
    "compare_outputs": "tracker.measure.output_diff",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'tracker' has no attribute {name!r}")
    return getattr(import_module(_EXPORTS[name]), name)
