"""A study's attempts as rows (`AttemptRow`, built by `row_from_content` from what a run holds, live or read
back), the rules behind them (status, baseline, speed-ups, best attempt, per node type on a cluster), and the
report's tables (op type x attempt)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pandas as pd

from tracker.base.keys import (
    ROLE_NODE_BASELINE,
    TAG_DISTURBED,
    TAG_ERROR,
    TAG_NODE,
    TAG_NODE_TYPE,
    TAG_ROLE,
    TAG_STATUS,
    TAG_VERDICT,
)
from tracker.base.vocabulary import Phase, RunStatus, Status, Verdict
from tracker.measure import schema
from tracker.measure.graph_stats import DELTA
from tracker.measure.schema import ScenarioFigures, Scope, scenario_figures
from tracker.measure.timing.speedup import judge
from tracker.profile import columns as C
from tracker.profile.columns import OP_TYPE  # also the first column of the wide tables (op type x attempt)

if TYPE_CHECKING:
    from tracker.measure.attempt import AttemptResult

# Columns of the attempts table (one row per attempt).
ATTEMPT = "attempt"
RUNTIME = "runtime"
STATUS = "status"  # a `Status` (as the `tracker.status` tag)
VERDICT = "verdict"  # a `Verdict`; None when the attempt failed
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
PPL_INCREASE = "ppl_increase"  # a language model on real text: perplexity / the baseline's - 1
GREEDY_PREFIX = "greedy_prefix"  # ... and the share of greedy tokens matching the baseline's before a difference
SIZE_BYTES = "size_bytes"
NODE_COUNT = "node_count"
ERROR = "error"
UNREADABLE = "unreadable"  # "FILE: reason" for each table of the run that could not be read back
RUN_ID = "run_id"
ATTEMPT_COLUMNS = (ATTEMPT, RUNTIME, STATUS, VERDICT, BEST, P50_MS, SPEEDUP, SPEEDUP_CI_LOW, SPEEDUP_CI_HIGH,
                   SPEEDUP_MDE, SPEEDUP_VS_BASELINE, DISTURBED, DIFF_PASSED, DIFF_MAX_ABS, TOP1, COSINE, PPL_INCREASE,
                   GREEDY_PREFIX, SIZE_BYTES, NODE_COUNT, ERROR, UNREADABLE, RUN_ID)
# Where each attempt ran on a cluster: columns the table has after ATTEMPT only when its rows hold several node
# types (`several_node_types`); a local study, or a cluster of one node type, has the columns above alone.
NODE_TYPE = "node_type"  # the `tracker.node_type` tag
NODE = "node"  # the `tracker.node` tag: the Ray node's id

TABLES = ("attempts", "ops_by_attempt", "graph_changes_by_attempt")


@dataclass(frozen=True)
class AttemptRow:
    """One attempt of a study, whether it comes from memory (`tracker.run.content.rows_from_results`) or from
    MLflow (`compare.row_from_run`), built by `row_from_content` either way: the one row behind the study's
    attempts table, its report and `tracker compare`.

    The forward scenario's figures are the row's own fields; `phases` holds the generation phases' (prefill,
    decode), typed (`tracker.measure.schema.ScenarioFigures`). `ops_by_op` is the attempt's per-op-type summary
    (`tracker.profile.columns.SUMMARY_COLUMNS`, warm-up runs dropped) and `graph_diff` its node counts against its
    baseline (`graph_stats.diff_graphs`); either is None when the attempt has none (it failed, or the run predates
    them). `node` and `node_type` say where it was measured on a cluster (None on a local study); `node_baseline`
    marks a node's own baseline that another node of its type already gave that type's row (`attempt_rows`).
    """

    attempt: str
    runtime: str | None = None
    status: Status = Status.OK
    verdict: Verdict | None = None
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
    ppl_increase: float | None = None
    greedy_prefix: float | None = None
    size_bytes: int | None = None
    node_count: int | None = None
    error: str | None = None
    run_id: str | None = None
    node: str | None = None
    node_type: str | None = None
    node_baseline: bool = False
    ops_by_op: pd.DataFrame | None = field(default=None, repr=False, compare=False)
    graph_diff: pd.DataFrame | None = field(default=None, repr=False, compare=False)
    unreadable: str | None = None  # "FILE: reason; ..." for each table of the run that could not be read back
    phases: Mapping[Phase, ScenarioFigures] = field(default_factory=dict, repr=False, compare=False)

    @property
    def failed(self) -> bool:
        return self.status == Status.FAILED or self.error is not None


def row_from_content(
    attempt: str,
    *,
    metrics: Mapping[str, float],
    tags: Mapping[str, str],
    runtime: str | None = None,
    run_status: str = RunStatus.FINISHED,
    run_id: str | None = None,
    tables: Mapping[str, pd.DataFrame] | None = None,
    unreadable: Sequence[str] = (),
) -> AttemptRow:
    """The row of an attempt from what its run holds: its metrics and tags (read through `tracker.measure.schema`),
    the run's status, and its per-op tables (`ops_by_op`, `graph_diff`) where it has them (`unreadable`: those that
    could not be read back, each "FILE: reason"). The one function
    behind live rows and rows read back from MLflow."""
    crashed = run_status != RunStatus.FINISHED or tags.get(TAG_STATUS) == Status.FAILED
    forward = scenario_figures(metrics, Scope(Phase.FORWARD))
    logged = tags.get(TAG_VERDICT)
    verdict = None if crashed else (Verdict(logged) if logged else judge(None, accuracy_passed=forward.passed))
    speedup = forward.speedup
    tables = tables or {}
    return AttemptRow(
        attempt=attempt,
        runtime=runtime,
        status=attempt_status(failed=crashed, diff_passed=forward.passed),
        verdict=verdict,
        p50_ms=forward.p50_ms,
        speedup=speedup.speedup if speedup else None,
        speedup_ci_low=speedup.ci_low if speedup else None,
        speedup_ci_high=speedup.ci_high if speedup else None,
        speedup_mde=speedup.mde if speedup else None,
        speedup_vs_baseline=metrics.get(schema.SPEEDUP_VS_BASELINE),
        disturbed=tags.get(TAG_DISTURBED) or None,
        diff_passed=forward.passed,
        diff_max_abs=metrics.get(schema.DIFF_MAX_ABS),
        diff_nonfinite=_int(metrics.get(schema.DIFF_NONFINITE)),
        top1_agreement=metrics.get(schema.TOP1),
        cosine_min=metrics.get(schema.COSINE_MIN),
        ppl_increase=metrics.get(schema.PPL_INCREASE),
        greedy_prefix=metrics.get(schema.GREEDY_PREFIX),
        size_bytes=_int(metrics.get(schema.SIZE_BYTES)),
        node_count=_int(metrics.get(schema.NODE_COUNT)),
        error=tags.get(TAG_ERROR) or (f"run {run_status}" if crashed else None),
        run_id=run_id,
        node=tags.get(TAG_NODE) or None,
        node_type=tags.get(TAG_NODE_TYPE) or None,
        node_baseline=tags.get(TAG_ROLE) == ROLE_NODE_BASELINE,
        ops_by_op=tables.get("ops_by_op"),
        graph_diff=tables.get("graph_diff"),
        unreadable="; ".join(unreadable) or None,
        phases=schema.read_phases(metrics) if not crashed else {},
    )


def failed_row(attempt: str, error: str, *, runtime: str | None = None, run_id: str | None = None) -> AttemptRow:
    """The row of an attempt that crashed (`row_from_content` of a FAILED run carrying `error`)."""
    return row_from_content(attempt, metrics={}, tags={TAG_STATUS: Status.FAILED, TAG_ERROR: error}, runtime=runtime,
                            run_status=RunStatus.FAILED, run_id=run_id)


def _int(value: float | None) -> int | None:
    return None if value is None or value != value else int(value)


def attempt_status(*, failed: bool, diff_passed: bool | None) -> Status:
    """An attempt's status (the `tracker.status` tag, a row's `status`): FAILED when it crashed, DIFF_FAILED when
    its outputs are outside the tolerance, else OK (no check counts as passed)."""
    if failed:
        return Status.FAILED
    return Status.DIFF_FAILED if diff_passed is False else Status.OK


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


def study_counts(rows: Sequence[AttemptRow]) -> dict[str, float]:
    """The study run's `study.attempts` and `study.failed` metrics, from its rows (`attempt_rows`')."""
    rows = attempt_rows(rows)
    return {"study.attempts": len(rows), "study.failed": sum(r.failed for r in rows)}


def attempt_rows(rows: Iterable[AttemptRow]) -> list[AttemptRow]:
    """The rows that stand for attempts, in the order to show them: a node's repeated baseline (`node_baseline`)
    left out, as a search's candidate runs are; on a study over several node types, grouped by node type (in the
    order the types first appear, rows without one last), study order within each. The one order and filter
    behind the report, `tracker compare` and the study's counts."""
    kept = [r for r in rows if not r.node_baseline]
    if not several_node_types(kept):
        return kept
    return [r for rows_of_type in node_type_groups(kept).values() for r in rows_of_type]


