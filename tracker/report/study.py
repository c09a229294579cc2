"""The study report: its tables and one offline HTML page of them, with charts and colour-coded verdicts."""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from tracker.base.vocabulary import Status, Verdict
from tracker.measure.costmodel import roofline as R
from tracker.measure.timing.speedup import describe
from tracker.report.charts import roofline_chart, step_split_chart
from tracker.report.page import write_page
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
from tracker.report.scenarios import SPLIT_NOTE, decode_splits, generation_table, roof_sentences, scenarios_table

if TYPE_CHECKING:
    import plotly.graph_objects as go

VERDICT_COLORS = {Verdict.BASELINE: "#4575b4", Verdict.BETTER: "#1a9850", Verdict.WORSE: "#e66101",
                  Verdict.SAME: "#5e3c99", Verdict.INCONCLUSIVE: "#878787", Verdict.REJECTED: "#a50026",
                  Status.FAILED: "#222222", "disturbed": "#b8860b"}
_TOP_OPS = 12
_ROOFLINE_OPS = 5  # op types per attempt in the study's roofline chart, the slowest with FLOPs
_PHASE_OPS = 3  # op types per attempt and phase in the scenarios' roofline chart, the slowest with FLOPs
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
    scenario_parts, scenario_tables = _scenario_parts(rows, rooflines or {}, phase_rooflines or {})
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
    parts += _roofline_parts(rooflines or {})
    return write_page(path, title=title, parts=parts, css=_CSS)


def _roofline_parts(rooflines: Mapping[str, R.Roofline]) -> list:
    """The roofline section: the machine's roofs, each attempt's FLOPs, and its main op types on one chart."""
    if not rooflines:
        return []
    machine = next((r.machine for r in rooflines.values() if r.machine is not None), None)
    chart = _rooflines_chart(rooflines, top=_ROOFLINE_OPS, title=(
        f"The {_ROOFLINE_OPS} slowest op types with FLOPs of each attempt, against the roofs"))
    if machine is None:
        roofs = "The machine was not measured: no roofs."
    else:
        roofs = (f"Measured once for the study: peak {machine.peak_gflops:,.1f} GFLOP/s (an fp32 "
                 f"{machine.gemm_size}&sup3; MatMul in ONNX Runtime, {machine.threads} threads) and bandwidth "
                 f"{machine.bandwidth_gbps:,.1f} GB/s (the better of a {machine.copy_mb} MiB copy, bytes read + "
                 f"written, and a sum, bytes read), in "
                 f"{machine.seconds:.1f} s. Op types below {machine.ridge_flop_per_byte:,.1f} FLOP per byte are "
                 "bound by memory, above it by compute. A point's height against the roof above it is its share "
                 "of what the machine allows at its intensity.")
    head = ("attempt", "GFLOP per run", "GFLOP per token", "achieved GFLOP/s", "MB moved per run",
            "kernel time with known FLOPs")
    body = [f"<tr><td>{_e(name)}</td><td>{r.gflop_per_run:.4g}</td>"
            f"<td>{_num(r.gflop_per_token, '.4g')}</td><td>{_num(r.gflops, ',.1f')}</td>"
            f"<td>{r.mb_per_run:.4g}</td><td>{r.covered_time_pct:.1f} %</td></tr>"
            for name, r in rooflines.items()]
    return ["<h2>Against the machine's limits (roofline)</h2>", f"<p>{roofs}</p>",
            _table(head, body, classes=None), chart]


def _rooflines_chart(rooflines: Mapping[str, R.Roofline], *, top: int, title: str):
    """The `top` slowest op types with FLOPs of each roofline on one chart, a series per label."""
    machine = next((r.machine for r in rooflines.values() if r.machine is not None), None)
    main = [roofline.table[roofline.table[R.GFLOP_PER_RUN] > 0].head(top).assign(series=label)
            for label, roofline in rooflines.items()]
    return roofline_chart(pd.concat(main, ignore_index=True), machine=machine, series="series", title=title)


