"""A study's attempts as rows (`AttemptRow`), the rules behind them (status, baseline, speed-ups, best attempt),
and the report's tables (op type x attempt)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pandas as pd

from tracker.base.keys import STATUS_DIFF_FAILED, STATUS_FAILED, STATUS_OK
from tracker.measure.graph_stats import DELTA, diff_graphs
from tracker.measure.timing.speedup import BASELINE_SPEEDUP, Speedup
from tracker.profile import columns as C
from tracker.profile.columns import OP_TYPE  # also the first column of the wide tables (op type x attempt)

if TYPE_CHECKING:
    from tracker.measure.attempt import AttemptResult

# Columns of the attempts table (one row per attempt).
ATTEMPT = "attempt"
RUNTIME = "runtime"
STATUS = "status"  # STATUS_OK, STATUS_DIFF_FAILED or STATUS_FAILED (as the `tracker.status` tag)
VERDICT = "verdict"  # "baseline" or one of tracker.measure.timing.speedup.VERDICTS; None when the attempt failed
BEST = "best"
P50_MS = "p50_ms"
SPEEDUP = "speedup"
SPEEDUP_CI_LOW = "speedup_ci_low"
SPEEDUP_CI_HIGH = "speedup_ci_high"
SPEEDUP_MDE = "speedup_mde"  # smallest change the speed-up measurement could detect (0.03 = 3 %)
SPEEDUP_VS_BASELINE = "speedup_vs_baseline"  # plain ratio of the two p50s (`speedup_vs_baseline`)
DISTURBED = "disturbed"  # measuring steps other processes disturbed ("latency,profiling"), else None
DIFF_PASSED = "diff_passed"
DIFF_MAX_ABS = "diff_max_abs"
TOP1 = "top1_agreement"  # language-model and classification checks
COSINE = "cosine_min"  # embedding checks
SIZE_BYTES = "size_bytes"
NODE_COUNT = "node_count"
ERROR = "error"
RUN_ID = "run_id"
ATTEMPT_COLUMNS = (ATTEMPT, RUNTIME, STATUS, VERDICT, BEST, P50_MS, SPEEDUP, SPEEDUP_CI_LOW, SPEEDUP_CI_HIGH,
                   SPEEDUP_MDE, SPEEDUP_VS_BASELINE, DISTURBED, DIFF_PASSED, DIFF_MAX_ABS, TOP1, COSINE, SIZE_BYTES,
                   NODE_COUNT, ERROR, RUN_ID)

TABLES = ("attempts", "ops_by_attempt", "graph_changes_by_attempt")
GEN_PREFIX = "gen."  # the generation scenario's metrics


@dataclass(frozen=True)
class AttemptRow:
    """One attempt of a study, whether it comes from memory (`rows_from_results`) or from MLflow
    (`compare.row_from_run`): the one row behind the study's attempts table, its report and `tracker compare`.

    `ops_by_op` is the attempt's per-op-type summary (`tracker.profile.columns.SUMMARY_COLUMNS`, warm-up runs
    dropped) and `graph_diff` its node counts against its baseline (`graph_stats.diff_graphs`); either is
    None when the attempt has none (it failed, or the run predates them). `generation` holds its `gen.*`
    metrics (the generation scenario, `tracker.report.scenarios`).
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
    speedup_vs_baseline: float | None = None
    disturbed: str | None = None
    diff_passed: bool | None = None
    diff_max_abs: float | None = None
    diff_nonfinite: int | None = None  # outputs NaN or infinite on one side only
    top1_agreement: float | None = None
    cosine_min: float | None = None
    size_bytes: int | None = None
    node_count: int | None = None
    error: str | None = None
    run_id: str | None = None
    ops_by_op: pd.DataFrame | None = field(default=None, repr=False, compare=False)
    graph_diff: pd.DataFrame | None = field(default=None, repr=False, compare=False)
    generation: Mapping[str, float] = field(default_factory=dict, repr=False, compare=False)

    @property
    def failed(self) -> bool:
        return self.status == STATUS_FAILED or self.error is not None


def attempt_status(*, failed: bool, diff_passed: bool | None) -> str:
    """An attempt's status (the `tracker.status` tag, a row's `status`): STATUS_FAILED when it crashed,
    STATUS_DIFF_FAILED when its outputs are outside the tolerance, else STATUS_OK (no check counts as passed)."""
    if failed:
        return STATUS_FAILED
    return STATUS_DIFF_FAILED if diff_passed is False else STATUS_OK


