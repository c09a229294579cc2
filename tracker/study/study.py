"""A study's lifecycle: its parent run (held open by `tracker.study.context`), each attempt measured as a nested run
(`tracker.pipeline`; an entry's candidate made by `tracker.study.candidates`), the search, and at the end its summary
and report (`tracker.summary`)."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import onnx

from tracker.base.keys import check_experiment_name, check_registered_model_name
from tracker.base.model_io import load_graph
from tracker.base.steps import StepTimes
from tracker.base.termination import reraise_if_received
from tracker.base.vocabulary import Phase
from tracker.executor import GENERATION, TEXT, Executor, executor_for
from tracker.generation import GenerationFigures
from tracker.measure.accuracy.output_diff import TOLERANCES
from tracker.measure.accuracy.task_diff import TaskTolerance, tolerance_for
from tracker.measure.attempt import Attempt, AttemptResult, MeasureConfig, check_name
from tracker.measure.costmodel.machine import MachinePeaks
from tracker.measure.runtimes.ort_runtime import SessionConfig
from tracker.optimize import Context, Entry, ModelInfo, get_entry
from tracker.outcome import Failed, Outcome
from tracker.pipeline import AttemptSetup, StudySetup, log_failure, machine_params, measure_machine_or_none
from tracker.report.rows import AttemptRow, pick_best
from tracker.report.scenarios import scenario_bests
from tracker.search import SearchConfig, SearchResult
from tracker.search.cache import MadeModels
from tracker.search.result import Strategy
from tracker.search.run import ForwardSearch
from tracker.store.registering import check_registry
from tracker.study.candidates import PREPARED, attempt_of, lineage_tags, make_candidate
from tracker.study.context import StudyContext
from tracker.study.register import Registered, register_best
from tracker.summary import log_end, log_search_candidates

logger = logging.getLogger(__name__)


class Study:
    """A parent MLflow run holding one nested run per optimization attempt.

    The first attempt of each runtime that succeeds is that runtime's baseline (`runtime_baselines`): later
    attempts of the runtime are compared with it (outputs, latency, per-op profile, graph). The first attempt
    of a second runtime has its outputs compared with the first runtime's baseline (a cross-runtime check).

    The attempts are measured by an `Executor`: here, or given `cluster` (a Ray address) on the cluster's nodes
    (`tracker.cluster`): `optimize` then sends each candidate and returns `Pending` at once, `attempt` waits for its
    runs, and `wait` (or the end of the `with` block) for every one; `rows` are the runs', and at the end `results`
    the driver's view (no figures).

    With `register` (a registered model's name), the study's best passing attempt becomes a new version of it at the
    end (`tracker.study.register`): alias `candidate` moves to it, `champion` only when it measures better than the
    champion here; `registered` says what was done.

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
        params: Mapping[str, str] | None = None,
        tracking_uri: str | None = None,
        log_models: bool = True,
        setup: StudySetup | None = None,
        cluster: str | None = None,
        executor: Executor | None = None,
        register: str | None = None,
    ) -> None:
        check_name("study", name)
        if experiment:
            check_experiment_name(experiment)
        if register is not None:
            check_registered_model_name(register)  # before any work
        self.register = register
        self.registered: Registered | None = None  # what registering did, once the study has ended
        setup = setup or StudySetup()
        self._executor = executor or executor_for(cluster, study=name, feeds=feeds)
        self._executor.capabilities.check(*[need for need, used in ((GENERATION, setup.generation),
                                                                    (TEXT, setup.quality)) if used is not None])
        self.name, self.feeds, self.experiment = name, dict(feeds), experiment
        self.config, self.params = config or MeasureConfig(), dict(params or {})
        self.tracking_uri, self.log_models = tracking_uri, log_models
        self.setup, self.tags, self.generation = setup, dict(setup.tags), setup.generation
        self._context = StudyContext(name, experiment=experiment, tracking_uri=tracking_uri, workdir=setup.workdir,
                                     tags=self.tags)
        self.made = MadeModels()  # what a search made of its leaders, for `optimize` to measure
        self.failures: dict[str, str] = {}  # attempts that failed before they could be measured
        self._graphs: dict[str, onnx.ModelProto] = {}  # `graph_of`
        self.steps = StepTimes()  # the study's own work; each attempt has its own
        self._started = time.perf_counter()
        if setup.prior_steps is not None:  # work done for the study before it started (e.g. an export)
            self.steps.add(setup.prior_steps)
            self._started -= sum(setup.prior_steps.seconds.values())
        self.machine: MachinePeaks | None = None  # the roofs of every attempt's roofline, measured on entry
        self.search_result: SearchResult | None = None  # `search`, `record_search`

    def __enter__(self) -> Study:
        self._context.prepare()  # the store, the outbox and SIGTERM, before any work
        try:
            if self.register is not None:
                check_registry()  # a file store has none: a one-line error before any work
            self._executor.connect()  # an unreachable cluster: a one-line error before any work
            self._context.make_work_folder()
            with self.steps.step("machine"):
                self.machine = measure_machine_or_none()
            self.run = self._context.open_run({**self.config.params(), **machine_params(self.machine), **self.params})
        except BaseException:  # `with` calls no __exit__ when __enter__ fails: undo what was set up here
            self._context.release()
            raise
        logger.info("study %s: run %s", self.name, self.run.info.run_id)
        return self

    def attempt(self, name: str | Attempt, model: onnx.ModelProto | str | Path | None = None, *,
                tags: Mapping[str, str] | None = None, generation: GenerationFigures | None = None,
                **kwargs) -> AttemptResult:
        """Measures and logs one attempt as a nested run; a failure is logged and returned, not raised.

        With a generation scenario, the study's first attempt (its baseline) also generates with the decode-ready
        export as it is (`tracker.generation`).

        Args:
            name: the attempt's name, or a ready `Attempt` (then `model` and `kwargs` must be absent).
            model: the model, in memory or as a path.
            tags: the run's tags on top of the study's (e.g. a chain's lineage).
            generation: what the generation scenario measured for this attempt (`optimize` passes it).
            **kwargs: other `Attempt` fields (runtime, session, new_ops, tolerance, description, ...).
        """
        self._context.check_open("adding attempts")
        if isinstance(name, Attempt):
            attempt = name
        elif model is None:
            raise ValueError(f"attempt {name!r} needs a model: a ModelProto or the path of one")
        else:
            attempt = Attempt(name=name, model=model if isinstance(model, onnx.ModelProto) else Path(model), **kwargs)
        if generation is None and self.generation is not None and self.generation.baseline is None:
            with self.steps.step("generation"):
                generation = self.generation.measure_baseline(machine=self.machine,
                                                              workdir=self._work / "generation" / attempt.name)
        return self._executor.result(self._submit(attempt, tags, generation))  # on a cluster, waits for its runs

    def _submit(self, attempt: Attempt, tags: Mapping[str, str] | None,
                generation: GenerationFigures | None) -> Outcome:
        """`attempt` measured and logged as this study's (here, or sent), with `tags` on top of the study's."""
        setup = AttemptSetup(config=self.config, study=self.name, evaluate=self.setup.evaluate, log_model=self.log_models,
                             latency_feeds=self.setup.latency_feeds, tags={**self.tags, **(tags or {})},
                             machine=self.machine, quality=self.setup.quality, parent_run_id=self.run.info.run_id,
                             experiment_id=self.run.info.experiment_id)
        return self._executor.submit(attempt, setup, workdir=self._work / attempt.name, generation=generation)

    @property
    def results(self) -> list[AttemptResult]:
        """Each attempt measured, in order (on a cluster: the driver's view, once the study has ended)."""
        return self._executor.results

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
    ) -> Outcome:
        """Runs the registry entry `entry` on `source`, then measures and logs what it made as one attempt.

        An entry that does not apply to `source`, or that raises, is logged as a FAILED attempt carrying
        the reason, and returned as `Failed`; the study goes on. A model a search made of `source` with `entry` (kept
        in `made`) is measured as it is, not made again.

        Returns:
            `Measured` (its `result`), `Failed` (why), or, on a cluster, `Pending` (sent to the nodes).

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
        self._context.check_open("adding attempts")
        found = get_entry(entry) if isinstance(entry, str) else entry
        name = name or found.name
        check_name("attempt", name)
        context = Context(info=info, runtime=runtime, feeds=self.feeds, work=self._work / PREPARED)
        logger.info("study %s: optimizing %s (%s)", self.name, name, found.summary)
        try:
            candidate, seconds, source_path = make_candidate(found, source, name=name, work=self._work, context=context,
                                                             made=self.made, graph_of=self.graph_of, steps=self.steps)
        except Exception as e:  # an optimizer failure is a result of the study, logged on its own run
            reraise_if_received(e)
            self.record_failure(name, e, runtime=runtime, tags={**lineage_tags(found), **(tags or {})})
            return Failed(name, self.failures[name])
        attempt = attempt_of(found, candidate, seconds, name=name, source=source, source_path=source_path,
                             runtime=runtime, session=session, tolerance=tolerance, fields=fields)
        generation = None
        if self.generation is not None and self.generation.baseline is not None:
            with self.steps.step("generation"):
                generation = self.generation.measure_entry(found, machine=self.machine, graph_of=self.graph_of,
                                                           workdir=self._work / "generation" / name)
        # On a cluster, sent: the study makes its next candidate while the nodes measure this one.
        return self._submit(attempt, {**lineage_tags(found), **(tags or {})}, generation)

    def search(
        self,
        source: str | Path,
        *,
        config: SearchConfig | None = None,
        info: ModelInfo | None = None,
        session: SessionConfig | None = None,
        tolerance: TaskTolerance | Mapping[str, TaskTolerance] = TOLERANCES,
    ) -> SearchResult:
        """Searches the registry's entries, knobs and chains for the fastest variant of `source` that passes its check
        (`ForwardSearch`), screening here or on the study's cluster. The leaders become attempt runs, the other timed
        candidates light runs ("candidate"), every candidate a row of `report/search.html`. Returns what it did; the
        answer is `study.best`."""
        self._context.check_open("searching")
        session = session or SessionConfig()
        baseline = self._search_baseline(Path(source), session, tolerance_for(tolerance, "fp32"))
        with self.steps.step("search"):
            return self.run_strategy(ForwardSearch(
                Path(source), feeds=self.feeds, baseline=baseline.attempt, baseline_outputs=baseline.outputs,
                tolerance=tolerance, made=self.made, workdir=self._work / "search", config=config or SearchConfig(),
                info=info, session=session, full_attempt_s=sum(baseline.steps.seconds.values()) or 60.0,
                prepared=self._work / PREPARED, text=self.setup.quality, remote=self._executor.remote,
                profile=baseline.profile,
            ), source, info=info, session=session, tolerance=tolerance)

    def run_strategy(self, strategy: Strategy, source: str | Path, *, info: ModelInfo | None = None,
                     session: SessionConfig | None = None,
                     tolerance: TaskTolerance | Mapping[str, TaskTolerance] = TOLERANCES) -> SearchResult:
        """Runs a search `strategy`: each candidate it proposes is applied to `source` and measured in full as an
        attempt (`optimize`, with `info`, `session` and `tolerance`), and its outcome handed back; then its result is
        kept for the report (`record_search`)."""
        for proposal in strategy.proposals():
            strategy.record(proposal, self.optimize(proposal.entry, source, info=info, session=session,
                                                    tolerance=tolerance, tags=proposal.tags))
        return self.record_search(strategy.result())

    def record_search(self, result: SearchResult) -> SearchResult:
        """Keeps a search's `result` for the report, its candidates timed only on the screen logged as light runs."""
        self.search_result = result
        log_search_candidates(result, study=self.name, study_run=self.run)
        return result

    def _search_baseline(self, source: Path, session: SessionConfig, tolerance: TaskTolerance) -> AttemptResult:
        """The onnxruntime baseline with its outputs on the feeds, measured if the study has none."""
        baseline = self._executor.baseline("onnxruntime")
        if baseline is None:
            measured = self.attempt("baseline", source, session=session, tolerance=tolerance,
                                    description=f"{source.name} as given")
            if not measured.ok:
                raise ValueError(f"the baseline failed, so nothing can be compared with it: {measured.error}")
            baseline = self._executor.baseline("onnxruntime") or measured
        return baseline

    @property
    def _work(self) -> Path:  # the study's work folder (made on entry when none was given)
        return self._context.work

    def graph_of(self, path: str | Path) -> onnx.ModelProto:
        """The model at `path` without its weights' values (`load_graph`), read once per study."""
        key = str(Path(path).resolve())
        if key not in self._graphs:
            self._graphs[key] = load_graph(path)
        return self._graphs[key]

    def record_failure(self, name: str, error: BaseException, *, runtime: str = "onnxruntime",
                       tags: Mapping[str, str] | None = None) -> None:
        """Logs an attempt that failed before it had a model to measure (e.g. its optimizer raised)."""
        self._context.check_open("adding attempts")
        self.failures[name] = log_failure(self.name, name, error, runtime=runtime, tags={**self.tags, **(tags or {})},
                                          parent_run_id=self.run.info.run_id, experiment_id=self.run.info.experiment_id)

    def rows(self, *, tables: bool = False) -> list[AttemptRow]:
        """The study's rows (per-op tables if `tables`): its attempts', or a cluster's runs', then `failures`'."""
        return self._executor.rows(self.failures, skip_runs=self.config.skip_runs, tables=tables)

    def wait(self) -> None:  # for the attempts a cluster's nodes are measuring, logging each
        self._executor.wait()

    @property
    def best(self) -> AttemptResult | None:
        """The attempt to ship: the largest speed-up among those that passed their accuracy check and
        are faster than their baseline beyond the noise ("better"), else the first baseline (`pick_best`). On a
        cluster: None until the study ends, then the driver's result (no figures: `rows` have them)."""
        name = pick_best(self.rows())
        return next((r for r in self.results if r.attempt.name == name), None)

    @property
    def scenario_bests(self) -> dict[Phase, str | None]:
        """The best attempt's name per scenario measured: forward (`best`), prefill and decode (`scenario_bests`)."""
        return scenario_bests(self.rows())

    def step_totals(self) -> tuple[StepTimes, float]:
        """Seconds per step over the study and its attempts (on a cluster, the nodes' summed: they overlap), and the
        study's wall time so far."""
        totals = StepTimes()
        totals.add(self.steps)
        totals.add(self._executor.measuring_steps())
        return totals, time.perf_counter() - self._started

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            self._executor.finish(exc)  # a cluster waits for its nodes, or ends what they measure as FAILED runs
        except BaseException as e:  # Ctrl-C while waiting: the study ends as if it had landed in the block
            self._end(type(e), e, e.__traceback__)
            raise
        self._end(exc_type, exc, tb)

    def _end(self, exc_type, exc, tb) -> None:
        """The summary and report on the study run (unless the study is unwinding from `exc`), then its end."""
        try:
            if exc_type is None:
                log_end(self.rows, *self.step_totals(), study=self.name, run_id=self.run.info.run_id,
                        folder=self._work / "report", results=self.results, machine=self.machine,
                        search=self.search_result)
                if self.register is not None:
                    self.registered = register_best(self.best, name=self.register, study=self.name,
                                                    study_run_id=self.run.info.run_id, feeds=self.feeds,
                                                    config=self.config.speedup, workdir=self._work / "register")
        finally:
            self._context.close(exc_type, exc, tb)


