"""The study report: its tables and one offline HTML page of them, with charts and colour-coded verdicts."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from tracker.base.vocabulary import Status, Verdict
from tracker.measure.costmodel import roofline as R
from tracker.measure.timing.speedup import describe
from tracker.report.page import (
    NA,
    PAGE_CSS,
    VERDICT_COLORS,
    escape,
    html_table,
    num,
    present,
    size_text,
    write_page,
)
from tracker.report.rows import (
    BEST,
    COSINE,
    DIFF_MAX_ABS,
    DIFF_PASSED,
    DISTURBED,
    ERROR,
    GREEDY_PREFIX,
    NODE_COUNT,
    NODE_TYPE,
    OP_TYPE,
    P50_MS,
    PPL_INCREASE,
    RUNTIME,
    SIZE_BYTES,
    SPEEDUP,
    SPEEDUP_CI_HIGH,
    SPEEDUP_CI_LOW,
    SPEEDUP_MDE,
    STATUS,
    TOP1,
    VERDICT,
    AttemptRow,
    attempt_labels,
    attempt_rows,
    best_by_node_type,
    report_tables,
)
from tracker.report.study_sections import roofline_section, scenario_section

if TYPE_CHECKING:
    import plotly.graph_objects as go

_TOP_OPS = 12
_OTHER = "(other)"


@dataclass(frozen=True)
class StudyReport:
    """The report's HTML page and its tables (`rows.TABLES`), ready to be logged."""

    html: Path
    tables: dict[str, pd.DataFrame]


def build_study_report(
    rows: Sequence[AttemptRow], folder: str | Path, *, study: str, best: str | None,
    rooflines: Mapping[str, R.Roofline] | None = None,
    phase_rooflines: Mapping[str, Mapping[str, R.Roofline]] | None = None,
) -> StudyReport:
    """Writes `folder/study_report.html` (see `write_report`) and returns it with the report's tables.

    Args:
        rooflines: the attempts' rooflines by attempt name: a roofline section with their main op types.
        phase_rooflines: the generation phases' rooflines by attempt name and phase: drawn in the scenarios
            section, which the report has when some row has generation figures (`tracker.report.scenarios`).

    The rows shown are `attempt_rows`': on a study over several node types, one per (attempt, node type), and the
    best of each type (`best_by_node_type`) is marked instead of `best`.
    """
    rows = attempt_rows(rows)
    tables = report_tables(rows, best=best)
    scenario_parts, scenario_tables = scenario_section(rows, rooflines or {}, phase_rooflines or {})
    path = _write(rows, tables, Path(folder) / "study_report.html", title=f"Study {study}", best=best,
                  rooflines=rooflines, extra_parts=scenario_parts)
    return StudyReport(html=path, tables={**tables, **scenario_tables})


def write_report(rows: Sequence[AttemptRow], path: str | Path, *, title: str, best: str | None) -> Path:
    """Writes the report as one HTML page that renders offline (plotly.js inlined once, no CDN).

    Args:
        rows: the attempts, in the order to show them (`attempt_rows`' order and filter apply).
        path: the file to write; missing parent directories are created.
        title: the page's title and heading.
        best: the attempt to highlight (see `rows.pick_best`), or None.

    Returns:
        The path written.

    Raises:
        ValueError: the file or its folder cannot be written.
    """
    rows = attempt_rows(rows)
    try:
        return _write(rows, report_tables(rows, best=best), Path(path), title=title, best=best)
    except OSError as e:  # a folder that cannot be created or written: a clear error, not a traceback
        raise ValueError(f"cannot write the report to {str(path)!r}: {e.strerror or e}") from e


