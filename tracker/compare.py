"""`tracker compare`: a study's attempts read back from MLflow, as a table, a report and a CI gate; on a study
measured on several node types, one row per (attempt, node type) and a best attempt per type."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from tracker.base.keys import (
    NO_BEST,
    TAG_ATTEMPT,
    TAG_BEST,
    TAG_KILLED,
    TAG_RUNTIME,
    TAG_STUDY,
)
from tracker.base.vocabulary import Verdict

if TYPE_CHECKING:  # kept light: `tracker --help` imports this module for PASS_RULE
    from tracker.report.rows import AttemptRow
    from tracker.store.read import FetchedRun

PASS_RULE = (
    "An attempt passes when a run of that name is among the compared runs, it did not crash (run "
    "FINISHED, tracker.status not 'failed') and its accuracy check passed (diff.passed = 1, verdict not "
    "'rejected'). Its speed does not matter: 'worse', 'same' and 'inconclusive' attempts pass."
)


@dataclass(frozen=True)
class Comparison:
    """Attempts to compare: from one study's parent run, or from any list of runs.

    `best_by_node_type` holds each node type's best attempt when the rows hold several node types (else it is
    empty and `best` is the one to read).
    """

    title: str
    rows: list[AttemptRow]
    best: str | None
    study_run_id: str | None = None
    best_by_node_type: dict[str, str | None] = field(default_factory=dict)
    unfinished: str | None = None  # why the study run did not end FINISHED (its status, and a killed run's reason)


@dataclass(frozen=True)
class Requirement:
    """Whether a required attempt passed (see `PASS_RULE`), and why not."""

    name: str
    passed: bool
    reason: str


def load_comparison(
    *,
    study_run_id: str | None = None,
    experiment: str | None = None,
    study: str | None = None,
    run_ids: Sequence[str] = (),
) -> Comparison:
    """Reads the attempts from the active tracking store (call `store.connect.setup_tracking` first).

    Give exactly one of: `study_run_id`; `experiment` and `study` (the study's latest parent run);
    `run_ids` (attempt runs, in the order to show them). The rows are `rows.attempt_rows`': a node's repeated
    baseline is left out, and rows of several node types are grouped by type.

    Raises:
        ValueError: not exactly one way of choosing the runs was given.
        TrackerError: the runs do not exist.
    """
    from tracker.report.rows import attempt_rows, pick_best
    from tracker.store import read

    ways = [study_run_id is not None, experiment is not None or study is not None, bool(run_ids)]
    if sum(ways) != 1 or (ways[1] and (experiment is None or study is None)):
        raise ValueError("give a study run id, or an experiment and a study name, or a list of run ids")
    if run_ids:
        runs = read.fetch_runs(run_ids)
        rows = attempt_rows(row_from_run(run) for run in runs)
        studies = {r.tags.get(TAG_STUDY) for r in runs}
        title = f"Study {studies.pop()}" if len(studies) == 1 and None not in studies else "Selected runs"
        return Comparison(title, rows, pick_best(rows), best_by_node_type=_node_type_bests(rows, {}))
    if study_run_id is None:
        assert experiment is not None and study is not None  # checked above: both are given
        study_run_id = read.find_study_run(experiment, study)
    parent, attempts = read.fetch_study_runs(study_run_id)
    rows = attempt_rows(row_from_run(run) for run in attempts)
    best = _logged_best(parent.tags, TAG_BEST, rows)
    name = parent.tags.get(TAG_STUDY, parent.name)
    unfinished = None if parent.status == "FINISHED" else (
        f"{parent.status}: {parent.tags.get(TAG_KILLED) or _UNFINISHED.get(parent.status, 'did not finish')}")
    return Comparison(f"Study {name}", rows, best, study_run_id=study_run_id,
                      best_by_node_type=_node_type_bests(rows, parent.tags), unfinished=unfinished)


_UNFINISHED = {"RUNNING": "still running, or its process was cut off on another host",
               "FAILED": "it ended on an error", "KILLED": "it was stopped"}


def _logged_best(tags: dict[str, str], tag: str, rows: Sequence[AttemptRow]) -> str | None:
    """The best attempt the study run's `tag` names, else (a run without its summary) `pick_best`'s of `rows`."""
    from tracker.report.rows import pick_best

    best = tags.get(tag)
    return pick_best(rows) if best is None else (None if best == NO_BEST else best)


def _node_type_bests(rows: Sequence[AttemptRow], tags: dict[str, str]) -> dict[str, str | None]:
    """Each node type's best attempt when the rows hold several, as the study run's tags name them (else each
    type's `pick_best`); empty for rows of one node type or none."""
    from tracker.report.rows import node_type_groups, several_node_types
    from tracker.report.scenarios import FORWARD, node_type_best_tag

    if not several_node_types(rows):
        return {}
    return {t: _logged_best(tags, node_type_best_tag(FORWARD, t), group)
            for t, group in node_type_groups(rows).items() if t is not None}


def check_report_path(path: str | Path) -> Path:
    """Checks, before any run is read, that the HTML report can be written at `path`.

    Missing parent folders are fine: `study.write_report` creates them. What cannot be created is
    an error: a parent that is a file, a folder that is not writable, or `path` being a folder.

    Raises:
        ValueError: naming the path and what is in the way.
    """
    path = Path(path)
    if path.is_dir():
        example = str(path / "report.html")
        raise ValueError(f"--html {str(path)!r} is a folder; expected the path of an HTML file, e.g. {example!r}")
    existing = next(p for p in path.absolute().parents if p.exists())
    if not existing.is_dir():
        raise ValueError(f"cannot write the report to {str(path)!r}: {str(existing)!r} is a file, not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        missing = "" if existing == path.absolute().parent else f" (to create {str(path.parent)!r})"
        raise ValueError(
            f"cannot write the report to {str(path)!r}: folder {str(existing)!r} is not writable{missing}; "
            "give a path in a folder you can write to"
        )
    return path


def row_from_run(run: FetchedRun) -> AttemptRow:
    """The row of an attempt run, read back from what it recorded (`rows.row_from_content`, as live rows are)."""
    from tracker.report.rows import row_from_content

    return row_from_content(run.tags.get(TAG_ATTEMPT, run.name), metrics=run.metrics, tags=run.tags,
                            runtime=run.tags.get(TAG_RUNTIME), run_status=run.status, run_id=run.run_id,
                            tables=run.tables, unreadable=run.unreadable)


def check_required(rows: Sequence[AttemptRow], names: Sequence[str]) -> list[Requirement]:
    """One `Requirement` per name (see `PASS_RULE`); every attempt of that name must pass."""
    out = []
    for name in names:
        found = [r for r in rows if r.attempt == name]
        if not found:
            known = ", ".join(sorted({r.attempt for r in rows}))
            out.append(Requirement(name, False, f"no attempt named {name!r} (attempts: {known})"))
            continue
        reasons = [_failure(r) for r in found]
        bad = [r for r in reasons if r]
        out.append(Requirement(name, not bad, "; ".join(bad) if bad else f"passed (verdict {found[0].verdict})"))
    return out


def format_table(comparison: Comparison) -> str:
    """The attempts as a plain-text table (`*` marks the best attempt; on several node types, each type's best
    and a `node type` column), then a line on each attempt whose speed-up is below what its measurement could
    detect, or whose measurement was disturbed."""
    from tracker.measure.timing.speedup import describe
    from tracker.report.rows import attempt_labels

    by_type = comparison.best_by_node_type
    head = ("", "attempt", *(("node type",) if by_type else ()), "runtime", "verdict", "p50_ms", "speedup",
            "interval", "detects", "accuracy", "nodes", "size_bytes", "status")
    lines, notes = [], []
    names = attempt_labels(comparison.rows, with_node_type=False)
    for name, label, r in zip(names, attempt_labels(comparison.rows), comparison.rows):
        accuracy = "-" if r.diff_passed is None else (
            f"{'passed' if r.diff_passed else 'FAILED'} (max {r.diff_max_abs:.2g}{_nonfinite(r)})")
        if r.top1_agreement is not None:
            accuracy += f" top1 {r.top1_agreement:.1%}"
        if r.cosine_min is not None:
            accuracy += f" cos {r.cosine_min:.4f}"
        if r.ppl_increase is not None:
            accuracy += f" ppl {r.ppl_increase:+.1%} greedy {r.greedy_prefix or 0:.0%}"
        interval = "-" if r.speedup_ci_low is None else (
            f"[{_fmt(r.speedup_ci_low, '.3f')}, {_fmt(r.speedup_ci_high, '.3f')}]")
        detects = "-" if r.speedup_mde is None or r.verdict == Verdict.BASELINE else f"\u00b1{r.speedup_mde:.1%}"
        status = f"failed: {(r.error or '')[:100]}" if r.failed else r.status
        if r.unreadable:
            status += f" (unreadable: {r.unreadable})"
            notes.append(f"note: {label}: unreadable ({r.unreadable}); its other figures are as logged, its "
                         "per-op tables are left out of the report")
        if r.disturbed and not r.failed:
            status += f" (disturbed: {r.disturbed})"
            notes.append(f"note: {label}: other processes used the CPU while its {r.disturbed} was measured; "
                         "its figures are not reliable, measure it again on a quiet machine")
        if r.verdict in ("same", "inconclusive") and not r.failed:
            notes.append(f"note: {label}: {describe(r.speedup, r.speedup_mde, r.verdict)}")
        best = by_type.get(r.node_type or "") if by_type else comparison.best
        lines.append((
            "*" if r.attempt == best else "", name, *((r.node_type or "-",) if by_type else ()), r.runtime or "-",
            ("failed" if r.failed else r.verdict) or "-", _fmt(r.p50_ms, ".4f"), _fmt(r.speedup, ".3f"),
            interval, detects, accuracy, _fmt(r.node_count, "d"), _fmt(r.size_bytes, ",d"), status,
        ))
    numeric = {"p50_ms", "speedup", "detects", "nodes", "size_bytes"}
    widths = [max(len(str(c)) for c in column) for column in zip(head, *lines)]
    text = [
        "  ".join(c.rjust(w) if h in numeric else c.ljust(w) for h, c, w in zip(head, line, widths)).rstrip()
        for line in (head, *lines)
    ]
    best = f"best: {comparison.best or 'none (no attempt passed)'}" if not by_type else "best per node type: " + (
        "; ".join(f"{t}: {b or 'none passed'}" for t, b in by_type.items()))
    run = f" (run {comparison.study_run_id})" if comparison.study_run_id else ""
    if comparison.unfinished:  # its attempts are those it reached: the best is the best of those
        notes.insert(0, f"note: the study did not finish ({comparison.unfinished}): the attempts it did not reach "
                        "are missing, and the best is the best of those it measured")
        run += " [did not finish]"
    return (f"{comparison.title}{run}: {len(comparison.rows)} attempts, {best}\n" + "\n".join(text)
            + "".join(f"\n{note}" for note in notes) + "".join(f"\n{line}" for line in _scenario_lines(comparison)))


def _scenario_lines(comparison: Comparison) -> list[str]:
    """A line per generation phase naming its best attempt and speed-up, when the attempts have generation
    figures (`tracker.report.scenarios`)."""
    from tracker.report.rows import NODE_TYPE
    from tracker.report.scenarios import FORWARD, scenarios_table

    table = scenarios_table(comparison.rows)
    lines = []
    for row in table.to_dict("records"):
        if row["scenario"] == FORWARD:  # its best is the table's
            continue
        speedup = "" if row["speedup"] is None or row["best"] == "baseline" else (
            f" {row['speedup']:.3f}x [{row['speedup_ci_low']:.3f}, {row['speedup_ci_high']:.3f}]")
        roof = f", bound by {row['roof']}" if row["roof"] else ""
        where = f" on {row[NODE_TYPE]}" if NODE_TYPE in row else ""
        lines.append(f"{row['scenario']}{where} ({row['measured']}): best {row['best'] or 'none'}{speedup}{roof}")
    return lines


def to_json(comparison: Comparison, requirements: Sequence[Requirement]) -> dict[str, object]:
    """The comparison and the requirement checks as JSON-ready data (NaN becomes None)."""
    from tracker.report.rows import attempts_table

    attempts = attempts_table(comparison.rows, best=comparison.best)
    by_type = {"best_by_node_type": comparison.best_by_node_type} if comparison.best_by_node_type else {}
    return {
        "title": comparison.title,
        "study_run_id": comparison.study_run_id,
        "best": comparison.best,
        "unfinished": comparison.unfinished,
        **by_type,
        "attempts": [{k: _json_value(v) for k, v in row.items()} for row in attempts.to_dict("records")],
        "require": [{"name": q.name, "passed": q.passed, "reason": q.reason} for q in requirements],
        "passed": all(q.passed for q in requirements),
    }


def _nonfinite(row: AttemptRow) -> str:
    """", N NaN/inf on one side only" when outputs are NaN or infinite where the baseline's are not, or the
    reverse (its max |diff| counts the finite positions only), else nothing."""
    return f", {row.diff_nonfinite} NaN/inf on one side only" if row.diff_nonfinite else ""


def _failure(row: AttemptRow) -> str | None:
    name = f"{row.attempt} on {row.node_type}" if row.node_type else row.attempt
    if row.failed:
        return f"{name} failed: {row.error or row.status}"
    if row.verdict == "rejected" or row.diff_passed is False:
        return (f"{name} was rejected: its accuracy check failed (max |diff| {_fmt(row.diff_max_abs, '.3g')}"
                f"{_nonfinite(row)})")
    if row.diff_passed is None:
        return f"{name} has no accuracy check (no diff.passed metric)"
    return None


def _fmt(value, spec: str) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, spec)


def _json_value(value):
    import pandas as pd

    if pd.api.types.is_scalar(value) and pd.isna(value):  # None, NaN and pandas' NA
        return None
    return value.item() if hasattr(value, "item") else value
