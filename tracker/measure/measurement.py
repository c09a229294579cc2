"""How an attempt is measured: its session, latency, speed-up against the baseline, profile, outputs and check,
each step watched for other processes' load; the figures are gathered first and the result made once, frozen."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TypeVar

import numpy as np
import onnx

from tracker.base.memory import rss_growth
from tracker.base.model_io import ort_can_load
from tracker.base.steps import StepTimes
from tracker.measure.accuracy.output_values import output_nbytes
from tracker.measure.attempt import Attempt, AttemptResult, MeasureConfig
from tracker.measure.costmodel.machine import MachinePeaks
from tracker.measure.costmodel.roofline import build_roofline, count_tokens
from tracker.measure.graph_stats import graph_stats
from tracker.measure.inputs.feed_checks import check_feeds, check_indices
from tracker.measure.inputs.feeds_description import describe_feeds
from tracker.measure.runtimes.runtime import get_runtime
from tracker.measure.timing.cpu_load import watch_cpu_load
from tracker.measure.timing.latency import time_once, time_runs
from tracker.measure.timing.speedup import MakeRunner, Runner, Speedup, SpeedupConfig, Stop, measure_speedup
from tracker.profile.parse import parse_profile

logger = logging.getLogger(__name__)


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
    graph = graph_stats(model, size_bytes=attempt.size_bytes(model))
    loadable = ort_can_load(model)
    described = describe_feeds(feeds)
    if baseline_outputs is None and described.nonfinite:  # once, on the baseline: its attempts share the feeds
        logger.warning("attempt %s: its feeds hold %s; where an attempt's outputs and the baseline's are both NaN, "
                       "or the same infinity, they count as equal", attempt.name, described.nonfinite_text())
    steps, watch = StepTimes(), _LoadWatch(attempt.name)
    logger.info("attempt %s: timing (%s)", attempt.name, attempt.runtime)
    warm_up(attempt.runtime)
    with rss_growth() as growth:
        with steps.step("session"):
            run, session_create_ms = time_once(lambda: runtime.runner(attempt, model))
        with steps.step("latency"):
            outputs, first_run_ms = time_once(lambda: run(feeds))
    with steps.step("latency"):
        latency = watch.undisturbed("latency", lambda: time_runs(lambda: run(feeds), config.timing))
        latencies = {}
        for label, extra in latency_feeds.items():
            logger.info("attempt %s: timing %s", attempt.name, label)
            run(extra)
            latencies[label] = time_runs(functools.partial(run, extra), config.timing)
    # free this session before the next ones: a GPT-2 session holds ~1 GB (the ignore: `run` is typed as the
    # runner, and `del run` would confuse linters about the lambdas above that read it)
    run = None  # type: ignore[assignment]
    speedup = None
    if baseline is not None:
        logger.info("attempt %s: timing against %s in %d rounds", attempt.name, baseline.name, config.speedup.rounds)
        with steps.step("speedup"):
            speedup = time_against(attempt, baseline, feeds, config.speedup, model=model)
        watch.note("speedup", speedup.other_load, disturbed=bool(speedup.disturbed_rounds))
    logger.info("attempt %s: profiling %d runs", attempt.name, config.profile_runs)
    with steps.step("profiling"):
        profiled = watch.undisturbed("profiling", lambda: runtime.profile(
            attempt, model, feeds, runs=config.profile_runs, workdir=workdir
        ))
    profile = profiled.profile
    if profile is None:  # the runtime wrote its profile to a file
        assert profiled.profile_path is not None, "a runtime gives its profile or the file it wrote"
        with steps.step("parsing"):
            profile = parse_profile(profiled.profile_path)
    with steps.step("parsing"):
        roofline = build_roofline(profile.events, machine=machine, skip_runs=config.skip_runs,
                                  tokens_per_run=count_tokens(feeds))
    traces = runtime.trace(attempt, model, feeds, config.trace_levels)
    diff = None
    if baseline_outputs is not None:
        diff = attempt.tolerance.compare(baseline_outputs, outputs)
        if diff.nonfinite_mismatches:
            logger.warning("attempt %s: %d output values are NaN or infinite where the baseline's are not (or the "
                           "reverse); its accuracy check fails", attempt.name, diff.nonfinite_mismatches)
    # The session's growth counts the tracker's outputs (kept for the diff) out: they are not the session's.
    session_bytes = growth.bytes - sum(output_nbytes(o) for o in outputs)
    return AttemptResult(
        attempt=attempt, graph=graph, feeds=described, ort_loadable=loadable,
        session_create_ms=session_create_ms, first_run_ms=first_run_ms, session_bytes=session_bytes,
        latency=latency, latencies=latencies, speedup=speedup,
        profiled_latency=profiled.latency, profile_path=profiled.profile_path, profile=profile, roofline=roofline,
        optimized_model_path=profiled.optimized_model_path, traces=traces, outputs=outputs, diff=diff,
        extra_metrics={k: float(v) for k, v in evaluate(outputs).items()} if evaluate is not None else {},
        steps=steps, cpu_load=watch.cpu_load, disturbed_steps=watch.disturbed,
    )


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


class _LoadWatch:
    """Other processes' share of the CPU during each measuring step of one attempt (`cpu_load`), and the steps
    that stayed disturbed (`disturbed`)."""

    def __init__(self, attempt: str) -> None:
        self._attempt = attempt
        self.cpu_load: dict[str, float] = {}
        self.disturbed: list[str] = []

    def note(self, step: str, other_load: float, *, disturbed: bool) -> None:
        self.cpu_load[step] = other_load
        if disturbed:
            self.disturbed.append(step)

    def undisturbed(self, step: str, measure: Callable[[], T]) -> T:
        """Runs a measuring step, and once more if other processes took the CPU meanwhile; a step disturbed twice
        is noted as disturbed."""
        for tries in (1, 2):
            with watch_cpu_load() as load:
                value = measure()
            if not load.disturbed:
                break
            logger.warning("attempt %s: other processes used %.0f%% of the CPU during %s; %s", self._attempt,
                           100 * load.other_load, step, "measuring it again" if tries == 1 else "flagged as disturbed")
        self.note(step, load.other_load, disturbed=load.disturbed)
        return value
