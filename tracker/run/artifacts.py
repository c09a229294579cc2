"""Writes an attempt's tables, charts and traces into a folder, ready to be logged as run artifacts."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from tracker.measure.attempt import AttemptResult, diff_against
from tracker.profile.aggregate import By
from tracker.report import charts

logger = logging.getLogger(__name__)

VIEWS: tuple[By, ...] = ("op", "node", "provider", "layer")


@dataclass
class AttemptArtifacts:
    """Files written for one attempt, and the tables that go to `mlflow.log_table` too."""

    folder: Path
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)


def write_attempt_artifacts(
    result: AttemptResult,
    folder: str | Path,
    *,
    baseline: AttemptResult | None,
    skip_runs: int,
    top: int = 20,
) -> AttemptArtifacts:
    """Writes `folder/{tables,charts,traces}` for one measured attempt (with `tables/roofline.csv` and its chart
    when the attempt has a roofline).

    The raw profile and ORT's optimized graph are not copied here: they are logged from where they are.

    Args:
        result: the measured attempt.
        folder: an empty or new folder; everything in it is meant to be logged.
        baseline: the attempt to compare with (same runtime; may be `result` itself), or None.
        skip_runs: warm-up runs left out of the per-op tables.
        top: ops shown in the charts before the rest is grouped.
    """
    out = AttemptArtifacts(Path(folder))
    out.folder.mkdir(parents=True, exist_ok=True)
    if result.profile is not None:
        for by in VIEWS:
            out.tables[f"ops_by_{by}"] = result.summary(by=by, skip_runs=skip_runs)
    if result.roofline is not None:
        out.tables["roofline"] = result.roofline.table
    if baseline is not None:  # the baseline against itself too: every attempt has the same tables
        out.tables.update(diff_against(result, baseline, skip_runs=skip_runs))
    for name, table in out.tables.items():
        path = out.folder / "tables" / f"{name}.csv"
        path.parent.mkdir(parents=True, exist_ok=True)
        table.to_csv(path, index=False)
    if result.profile is not None:
        _write_charts(result, out, skip_runs=skip_runs, top=top)
    for level, text in result.traces.items():
        path = out.folder / "traces" / f"reference_verbose_{level}.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    if result.graph is not None:
        graph = {"op_types": result.graph.op_types, "opsets": result.graph.opsets}
        (out.folder / "graph.json").write_text(json.dumps(graph, indent=1, sort_keys=True))
    return out


def _write_charts(result: AttemptResult, out: AttemptArtifacts, *, skip_runs: int, top: int) -> None:
    name = result.attempt.name
    figures = charts.op_views(out.tables["ops_by_op"], title=f"{name}: per op type", top=top)
    figures.append(charts.treemap(result.events, title=f"{name}: op type / node", skip_runs=skip_runs))
    if len(out.tables["ops_by_layer"]) > 1:  # only models whose node names carry their block
        by_layer = out.tables["ops_by_layer"].sort_values("key", ignore_index=True)
        figures.append(charts.op_views(by_layer, title=f"{name}: per transformer block", top=len(by_layer))[0])
    if "op_diff" in out.tables:
        figures.append(
            charts.comparison_chart(out.tables["op_diff"], title=f"{name} vs baseline: µs per run", top=top)
        )
    if result.roofline is not None:
        figures.append(charts.roofline_chart(result.roofline.table, machine=result.roofline.machine,
                                             title=f"{name}: op types against the machine's roofs"))
    charts.write_html(figures, out.folder / "charts" / "profile.html", title=f"Profile of attempt {name}")

