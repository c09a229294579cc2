"""A study's attempts as report rows, the best-attempt rule, and the report's tables (op type x attempt)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pandas as pd

from tracker.measure.graph_stats import DELTA, diff_graphs
from tracker.keys import STATUS_DIFF_FAILED, STATUS_FAILED, STATUS_OK
from tracker.profile import columns as C
from tracker.profile.columns import OP_TYPE  # also the first column of the wide tables (op type x attempt)

if TYPE_CHECKING:
    from tracker.measure.attempt import AttemptResult

# Columns of the attempts table (one row per attempt).
ATTEMPT = "attempt"
RUNTIME = "runtime"
STATUS = "status"  # STATUS_OK, STATUS_DIFF_FAILED or STATUS_FAILED (as the `tracker.status` tag)
VERDICT = "verdict"  # "baseline" or one of tracker.measure.speedup.VERDICTS; None when the attempt failed
BEST = "best"
P50_MS = "p50_ms"
SPEEDUP = "speedup"
SPEEDUP_CI_LOW = "speedup_ci_low"
SPEEDUP_CI_HIGH = "speedup_ci_high"
SPEEDUP_MDE = "speedup_mde"  # smallest change the speed-up measurement could detect (0.03 = 3 %)
DISTURBED = "disturbed"  # measuring steps other processes disturbed ("latency,profiling"), else None
DIFF_PASSED = "diff_passed"
DIFF_MAX_ABS = "diff_max_abs"
TOP1 = "top1_agreement"  # language-model checks only
SIZE_BYTES = "size_bytes"
NODE_COUNT = "node_count"
ERROR = "error"
RUN_ID = "run_id"
ATTEMPT_COLUMNS = (ATTEMPT, RUNTIME, STATUS, VERDICT, BEST, P50_MS, SPEEDUP, SPEEDUP_CI_LOW, SPEEDUP_CI_HIGH,
                   SPEEDUP_MDE, DISTURBED, DIFF_PASSED, DIFF_MAX_ABS, TOP1, SIZE_BYTES, NODE_COUNT, ERROR, RUN_ID)

TABLES = ("attempts", "ops_by_attempt", "graph_changes_by_attempt")


@dataclass(frozen=True)
class AttemptRow:
    """What the report shows of one attempt, whether it comes from memory or from MLflow.

    `ops_by_op` is the attempt's per-op-type summary (`tracker.profile.columns.SUMMARY_COLUMNS`, warm-up runs
    dropped) and `graph_diff` its node counts against its baseline (`graph_stats.diff_graphs`); either is
    None when the attempt has none (it failed, or the run predates them).
    """

    attempt: str
    runtime: str | None = None
    status: str = STATUS_OK
    verdict: str | None = None
    p50_ms: float | None = None
    speedup: float | None = None
    speedup_ci_low: float | None = None
    speedup_ci_high: float | None = None
    speedup_mde: float | None = None
    disturbed: str | None = None
    diff_passed: bool | None = None
    diff_max_abs: float | None = None
    top1_agreement: float | None = None
    size_bytes: int | None = None
    node_count: int | None = None
    error: str | None = None
    run_id: str | None = None
    ops_by_op: pd.DataFrame | None = field(default=None, repr=False, compare=False)
    graph_diff: pd.DataFrame | None = field(default=None, repr=False, compare=False)

    @property
    def failed(self) -> bool:
        return self.status == STATUS_FAILED or self.error is not None


def rows_from_results(
    results: Sequence[AttemptResult], *, failures: Mapping[str, str] | None = None, skip_runs: int = 0
) -> list[AttemptRow]:
    """Rows of a study's attempts as measured in this process (`Study.results`, `Study.failures`).

    Args:
        results: the attempts, in order; the first of each runtime whose verdict is "baseline" is
            the reference of that runtime's graph changes.
        failures: attempts that failed before they had a model, name -> error text.
        skip_runs: warm-up runs left out of the per-op times (the study's `MeasureConfig.skip_runs`).
    """
    baselines: dict[str, AttemptResult] = {}
    for r in results:
        if r.ok and r.verdict == "baseline":
            baselines.setdefault(r.attempt.runtime, r)
    rows = []
    for r in results:
        base = baselines.get(r.attempt.runtime)
        graph_diff = diff_graphs(base.graph, r.graph) if base is not None and base.graph and r.graph else None
        diff, speedup = r.diff, r.speedup
        rows.append(AttemptRow(
            attempt=r.attempt.name,
            runtime=r.attempt.runtime,
            status=STATUS_FAILED if not r.ok else (STATUS_OK if diff is None or diff.passed else STATUS_DIFF_FAILED),
            verdict=r.verdict if r.ok else None,
            p50_ms=r.latency.p50_ms if r.latency else None,
            speedup=speedup.speedup if speedup else (1.0 if r.verdict == "baseline" else None),
            speedup_ci_low=speedup.ci_low if speedup else (1.0 if r.verdict == "baseline" else None),
            speedup_ci_high=speedup.ci_high if speedup else (1.0 if r.verdict == "baseline" else None),
            speedup_mde=speedup.mde if speedup else None,
            disturbed=",".join(r.disturbed_steps) or None,
            diff_passed=bool(diff.passed) if diff is not None else None,
            diff_max_abs=float(diff.max_abs) if diff is not None else None,
            top1_agreement=getattr(diff, "top1_agreement", None),
            size_bytes=r.graph.size_bytes if r.graph else None,
            node_count=r.graph.node_count if r.graph else None,
            error=r.error,
            run_id=r.run_id,
            ops_by_op=r.summary(by="op", skip_runs=skip_runs) if r.ok and r.profile is not None else None,
            graph_diff=graph_diff,
        ))
    rows += [AttemptRow(attempt=name, status=STATUS_FAILED, error=error) for name, error in (failures or {}).items()]
    return rows


def pick_best(rows: Iterable[AttemptRow]) -> str | None:
    """The attempt to ship among report rows (see `best_attempt`)."""
    return best_attempt((r.attempt, r.verdict, r.speedup) for r in rows)


def best_attempt(candidates: Iterable[tuple[str, str | None, float | None]]) -> str | None:
    """The attempt to ship, from (name, verdict, speed-up) in study order: the largest speed-up among
    the "better" ones (faster beyond the noise, accuracy check passed), else the first baseline, else None.

    The one rule behind `Study.best`, the report's highlighted row, `tracker compare` and `tracker upload`.
    """
    candidates = list(candidates)
    better = [(name, speedup) for name, verdict, speedup in candidates if verdict == "better" and speedup is not None]
    if better:
        return max(better, key=lambda c: c[1])[0]
    return next((name for name, verdict, _ in candidates if verdict == "baseline"), None)


def attempts_table(rows: Sequence[AttemptRow], *, best: str | None = None) -> pd.DataFrame:
    """One row per attempt, columns `ATTEMPT_COLUMNS` (`best` marks the attempt named `best`)."""
    records = [{c: getattr(r, c) for c in ATTEMPT_COLUMNS if c != BEST} | {BEST: r.attempt == best} for r in rows]
    table = pd.DataFrame(records, columns=list(ATTEMPT_COLUMNS))
    return table.astype({SIZE_BYTES: "Int64", NODE_COUNT: "Int64"})


def ops_by_attempt(rows: Sequence[AttemptRow]) -> pd.DataFrame:
    """Profiled µs per run of each op type (rows) in each attempt (columns), slowest op types first.

    An op type an attempt does not run is NaN in its column; attempts without a profile have no column.
    """
    columns = {label: r.ops_by_op.set_index(C.KEY)[C.US_PER_RUN]
               for label, r in zip(attempt_labels(rows), rows) if r.ops_by_op is not None}
    return _wide(columns, sort_by=lambda t: t.max(axis=1))


def graph_changes_by_attempt(rows: Sequence[AttemptRow]) -> pd.DataFrame:
    """Node count change against the baseline per op type (rows) and attempt (columns).

    Only op types that some attempt changed are listed, the most changed first.
    """
    columns = {label: r.graph_diff.set_index(OP_TYPE)[DELTA]
               for label, r in zip(attempt_labels(rows), rows) if r.graph_diff is not None}
    table = _wide(columns, sort_by=lambda t: t.abs().max(axis=1))
    labels = [c for c in table.columns if c != OP_TYPE]
    # an op type missing from one runtime's diff is in neither of its graphs: unchanged there
    table[labels] = table[labels].fillna(0).astype(int)
    return table[table[labels].ne(0).any(axis=1)].reset_index(drop=True)


def report_tables(rows: Sequence[AttemptRow], *, best: str | None) -> dict[str, pd.DataFrame]:
    """The three tables of the report, by name (`TABLES`)."""
    return {"attempts": attempts_table(rows, best=best), "ops_by_attempt": ops_by_attempt(rows),
            "graph_changes_by_attempt": graph_changes_by_attempt(rows)}


def attempt_labels(rows: Sequence[AttemptRow]) -> list[str]:
    """Column labels of the attempts: their names, made unique with the run id when names repeat."""
    names = [r.attempt for r in rows]
    return [n if names.count(n) == 1 else f"{n} ({(r.run_id or str(i))[:8]})"
            for i, (n, r) in enumerate(zip(names, rows))]


def _wide(columns: Mapping[str, pd.Series], *, sort_by) -> pd.DataFrame:
    if not columns:
        return pd.DataFrame({OP_TYPE: pd.Series(dtype=str)})
    table = pd.DataFrame({label: s.groupby(level=0).sum() for label, s in columns.items()})
    order = pd.DataFrame({"_v": sort_by(table).fillna(0).to_numpy(), "_k": table.index.astype(str)},
                         index=table.index).sort_values(["_v", "_k"], ascending=[False, True]).index
    table = table.loc[order]
    table.index = table.index.astype(str)
    return table.rename_axis(OP_TYPE).reset_index().astype({OP_TYPE: str})
