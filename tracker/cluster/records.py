"""A cluster study's records as they come back from the nodes: each logged under the study run (else kept in the
outbox) as it comes, saying against which node's baseline it was judged (`StudyRecords`); and what the driver keeps of
the runs once they are logged (`RecordedRows`): each record's row (built from its metrics, tags and tables by
`row_from_content`, as `tracker compare` builds a row from the run), what each attempt came to, and which node's
baseline is each node type's baseline row."""

from __future__ import annotations

import logging
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from tracker.base.errors import RecordError
from tracker.base.files import make_work_folder
from tracker.base.keys import ROLE_NODE_BASELINE, TAG_NODE, TAG_NODE_TYPE, TAG_ROLE
from tracker.base.steps import StepTimes
from tracker.base.vocabulary import RunStatus
from tracker.cluster.measurers import Node, Task
from tracker.cluster.node import NodeInfo
from tracker.cluster.wire import Returned, unpack_record
from tracker.measure.attempt import Logged
from tracker.pipeline import AttemptSetup, log_or_keep
from tracker.profile import columns as C
from tracker.report.rows import AttemptRow, row_from_content
from tracker.run.content import attempt_params
from tracker.run.record import AttemptRecord

logger = logging.getLogger(__name__)

TAG_BASELINE_RUN = "tracker.baseline_run"  # an attempt's run: the run of the baseline it was judged against
TAG_RETRIED = "tracker.cluster.retried"  # an attempt measured again after its node died: why
ROW_TABLES = ("ops_by_op", "graph_diff")  # the per-op tables a row holds, from the record's `tables/<name>.csv`


@dataclass(frozen=True)
class Outcome:
    """Where one run of an attempt went, and its error when it failed."""

    error: str | None
    logged: Logged


class RecordedRows:
    """The rows and outcomes of the runs logged so far, by attempt number (the order the study sent them)."""

    def __init__(self) -> None:
        self._rows: list[tuple[int, str, AttemptRow]] = []  # attempt number, node type, row
        self._outcomes: dict[int, list[Outcome]] = {}
        self._type_baselines: set[tuple[str, str]] = set()

    def first_baseline(self, node_type: str, runtime: str) -> bool:
        """Whether a baseline of `runtime` measured on a node of `node_type` is the first one logged, so that type's
        baseline row (the others are tagged as nodes' own baselines)."""
        first = (node_type, runtime) not in self._type_baselines
        self._type_baselines.add((node_type, runtime))
        return first

    def add(self, seq: int, record: AttemptRecord, logged: Logged) -> None:
        """Keeps the row of a logged record (read before its folder goes) and its outcome."""
        tables = {}
        if record.artifact_dir:
            for name in ROW_TABLES:
                path = Path(record.artifact_dir) / "tables" / f"{name}.csv"
                if path.is_file():
                    tables[name] = pd.read_csv(path, dtype={C.KEY: str, C.OP_TYPE: str})
        row = row_from_content(record.attempt, metrics=record.metrics, tags=record.tags, runtime=record.runtime,
                               run_status=record.status, run_id=logged.run_id, tables=tables)
        self._rows.append((seq, record.tags.get(TAG_NODE_TYPE, ""), row))
        self._outcomes.setdefault(seq, []).append(Outcome(record.error, logged))

    def outcomes(self, seq: int) -> list[Outcome]:
        return list(self._outcomes.get(seq, []))

    def rows(self, node_types: Sequence[str]) -> list[AttemptRow]:
        """Every row, in study order; an attempt's rows in the order of `node_types`."""
        order = {t: i for i, t in enumerate(dict.fromkeys(node_types))}
        ranked = sorted(self._rows, key=lambda r: (r[0], order.get(r[1], len(order))))
        return [row for _, _, row in ranked]


class StudyRecords:
    """The records the nodes return, each logged under the study run as it comes back (else kept in the outbox), and
    the rows of those logged (`recorded`).

    Args:
        study: the study's name.
        steps: the nodes' measuring steps, summed: each record's steps, and its logging's, join them.
    """

    def __init__(self, study: str, steps: StepTimes) -> None:
        self.study = study
        self.steps = steps
        self.recorded = RecordedRows()
        self._node_baseline_runs: dict[tuple[str, str], str] = {}  # (node id, runtime) -> its baseline's run id
        self._work: Path | None = None  # where records are unpacked, then logged
        self._parent: tuple[str | None, str | None] = (None, None)  # the study run's id and experiment id

    def open(self, setup: AttemptSetup) -> None:
        """Makes the folder records are unpacked in, and takes the study run they are logged under from `setup`."""
        self._work = make_work_folder(f"tracker-{self.study}-records-")
        self._parent = (setup.parent_run_id, setup.experiment_id)

    def close(self) -> None:
        """Removes the records' folder."""
        if self._work is not None:
            shutil.rmtree(self._work, ignore_errors=True)

    def log_returned(self, task: Task, returned: Returned, node: Node) -> None:
        """Logs the record `node` returned for `task` (unpacked, logged, then removed); a record that cannot be read
        fails its attempt, and the study goes on. A baseline measured to the end gives `node` its runtime."""
        assert self._work is not None  # made when the nodes started
        folder = self._work / f"{task.job.seq}-{node.info.node_id[:12]}"
        try:
            try:
                record = unpack_record(returned.record, folder)
            except RecordError as e:  # the node's record is damaged: this attempt fails, the study goes on
                self.log_failed(task, f"its node returned a record that cannot be read: {e}", node=node.info)
                return
            self.steps.add(StepTimes(dict(returned.steps)))
            if task.job.baseline and record.status == RunStatus.FINISHED:
                node.runtimes.add(task.job.attempt.runtime)
            self.log(task, record, measured=True)
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def log(self, task: Task, record: AttemptRecord, *, measured: bool) -> None:
        """Logs a record under the study run (else keeps it in the outbox), saying against which baseline it was
        judged; its row joins the study's. A node's baseline that did not give its type's baseline row, or that
        its node did not measure to the end (`measured` False), is tagged as that node's own."""
        record.parent_run_id, record.experiment_id = self._parent
        runtime, node_id = task.job.attempt.runtime, record.tags.get(TAG_NODE)
        if task.job.baseline and not (measured and self.recorded.first_baseline(task.node_type, runtime)):
            record.tags[TAG_ROLE] = ROLE_NODE_BASELINE
        elif not task.job.baseline and node_id is not None and (node_id, runtime) in self._node_baseline_runs:
            record.tags[TAG_BASELINE_RUN] = self._node_baseline_runs[(node_id, runtime)]
        if task.retried is not None and record.status == RunStatus.FINISHED:
            record.tags[TAG_RETRIED] = task.retried[:500]
        logged = log_or_keep(record, steps=self.steps)  # its logging steps join the nodes' steps
        if task.job.baseline and node_id is not None and logged.run_id is not None:
            self._node_baseline_runs[(node_id, runtime)] = logged.run_id
        self.recorded.add(task.job.seq, record, logged)

    def log_failed(self, task: Task, why: str, *, node: NodeInfo | None = None) -> None:
        """Logs a FAILED run of an attempt the nodes did not measure, or not to the end, saying why."""
        attempt = task.job.attempt
        tags = {**task.job.tags, TAG_NODE_TYPE: task.node_type, **({TAG_NODE: node.node_id} if node else {})}
        record = AttemptRecord(attempt.name, self.study, attempt.runtime, status=RunStatus.FAILED, error=why,
                               params=attempt_params(attempt), tags=tags)
        logger.error("attempt %s failed: %s", attempt.name, why)
        self.log(task, record, measured=False)