def _scenario_parts(rows: Sequence[AttemptRow], rooflines: Mapping[str, R.Roofline],
                    phase_rooflines: Mapping[str, Mapping[str, R.Roofline]]) -> tuple[list, dict[str, pd.DataFrame]]:
    """The scenarios section (HTML, a chart of each attempt's prefill and decode), its tables; nothing without."""
    generation = generation_table(rows)
    if generation.empty:
        return [], {}
    scenarios = scenarios_table(rows, rooflines)
    parts = ["<h2>Scenarios: forward, prefill and decode</h2>",
             "<p>Each scenario's best attempt is the largest speed-up among those faster than the baseline beyond "
             "the noise, whose accuracy check passed (forward: the attempt's check; prefill and decode: the "
             "generation check, the attempt's next-token logits along the baseline's tokens within the bounds of "
             "its precision), else the baseline. Its roof is the one most of its kernel time sits under.</p>",
             _frame_html(scenarios), "<p>" + _e(" ".join(roof_sentences(scenarios))) + "</p>",
             "<h3>Every attempt in each phase</h3>", _frame_html(generation)]
    length, splits = decode_splits(rows)
    if splits:
        parts += ["<h3>Where a decode step's time goes</h3>", f"<p>{_e(SPLIT_NOTE)}</p>", step_split_chart(
            splits, title=f"Where a decode step's time goes, at a past of {length} (ms per step)")]
    by_phase = {f"{attempt} · {phase}": roofline
                for attempt, phases in phase_rooflines.items() for phase, roofline in phases.items()}
    if by_phase:
        parts.append(_rooflines_chart(by_phase, top=_PHASE_OPS, title=(
            f"Prefill and decode: the {_PHASE_OPS} slowest op types with FLOPs of each attempt")))
    return parts, {"scenarios": scenarios, "generation": generation}


