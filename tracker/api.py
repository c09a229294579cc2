"""The Python API training code calls: a `Study` of attempts, or one `log_attempt`."""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
import traceback
from collections.abc import Callable, Mapping
from contextlib import nullcontext
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import onnx

from tracker.base.keys import TAG_PARENT_ATTEMPT, TAG_PIPELINE, check_experiment_name
from tracker.base.memory import release_free_memory
from tracker.base.model_io import load_model
from tracker.base.steps import StepTimes
from tracker.base.termination import Terminated, received, reraise_if_received, sigterm_as_exit
from tracker.measure.accuracy.output_diff import TOLERANCES
from tracker.measure.accuracy.task_diff import TaskTolerance, tolerance_for
from tracker.measure.attempt import Attempt, AttemptResult, MeasureConfig, check_name, measure_attempt
from tracker.measure.costmodel.machine import MachinePeaks, measure_machine
from tracker.measure.costmodel.roofline import Roofline
from tracker.measure.runtimes.ort_runtime import SessionConfig
from tracker.measure.timing.speedup import verdict
from tracker.optimize import Candidate, Chain, Context, Entry, ModelInfo, get_entry
from tracker.report.rows import pick_best, rows_from_results, runtime_baselines, study_counts
from tracker.report.scenarios import scenario_bests, scenario_tags
from tracker.report.search import build_search_report
from tracker.report.study import build_study_report
from tracker.run import content as run_content
from tracker.run.artifacts import write_attempt_artifacts
from tracker.run.record import AttemptRecord, check_outbox, outbox_root, save_record, save_summary
from tracker.search import SearchConfig, SearchResult, run_search
from tracker.store import connect, faults, write

logger = logging.getLogger(__name__)

Evaluate = Callable[[list[np.ndarray]], Mapping[str, float]]


