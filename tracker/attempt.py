"""One optimization attempt: what it is, how it is measured, and everything measured about it."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import pandas as pd

from tracker import aggregate
from tracker import reference_runtime as ref
from tracker.feeds import check_feeds
from tracker.graph_stats import GraphStats, diff_graphs, graph_stats
from tracker.latency import Latency, TimingConfig
from tracker.model_io import load_model
from tracker.ort_runtime import SessionConfig, profile_ort, time_ort
from tracker.output_diff import FP32, OutputDiff, Tolerance
from tracker.lm_diff import LogitsDiff, LogitsTolerance
from tracker.profile_parse import Profile, parse_profile

logger = logging.getLogger(__name__)

RUNTIMES = ("onnxruntime", "reference")
_MAIN = "\0main"  # label of the main feeds among the feeds sets timed in one session
TRACE_LEVELS = (1, 2, 3, 4)


@dataclass(frozen=True)
class MeasureConfig:
    """How every attempt of a study is measured.

    Attributes:
        profile_runs: runs of the profiled session (the first is a warm-up).
        skip_runs: leading profiled runs left out of the per-op aggregates.
        timing: the unprofiled latency loop.
        trace_levels: ReferenceEvaluator verbose levels logged as text (reference runtime only).
    """

    profile_runs: int = 20
    skip_runs: int = 1
    timing: TimingConfig = field(default_factory=TimingConfig)
    trace_levels: tuple[int, ...] = TRACE_LEVELS

    def __post_init__(self) -> None:
        if self.profile_runs < 1:
            raise ValueError(f"profile_runs must be >= 1, got {self.profile_runs}")
        if not 0 <= self.skip_runs < self.profile_runs:
            raise ValueError(
                f"skip_runs must be in [0, profile_runs={self.profile_runs}), got {self.skip_runs}"
            )
        bad = [v for v in self.trace_levels if v not in TRACE_LEVELS]
        if bad:
            raise ValueError(f"trace_levels must be among {TRACE_LEVELS}, got {bad}")

    def params(self) -> dict[str, str]:
        return {
            "measure.profile_runs": str(self.profile_runs),
            "measure.skip_runs": str(self.skip_runs),
            "measure.warmup_runs": str(self.timing.warmup_runs),
            "measure.min_runs": str(self.timing.min_runs),
            "measure.min_seconds": str(self.timing.min_seconds),
        }


@dataclass(frozen=True)
class Attempt:
    """An optimization attempt: a model and how to run it.

    Attributes:
        name: short, stable name (the run name and `tracker.attempt` tag), e.g. "ort_opt_basic".
        model: the model, in memory or as a path (large models stay on disk).
        runtime: "onnxruntime" or "reference" (onnx.reference.ReferenceEvaluator).
        session: ONNX Runtime settings (runtime "onnxruntime").
        new_ops: custom `OpRun` classes (runtime "reference").
        tolerance: tolerances of the prediction-diff check against the baseline.
        description: one line for humans.
        params: extra params saying what the attempt did.
        metrics: extra metrics known before measuring (e.g. fusion counts).
    """

    name: str
    model: onnx.ModelProto | Path
    runtime: str = "onnxruntime"
    session: SessionConfig = field(default_factory=SessionConfig)
    new_ops: tuple[type, ...] = ()
    tolerance: Tolerance | LogitsTolerance = FP32
    description: str = ""
    params: Mapping[str, str] = field(default_factory=dict)
    metrics: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.name or not self.name.replace("_", "").replace("-", "").replace(".", "").isalnum():
            raise ValueError(f"attempt name must be letters, digits, '_', '-' or '.', got {self.name!r}")
        if self.runtime not in RUNTIMES:
            raise ValueError(f"runtime must be one of {RUNTIMES}, got {self.runtime!r}")
        if self.new_ops and self.runtime != "reference":
            raise ValueError("new_ops only apply to runtime='reference'")
        if not isinstance(self.model, onnx.ModelProto):
            object.__setattr__(self, "model", Path(self.model))

    def load(self, *, external_data: bool = True) -> onnx.ModelProto:
        """The model in memory (a path is loaded and checked; its weights only if `external_data`)."""
        if isinstance(self.model, onnx.ModelProto):
            return self.model
        return load_model(self.model, load_external_data=external_data)

    def size_bytes(self) -> int:
        """Size of the model: file plus external data files, or the serialized in-memory proto."""
        if isinstance(self.model, onnx.ModelProto):
            return int(self.model.ByteSize())
        model = onnx.load(str(self.model), load_external_data=False)
        locations = {e.value for t in model.graph.initializer for e in t.external_data if e.key == "location"}
        folder = self.model.parent
        return self.model.stat().st_size + sum((folder / loc).stat().st_size for loc in locations)


@dataclass
class AttemptResult:
    """Everything measured about one attempt; `error` is set when the attempt failed."""

    attempt: Attempt
    graph: GraphStats | None = None
    latency: Latency | None = None
    profiled_latency: Latency | None = None
    profile_path: Path | None = None
    profile: Profile | None = None
    optimized_model_path: Path | None = None
    outputs: list[np.ndarray] = field(default_factory=list)
    diff: OutputDiff | LogitsDiff | None = None
    traces: dict[int, str] = field(default_factory=dict)
    latencies: dict[str, Latency] = field(default_factory=dict)  # extra feeds sets, by label
    extra_metrics: dict[str, float] = field(default_factory=dict)
    error: str | None = None
    run_id: str | None = None
    outbox: Path | None = None  # where the record was kept when it could not be logged

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def events(self) -> pd.DataFrame:
        return self.profile.events if self.profile is not None else pd.DataFrame()

    def summary(self, *, by: aggregate.By = "op", skip_runs: int = 0) -> pd.DataFrame:
        return aggregate.summarize(self.events, by=by, skip_runs=skip_runs)

    @property
    def overhead_ratio(self) -> float | None:
        """Profiled mean / unprofiled mean (warm-up run of the profiled session excluded)."""
        if self.latency is None or self.profiled_latency is None:
            return None
        samples = self.profiled_latency.samples_ms[1:] or self.profiled_latency.samples_ms
        return float(np.mean(samples)) / self.latency.mean_ms


def measure_attempt(
    attempt: Attempt,
    feeds: Mapping[str, np.ndarray],
    *,
    config: MeasureConfig,
    workdir: str | Path,
    baseline_outputs: Sequence[np.ndarray] | None = None,
    evaluate: Callable[[list[np.ndarray]], Mapping[str, float]] | None = None,
    latency_feeds: Mapping[str, Mapping[str, np.ndarray]] | None = None,
) -> AttemptResult:
    """Measures an attempt: graph statistics, latency, profile, outputs and the diff check.

    Args:
        attempt: what to measure.
        feeds: inputs, checked against the model's signature first.
        config: how to measure.
        workdir: where the profile and ORT's optimized graph are written.
        baseline_outputs: outputs to compare against; None for the baseline itself.
        evaluate: optional task metrics from the outputs (e.g. `{"quality.mse": ...}`).
        latency_feeds: more inputs to time (not profiled), by label, e.g. `{"s128": {...}}`.

    Raises:
        FeedError, ModelError: bad input, before anything is timed.
    """
    # ORT reads a path itself: only the reference runtime needs the weights in this process.
    model = attempt.load(external_data=attempt.runtime == "reference")
    latency_feeds = dict(latency_feeds or {})
    for extra in (feeds, *latency_feeds.values()):
        check_feeds(model, extra)
    workdir = Path(workdir)
    result = AttemptResult(attempt=attempt, graph=graph_stats(model, size_bytes=attempt.size_bytes()))
    logger.info("attempt %s: timing (%s)", attempt.name, attempt.runtime)
    if attempt.runtime == "onnxruntime":
        source = attempt.model  # a path keeps large models out of this process's memory twice
        sets = {_MAIN: feeds, **latency_feeds}
        latencies, outputs = time_ort(source, sets, config=attempt.session, timing=config.timing)
        result.latency, result.outputs = latencies.pop(_MAIN), outputs[_MAIN]
        result.latencies = latencies
        logger.info("attempt %s: profiling %d runs", attempt.name, config.profile_runs)
        profiled = profile_ort(source, feeds, config=attempt.session, runs=config.profile_runs, workdir=workdir)
        result.profile_path = profiled.profile_path
        result.optimized_model_path = profiled.optimized_model_path
        result.profiled_latency = profiled.latency
        result.profile = parse_profile(profiled.profile_path)
    else:
        _measure_reference(result, model, feeds, config)
        for label, extra in latency_feeds.items():
            result.latencies[label] = ref.time_reference(model, extra, new_ops=attempt.new_ops, timing=config.timing)
    if baseline_outputs is not None:
        result.diff = attempt.tolerance.compare(baseline_outputs, result.outputs)
    if evaluate is not None:
        result.extra_metrics.update({k: float(v) for k, v in evaluate(result.outputs).items()})
    return result


def _measure_reference(result: AttemptResult, model: onnx.ModelProto, feeds, config: MeasureConfig) -> None:
    attempt = result.attempt
    result.outputs = ref.run_reference(model, feeds, new_ops=attempt.new_ops)
    result.latency = ref.time_reference(model, feeds, new_ops=attempt.new_ops, timing=config.timing)
    result.profile = ref.profile_reference(model, feeds, new_ops=attempt.new_ops, runs=config.profile_runs)
    result.profiled_latency = Latency.from_values(result.profile.runs["dur_us"].to_numpy() * 1e-6)
    for level in config.trace_levels:
        result.traces[level] = ref.trace_reference(model, feeds, new_ops=attempt.new_ops, verbose=level)


def diff_against(result: AttemptResult, baseline: AttemptResult, *, skip_runs: int) -> dict[str, pd.DataFrame]:
    """Per-op time and graph differences of an attempt against a baseline measured the same way."""
    tables = {}
    if result.profile is not None and baseline.profile is not None:
        tables["op_diff"] = aggregate.diff_summaries(
            baseline.summary(skip_runs=skip_runs), result.summary(skip_runs=skip_runs)
        )
    if result.graph is not None and baseline.graph is not None:
        tables["graph_diff"] = diff_graphs(baseline.graph, result.graph)
    return tables
