"""One optimization attempt: what it is, how it is measured, and everything measured about it."""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import pandas as pd

from tracker.base.model_io import load_model
from tracker.base.steps import StepTimes
from tracker.base.vocabulary import Verdict
from tracker.measure.accuracy.lm_diff import LogitsDiff
from tracker.measure.accuracy.output_diff import FP32, OutputDiff
from tracker.measure.accuracy.task_diff import ClassificationDiff, EmbeddingDiff, RegressionDiff, TaskTolerance
from tracker.measure.accuracy.text_quality import CheckedOnText
from tracker.measure.costmodel.roofline import Roofline
from tracker.measure.graph_stats import GraphStats, diff_graphs
from tracker.measure.inputs.feeds_description import FeedsDescription
from tracker.measure.runtimes.ort_runtime import SessionConfig
from tracker.measure.runtimes.runtime import get_runtime
from tracker.measure.timing.latency import Latency, TimingConfig
from tracker.measure.timing.speedup import Speedup, SpeedupConfig
from tracker.profile import aggregate
from tracker.profile.parse import Profile

logger = logging.getLogger(__name__)

TRACE_LEVELS = (1, 2, 3, 4)


# `+` joins the steps of a chain (`attention_fused+int8_dynamic`).
MAX_ATTEMPT_NAME_LENGTH = 100
_NAME = re.compile(rf"[A-Za-z0-9_][A-Za-z0-9_.+-]{{0,{MAX_ATTEMPT_NAME_LENGTH - 1}}}")


def check_name(kind: str, name: str) -> None:
    """Study and attempt names become run names, tags and folder names: keep them to a safe alphabet.

    Raises:
        ValueError: anything else (a path separator, "..", spaces, an empty name).
    """
    if not isinstance(name, str) or not _NAME.fullmatch(name) or ".." in name:
        raise ValueError(
            f"{kind} name must be 1-100 letters, digits, '_', '-', '+' or '.' (not starting with '.', '+' or '-', "
            f"no '..'), got {name!r}"
        )


@dataclass(frozen=True)
class MeasureConfig:
    """How every attempt of a study is measured.

    Attributes:
        profile_runs: runs of the profiled session (the first is a warm-up).
        skip_runs: leading profiled runs left out of the per-op aggregates.
        timing: the unprofiled latency loop (the attempt's own session settings).
        speedup: the interleaved timing against the baseline.
        trace_levels: ReferenceEvaluator verbose levels logged as text (reference runtime only).
    """

    profile_runs: int = 20
    skip_runs: int = 1
    timing: TimingConfig = field(default_factory=TimingConfig)
    speedup: SpeedupConfig = field(default_factory=SpeedupConfig)
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
            **self.speedup.params(),
        }


@dataclass(frozen=True)
class Attempt:
    """An optimization attempt: a model and how to run it.

    Attributes:
        name: short, stable name (the run name and `tracker.attempt` tag), e.g. "ort_opt_basic".
        model: the model, in memory or as a path (large models stay on disk).
        runtime: the name of its runtime in `tracker.measure.runtimes.runtime.RUNTIMES`: "onnxruntime" or
            "reference" (onnx.reference.ReferenceEvaluator).
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
    tolerance: TaskTolerance = FP32
    description: str = ""
    params: Mapping[str, str] = field(default_factory=dict)
    metrics: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_name("attempt", self.name)
        get_runtime(self.runtime).check(self)
        if not isinstance(self.model, onnx.ModelProto):
            object.__setattr__(self, "model", Path(self.model))

    def load(self, *, external_data: bool = True) -> onnx.ModelProto:
        """The model in memory (a path is loaded and checked; its weights only if `external_data`)."""
        if isinstance(self.model, onnx.ModelProto):
            return self.model
        return load_model(self.model, load_external_data=external_data)

    def size_bytes(self, loaded: onnx.ModelProto | None = None) -> int:
        """Size of the model: file plus external data files, or the serialized in-memory proto.

        Args:
            loaded: the model as already loaded from its path, to spare reading it again.
        """
        if isinstance(self.model, onnx.ModelProto):
            return int(self.model.ByteSize())
        model = loaded if loaded is not None else load_model(self.model, load_external_data=False, check=False)
        locations = {e.value for t in model.graph.initializer for e in t.external_data if e.key == "location"}
        folder = self.model.parent
        return self.model.stat().st_size + sum((folder / loc).stat().st_size for loc in locations)


@dataclass(frozen=True)
class Logged:
    """Where an attempt's record went, apart from what was measured: a run, or the outbox (with the reason when
    the store refused it)."""

    run_id: str | None = None
    outbox: Path | None = None
    refused: str | None = None


@dataclass(frozen=True)
class AttemptResult:
    """Everything measured about one attempt (`tracker.measure.measurement.measure_attempt` makes it); `error` is set
    when the attempt failed, `logged` once its record went to the store or the outbox. Frozen: what adds to it
    (the pipeline's checks, the store) makes a new one with `dataclasses.replace`.

    `session_create_ms`, `first_run_ms` and `session_bytes` are those of the session the latency loop
    times (not of the profiled or interleaved ones). `session_bytes` is the growth of this process's
    resident memory from just before that session (or evaluator) is made to just after its first run,
    less the outputs of that run (`tracker.base.memory.rss_growth`).
    """

    attempt: Attempt
    graph: GraphStats | None = None
    feeds: FeedsDescription | None = None
    session_create_ms: float | None = None
    first_run_ms: float | None = None
    session_bytes: int | None = None
    latency: Latency | None = None
    profiled_latency: Latency | None = None
    profile_path: Path | None = None
    profile: Profile | None = None
    roofline: Roofline | None = None  # the profile's kernels against the machine's roofs
    phase_rooflines: dict[str, Roofline] = field(default_factory=dict)  # other scenarios' (prefill, decode), by phase
    optimized_model_path: Path | None = None
    outputs: list[np.ndarray] = field(default_factory=list)
    diff: OutputDiff | LogitsDiff | CheckedOnText | RegressionDiff | ClassificationDiff | EmbeddingDiff | None = None
    traces: dict[int, str] = field(default_factory=dict)
    latencies: dict[str, Latency] = field(default_factory=dict)  # extra feeds sets, by label
    speedup: Speedup | None = None  # vs the same runtime's baseline, timed interleaved
    verdict: Verdict | None = None  # decided by tracker.measure.timing.speedup.judge
    ort_loadable: bool = True  # False for a custom-domain op ONNX Runtime does not know
    steps: StepTimes = field(default_factory=StepTimes)
    cpu_load: dict[str, float] = field(default_factory=dict)  # other processes' share of the CPU, by step
    disturbed_steps: list[str] = field(default_factory=list)  # steps that stayed disturbed after a retry
    extra_metrics: dict[str, float] = field(default_factory=dict)  # the task's (`evaluate`), other scenarios' (gen.*)
    error: str | None = None
    logged: Logged | None = None  # where its record went, once the pipeline logged it

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def run_id(self) -> str | None:
        return self.logged.run_id if self.logged is not None else None

    @property
    def outbox(self) -> Path | None:
        """Where the record was kept when it could not be logged."""
        return self.logged.outbox if self.logged is not None else None

    @property
    def refused(self) -> str | None:
        """Why the tracking store refused the run (not an outage), when it did."""
        return self.logged.refused if self.logged is not None else None

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