class Study:
    """A parent MLflow run holding one nested run per optimization attempt.

    The first attempt of each runtime that succeeds is that runtime's baseline (`runtime_baselines`): later
    attempts of the runtime are compared with it (outputs, latency, per-op profile, graph). The first attempt
    of a second runtime has its outputs compared with the first runtime's baseline (a cross-runtime check).

    Example:
        with Study("my-model", feeds={"X": x}) as study:
            study.attempt("baseline", model)
            study.attempt("ort_opt_disabled", model, session=SessionConfig(graph_optimization_level="disable"))
    """

    def __init__(
        self,
        name: str,
        *,
        feeds: Mapping[str, np.ndarray],
        experiment: str | None = None,
        config: MeasureConfig | None = None,
        evaluate: Evaluate | None = None,
        params: Mapping[str, str] | None = None,
        tags: Mapping[str, str] | None = None,
        tracking_uri: str | None = None,
        log_models: bool = True,
        workdir: str | Path | None = None,
        latency_feeds: Mapping[str, Mapping[str, np.ndarray]] | None = None,
    ) -> None:
        check_name("study", name)
        if experiment:
            check_experiment_name(experiment)
        self.name = name
        self.feeds = dict(feeds)
        self.latency_feeds = dict(latency_feeds or {})
        self.experiment = experiment
        self.config = config or MeasureConfig()
        self.evaluate = evaluate
        self.params = dict(params or {})
        self.tags = dict(tags or {})
        self.tracking_uri = tracking_uri
        self.log_models = log_models
        self._workdir_given = workdir is not None
        self._workdir = Path(workdir) if workdir is not None else None
        self.results: list[AttemptResult] = []
        self.failures: dict[str, str] = {}  # attempts that failed before they could be measured
        self._graphs: dict[str, onnx.ModelProto] = {}  # `graph_of`
        self.steps = StepTimes()  # the study's own work; each attempt has its own
        self.machine: MachinePeaks | None = None  # the roofs of every attempt's roofline, measured on entry
        # attempt -> phase -> roofline (`add_phase_rooflines`)
        self.phase_rooflines: dict[str, dict[str, Roofline]] = {}
        self.search_result: SearchResult | None = None  # `search`
        self._started = time.perf_counter()
        self._run_cm = None

    def __enter__(self) -> Study:
        connect.setup_tracking(self.tracking_uri)
        check_outbox()  # a place for what the store may not take, before any work
        # SIGTERM (`timeout`, a CI cancel) unwinds like Ctrl-C: runs end FAILED, the work folder goes.
        self._sigterm = sigterm_as_exit()
        self._sigterm.__enter__()
        try:
            if self._workdir is None:
                self._workdir = Path(tempfile.mkdtemp(prefix=f"tracker-{self.name}-"))
            with self.steps.step("machine"):
                self.machine = _measure_machine()
            params = {**self.config.params(), **(self.machine.params() if self.machine else {}), **self.params}
            self._run_cm = write.study_run(self.name, experiment=self.experiment, params=params, tags=self.tags)
            self.run = self._run_cm.__enter__()
        except BaseException:  # `with` calls no __exit__ when __enter__ fails: undo what was set up here
            self._release()
            raise
        logger.info("study %s: run %s", self.name, self.run.info.run_id)
        return self

    def attempt(self, name: str | Attempt, model: onnx.ModelProto | str | Path | None = None, *,
                tags: Mapping[str, str] | None = None, **kwargs) -> AttemptResult:
        """Measures and logs one attempt as a nested run; a failure is logged and returned, not raised.

        Args:
            name: the attempt's name, or a ready `Attempt` (then `model` and `kwargs` must be absent).
            model: the model, in memory or as a path.
            tags: the run's tags on top of the study's (e.g. a chain's lineage).
            **kwargs: other `Attempt` fields (runtime, session, new_ops, tolerance, description, ...).
        """
        if self._run_cm is None:
            raise RuntimeError("use the Study in a `with` block before adding attempts")
        attempt = name if isinstance(name, Attempt) else Attempt(name=name, model=model, **kwargs)
        result = run_attempt(
            attempt,
            self.feeds,
            config=self.config,
            baselines=runtime_baselines(self.results),
            workdir=self._workdir / attempt.name,
            study=self.name,
            evaluate=self.evaluate,
            log_model=self.log_models,
            latency_feeds=self.latency_feeds,
            tags={**self.tags, **(tags or {})},
            machine=self.machine,
        )
        self.results.append(result)
        return result

    def optimize(
        self,
        entry: str | Entry,
        source: onnx.ModelProto | str | Path,
        *,
        name: str | None = None,
        info: ModelInfo | None = None,
        runtime: str = "onnxruntime",
        session: SessionConfig | None = None,
        tolerance: TaskTolerance | Mapping[str, TaskTolerance] = TOLERANCES,
        tags: Mapping[str, str] | None = None,
        **fields,
    ) -> AttemptResult | None:
        """Runs the registry entry `entry` on `source`, then measures and logs what it made as one attempt.

        An entry that does not apply to `source`, or that raises, is logged as a FAILED attempt carrying
        the reason, and None is returned; the study goes on.

        Args:
            entry: an entry, or its name as `tracker.optimize.get_entry` reads it (a registered name, a variant
                `int8_dynamic:per_channel=true`, a chain `attention_fused+int8_dynamic`).
            source: the model to optimize, in memory or as a path.
            name: the attempt's name (default: the entry's).
            info: heads and hidden size, for the entries that fuse transformer blocks.
            runtime: the runtime the candidate runs in.
            session: the study's ONNX Runtime settings; a session entry sets its own on top.
            tolerance: one tolerance, or one per precision ("fp32", "fp16", "int8"): the candidate's
                precision picks it.
            tags: the attempt run's tags on top of the study's and the chain's lineage.
            **fields: `Attempt` fields that replace the candidate's (description, new_ops, ...);
                `params` and `metrics` are added to the candidate's.
        """
        if self._run_cm is None:
            raise RuntimeError("use the Study in a `with` block before adding attempts")
        found = get_entry(entry) if isinstance(entry, str) else entry
        name = name or found.name
        check_name("attempt", name)
        context = Context(info=info, runtime=runtime, feeds=self.feeds, work=self._prepared)
        logger.info("study %s: optimizing %s (%s)", self.name, name, found.summary)
        # A session entry makes nothing: no optimize step in the study's time table.
        step = nullcontext() if found.kind == "session" else self.steps.step("optimize")
        try:
            with step:
                source_path = self._on_disk(source, name)
                graph = source if isinstance(source, onnx.ModelProto) else self.graph_of(source_path)
                start = time.perf_counter()
                candidate = found(source_path, self._workdir / name / "optimized", context, graph=graph)
                seconds = time.perf_counter() - start
        except Exception as e:  # an optimizer failure is a result of the study, logged on its own run
            reraise_if_received(e)
            self.record_failure(name, e, runtime=runtime, tags={**lineage_tags(found), **(tags or {})})
            return None
        # A session entry measures its source as given (in memory or not), with other settings.
        model = source if candidate.path == source_path else candidate.path
        chosen = tolerance_for(tolerance, candidate.precision)
        metrics, params = _candidate_content(found, candidate, seconds)
        return self.attempt(
            name,
            model,
            tags={**lineage_tags(found), **(tags or {})},
            runtime=runtime,
            session=replace(session or SessionConfig(), **candidate.session),
            new_ops=fields.pop("new_ops", candidate.new_ops),
            tolerance=chosen,
            description=fields.pop("description", "; ".join(candidate.notes)),
            metrics={**metrics, **fields.pop("metrics", {})},
            params={**params, **fields.pop("params", {})},
            **fields,
        )

    def search(
        self,
        source: str | Path,
        *,
        config: SearchConfig | None = None,
        info: ModelInfo | None = None,
        session: SessionConfig | None = None,
        tolerance: TaskTolerance | Mapping[str, TaskTolerance] = TOLERANCES,
    ) -> SearchResult:
        """Searches the registry's entries, knobs and chains for the fastest variant of `source` that passes its
        check (`tracker.search.run_search`). The leaders become attempt runs; every other candidate that was timed a
        light run (`tracker.role` = "candidate"); every candidate, with where and why it stopped, a row of the table
        on the study run (`report/search.html`). Measures the baseline first if the study has none.

        Returns:
            What the search did; the answer is `study.best`.
        """
        if self._run_cm is None:
            raise RuntimeError("use the Study in a `with` block before searching")
        session = session or SessionConfig()
        baseline = runtime_baselines(self.results).get("onnxruntime")
        if baseline is None:
            baseline = self.attempt("baseline", Path(source), session=session,
                                    tolerance=tolerance_for(tolerance, "fp32"),
                                    description=f"{Path(source).name} as given")
            if not baseline.ok:
                raise ValueError(f"the baseline failed, so nothing can be compared with it: {baseline.error}")
        with self.steps.step("search"):
            self.search_result = run_search(
                Path(source), feeds=self.feeds, baseline=baseline.attempt, baseline_outputs=baseline.outputs,
                tolerance=tolerance, workdir=self._workdir / "search", config=config or SearchConfig(), info=info,
                session=session, full_attempt_s=sum(baseline.steps.seconds.values()),
                prepared=self._prepared,
                optimize=lambda entry, src, tags: self.optimize(entry, src, info=info, session=session,
                                                                tolerance=tolerance, tags=tags),
            )
        try:  # the table on the study run holds the same rows: losing these runs loses no figure
            write.log_candidate_runs(self.search_result.candidate_runs(self.name))
        except Exception as e:
            logger.warning("could not log the search's candidate runs (%s: %s); the study run's "
                           "report/search_candidates.json holds them", type(e).__name__, e)
        return self.search_result

    @property
    def _prepared(self) -> Path:
        """Where entries keep the pre-processed sources their variants share (`Context.work`), for the study's
        attempts and its search alike."""
        return self._workdir / "prepared"

    def graph_of(self, path: str | Path) -> onnx.ModelProto:
        """The model at `path` without its weights' values, read once per study: what `Entry.applies` looks at."""
        key = str(Path(path).resolve())
        if key not in self._graphs:
            model = load_model(path, load_external_data=False, check=False)
            for tensor in model.graph.initializer:  # names, types and shapes stay; the values go
                for values in ("raw_data", "float_data", "int32_data", "int64_data", "double_data", "uint64_data"):
                    tensor.ClearField(values)
            self._graphs[key] = model
        return self._graphs[key]

    def _on_disk(self, source: onnx.ModelProto | str | Path, name: str) -> Path:
        """`source` as a file: its path, or a model in memory saved in the attempt's work folder."""
        if not isinstance(source, onnx.ModelProto):
            return Path(source)
        path = self._workdir / name / "source.onnx"
        path.parent.mkdir(parents=True, exist_ok=True)
        onnx.save_model(source, str(path))
        return path

    def record_failure(self, name: str, error: BaseException, *, runtime: str = "onnxruntime",
                       tags: Mapping[str, str] | None = None) -> None:
        """Logs an attempt that failed before it had a model to measure (e.g. its optimizer raised)."""
        if self._run_cm is None:
            raise RuntimeError("use the Study in a `with` block before adding attempts")
        parent_run_id, experiment_id = write.current_ids()
        record = AttemptRecord(name, self.name, runtime, tags={**self.tags, **(tags or {})},
                               parent_run_id=parent_run_id,
                               experiment_id=experiment_id)
        self.failures[name] = _mark_failed(record, error)
        _log_or_keep(record)  # the same way as a measured attempt: to the store, else to the outbox

    @property
    def best(self) -> AttemptResult | None:
        """The attempt to ship: the largest speed-up among those that passed their accuracy check and
        are faster than their baseline beyond the noise ("better"), else the first baseline (`pick_best`)."""
        name = pick_best(rows_from_results(self.results, tables=False))
        return next((r for r in self.results if r.attempt.name == name), None)

    @property
    def scenario_bests(self) -> dict[str, str | None]:
        """The best attempt's name in each scenario the study measured: forward (`best`), and prefill and decode
        when its attempts carry generation figures (`tracker.report.scenarios.scenario_bests`)."""
        return scenario_bests(rows_from_results(self.results, tables=False))

    def _log_report(self, best: str | None) -> None:
        """The study report on the parent run; a report problem never costs the study its summary."""
        try:
            rows = rows_from_results(self.results, failures=self.failures, skip_runs=self.config.skip_runs)
            rooflines = {r.attempt.name: r.roofline for r in self.results if r.ok and r.roofline is not None}
            built = build_study_report(rows, self._workdir / "report", study=self.name, best=best,
                                       rooflines=rooflines, phase_rooflines=self.phase_rooflines)
            write.log_study_report(built.html, built.tables)
            if self.search_result is not None:
                page = build_search_report(self.search_result, rows, self._workdir / "report", study=self.name,
                                           best=best)
                write.log_study_report(page.html, page.tables)
        except Exception as e:
            logger.error("could not log the report of study %s (%s: %s)", self.name, type(e).__name__, e)

    def add_phase_rooflines(self, attempt: str, rooflines: Mapping[str, Roofline]) -> None:
        """Keeps an attempt's rooflines of other phases than its forward pass (e.g. a generation's prefill and
        decode, by phase) for the study report's scenarios section."""
        if rooflines:
            self.phase_rooflines[attempt] = dict(rooflines)

    def add_prior_work(self, steps: StepTimes) -> None:
        """Counts work done for the study before it started (e.g. an export) in its steps and its wall time."""
        self.steps.add(steps)
        self._started -= sum(steps.seconds.values())

    def step_totals(self) -> tuple[StepTimes, float]:
        """Seconds per step over the study and its attempts, and the study's wall time so far."""
        totals = StepTimes()
        totals.add(self.steps)
        for result in self.results:
            totals.add(result.steps)
        return totals, time.perf_counter() - self._started

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if exc_type is None:
                # The attempts table itself is the report's (`_log_report`); these rows only count and rank.
                rows = rows_from_results(self.results, failures=self.failures, tables=False)
                totals, wall = self.step_totals()
                logger.info("study %s: time per step (* the tracker's own)\n%s", self.name, totals.table(wall))
                machine = self.machine.metrics() if self.machine else {}
                searched = self.search_result.metrics() if self.search_result is not None else {}
                summary = {"metrics": {**study_counts(rows), **totals.metrics(wall), **machine, **searched},
                           "best": pick_best(rows), "tags": scenario_tags(rows)}
                try:
                    connect.ensure_reachable()
                    write.log_study_summary(**summary)
                except Exception as e:
                    kept = save_summary(summary, study=self.name, parent_run_id=self.run.info.run_id)
                    why = "could not log" if faults.is_outage(e) else "the tracking store refused"
                    logger.error("%s the summary of study %s (%s); it is kept in %s and its run stays open on the "
                                 "server until `tracker upload %s`", why, self.name, faults.describe(e),
                                 kept.parent, kept.parent.parent)
                else:
                    self._log_report(summary["best"])
        finally:
            self._run_cm.__exit__(exc_type, exc, tb)
            self._run_cm = None
            self._release()

    def _release(self) -> None:
        """Removes the work folder the study made and restores SIGTERM's handler."""
        if not self._workdir_given and self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
        self._sigterm.__exit__(None, None, None)


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
        experiment: MLflow experiment of a top-level run (ignored inside an active run).
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
    if not write.has_active_run():
        connect.setup_tracking(tracking_uri)
        if experiment:
            write.set_experiment(experiment)
    attempt = Attempt(name=name, model=model, **kwargs)
    with tempfile.TemporaryDirectory(prefix="tracker-") as tmp:
        return run_attempt(
            attempt,
            dict(feeds),
            config=config or MeasureConfig(),
            baselines={},
            workdir=Path(tmp),
            study=None,
            evaluate=evaluate,
            log_model=log_model,
            baseline_outputs=baseline_outputs,
        )