def runtime_baselines(results: Iterable[AttemptResult]) -> dict[str, AttemptResult]:
    """The baseline of each runtime: its first attempt that succeeded, in study order (runtime -> result)."""
    baselines: dict[str, AttemptResult] = {}
    for r in results:
        if r.ok:
            baselines.setdefault(r.attempt.runtime, r)
    return baselines


def speedup_vs_baseline(p50_ms: float | None, baseline_p50_ms: float | None) -> float | None:
    """The plain ratio of two separately measured p50 latencies (baseline / attempt); None without both."""
    if p50_ms is None or baseline_p50_ms is None:
        return None
    return baseline_p50_ms / p50_ms


def carried_speedup(result: AttemptResult) -> Speedup | None:
    """The speed-up an attempt carries: the one measured against its baseline, `BASELINE_SPEEDUP` for a
    baseline itself, else None."""
    if result.speedup is not None:
        return result.speedup
    return BASELINE_SPEEDUP if result.verdict == "baseline" else None


def rows_from_results(
    results: Sequence[AttemptResult],
    *,
    failures: Mapping[str, str] | None = None,
    skip_runs: int = 0,
    tables: bool = True,
) -> list[AttemptRow]:
    """Rows of a study's attempts as measured in this process (`Study.results`, `Study.failures`).

    Args:
        results: the attempts, in order; each runtime's baseline is `runtime_baselines`'.
        failures: attempts that failed before they had a model, name -> error text.
        skip_runs: warm-up runs left out of the per-op times (the study's `MeasureConfig.skip_runs`).
        tables: fill `ops_by_op` and `graph_diff` (the report's per-op tables); the other fields do not
            depend on it.
    """
    baselines = runtime_baselines(results)
    rows = []
    for r in results:
        base = baselines.get(r.attempt.runtime)
        diff, speedup = r.diff, carried_speedup(r)
        passed = bool(diff.passed) if diff is not None else None
        rows.append(AttemptRow(
            attempt=r.attempt.name,
            runtime=r.attempt.runtime,
            status=attempt_status(failed=not r.ok, diff_passed=passed),
            verdict=r.verdict if r.ok else None,
            p50_ms=r.latency.p50_ms if r.latency else None,
            speedup=speedup.speedup if speedup else None,
            speedup_ci_low=speedup.ci_low if speedup else None,
            speedup_ci_high=speedup.ci_high if speedup else None,
            speedup_mde=speedup.mde if speedup else None,
            speedup_vs_baseline=speedup_vs_baseline(
                r.latency.p50_ms if r.latency else None,
                base.latency.p50_ms if base is not None and base.latency else None),
            disturbed=",".join(r.disturbed_steps) or None,
            diff_passed=passed,
            diff_max_abs=float(diff.max_abs) if diff is not None else None,
            diff_nonfinite=getattr(diff, "nonfinite_mismatches", None),
            top1_agreement=getattr(diff, "top1_agreement", None),
            cosine_min=getattr(diff, "cosine_min", None),
            size_bytes=r.graph.size_bytes if r.graph else None,
            node_count=r.graph.node_count if r.graph else None,
            error=r.error,
            run_id=r.run_id,
            ops_by_op=r.summary(by="op", skip_runs=skip_runs) if tables and r.ok and r.profile is not None else None,
            graph_diff=(diff_graphs(base.graph, r.graph)
                        if tables and base is not None and base.graph and r.graph else None),
            generation=generation_metrics(r.attempt.metrics),
        ))
    rows += [AttemptRow(attempt=name, status=attempt_status(failed=True, diff_passed=None), error=error)
             for name, error in (failures or {}).items()]
    return rows


def generation_metrics(metrics: Mapping[str, float]) -> dict[str, float]:
    """The `gen.*` metrics among an attempt's."""
    return {k: float(v) for k, v in metrics.items() if k.startswith(GEN_PREFIX)}


def study_counts(rows: Sequence[AttemptRow]) -> dict[str, float]:
    """The study run's `study.attempts` and `study.failed` metrics, from its rows."""
    return {"study.attempts": len(rows), "study.failed": sum(r.failed for r in rows)}


def pick_best(rows: Iterable[AttemptRow]) -> str | None:
    """The attempt to ship among report rows (see `best_attempt`)."""
    return best_attempt((r.attempt, r.verdict, r.speedup) for r in rows)


def best_attempt(candidates: Iterable[tuple[str, str | None, float | None]]) -> str | None:
    """The attempt to ship, from (name, verdict, speed-up) in study order: the largest speed-up among
    the "better" ones (faster beyond the noise, accuracy check passed), else the first baseline, else None.

    The one rule behind `Study.best`, the study's `tracker.best_attempt` tag, the report's highlighted row,
    `tracker compare` and `tracker upload`.
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