def _frame_html(table: pd.DataFrame) -> str:
    """A table as it is: numbers to 3 significant digits, missing values as a dash."""
    body = ["<tr>" + "".join(f"<td>{_num(v, '.3g') if isinstance(v, float) else (_e(v) if _present(v) else _NA)}</td>"
                             for v in row) + "</tr>" for row in table.itertuples(index=False)]
    return _table(list(table.columns), body, classes=None)


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
        fig.add_annotation(x=row["_label"], y=row[SPEEDUP_CI_HIGH] if _present(row[SPEEDUP_CI_HIGH]) else row[SPEEDUP],
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


_CSS = """
body{font-family:system-ui,-apple-system,sans-serif;margin:1em 2em;color:#222}
div.table{overflow-x:auto;margin:.5em 0 1.5em}table{border-collapse:collapse;font-size:13px}
p.legend{font-size:12px;line-height:1.9}
th,td{border-bottom:1px solid #ddd;padding:4px 10px;text-align:right;white-space:nowrap}
th{background:#f4f4f4}th:first-child,td:first-child{text-align:left}
tr.best td{background:#fff4c2;font-weight:600}
td.error{white-space:normal;max-width:32em;text-align:left;color:#a50026}
.verdict{color:#fff;border-radius:3px;padding:1px 7px;font-size:12px;font-weight:600}
.ok{color:#1a9850}.bad{color:#a50026;font-weight:600}.muted{color:#999}
section.figure{margin-bottom:1.5em}
""" + "".join(f".v-{v}{{background:{c}}}\nth.v-{v}{{border-bottom:4px solid {c};background:#f4f4f4}}\n"
              for v, c in VERDICT_COLORS.items())
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
        bests = "; ".join(f"on {_e(t)}: <b>{_e(b)}</b>" if b else f"on {_e(t)}: none passed"
                          for t, b in best_by_node_type(rows).items())
        return (f"Best attempt per node type ({bests}). Each node type's attempts are timed against its own "
                "baseline: compare rows within a node type, never across types.")
    best_verdict = attempts.loc[attempts[BEST], VERDICT].iloc[0] if attempts[BEST].any() else None
    if best is None:
        return "No attempt passed: there is no baseline to ship."
    if best_verdict == Verdict.BASELINE:
        return f"Best attempt: <b>{_e(best)}</b> (a baseline: no attempt was faster beyond the noise)."
    return f"Best attempt: <b>{_e(best)}</b>, the largest speed-up among the attempts that are better."


def _parts(tables: Mapping[str, pd.DataFrame], labels: Sequence[str], figures: Sequence[go.Figure],
           headline: str, names: Sequence[str]) -> list[str | go.Figure]:
    """The page's parts; `labels` name the attempts in the charts and wide tables, `names` in the attempts table
    (without the node type, which has its own column there)."""
    attempts = tables["attempts"]
    verdicts = {label: (Status.FAILED if s == Status.FAILED else v or "unknown")
                for label, v, s in zip(labels, attempts[VERDICT], attempts[STATUS])}
    best = {label for label, flag in zip(labels, attempts[BEST]) if flag}
    legend = " ".join(f'<span class="verdict v-{v}">{v}</span> {_e(m)}&nbsp;&nbsp;'
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
        badge = f'<span class="verdict v-{_e(verdict_)}">{_e(verdict_)}</span>' if verdict_ else _NA
        speedup = (f"{row[SPEEDUP]:.3f}x [{_num(row[SPEEDUP_CI_LOW], '.3f')}, {_num(row[SPEEDUP_CI_HIGH], '.3f')}]"
                   if _present(row[SPEEDUP]) else _NA)
        meaning = describe(row[SPEEDUP] if _present(row[SPEEDUP]) else None,
                           row[SPEEDUP_MDE] if _present(row[SPEEDUP_MDE]) else None, verdict_)
        if meaning:
            speedup += f'<br><span class="muted">{_e(meaning)}</span>'
        if _present(row[DISTURBED]) and not failed:
            badge += (f' <span class="verdict v-disturbed" title="other processes used the CPU while this was '
                      f'measured">disturbed: {_e(row[DISTURBED])}</span>')
        if _present(row[DIFF_PASSED]):
            mark = '<span class="ok">passed</span>' if row[DIFF_PASSED] else '<span class="bad">failed</span>'
            accuracy = f"{mark}, max |diff| {_num(row[DIFF_MAX_ABS], '.2g')}"
            if _present(row[TOP1]):
                accuracy += f", top-1 {row[TOP1]:.1%}"
            if _present(row[COSINE]):
                accuracy += f", cosine &ge; {row[COSINE]:.4f}"
            if _present(row[PPL_INCREASE]):
                accuracy += f", perplexity {row[PPL_INCREASE]:+.1%}, greedy {row[GREEDY_PREFIX]:.0%}"
        else:
            accuracy = _NA
        where = [_e(row[NODE_TYPE]) if _present(row[NODE_TYPE]) else _NA] if by_type else []
        cells = [("&#9733; " if row[BEST] else "") + _e(label), *where,
                 _e(row[RUNTIME]) if _present(row[RUNTIME]) else "",
                 badge, f"{_num(row[P50_MS], '.3f')} ms" if _present(row[P50_MS]) else _NA, speedup, accuracy,
                 _num(row[NODE_COUNT], ".0f"), _bytes(row[SIZE_BYTES])]
        status = (f'<td class="error">{_e(str(row[ERROR] or "failed")[:300])}</td>' if failed
                  else f"<td>{_e(row[STATUS])}</td>")
        body.append(('<tr class="best">' if row[BEST] else "<tr>") + "".join(f"<td>{c}</td>" for c in cells)
                    + status + "</tr>")
    return _table(head, body, classes=None)


def _wide_html(table: pd.DataFrame, verdicts: Mapping[str, str], best: set[str], *, fmt, total: bool) -> str:
    labels = [c for c in table.columns if c != OP_TYPE]
    head = ["op type", *[("&#9733; " if label in best else "") + _e(label) for label in labels]]
    classes = ["", *[f"v-{verdicts.get(label, 'unknown')}" for label in labels]]
    body = [f"<tr><td>{_e(op)}</td>" + "".join(f"<td>{fmt(v) if _present(v) else _NA}</td>" for v in values)
            + "</tr>" for op, values in zip(table[OP_TYPE], table[labels].to_numpy(dtype=float))]
    if total and len(table):
        sums = table[labels].sum(axis=0, min_count=1)
        body.append("<tr><td><b>total</b></td>"
                    + "".join(f"<td><b>{fmt(v)}</b></td>" if _present(v) else f"<td>{_NA}</td>" for v in sums)
                    + "</tr>")
    return _table(head, body, classes=classes, escaped=True)


def _table(head: Sequence[str], body: Sequence[str], *, classes: Sequence[str] | None, escaped: bool = False) -> str:
    classes = classes or [""] * len(head)
    cells = "".join(f'<th class="{c}">{h if escaped else _e(h)}</th>' for h, c in zip(head, classes))
    return (f'<div class="table"><table>\n<thead><tr>{cells}</tr></thead>\n<tbody>\n' + "\n".join(body)
            + "\n</tbody>\n</table></div>")


_NA = '<span class="muted">&mdash;</span>'


def _present(value) -> bool:
    return value is not None and not (pd.api.types.is_scalar(value) and pd.isna(value))


def _num(value, spec: str) -> str:
    return format(float(value), spec) if _present(value) else _NA


def _bytes(value) -> str:
    if not _present(value):
        return _NA
    exponent = min(3, int(np.log(max(float(value), 1.0)) // np.log(1024)))
    return f"{float(value) / 1024 ** exponent:,.{0 if exponent == 0 else 1}f} {('B', 'KB', 'MB', 'GB')[exponent]}"


def _e(text) -> str:
    return html.escape(str(text))
