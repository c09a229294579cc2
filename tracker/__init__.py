"""Make ONNX model optimization measurable: every attempt becomes an MLflow run you can compare."""

from tracker.base.lazy import lazy_getattr

# Public names (what the docs' examples import) and their modules, imported on first use so `tracker summarize` does
# not pay for importing MLflow. `module:attribute` where the public name is not the module's.
_EXPORTS = {
    "Study": "tracker.api",
    "StudySetup": "tracker.api",
    "GenerationScenario": "tracker.api",
    "log_attempt": "tracker.api",
    "Verdict": "tracker.base.vocabulary",
    "Status": "tracker.base.vocabulary",
    "Phase": "tracker.base.vocabulary",
    "Attempt": "tracker.measure.attempt",
    "AttemptResult": "tracker.measure.attempt",
    "MeasureConfig": "tracker.measure.attempt",
    "Measured": "tracker.outcome",
    "Failed": "tracker.outcome",
    "Pending": "tracker.outcome",
    "TimingConfig": "tracker.measure.timing.latency",
    "SessionConfig": "tracker.measure.runtimes.ort_runtime",
    "SearchConfig": "tracker.search.result",
    "ModelInfo": "tracker.optimize",
    # A task's tolerance per precision (`study.search(..., tolerance=tracker.tolerances("embedding"))`).
    "tolerances": "tracker.measure.accuracy.task_diff:task_tolerances",
    "Tolerance": "tracker.measure.accuracy.output_diff",
    "EXACT": "tracker.measure.accuracy.output_diff",
    "FP32": "tracker.measure.accuracy.output_diff",
    "FP16": "tracker.measure.accuracy.output_diff",
    "INT8": "tracker.measure.accuracy.output_diff",
    "parse_profile": "tracker.profile.parse",
    "summarize": "tracker.profile.aggregate",
    "diff_summaries": "tracker.profile.aggregate",
    "compare_outputs": "tracker.measure.accuracy.output_diff",
}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_getattr(__name__, _EXPORTS)
