"""One optimization attempt: what it is, how it is measured, and everything measured about it."""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import numpy as np
import onnx
import pandas as pd

from tracker.base.memory import rss_growth
from tracker.base.model_io import load_model, ort_can_load
from tracker.base.steps import StepTimes
from tracker.base.vocabulary import Verdict
from tracker.measure.accuracy.lm_diff import LogitsDiff
from tracker.measure.accuracy.output_diff import FP32, OutputDiff
from tracker.measure.accuracy.output_values import output_nbytes
from tracker.measure.accuracy.task_diff import ClassificationDiff, EmbeddingDiff, RegressionDiff, TaskTolerance
from tracker.measure.accuracy.text_quality import CheckedOnText
from tracker.measure.costmodel.machine import MachinePeaks
from tracker.measure.costmodel.roofline import Roofline, build_roofline, count_tokens
from tracker.measure.graph_stats import GraphStats, diff_graphs, graph_stats
from tracker.measure.inputs.feed_checks import check_feeds, check_indices
from tracker.measure.inputs.feeds_description import FeedsDescription, describe_feeds
from tracker.measure.runtimes.ort_runtime import SessionConfig
from tracker.measure.runtimes.runtime import get_runtime
from tracker.measure.timing.cpu_load import watch_cpu_load
from tracker.measure.timing.latency import Latency, TimingConfig, time_once, time_runs
from tracker.measure.timing.speedup import MakeRunner, Runner, Speedup, SpeedupConfig, Stop, measure_speedup
from tracker.profile import aggregate
from tracker.profile.parse import Profile, parse_profile

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