def _write(rows: Sequence[AttemptRow], tables: Mapping[str, pd.DataFrame], path: Path, *, title: str,
           best: str | None, rooflines: Mapping[str, R.Roofline] | None = None, extra_parts: Sequence = ()) -> Path:
    if not rows:
        raise ValueError("a report needs at least one attempt, got none")
    labels = attempt_labels(rows)
    figures = [_speedup_chart(tables["attempts"], labels)]
    if tables["ops_by_attempt"].shape[1] > 1:
        figures.append(_ops_chart(tables["ops_by_attempt"]))
    names = attempt_labels(rows, with_node_type=False)
    parts = _parts(tables, labels, figures, _headline(rows, tables["attempts"], best), names) + list(extra_parts)
    parts += roofline_section(rooflines or {})
    return write_page(path, title=title, parts=parts, css=PAGE_CSS)


def _speedup_chart(attempts: pd.DataFrame, labels: Sequence[str]):
    import plotly.graph_objects as go

    shown = attempts.assign(_label=list(labels), _verdict=attempts[VERDICT].fillna("unknown"))
    shown = shown[shown[SPEEDUP].notna()]
    fig = go.Figure()
    for verdict_, group in shown.groupby("_verdict", sort=False):
        speedup = group[SPEEDUP].astype(float).to_numpy()
        low = group[SPEEDUP_CI_LOW].astype(float).fillna(group[SPEEDUP].astype(float)).to_numpy()
        high = group[SPEEDUP_CI_HIGH].astype(float).fillna(group[SPEEDUP].astype(float)).to_numpy()
        fig.add_trace(go.Scatter(
            x=group["_label"], y=speedup, mode="markers", name=str(verdict_),
            marker={"color": VERDICT_COLORS.get(str(verdict_), "#444444"), "size": 12},
            error_y={"type": "data", "symmetric": False, "array": high - speedup, "arrayminus": speedup - low,
                     "thickness": 2, "width": 8},
            customdata=np.stack([low, high], axis=1),
            hovertemplate=("<b>%{x}</b><br>speed-up %{y:.3f}x<br>interval %{customdata[0]:.3f} - "
                           "%{customdata[1]:.3f}<extra>%{fullData.name}</extra>"),
        ))
    for _, row in shown[shown[BEST]].iterrows():
        fig.add_annotation(x=row["_label"], y=row[SPEEDUP_CI_HIGH] if present(row[SPEEDUP_CI_HIGH]) else row[SPEEDUP],
                           text="&#9733; best", showarrow=True, arrowhead=0, ay=-28, font={"size": 13})
    if shown.empty:
        fig.add_annotation(text="no attempt was timed", x=0.5, y=0.5, xref="paper", yref="paper",
                           showarrow=False, font_size=18)
    fig.add_hline(y=1.0, line_dash="dash", line_color="#888888")
    fig.update_layout(
        title="Speed-up of the median latency over the runtime's baseline, with its confidence interval",
        height=440, margin={"t": 60, "l": 10, "r": 10, "b": 40}, legend_title_text="verdict",
        xaxis={"type": "category", "categoryorder": "array", "categoryarray": list(labels)},
        yaxis={"title": "speed-up (x; above 1 is faster)", "automargin": True},
    )
    return fig


def _ops_chart(ops: pd.DataFrame):
    import plotly.graph_objects as go

    labels = [c for c in ops.columns if c != OP_TYPE]
    shown, rest = ops.iloc[:_TOP_OPS], ops.iloc[_TOP_OPS:]
    traces = [(str(op), values) for op, values in zip(shown[OP_TYPE], shown[labels].to_numpy(dtype=float))]
    if not rest.empty:
        traces.append((f"{_OTHER} x{len(rest)}", rest[labels].fillna(0).to_numpy(dtype=float).sum(axis=0)))
    fig = go.Figure([
        go.Bar(name=name, x=labels, y=np.nan_to_num(values),
               hovertemplate="<b>%{fullData.name}</b><br>%{x}: %{y:,.1f} µs per run<extra></extra>")
        for name, values in traces
    ])
    fig.update_layout(barmode="stack", title="Profiled kernel time per run, by op type", height=480,
                      margin={"t": 60, "l": 10, "r": 10, "b": 40}, legend_title_text="op type",
                      xaxis={"type": "category"}, yaxis={"title": "µs per run", "automargin": True})
    return fig


