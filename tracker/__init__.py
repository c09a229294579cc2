"""Make ONNX model optimization measurable: every attempt becomes an MLflow run you can compare."""

from tracker.base.lazy import lazy_exports

# Public names (what the docs' examples import), by the module that defines them, imported on first use so that
# `tracker summarize` does not pay for importing MLflow.
__all__, __getattr__ = lazy_exports(__name__, {
    "tracker.api": ("Study", "StudySetup", "GenerationScenario", "log_attempt"),
    "tracker.base.vocabulary": ("Verdict", "Status", "Phase"),
    "tracker.measure.attempt": ("Attempt", "AttemptResult", "MeasureConfig"),
    "tracker.outcome": ("Measured", "Failed", "Pending"),
    "tracker.measure.timing.latency": ("TimingConfig",),
    "tracker.measure.runtimes.ort_runtime": ("SessionConfig",),
    "tracker.search.result": ("SearchConfig",),
    "tracker.optimize": ("ModelInfo",),
    # A task's tolerance per precision (`study.search(..., tolerance=tracker.tolerances("embedding"))`).
    "tracker.measure.accuracy.task_diff": ("tolerances=task_tolerances",),
    "tracker.measure.accuracy.output_diff": ("Tolerance", "EXACT", "FP32", "FP16", "INT8", "compare_outputs"),
    "tracker.profile.parse": ("parse_profile",),
    "tracker.profile.aggregate": ("summarize", "diff_summaries"),
})
