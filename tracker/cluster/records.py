"""What the driver keeps of a cluster study's runs once they are logged: each record's row (built from its metrics,
tags and tables by `row_from_content`, as `tracker compare` builds a row from the run), what each attempt came to,
and which node's baseline is each node type's baseline row."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from tracker.base.keys import TAG_NODE_TYPE
from tracker.measure.attempt import Logged
from tracker.profile import columns as C
from tracker.report.rows import AttemptRow, row_from_content
from tracker.run.record import AttemptRecord

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