_TIMING_NOTE = ("p50 latency is the attempt's own timing loop, under its own session settings; the speed-up "
                "and its 95 % interval come from rounds of fresh sessions timed in turn with the runtime's "
                "baseline (threads stop spinning between runs), which cancels drift: on a noisy machine the "
                "two can disagree, and the speed-up is the one to trust. A change smaller than what the "
                "measurement could detect is not a finding either way.")
_VERDICT_MEANING = {
    Verdict.BASELINE: "the runtime's reference",
    Verdict.BETTER: "accuracy passed, faster by at least what the measurement could detect (and 2 %)",
    Verdict.WORSE: "accuracy passed, slower by at least what the measurement could detect (and 2 %)",
    Verdict.SAME: "accuracy passed, no change larger than 5 % either way (the whole interval is within +-5 %)",
    Verdict.INCONCLUSIVE: "accuracy passed, no change found, but the interval is too wide to rule one out",
    Verdict.REJECTED: "accuracy check failed",
    Status.FAILED: "the attempt crashed",
}


def _headline(rows: Sequence[AttemptRow], attempts: pd.DataFrame, best: str | None) -> str:
    """The best attempt in a sentence; on a study over several node types, the best of each type."""
    if NODE_TYPE in attempts:
        bests = "; ".join(f"on {escape(t)}: <b>{escape(b)}</b>" if b else f"on {escape(t)}: none passed"
                          for t, b in best_by_node_type(rows).items())
        return (f"Best attempt per node type ({bests}). Each node type's attempts are timed against its own "
                "baseline: compare rows within a node type, never across types.")
    best_verdict = attempts.loc[attempts[BEST], VERDICT].iloc[0] if attempts[BEST].any() else None
    if best is None:
        return "No attempt passed: there is no baseline to ship."
    if best_verdict == Verdict.BASELINE:
        return f"Best attempt: <b>{escape(best)}</b> (a baseline: no attempt was faster beyond the noise)."
    return f"Best attempt: <b>{escape(best)}</b>, the largest speed-up among the attempts that are better."


def _parts(tables: Mapping[str, pd.DataFrame], labels: Sequence[str], figures: Sequence[go.Figure],
           headline: str, names: Sequence[str]) -> list[str | go.Figure]:
    """The page's parts; `labels` name the attempts in the charts and wide tables, `names` in the attempts table
    (without the node type, which has its own column there)."""
    attempts = tables["attempts"]
    verdicts = {label: (Status.FAILED if s == Status.FAILED else v or "unknown")
                for label, v, s in zip(labels, attempts[VERDICT], attempts[STATUS])}
    best = {label for label, flag in zip(labels, attempts[BEST]) if flag}
    legend = " ".join(f'<span class="verdict v-{v}">{v}</span> {escape(m)}&nbsp;&nbsp;'
                      for v, m in _VERDICT_MEANING.items())
    graph = tables["graph_changes_by_attempt"]
    return [
        f"<p>{headline}</p>",
        "<h2>Attempts</h2>", _attempts_html(attempts, names),
        f'<p class="legend">{legend}<br>{_TIMING_NOTE}</p>',
        figures[0],
        "<h2>Time per op type (profiled µs per run)</h2>",
        _wide_html(tables["ops_by_attempt"], verdicts, best, fmt=lambda v: f"{v:,.1f}", total=True),
        *figures[1:],
        "<h2>Graph changes (nodes added or removed per op type, against the runtime's baseline)</h2>",
        _wide_html(graph, verdicts, best, fmt=lambda v: f"{int(v):+d}" if v else "0", total=False)
        if len(graph) else "<p>No attempt changed the graph.</p>",
    ]


