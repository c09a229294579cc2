"""The search's page on the study run: the answer, every candidate with where and why it stopped, the Pareto front
of speed-up against the task metric, and each sensitivity fallback (a table and a chart)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import pandas as pd

from tracker.report.page import PAGE_CSS, escape, frame_html, write_page
from tracker.report.rows import AttemptRow

# The task metric the Pareto chart plots, in the order looked for, and whether larger is better.
# A language model judged on real text (`screen.check_text`) ranks by its perplexity increase.
TASK_METRICS = (("diff.quality.ppl_increase", False), ("diff.cosine_min", True), ("diff.top1_agreement", True), ("diff.kl_divergence", False),
                ("diff.scaled_error", False), ("diff.max_abs", False))
CANDIDATE_COLUMNS = ("name", "family", "stage", "status", "reason", "precision", "passed", "margin", "speedup",
                     "speedup_ci_low", "speedup_ci_high", "speedup_source", "size_bytes", "fallback_of", "pipeline")


@dataclass(frozen=True)
class SearchReport:
    html: Path
    tables: dict[str, pd.DataFrame]


def candidates_table(result, rows: Sequence[AttemptRow]) -> pd.DataFrame:
    """One row per candidate: the screen's figures, or the full attempt's calibrated ones where it was timed."""
    timed = {r.attempt: r for r in rows if r.speedup is not None}
    records = []
    for row in result.rows:
        record = {k: v for k, v in asdict(row).items() if k != "diff"}
        record.update(row.diff)
        full = timed.get(row.name)
        if full is not None:
            record.update(speedup=full.speedup, speedup_ci_low=full.speedup_ci_low,
                          speedup_ci_high=full.speedup_ci_high, speedup_source="full", verdict=full.verdict)
        else:
            record.update(speedup=row.screen_speedup, speedup_ci_low=row.screen_ci_low,
                          speedup_ci_high=row.screen_ci_high,
                          speedup_source="screen" if row.screen_speedup is not None else None)
        records.append(record)
    table = pd.DataFrame(records)
    front = [c for c in CANDIDATE_COLUMNS if c in table.columns]
    return table[front + [c for c in table.columns if c not in front and not c.startswith("screen_")]]


def task_metric(table: pd.DataFrame) -> tuple[str, bool] | None:
    """The first of TASK_METRICS the candidates carry, and whether larger is better."""
    for name, larger in TASK_METRICS:
        if name in table.columns and table[name].notna().any():
            return name, larger
    return None


def pareto_front(table: pd.DataFrame, metric: str, larger_is_better: bool) -> pd.DataFrame:
    """The candidates no other one beats on both speed-up and the task metric (timed or screened, passed or not)."""
    points = table[table["speedup"].notna() & table[metric].notna()]
    keep = []
    for i, row in points.iterrows():
        better = (points["speedup"] >= row["speedup"]) & (
            points[metric] >= row[metric] if larger_is_better else points[metric] <= row[metric])
        strictly = (points["speedup"] > row["speedup"]) | (
            points[metric] > row[metric] if larger_is_better else points[metric] < row[metric])
        if not (better & strictly).any():
            keep.append(i)
    return points.loc[keep].sort_values("speedup", ascending=False)


def pareto_chart(table: pd.DataFrame, metric: str, larger_is_better: bool, *, best: str | None):
    import plotly.graph_objects as go

    points = table[table["speedup"].notna() & table[metric].notna()]
    fig = go.Figure()
    size = points["size_bytes"].fillna(0).astype(float)
    scale = size.max() or 1.0
    for passed, group in points.groupby(points["passed"].fillna(False).astype(bool)):
        fig.add_trace(go.Scatter(
            x=group[metric], y=group["speedup"], mode="markers", name="passed" if passed else "failed its check",
            text=group["name"], marker={"size": 8 + 22 * size[group.index] / scale, "opacity": 0.75,
                                        "color": "#1a9850" if passed else "#a50026"},
            hovertemplate="<b>%{text}</b><br>" + metric + " %{x:.4g}<br>speed-up %{y:.3f}x<extra></extra>"))
    front = pareto_front(table, metric, larger_is_better).sort_values(metric)
    if len(front) > 1:
        fig.add_trace(go.Scatter(x=front[metric], y=front["speedup"], mode="lines", name="Pareto front",
                                 line={"dash": "dot", "color": "#444444"}))
    chosen = points[points["name"] == best]
    for _, row in chosen.iterrows():
        fig.add_annotation(x=row[metric], y=row["speedup"], text="&#9733; chosen", showarrow=True, ay=-30)
    fig.add_hline(y=1.0, line_dash="dash", line_color="#888888")
    fig.update_layout(title=f"Speed-up against {metric} (marker size: model size; full runs' calibrated "
                            f"speed-ups, else the screen's)", height=460,
                      xaxis={"title": metric + (" (larger is better)" if larger_is_better else " (smaller is better)")},
                      yaxis={"title": "speed-up (x)"})
    return fig


def sensitivity_chart(sensitivity):
    import plotly.graph_objects as go

    rows = pd.DataFrame(sensitivity.rows)
    # A block per kind of projection is named by it (`self_attn.q_proj`); a block of nodes by its first nodes.
    labels = rows["nodes"].str.slice(0, 40)
    if "group" in rows:
        labels = rows["group"].where(rows["group"].astype(bool), labels)
    fig = go.Figure(go.Bar(x=labels, y=rows["margin"],
                           marker_color=["#1a9850" if p else "#878787" for p in rows["passed"]],
                           hovertemplate="%{x}<br>margin %{y:.3f}<extra></extra>"))
    fig.add_hline(y=0.0, line_dash="dash", line_color="#a50026")
    fig.update_layout(title=f"{sensitivity.entry.name}: the check's margin with each block kept in fp32 "
                            f"(above 0 passes)", height=380, xaxis={"title": "kept in fp32", "type": "category"},
                      yaxis={"title": "margin"})
    return fig


def build_search_report(result, rows: Sequence[AttemptRow], folder: str | Path, *, study: str,
                        best: str | None) -> SearchReport:
    """Writes `folder/search.html` and returns it with its tables (`search_candidates`, `search_pareto`,
    `search_sensitivity`)."""
    table = candidates_table(result, rows)
    best_row = next((r for r in rows if r.attempt == best), None)
    if best_row is None or best_row.speedup is None:
        answer = "No candidate passed its check and beat the baseline: the baseline stays the best."
    else:
        answer = (f"Chosen: <b>{escape(best)}</b>, {best_row.speedup:.3f}x [{best_row.speedup_ci_low:.3f}, "
                  f"{best_row.speedup_ci_high:.3f}], verdict <b>{escape(best_row.verdict)}</b>.")
    counts = result.counts()
    stages = pd.DataFrame({"stage": list(result.stage_seconds), "seconds": list(result.stage_seconds.values())})
    budget = "no budget" if result.budget_s is None else f"a budget of {result.budget_s:.0f} s"
    parts: list = [
        f"<p>{answer}</p>",
        f"<p>{counts['considered']} candidates considered, {counts['screened_out']} screened out, "
        f"{counts['timed']} measured in full, in {result.seconds:.0f} s ({budget}).</p>",
        "<h2>Time per stage</h2>", frame_html(stages),
        f"<h2>Coverage</h2><p>{escape(result.coverage_line())}</p>",
        frame_html(pd.DataFrame([{"family": f, **c} for f, c in result.coverage().items()])),
    ]
    tables = {"search_candidates": table}
    found = task_metric(table)
    if found is not None:
        metric, larger = found
        front = pareto_front(table, metric, larger)
        tables["search_pareto"] = front
        parts += ["<h2>Pareto front</h2>", pareto_chart(table, metric, larger, best=best),
                  frame_html(front[["name", "speedup", "speedup_source", metric, "passed", "size_bytes"]])]
    parts += ["<h2>Candidates</h2>", frame_html(table[[c for c in CANDIDATE_COLUMNS if c in table.columns]])]
    sensitivities = []
    for sensitivity in result.sensitivities:
        if not sensitivity.rows:
            continue
        kept = (f"{len(sensitivity.kept)} node(s) kept in fp32: {', '.join(sensitivity.kept)}"
                if sensitivity.found is not None else f"no passing variant: {sensitivity.stopped}")
        parts += [f"<h2>Sensitivity of {escape(sensitivity.entry.name)}</h2><p>{escape(kept)}</p>",
                  sensitivity_chart(sensitivity), frame_html(pd.DataFrame(sensitivity.rows))]
        sensitivities.append(pd.DataFrame(sensitivity.rows).assign(entry=sensitivity.entry.name))
    if sensitivities:
        tables["search_sensitivity"] = pd.concat(sensitivities, ignore_index=True)
    path = write_page(Path(folder) / "search.html", title=f"Search of study {study}", parts=parts, css=PAGE_CSS)
    return SearchReport(html=path, tables=tables)