def run_attempt(
    attempt: Attempt,
    feeds: Mapping[str, np.ndarray],
    *,
    config: MeasureConfig,
    baselines: Mapping[str, AttemptResult],
    workdir: Path,
    study: str | None,
    evaluate: Evaluate | None,
    log_model: bool,
    baseline_outputs: list[np.ndarray] | None = None,
    latency_feeds: Mapping[str, Mapping[str, np.ndarray]] | None = None,
    tags: Mapping[str, str] | None = None,
    machine: MachinePeaks | None = None,
) -> AttemptResult:
    """Measures an attempt, then logs it in its own run (with `tags` on top of its own).

    `baselines` are the study's so far (`runtime_baselines`); empty outside a study. `machine` holds the roofs
    of the attempt's roofline (`Study.machine`); None outside a study.
    Measuring needs no tracking server. A crash while measuring becomes a FAILED run carrying the
    error (and `result.error`). If the run cannot be logged (the server is unreachable or dies), the
    record is kept in the outbox (`tracker.run.record.outbox_root()`) and the log says how to upload it.
    """
    parent_run_id, experiment_id = write.current_ids()
    record = AttemptRecord(attempt.name, study, attempt.runtime, parent_run_id=parent_run_id,
                           experiment_id=experiment_id, params=run_content.attempt_params(attempt))
    result = AttemptResult(attempt=attempt)
    interrupted: BaseException | None = None
    try:
        same_runtime = baselines.get(attempt.runtime)
        # A runtime's first attempt has its outputs checked against the study's first baseline (cross-runtime).
        output_baseline = same_runtime or next(iter(baselines.values()), None)
        if baseline_outputs is None and output_baseline is not None:
            baseline_outputs = output_baseline.outputs
        result = measure_attempt(
            attempt, feeds, config=config, workdir=workdir, baseline_outputs=baseline_outputs,
            evaluate=evaluate, latency_feeds=latency_feeds,
            baseline=same_runtime.attempt if same_runtime is not None else None, machine=machine,
        )
        if result.diff is None:
            # The baseline against itself, so that every attempt carries the same diff.* keys.
            result.diff = attempt.tolerance.compare(result.outputs, result.outputs)
        # The first attempt of a runtime is its own baseline: speed-up 1, node delta 0.
        baseline = same_runtime or result
        result.verdict = ("baseline" if baseline is result
                          else verdict(result.speedup, accuracy_passed=result.diff.passed))
        with result.steps.step("artifacts"):
            artifacts = write_attempt_artifacts(
                result, workdir / "artifacts", baseline=baseline, skip_runs=config.skip_runs
            )
        run_content.fill_record(record, result, artifacts, config, baseline, workdir, log_model=log_model)
    except Exception as e:
        result.error = _mark_failed(record, e)
        if received():  # SIGTERM in disguise (an ImportError from a cut import): the attempt was interrupted
            record.error = f"interrupted (SIGTERM) while measuring; it surfaced as {result.error}"
            interrupted = Terminated()
    except (KeyboardInterrupt, Terminated) as e:  # Ctrl-C or SIGTERM mid-attempt: the cut attempt is a FAILED run
        result.error = _mark_failed(record, e)
        record.error = f"interrupted ({'Ctrl-C' if isinstance(e, KeyboardInterrupt) else 'SIGTERM'}) while measuring"
        interrupted = e
    record.tags.update(tags or {})
    logged = _log_or_keep(record, steps=result.steps)
    result.run_id, result.outbox, result.refused = logged.run_id, logged.outbox, logged.refused
    if interrupted is not None:  # logged like any attempt; the study then unwinds
        raise interrupted
    # After a GPT-2 attempt (sessions, model copies) glibc keeps gigabytes in its arenas otherwise.
    release_free_memory()
    return result


