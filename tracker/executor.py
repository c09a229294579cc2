"""Where a study's attempts are measured: here (`LocalExecutor`) or on a Ray cluster's nodes (`ClusterExecutor`).

The study submits each attempt and gets an `Outcome` back through one interface; what an executor cannot measure it
says once, in its `Capabilities`, and the study refuses such a setup before any work.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from tracker.base.steps import StepTimes
from tracker.cluster.driver import Fanout
from tracker.generation import GenerationFigures
from tracker.measure.attempt import Attempt, AttemptResult
from tracker.outcome import Failed, Measured, Outcome, Pending, outcome_of
from tracker.pipeline import AttemptSetup, log_measured, measure_record
from tracker.report.rows import AttemptRow, failed_row, runtime_baselines
from tracker.run.content import rows_from_results
from tracker.search.screen import outputs_of
from tracker.search.screening import Remote

GENERATION = "a generation scenario"  # `StudySetup.generation`: a decode-ready export, a KV cache
TEXT = "a check on real text"  # `StudySetup.quality`: an LM scored on its tokenizer's text


@dataclass(frozen=True)
class Capabilities:
    """What an executor can measure besides an attempt's forward pass: the needs it `lacks` (`GENERATION`, `TEXT`)."""

    where: str
    lacks: frozenset[str] = frozenset()

    def check(self, *needs: str, fix: str = "run it on one machine") -> None:
        """Raises ValueError naming the first of `needs` this executor lacks, and `fix`."""
        missing = next((need for need in needs if need in self.lacks), None)
        if missing is not None:
            raise ValueError(f"{missing} is not supported on {self.where} yet: {fix}")


HERE = Capabilities("this machine")
ON_A_CLUSTER = Capabilities("a cluster", frozenset({GENERATION, TEXT}))


class Executor(Protocol):
    """Measures a study's attempts and keeps what it learnt of them (`results`, in the order they were measured)."""

    capabilities: Capabilities
    results: list[AttemptResult]

    @property
    def remote(self) -> Remote | None:  # where a search's screens run; None: here
        ...

    def connect(self) -> None:  # before any work: an executor that cannot be used says so in one line
        ...

    def submit(self, attempt: Attempt, setup: AttemptSetup, *, workdir: Path,
               generation: GenerationFigures | None = None) -> Outcome:
        """Measures `attempt` (and logs it), or sends it where it will be: `Pending` until then."""
        ...

    def result(self, outcome: Outcome) -> AttemptResult:  # waits for a pending one
        ...

    def baseline(self, runtime: str) -> AttemptResult | None:  # `runtime`'s baseline, with its outputs on the feeds
        ...

    def rows(self, failures: Mapping[str, str], *, skip_runs: int, tables: bool) -> list[AttemptRow]:
        ...

    def measuring_steps(self) -> StepTimes:  # seconds per step over every measurement
        ...

    def wait(self) -> None:  # until every attempt sent is logged
        ...

    def finish(self, error: BaseException | None) -> None:  # the study's end (`error`: what it unwinds from)
        ...


class LocalExecutor:
    """Measures each attempt here, at once, against the first attempt of its runtime (`runtime_baselines`)."""

    capabilities = HERE
    remote = None

    def __init__(self, feeds: Mapping[str, np.ndarray]) -> None:
        self.feeds = dict(feeds)
        self.results: list[AttemptResult] = []

    def connect(self) -> None:
        pass

    def submit(self, attempt: Attempt, setup: AttemptSetup, *, workdir: Path,
               generation: GenerationFigures | None = None) -> Measured | Failed:
        measured = measure_record(attempt, self.feeds, setup, baselines=runtime_baselines(self.results),
                                  workdir=workdir, generation=generation)
        result = log_measured(measured, setup)
        self.results.append(result)
        return outcome_of(result)

    def result(self, outcome: Outcome) -> AttemptResult:
        return _result_here(outcome)

    def baseline(self, runtime: str) -> AttemptResult | None:
        return runtime_baselines(self.results).get(runtime)

    def rows(self, failures: Mapping[str, str], *, skip_runs: int, tables: bool) -> list[AttemptRow]:
        return rows_from_results(self.results, failures=failures, skip_runs=skip_runs, tables=tables)

    def measuring_steps(self) -> StepTimes:
        return _summed([r.steps for r in self.results])

    def wait(self) -> None:
        pass

    def finish(self, error: BaseException | None) -> None:
        pass


class ClusterExecutor:
    """Sends each attempt to a Ray cluster's nodes (`Fanout`) and returns `Pending` at once; the driver logs the
    nodes' runs as they come back. `results` holds the driver's view (no figures: the rows have them) once the study
    ends."""

    capabilities = ON_A_CLUSTER

    def __init__(self, address: str, *, study: str, feeds: Mapping[str, np.ndarray]) -> None:
        self.fanout = Fanout(address, study=study, feeds=feeds)  # a malformed address fails here, before any work
        self.feeds = dict(feeds)
        self.results: list[AttemptResult] = []

    @property
    def remote(self) -> Remote:
        return self.fanout

    def connect(self) -> None:
        self.fanout.connect()

    def submit(self, attempt: Attempt, setup: AttemptSetup, *, workdir: Path,
               generation: GenerationFigures | None = None) -> Pending:
        if generation is not None:
            self.capabilities.check(GENERATION)
        return Pending(attempt.name, self.fanout.submit(attempt, setup))

    def result(self, outcome: Outcome) -> AttemptResult:
        return self.fanout.result(outcome.ticket) if isinstance(outcome, Pending) else _result_here(outcome)

    def baseline(self, runtime: str) -> AttemptResult | None:
        sent = self.fanout.baseline(runtime)
        if sent is None:
            return None
        return AttemptResult(attempt=sent, outputs=outputs_of(sent, self.feeds))  # the nodes' runs hold no outputs

    def rows(self, failures: Mapping[str, str], *, skip_runs: int, tables: bool) -> list[AttemptRow]:
        return self.fanout.rows() + [failed_row(name, error) for name, error in failures.items()]

    def measuring_steps(self) -> StepTimes:  # the nodes' summed: they overlap in time
        return _summed([self.fanout.steps] + [r.steps for r in self.results])

    def wait(self) -> None:
        self.fanout.wait()

    def finish(self, error: BaseException | None) -> None:  # waits for the nodes, or ends what they measure FAILED
        self.results += self.fanout.finish(error)


def executor_for(cluster: str | None, *, study: str, feeds: Mapping[str, np.ndarray]) -> Executor:
    """Here, or on the Ray cluster at `cluster`."""
    return ClusterExecutor(cluster, study=study, feeds=feeds) if cluster else LocalExecutor(feeds)


def _result_here(outcome: Outcome) -> AttemptResult:
    """The result an outcome holds (a measured one's, or a failed measurement's)."""
    if outcome.result is None:
        raise ValueError(f"attempt {outcome.name!r} has no result here: {outcome}")
    return outcome.result


def _summed(steps: list[StepTimes]) -> StepTimes:
    total = StepTimes()
    for each in steps:
        total.add(each)
    return total
