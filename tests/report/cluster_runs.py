"""Studies logged as a cluster would log them, on a real sqlite MLflow store: each attempt run's record (metrics,
tags, as a worker returns it) logged by the driver's `log_or_keep`, tagged with the node it ran on, then the
study's summary and report as `Study.__exit__` logs them. No ONNX Runtime: the figures are given, so each node
type's best attempt is known."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import pytest

from tests.conftest import isolate_mlflow, new_sqlite_store
from tracker.base.keys import (
    ROLE_NODE_BASELINE,
    TAG_NODE,
    TAG_NODE_TYPE,
    TAG_ROLE,
    TAG_STATUS,
    TAG_VERDICT,
)
from tracker.base.vocabulary import RunStatus, Status, Verdict
from tracker.measure import schema
from tracker.measure.timing.speedup import Speedup
from tracker.pipeline import log_or_keep
from tracker.run.record import OUTBOX_ENV, AttemptRecord

# Node -> its node type. Node type "cpu-a" has two nodes: node-a2's own baseline is a `node_baseline` run.
NODES = {"node-a1": "cpu-a", "node-a2": "cpu-a", "node-b1": "cpu-b"}


@dataclass(frozen=True)
class Run:
    """One attempt run: where it ran, its verdict and speed-up (None: it crashed)."""

    attempt: str
    node: str | None
    verdict: Verdict | None
    speedup: float | None = None
    p50_ms: float = 1.0
    role: str | None = None


# Logged in this order, as a cluster finishes them (the node types interleaved). On cpu-a int8 is the best
# (1.8x); on cpu-b int8 is slower and fused is the best (1.3x); over all rows int8's 1.8x is the largest.
RUNS = (
    Run("baseline", "node-a1", Verdict.BASELINE, 1.0, 2.0),
    Run("baseline", "node-b1", Verdict.BASELINE, 1.0, 3.0),
    Run("baseline", "node-a2", Verdict.BASELINE, 1.0, 2.1, role=ROLE_NODE_BASELINE),
    Run("int8", "node-a2", Verdict.BETTER, 1.8, 1.1),
    Run("int8", "node-b1", Verdict.WORSE, 0.7, 4.3),
    Run("fused", "node-b1", Verdict.BETTER, 1.3, 2.3),
    Run("fused", "node-a1", Verdict.BETTER, 1.2, 1.7),
    Run("broken", "node-a1", None),
    Run("broken", "node-b1", None),
    Run("unexportable", None, None),  # failed where candidates are made, before it reached a node
)
# What the report and `compare` show of RUNS: (attempt, node type), grouped by type, the types in the order
# they first appear, the attempt that never reached a node last.
SHOWN = [("baseline", "cpu-a"), ("int8", "cpu-a"), ("fused", "cpu-a"), ("broken", "cpu-a"),
         ("baseline", "cpu-b"), ("int8", "cpu-b"), ("fused", "cpu-b"), ("broken", "cpu-b"), ("unexportable", None)]
BEST = {"cpu-a": "int8", "cpu-b": "fused"}
# A cluster of one node type (node-a1 and node-a2), and the same study run locally (no node_baseline run there).
ONE_TYPE_RUNS = tuple(r for r in RUNS if r.node != "node-b1")
LOCAL_RUNS = tuple(r for r in ONE_TYPE_RUNS if r.role is None)


@dataclass(frozen=True)
class LoggedStudy:
    uri: str
    study_run_id: str
    run_ids: list[str] = field(default_factory=list)  # in the order of the runs logged


def _record(run: Run, study: str, nodes: dict[str, str] | None) -> AttemptRecord:
    """The record a worker returns for `run`: its figures, and where it ran when `nodes` says (else a local run)."""
    tags: dict[str, str] = {}
    if nodes is not None and run.node is not None:
        tags |= {TAG_NODE: run.node, TAG_NODE_TYPE: nodes[run.node]}
    if run.role is not None:
        tags[TAG_ROLE] = run.role
    if run.verdict is None:
        return AttemptRecord(run.attempt, study, "onnxruntime", status=RunStatus.FAILED,
                             tags=tags | {TAG_STATUS: Status.FAILED}, error=f"RuntimeError: {run.attempt} failed")
    assert run.speedup is not None
    width = 0.0 if run.verdict == Verdict.BASELINE else 0.1
    speedup = Speedup(run.speedup, run.speedup - width, run.speedup + width, 0.95, 8, rounds=4, mde=0.03)
    metrics = {schema.P50_MS: run.p50_ms, schema.DIFF_PASSED: 1.0, schema.DIFF_MAX_ABS: 1e-6,
               **schema.speedup_metrics(speedup)}
    return AttemptRecord(run.attempt, study, "onnxruntime", metrics=metrics,
                         tags=tags | {TAG_STATUS: Status.OK, TAG_VERDICT: run.verdict})


def log_cluster_study(tmp_path_factory, name: str, runs: tuple[Run, ...], nodes: dict[str, str] | None, *,
                      summary: bool = True) -> LoggedStudy:
    """Logs `runs` as study `name` (in experiment `name`), with the node tags `nodes` gives, and, unless `summary` is
    False (a study whose end the store missed, for `tracker upload` to finish), the study's summary and report as
    `Study.__exit__` does: counts, best and tags from the rows of every run it logged."""
    from tracker import compare
    from tracker.report.rows import pick_best, study_counts
    from tracker.report.scenarios import scenario_tags
    from tracker.report.study import build_study_report
    from tracker.store import read, write
    from tracker.store.summary import log_study_report, log_study_summary

    folder, uri, _ = new_sqlite_store(tmp_path_factory, name)
    with pytest.MonkeyPatch.context() as mp:
        isolate_mlflow(mp)
        mp.setenv(OUTBOX_ENV, str(folder / "outbox"))
        mp.setenv("MLFLOW_TRACKING_URI", uri)
        with write.study_run(name, experiment=name, params={}, tags={}) as parent:
            ids = []
            for run in runs:
                record = _record(run, name, nodes)
                record.parent_run_id, record.experiment_id = parent.info.run_id, parent.info.experiment_id
                logged = log_or_keep(record)
                assert logged.run_id is not None, f"run {run} was not logged: {logged}"
                ids.append(logged.run_id)
                time.sleep(0.01)  # distinct start times: `compare` orders a study's runs by them
            if not summary:
                return LoggedStudy(uri, parent.info.run_id, ids)
            rows = [compare.row_from_run(r) for r in read.fetch_runs(ids, tables=())]
            best = pick_best(rows)
            log_study_summary(parent.info.run_id, metrics=study_counts(rows), best=best, tags=scenario_tags(rows))
            built = build_study_report(rows, folder / "report", study=name, best=best)
            log_study_report(parent.info.run_id, built.html, built.tables)
    return LoggedStudy(uri, parent.info.run_id, ids)
