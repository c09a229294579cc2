"""The attempt pipeline: measure one attempt, fill its record, log it as a run or keep it in the outbox.

`Study` (`tracker.study`) runs it for each of its attempts; `log_attempt` runs it once, for training code.
"""

from __future__ import annotations

import logging
import tempfile
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import onnx

from tracker.base.files import no_space_note
from tracker.base.keys import check_experiment_name
from tracker.base.memory import release_free_memory
from tracker.base.steps import StepTimes
from tracker.base.termination import Terminated, received
from tracker.base.vocabulary import RunStatus
from tracker.generation import GenerationFigures, GenerationScenario
from tracker.measure.accuracy.lm_diff import LogitsDiff
from tracker.measure.accuracy.text_quality import CheckedOnText
from tracker.measure.attempt import Attempt, AttemptResult, Logged, MeasureConfig
from tracker.measure.costmodel.machine import MachinePeaks, measure_machine
from tracker.measure.environment import isa_params
from tracker.measure.generation.text_scoring import TextCheck
from tracker.measure.measurement import measure_attempt
from tracker.measure.runtimes.ort_runtime import SessionConfig
from tracker.measure.timing.speedup import judge
from tracker.run import content as run_content
from tracker.run.artifacts import write_attempt_artifacts
from tracker.run.record import AttemptRecord, check_outbox, keep, save_record
from tracker.store import connect, faults, runs, write

logger = logging.getLogger(__name__)

Evaluate = Callable[[list[np.ndarray]], Mapping[str, float]]


@dataclass(frozen=True)
class AttemptSetup:
    """How the pipeline measures and logs an attempt: the same for every attempt of a study.

    Attributes:
        config: how to measure.
        study: the study's name (its runs' `tracker.study`), None outside a study.
        evaluate: task metrics from the outputs.
        log_model: log the model with the onnx flavor.
        latency_feeds: other feeds sets to time, by label (`latency.<label>.*`).
        tags: the run's tags on top of its own.
        machine: the roofs of the attempt's roofline (`Study.machine`); None outside a study.
        quality: a language model's check on real text (the first attempt it scores is the reference); None: none.
        parent_run_id: the run its run is nested under (the study's); None: a top-level run.
        experiment_id: the experiment its run goes in; None: MLflow's environment's, else its default.
    """

    config: MeasureConfig = field(default_factory=MeasureConfig)
    study: str | None = None
    evaluate: Evaluate | None = None
    log_model: bool = True
    latency_feeds: Mapping[str, Mapping[str, np.ndarray]] = field(default_factory=dict)
    tags: Mapping[str, str] = field(default_factory=dict)
    machine: MachinePeaks | None = None
    quality: TextCheck | None = None
    parent_run_id: str | None = None
    experiment_id: str | None = None


def log_attempt(
    model: onnx.ModelProto | str | Path,
    feeds: Mapping[str, np.ndarray],
    *,
    name: str = "attempt",
    experiment: str | None = None,
    baseline_outputs: list[np.ndarray] | None = None,
    config: MeasureConfig | None = None,
    evaluate: Evaluate | None = None,
    tracking_uri: str | None = None,
    log_model: bool = True,
    **kwargs,
) -> AttemptResult:
    """Measures and logs one attempt as a run (nested under the active run if there is one).

    Args:
        model: the model, in memory or as a path.
        feeds: its inputs.
        name: the attempt's name.
        experiment: MLflow experiment of a top-level run (ignored inside an active run); default: MLflow's
            environment's ($MLFLOW_EXPERIMENT_NAME or _ID), else its Default experiment. `mlflow.set_experiment`'s
            process-global choice is not read: name the experiment.
        baseline_outputs: outputs of a baseline on the same feeds, for the prediction-diff check.
        config: how to measure (default `MeasureConfig()`).
        evaluate: task metrics from the outputs.
        tracking_uri: default `settings.resolve_tracking_uri()` (ignored inside an active run).
        log_model: log the model with the onnx flavor.
        **kwargs: other `Attempt` fields (runtime, session, tolerance, ...).
    """
    if experiment:
        check_experiment_name(experiment)
    check_outbox()
    if not runs.inside_run():
        connect.setup_tracking(tracking_uri)
    parent_run_id, experiment_id = runs.place(experiment)
    attempt = Attempt(name=name, model=model if isinstance(model, onnx.ModelProto) else Path(model), **kwargs)
    with tempfile.TemporaryDirectory(prefix="tracker-") as tmp:
        setup = AttemptSetup(config=config or MeasureConfig(), evaluate=evaluate, log_model=log_model,
                             parent_run_id=parent_run_id, experiment_id=experiment_id)
        measured = measure_record(attempt, dict(feeds), setup, baselines={}, workdir=Path(tmp),
                                  baseline_outputs=baseline_outputs)
        return log_measured(measured, setup)