def node_type_groups(rows: Iterable[AttemptRow]) -> dict[str | None, list[AttemptRow]]:
    """The rows by node type (None: rows without one, e.g. an attempt that failed before it reached a node), in
    the order the types first appear, None last."""
    groups: dict[str | None, list[AttemptRow]] = {}
    for r in rows:
        groups.setdefault(r.node_type, []).append(r)
    if None in groups:
        groups[None] = groups.pop(None)
    return groups


def several_node_types(rows: Iterable[AttemptRow]) -> bool:
    """Whether the rows were measured on more than one node type: then each type has its own baseline, best
    attempt and rows, and no speed-up is compared across types."""
    return len({r.node_type for r in rows} - {None}) > 1


def pick_best(rows: Iterable[AttemptRow]) -> str | None:
    """The attempt to ship among report rows (see `best_attempt`); a node's repeated baseline is no candidate."""
    return best_attempt((r.attempt, r.verdict, r.speedup) for r in rows if not r.node_baseline)


def best_by_node_type(rows: Iterable[AttemptRow]) -> dict[str, str | None]:
    """Each node type's best attempt (`pick_best` over that type's rows: its speed-ups are against its own
    baseline), by node type; empty when no row has one (a local study)."""
    return {t: pick_best(group) for t, group in node_type_groups(rows).items() if t is not None}