def _candidate_content(entry: Entry, candidate: Candidate, seconds: float) -> tuple[dict[str, float], dict[str, str]]:
    """The metrics and params saying what an entry did. A session entry made no model: it says it in its
    session params, which every attempt logs."""
    if entry.kind == "session":
        return {}, dict(candidate.params)
    metrics = {f"fusion.{op}": float(n) for op, n in candidate.fusions.items()}
    metrics["optimize.seconds"] = seconds
    if candidate.fully_optimized is not None:
        metrics["fusion.fully_optimized"] = float(candidate.fully_optimized)
    params = {**candidate.params, "precision": candidate.precision, "applied": str(candidate.applied)}
    return metrics, params


def lineage_tags(entry: Entry) -> dict[str, str]:
    """A chain's lineage: `tracker.pipeline` (its steps) and `tracker.parent_attempt` (every step but the last)."""
    if not isinstance(entry, Chain):
        return {}
    return {TAG_PIPELINE: entry.name, TAG_PARENT_ATTEMPT: entry.parent}


def _measure_machine() -> MachinePeaks | None:
    """The machine's roofs at the study's thread count (`SessionConfig`'s default), or None: a machine that
    cannot be measured costs the attempts their share of peak, never the study."""
    try:
        return measure_machine(threads=SessionConfig().intra_op_num_threads)
    except Exception as e:
        logger.warning("could not measure the machine's peaks (%s: %s); no roofs this study", type(e).__name__, e)
        return None