def log_measured(measured: MeasuredAttempt, setup: AttemptSetup) -> AttemptResult:
    """Logs a measured attempt (`measure_record`) in its own run, under `setup`'s parent run and in its experiment.

    Measuring needed no tracking server. A crash while measuring became a FAILED run carrying the error (and
    `result.error`). If the run cannot be logged (the server is unreachable or dies), the record is kept in the outbox
    (`tracker.run.record.outbox_root()`) and the log says how to upload it; `result.logged` says where it went.
    """
    record = measured.record
    record.parent_run_id, record.experiment_id = setup.parent_run_id, setup.experiment_id
    result = replace(measured.result, logged=log_or_keep(record, steps=measured.result.steps))
    if measured.interrupted is not None:  # logged like any attempt; the study then unwinds
        raise measured.interrupted
    # After a GPT-2 attempt (sessions, model copies) glibc keeps gigabytes in its arenas otherwise.
    release_free_memory()
    return result


@dataclass(frozen=True)
class MeasuredAttempt:
    """An attempt measured and its record filled, not logged yet (a cluster's node returns the record, and the
    driver logs it).

    Attributes:
        result: what was measured (`error` set when it failed).
        record: its run's content, FAILED with the error when it failed; no parent run yet.
        interrupted: the Ctrl-C or SIGTERM that cut the measurement, to raise once the record is logged.
    """

    result: AttemptResult
    record: AttemptRecord
    interrupted: BaseException | None = None


def measure_record(
    attempt: Attempt,
    feeds: Mapping[str, np.ndarray],
    setup: AttemptSetup,
    *,
    baselines: Mapping[str, AttemptResult],
    workdir: Path,
    baseline_outputs: list[np.ndarray] | None = None,
    generation: GenerationFigures | None = None,
) -> MeasuredAttempt:
    """Measures an attempt, judges it against its runtime's baseline and fills its record (with `setup.tags` on
    top of its own); needs no tracking store.

    `baselines` are the study's so far (`runtime_baselines`); empty outside a study. `generation` holds what the
    study's generation scenario measured for this attempt (`tracker.generation`): it joins the attempt's result and
    record. A crash while measuring makes the record FAILED, carrying the error.
    """
    record = AttemptRecord(attempt.name, setup.study, attempt.runtime, params=run_content.attempt_params(attempt))
    result = AttemptResult(attempt=attempt)
    interrupted: BaseException | None = None
    try:
        same_runtime = baselines.get(attempt.runtime)
        # A runtime's first attempt has its outputs checked against the study's first baseline (cross-runtime).
        output_baseline = same_runtime or next(iter(baselines.values()), None)
        if baseline_outputs is None and output_baseline is not None:
            baseline_outputs = output_baseline.outputs
        result = measure_attempt(
            attempt, feeds, config=setup.config, workdir=workdir, baseline_outputs=baseline_outputs,
            evaluate=setup.evaluate, latency_feeds=setup.latency_feeds,
            baseline=same_runtime.attempt if same_runtime is not None else None, machine=setup.machine,
        )
        if generation is not None:
            result = replace(result, extra_metrics={**result.extra_metrics, **generation.metrics},
                             phase_rooflines={**result.phase_rooflines, **generation.rooflines})
        # The baseline against itself, so that every attempt carries the same diff.* keys.
        diff = result.diff or attempt.tolerance.compare(result.outputs, result.outputs)
        if setup.quality is not None and isinstance(diff, LogitsDiff):
            with result.steps.step("quality"):
                quality = setup.quality.measure(attempt.model, attempt.session, workdir=workdir / "quality",
                                                precision=attempt.params.get("precision", "fp32"),
                                                reference=same_runtime is None)
            diff = CheckedOnText(diff, quality)
        # The first attempt of a runtime is its own baseline: speed-up 1, node delta 0.
        own_baseline = same_runtime is None
        result = replace(result, diff=diff, verdict=judge(result.speedup, accuracy_passed=bool(diff.passed),
                                                          baseline=own_baseline))
        baseline = same_runtime or result
        with result.steps.step("artifacts"):
            artifacts = write_attempt_artifacts(
                result, workdir / "artifacts", baseline=baseline, skip_runs=setup.config.skip_runs
            )
        run_content.fill_record(record, result, artifacts, setup.config, baseline, workdir, log_model=setup.log_model)
        record.params.update(generation.params if generation is not None else {})
    except Exception as e:
        result = replace(result, error=mark_failed(record, e))
        if received():  # SIGTERM in disguise (an ImportError from a cut import): the attempt was interrupted
            record.error = f"interrupted (SIGTERM) while measuring; it surfaced as {result.error}"
            interrupted = Terminated()
    except (KeyboardInterrupt, Terminated) as e:  # Ctrl-C or SIGTERM mid-attempt: the cut attempt is a FAILED run
        result = replace(result, error=mark_failed(record, e))
        record.error = f"interrupted ({'Ctrl-C' if isinstance(e, KeyboardInterrupt) else 'SIGTERM'}) while measuring"
        interrupted = e
    record.tags.update(setup.tags)
    return MeasuredAttempt(result, record, interrupted)


# The roofs measured in this process, by thread count: a machine's peaks do not change between two studies of one
# process (`mlflow run . -e main` runs three), so only the first pays the ~3.5 s.
_MACHINES: dict[int, MachinePeaks] = {}