def best_attempt(candidates: Iterable[tuple[str, str | None, float | None]]) -> str | None:
    """The attempt to ship, from (name, verdict, speed-up) in study order: the largest speed-up among
    the "better" ones (faster beyond the noise, accuracy check passed), else the first baseline, else None.

    The one rule behind `Study.best`, the study's `tracker.best_attempt` tag, the report's highlighted row,
    `tracker compare` and `tracker upload`.
    """
    candidates = list(candidates)
    better = [(name, speedup) for name, verdict, speedup in candidates
              if verdict == Verdict.BETTER and speedup is not None]
    if better:
        return max(better, key=lambda c: c[1])[0]
    return next((name for name, verdict, _ in candidates if verdict == Verdict.BASELINE), None)


def attempts_table(rows: Sequence[AttemptRow], *, best: str | None = None) -> pd.DataFrame:
    """One row per attempt, columns `ATTEMPT_COLUMNS` (`best` marks the attempt named `best`).

    On rows of several node types, one row per (attempt, node type): `NODE_TYPE` and `NODE` follow `ATTEMPT`, and
    `best` marks each type's best (`best_by_node_type`) instead of the attempt named `best`.
    """
    columns = list(ATTEMPT_COLUMNS)
    if several_node_types(rows):
        per_type = best_by_node_type(rows)
        flags = [r.node_type is not None and r.attempt == per_type[r.node_type] for r in rows]
        columns[1:1] = [NODE_TYPE, NODE]
    else:
        flags = [r.attempt == best for r in rows]
    records = [{c: getattr(r, c) for c in columns if c != BEST} | {BEST: flag} for r, flag in zip(rows, flags)]
    table = pd.DataFrame(records, columns=columns)
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


def attempt_labels(rows: Sequence[AttemptRow], *, with_node_type: bool = True) -> list[str]:
    """Column labels of the attempts: their names, made unique with the run id when a name repeats (on one node
    type, when the rows hold several: there each label ends with its node type, `int8 @ m5`, unless
    `with_node_type` is False because a column beside it says the type)."""
    several = several_node_types(rows)
    keys = [(r.node_type if several else None, r.attempt) for r in rows]
    labels = [r.attempt if keys.count(k) == 1 else f"{r.attempt} ({(r.run_id or str(i))[:8]})"
              for i, (k, r) in enumerate(zip(keys, rows))]
    if not (several and with_node_type):
        return labels
    return [f"{label} @ {r.node_type}" if r.node_type else label for label, r in zip(labels, rows)]


def _wide(columns: Mapping[str, pd.Series], *, sort_by) -> pd.DataFrame:
    if not columns:
        return pd.DataFrame({OP_TYPE: pd.Series(dtype=str)})
    table = pd.DataFrame({label: s.groupby(level=0).sum() for label, s in columns.items()})
    order = pd.DataFrame({"_v": sort_by(table).fillna(0).to_numpy(), "_k": table.index.astype(str)},
                         index=table.index).sort_values(["_v", "_k"], ascending=[False, True]).index
    table = table.loc[order]
    table.index = table.index.astype(str)
    return table.rename_axis(OP_TYPE).reset_index().astype({OP_TYPE: str})