@dataclass
class AttemptResult:
    """Everything measured about one attempt; `error` is set when the attempt failed.

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
    run_id: str | None = None
    outbox: Path | None = None  # where the record was kept when it could not be logged
    refused: str | None = None  # why the tracking store refused the run (not an outage), when it did

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
    baseline: Attempt | None = None,
    machine: MachinePeaks | None = None,
) -> AttemptResult:
    """Measures an attempt: graph statistics, latency, speed-up, profile, outputs and the diff check.

    Args:
        attempt: what to measure.
        feeds: inputs, checked against the model's signature first.
        config: how to measure.
        workdir: where the profile and ORT's optimized graph are written.
        baseline_outputs: outputs to compare against; None for the baseline itself.
        evaluate: optional task metrics from the outputs (e.g. `{"quality.mse": ...}`).
        latency_feeds: more inputs to time (not profiled), by label, e.g. `{"s128": {...}}`.
        baseline: the baseline attempt of the same runtime; when given, the two are timed interleaved
            on `feeds` for the speed-up and its confidence interval.
        machine: the machine's roofs (`measure_machine`), for the roofline's share of peak.

    Raises:
        FeedError, ModelError: bad input, before anything is timed.
    """
    runtime = get_runtime(attempt.runtime)
    model = attempt.load(external_data=runtime.needs_weights)
    latency_feeds = dict(latency_feeds or {})
    for extra in (feeds, *latency_feeds.values()):
        check_feeds(model, extra)
        check_indices(model, extra)  # an id outside its table would crash ONNX Runtime mid-measurement
    workdir = Path(workdir)
    result = AttemptResult(attempt=attempt, graph=graph_stats(model, size_bytes=attempt.size_bytes(model)))
    result.ort_loadable = ort_can_load(model)
    result.feeds = describe_feeds(feeds)
    if baseline_outputs is None and result.feeds.nonfinite:  # once, on the baseline: its attempts share the feeds
        logger.warning("attempt %s: its feeds hold %s; where an attempt's outputs and the baseline's are both NaN, "
                       "or the same infinity, they count as equal", attempt.name, result.feeds.nonfinite_text())
    steps = result.steps
    logger.info("attempt %s: timing (%s)", attempt.name, attempt.runtime)
    warm_up(attempt.runtime)
    with rss_growth() as growth:
        with steps.step("session"):
            run, result.session_create_ms = time_once(lambda: runtime.runner(attempt, model))
        with steps.step("latency"):
            result.outputs, result.first_run_ms = time_once(lambda: run(feeds))
    # The outputs are the tracker's (kept for the diff), not the session's.
    result.session_bytes = growth.bytes - sum(output_nbytes(o) for o in result.outputs)
    with steps.step("latency"):
        result.latency = _undisturbed(result, "latency", lambda: time_runs(lambda: run(feeds), config.timing))
        for label, extra in latency_feeds.items():
            logger.info("attempt %s: timing %s", attempt.name, label)
            run(extra)
            result.latencies[label] = time_runs(functools.partial(run, extra), config.timing)
    # free this session before the next ones: a GPT-2 session holds ~1 GB (the ignore: `run` is typed as the
    # runner, and `del run` would confuse linters about the lambdas above that read it)
    run = None  # type: ignore[assignment]
    if baseline is not None:
        logger.info("attempt %s: timing against %s in %d rounds", attempt.name, baseline.name, config.speedup.rounds)
        with steps.step("speedup"):
            result.speedup = time_against(attempt, baseline, feeds, config.speedup, model=model)
        result.cpu_load["speedup"] = result.speedup.other_load
        if result.speedup.disturbed_rounds:
            result.disturbed_steps.append("speedup")
    logger.info("attempt %s: profiling %d runs", attempt.name, config.profile_runs)
    with steps.step("profiling"):
        profiled = _undisturbed(result, "profiling", lambda: runtime.profile(
            attempt, model, feeds, runs=config.profile_runs, workdir=workdir
        ))
    result.profile_path = profiled.profile_path
    result.optimized_model_path = profiled.optimized_model_path
    result.profiled_latency = profiled.latency
    result.profile = profiled.profile
    if result.profile is None:  # the runtime wrote its profile to a file
        assert profiled.profile_path is not None, "a runtime gives its profile or the file it wrote"
        with steps.step("parsing"):
            result.profile = parse_profile(profiled.profile_path)
    with steps.step("parsing"):
        result.roofline = build_roofline(result.events, machine=machine, skip_runs=config.skip_runs,
                                         tokens_per_run=count_tokens(feeds))
    result.traces = runtime.trace(attempt, model, feeds, config.trace_levels)
    if baseline_outputs is not None:
        result.diff = attempt.tolerance.compare(baseline_outputs, result.outputs)
        if result.diff.nonfinite_mismatches:
            logger.warning("attempt %s: %d output values are NaN or infinite where the baseline's are not (or the "
                           "reverse); its accuracy check fails", attempt.name, result.diff.nonfinite_mismatches)
    if evaluate is not None:
        result.extra_metrics.update({k: float(v) for k, v in evaluate(result.outputs).items()})
    return result


def time_against(
    attempt: Attempt,
    baseline: Attempt,
    feeds: Mapping[str, np.ndarray],
    config: SpeedupConfig,
    *,
    model: onnx.ModelProto | None = None,
    stop: Stop | None = None,
) -> Speedup:
    """The speed-up of `attempt` over `baseline` on `feeds`, timed in rounds of fresh sessions
    (`tracker.measure.timing.speedup.measure_speedup`) whose threads stop spinning when a run returns.

    Args:
        model: `attempt`'s model as already loaded with its weights, to spare loading it again (for a
            runtime that `needs_weights`).
        stop: racing: asked after each round with the bounds so far; a reason it returns ends the timing.
    """
    return measure_speedup(_sessions(baseline, None, feeds), _sessions(attempt, model, feeds), config, stop=stop)


@functools.cache  # once per process and runtime
def warm_up(runtime: str) -> None:
    """Pays a runtime's once-per-process costs on a one-node model: its import, its environment, its first
    kernels (~30 MiB for ONNX Runtime). The first attempt's session is then measured for what it holds
    itself, as every later one is."""
    from onnx import TensorProto, helper

    value = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "warm_up", [value],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    run = get_runtime(runtime).runner(Attempt(name="warm_up", model=model, runtime=runtime), model)
    run({"x": np.zeros(1, dtype=np.float32)})


def _sessions(attempt: Attempt, model: onnx.ModelProto | None, feeds: Mapping[str, np.ndarray]) -> MakeRunner:
    """Makes fresh sessions of `attempt` for the interleaved timing, whose threads stop spinning when a
    run returns (so they leave the cores to the other session's run), each bound to `feeds`."""
    runtime = get_runtime(attempt.runtime)
    if model is None and runtime.needs_weights:
        model = attempt.load()  # once, not per session
    feeds = dict(feeds)

    def make() -> Runner:
        run = runtime.runner(attempt, model, stop_spinning_after_run=True)
        return lambda: run(feeds)

    return make


T = TypeVar("T")


def _undisturbed(result: AttemptResult, step: str, measure: Callable[[], T]) -> T:
    """Runs a measuring step, and once more if other processes took the CPU meanwhile. The other
    processes' load of the run kept goes to `result.cpu_load[step]`; a step disturbed twice is listed in
    `result.disturbed_steps`."""
    for tries in (1, 2):
        with watch_cpu_load() as load:
            value = measure()
        if not load.disturbed:
            break
        logger.warning("attempt %s: other processes used %.0f%% of the CPU during %s; %s", result.attempt.name,
                       100 * load.other_load, step, "measuring it again" if tries == 1 else "flagged as disturbed")
    else:
        result.disturbed_steps.append(step)
    result.cpu_load[step] = load.other_load
    return value


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