def measure_machine_or_none() -> MachinePeaks | None:
    """The machine's roofs at the study's thread count (`SessionConfig`'s default), measured by the first study of
    the process that needs them; or None: a machine that cannot be measured costs the attempts their share of peak,
    never the study (the next study tries again)."""
    threads = SessionConfig().intra_op_num_threads
    if threads in _MACHINES:
        logger.info("machine: the peaks an earlier study of this process measured (%.1f GFLOP/s, %.1f GB/s)",
                    _MACHINES[threads].peak_gflops, _MACHINES[threads].bandwidth_gbps)
        return _MACHINES[threads]
    try:
        _MACHINES[threads] = measure_machine(threads=threads)
    except Exception as e:
        logger.warning("could not measure the machine's peaks (%s: %s); no roofs this study", type(e).__name__, e)
        return None
    return _MACHINES[threads]


def machine_params(machine: MachinePeaks | None) -> dict[str, str]:
    """The machine as a study run's params: its instruction sets (`machine.isa.*`), and its measured peaks if any."""
    return {**isa_params(), **(machine.params() if machine else {})}


def log_failure(study: str | None, name: str, error: BaseException, *, runtime: str, tags: Mapping[str, str],
                parent_run_id: str | None, experiment_id: str | None) -> str:
    """Logs an attempt that failed before it had a model to measure (e.g. its optimizer raised) as a measured one
    is logged (under `parent_run_id`, in `experiment_id`): to the store, else to the outbox. Returns the error's
    one-line text."""
    record = AttemptRecord(name, study, runtime, tags=dict(tags), parent_run_id=parent_run_id,
                           experiment_id=experiment_id)
    error_text = mark_failed(record, error)
    log_or_keep(record)
    return error_text


def mark_failed(record: AttemptRecord, error: BaseException) -> str:
    """Makes `record` a FAILED attempt carrying `error` and its traceback; returns the error's one-line text."""
    record.status, record.error = RunStatus.FAILED, f"{type(error).__name__}: {error}{no_space_note(error)}"
    record.traceback = "".join(traceback.format_exception(error))
    logger.error("attempt %s failed: %s", record.attempt, record.error)
    return record.error


def log_or_keep(record: AttemptRecord, *, steps: StepTimes | None = None) -> Logged:
    """Logs a record as a run; what an outage stops (or the store refuses whole) is kept in the outbox.

    A part of the run MLflow refuses for its content is left out, and named on the run (`write.log_record`).
    A run refused whole (`faults.is_outage` says the store answers) is kept too, with the reason in `refused`:
    uploading it later fails the same way until what MLflow refused is fixed.
    """
    # When the run starts, or would have: a run uploaded later starts then too, in its study's order.
    record.start_time_ms = int(time.time() * 1000)
    try:
        connect.ensure_reachable()
        experiment_id = record.experiment_id or runs.experiment_id_for(None)
        with write.attempt_run(record.study, record.attempt, record.runtime, status=record.status,
                               parent_run_id=record.parent_run_id, experiment_id=experiment_id) as run:
            record.run_id = run.info.run_id
            write.log_record(record, run.info.run_id, steps=steps)
        return Logged(run_id=record.run_id)
    except Exception as e:
        outage = faults.is_outage(e)
        outbox = _keep(record)
        if outage:
            full = no_space_note(e)  # a full disk under MLflow's temporary files is no server's outage
            logger.error("could not log attempt %s (%s: %s%s); its results are kept in %s; upload them with "
                         "`tracker upload %s` once %s", record.attempt, type(e).__name__, e, full, outbox, outbox,
                         "there is space" if full else "the tracking server is back")
            return Logged(outbox=outbox)
        reason = faults.describe(e)
        logger.error("the tracking store refused the run of attempt %s (%s); this is not an outage: its results "
                     "are kept in %s", record.attempt, reason, outbox)
        return Logged(outbox=outbox, refused=reason)


def _keep(record: AttemptRecord) -> Path:
    """Saves a record in the outbox, else in this process's emergency folder (`run.record.keep`): a measurement is
    not lost for want of a place."""
    return keep(lambda root: save_record(record, root), f"attempt {record.attempt}")


@dataclass(frozen=True)
class StudySetup:
    """What a study needs beyond its feeds and measuring config; every field is optional.

    Attributes:
        evaluate: task metrics from each attempt's outputs.
        tags: every run's tags (the study's and its attempts').
        workdir: where attempts keep their files (default: a temporary folder, removed at the end).
        latency_feeds: other feeds sets timed for each attempt, by label (`latency.<label>.*`).
        generation: the generation scenario: each attempt also measured generating with a KV cache.
        prior_steps: work done for the study before it started (e.g. an export), counted in its time per step.
        quality: a language model's check on real text, for every attempt's forward model.
    """

    evaluate: Evaluate | None = None
    tags: Mapping[str, str] = field(default_factory=dict)
    workdir: str | Path | None = None
    latency_feeds: Mapping[str, Mapping[str, np.ndarray]] = field(default_factory=dict)
    generation: GenerationScenario | None = None
    prior_steps: StepTimes | None = None
    quality: TextCheck | None = None