def _attempts_html(attempts: pd.DataFrame, labels: Sequence[str]) -> str:
    by_type = NODE_TYPE in attempts  # a study over several node types: where each row was measured
    head = ("attempt", *(("node type",) if by_type else ()), "runtime", "verdict", "p50 latency",
            "speed-up [interval]", "accuracy check", "nodes", "size", "status")
    body = []
    for label, row in zip(labels, attempts.to_dict("records")):
        failed = row[STATUS] == "failed"
        verdict_ = "failed" if failed else row[VERDICT]
        badge = f'<span class="verdict v-{escape(verdict_)}">{escape(verdict_)}</span>' if verdict_ else NA
        speedup = (f"{row[SPEEDUP]:.3f}x [{num(row[SPEEDUP_CI_LOW], '.3f')}, {num(row[SPEEDUP_CI_HIGH], '.3f')}]"
                   if present(row[SPEEDUP]) else NA)
        meaning = describe(row[SPEEDUP] if present(row[SPEEDUP]) else None,
                           row[SPEEDUP_MDE] if present(row[SPEEDUP_MDE]) else None, verdict_)
        if meaning:
            speedup += f'<br><span class="muted">{escape(meaning)}</span>'
        if present(row[DISTURBED]) and not failed:
            badge += (f' <span class="verdict v-disturbed" title="other processes used the CPU while this was '
                      f'measured">disturbed: {escape(row[DISTURBED])}</span>')
        if present(row[DIFF_PASSED]):
            mark = '<span class="ok">passed</span>' if row[DIFF_PASSED] else '<span class="bad">failed</span>'
            accuracy = f"{mark}, max |diff| {num(row[DIFF_MAX_ABS], '.2g')}"
            if present(row[TOP1]):
                accuracy += f", top-1 {row[TOP1]:.1%}"
            if present(row[COSINE]):
                accuracy += f", cosine &ge; {row[COSINE]:.4f}"
            if present(row[PPL_INCREASE]):
                accuracy += f", perplexity {row[PPL_INCREASE]:+.1%}, greedy {row[GREEDY_PREFIX]:.0%}"
        else:
            accuracy = NA
        where = [escape(row[NODE_TYPE]) if present(row[NODE_TYPE]) else NA] if by_type else []
        cells = [("&#9733; " if row[BEST] else "") + escape(label), *where,
                 escape(row[RUNTIME]) if present(row[RUNTIME]) else "",
                 badge, f"{num(row[P50_MS], '.3f')} ms" if present(row[P50_MS]) else NA, speedup, accuracy,
                 num(row[NODE_COUNT], ".0f"), size_text(row[SIZE_BYTES])]
        status = (f'<td class="error">{escape(str(row[ERROR] or "failed")[:300])}</td>' if failed
                  else f"<td>{escape(row[STATUS])}</td>")
        body.append(('<tr class="best">' if row[BEST] else "<tr>") + "".join(f"<td>{c}</td>" for c in cells)
                    + status + "</tr>")
    return html_table(head, body, classes=None)


def _wide_html(table: pd.DataFrame, verdicts: Mapping[str, str], best: set[str], *, fmt, total: bool) -> str:
    labels = [c for c in table.columns if c != OP_TYPE]
    head = ["op type", *[("&#9733; " if label in best else "") + escape(label) for label in labels]]
    classes = ["", *[f"v-{verdicts.get(label, 'unknown')}" for label in labels]]
    body = [f"<tr><td>{escape(op)}</td>" + "".join(f"<td>{fmt(v) if present(v) else NA}</td>" for v in values)
            + "</tr>" for op, values in zip(table[OP_TYPE], table[labels].to_numpy(dtype=float))]
    if total and len(table):
        sums = table[labels].sum(axis=0, min_count=1)
        body.append("<tr><td><b>total</b></td>"
                    + "".join(f"<td><b>{fmt(v)}</b></td>" if present(v) else f"<td>{NA}</td>" for v in sums)
                    + "</tr>")
    return html_table(head, body, classes=classes, escaped=True)