def _mark_failed(record: AttemptRecord, error: BaseException) -> str:
    """Makes `record` a FAILED attempt carrying `error` and its traceback; returns the error's one-line text."""
    record.status, record.error = "FAILED", f"{type(error).__name__}: {error}"
    record.traceback = "".join(traceback.format_exception(error))
    logger.error("attempt %s failed: %s", record.attempt, record.error)
    return record.error


def _log_or_keep(record: AttemptRecord, *, steps: StepTimes | None = None) -> _Logged:
    """Logs a record as a run; what an outage stops (or the store refuses whole) is kept in the outbox.

    A part of the run MLflow refuses for its content is left out, and named on the run (`write.log_record`).
    A run refused whole (`faults.is_outage` says the store answers) is kept too, with the reason in `refused`:
    uploading it later fails the same way until what MLflow refused is fixed.
    """
    # When the run starts, or would have: a run uploaded later starts then too, in its study's order.
    record.start_time_ms = int(time.time() * 1000)
    try:
        connect.ensure_reachable()
        with write.attempt_run(record.study, record.attempt, record.runtime, status=record.status) as run:
            record.run_id = run.info.run_id
            write.log_record(record, steps=steps)
        return _Logged(run_id=record.run_id)
    except Exception as e:
        outage = faults.is_outage(e)
        outbox = _keep(record)
        if outage:
            logger.error("could not log attempt %s (%s: %s); its results are kept in %s; upload them with "
                         "`tracker upload %s` once the tracking server is back",
                         record.attempt, type(e).__name__, e, outbox, outbox)
            return _Logged(outbox=outbox)
        reason = faults.describe(e)
        logger.error("the tracking store refused the run of attempt %s (%s); this is not an outage: its results "
                     "are kept in %s", record.attempt, reason, outbox)
        return _Logged(outbox=outbox, refused=reason)


@dataclass(frozen=True)
class _Logged:
    """Where a record went: a run, or the outbox (with the reason when the store refused it)."""

    run_id: str | None = None
    outbox: Path | None = None
    refused: str | None = None


def _keep(record: AttemptRecord) -> Path:
    """Saves a record in the outbox; where that fails (a full disk, a folder that went), in a new temporary
    folder: a measurement is never lost for want of a place."""
    try:
        return save_record(record)
    except OSError as e:
        fallback = save_record(record, Path(tempfile.mkdtemp(prefix="tracker-outbox-")))
        logger.error("could not keep attempt %s in the outbox %s (%s: %s); it is kept in %s instead",
                     record.attempt, outbox_root(), type(e).__name__, e, fallback.parent.parent)
        return fallback
