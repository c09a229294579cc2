"""Plotly figures of one attempt's profile summaries, diffs and roofline, and the offline HTML page that holds them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from tracker.measure.costmodel import roofline as R
from tracker.measure.costmodel.step_split import Part, StepSplit
from tracker.profile import aggregate
from tracker.profile import columns as C
from tracker.report.page import write_page

if TYPE_CHECKING:
    from tracker.measure.costmodel.machine import MachinePeaks

_BAR_PX = 22
_MIN_HEIGHT_PX = 320
_TREEMAP_HEIGHT_PX = 700
_OTHER = "(other)"
_BAR_COLOR = "#636efa"  # plotly's first default color
_OTHER_COLOR = "#b0b0b0"
_CSS = "body{font-family:sans-serif;margin:1em 2em}section.figure{margin-bottom:2em}"
_STATUS_MARKS = {"added": " [added]", "removed": " [removed]"}
# (column, view name, axis title, hover format of the value)
_VIEWS = (
    (C.TOTAL_US, "total time", "total kernel time (µs)", ",.0f"),
    (C.CALLS, "number of calls", "calls", ",.0f"),
    (C.PCT, "share of time", "share of kernel time (%)", ".1f"),
)
_SUMMARY_HOVER = (
    "<b>%{y}</b><br>total %{customdata[0]:,.0f} µs<br>calls %{customdata[1]:,.0f}"
    "<br>share %{customdata[2]:.1f} %<br>%{customdata[3]:,.1f} µs per run<extra></extra>"
)


def op_views(summary: pd.DataFrame, *, title: str, top: int = 20) -> list[go.Figure]:
    """Total time, number of calls and share of time per key, as three horizontal bar charts.

    Args:
        summary: the output of `aggregate.summarize` (`tracker.profile.columns.SUMMARY_COLUMNS`).
        title: prefix of each figure's title, e.g. "baseline, by op".
        top: keys shown per view; the rest are folded into one "(other) xN" bar at the bottom.

    Returns:
        Three figures (time, calls, share), each with its largest key on top.
    """
    _require_columns(summary, C.SUMMARY_COLUMNS, "summary")
    if top < 1:
        raise ValueError(f"top must be >= 1, got {top}")
    figures = []
    for column, view, axis_title, value_format in _VIEWS:
        figure_title = f"{title}: {view}"
        if summary.empty:
            figures.append(_no_data_figure(figure_title))
            continue
        # Each view ranks by its own value: the most called op need not be the slowest.
        ranked = summary.sort_values([column, C.KEY], ascending=[False, True], ignore_index=True)
        bars = aggregate.top_n(ranked, top, other=_OTHER)
        colors = [_OTHER_COLOR if i == top else _BAR_COLOR for i in range(len(bars))]
        fig = go.Figure(
            go.Bar(
                x=bars[column],
                y=bars[C.KEY].astype(str),
                orientation="h",
                marker_color=colors,
                customdata=bars[[C.TOTAL_US, C.CALLS, C.PCT, C.US_PER_RUN]].to_numpy(),
                hovertemplate=_SUMMARY_HOVER,
                texttemplate=f"%{{x:{value_format}}}",
                textposition="auto",
            )
        )
        _layout_bars(fig, figure_title, axis_title, n_bars=len(bars))
        figures.append(fig)
    return figures


def treemap(
    events: pd.DataFrame, *, title: str, skip_runs: int = 0, top_nodes_per_op: int = 30
) -> go.Figure:
    """Kernel time as nested rectangles, op type then node, like ONNX Runtime's perf view.

    Args:
        events: one row per kernel invocation (`tracker.profile.columns.EVENT_COLUMNS`).
        title: the figure's title.
        skip_runs: leading runs to leave out (see `aggregate.keep_runs`).
        top_nodes_per_op: nodes drawn per op type; the smaller ones are folded into "(other) xN".

    Returns:
        A treemap sized by summed `dur_us` over the kept runs, under one "all kernels" root.
    """
    _require_columns(events, (C.OP_TYPE, C.NODE, C.RUN, C.DUR_US), "events")
    if top_nodes_per_op < 1:
        raise ValueError(f"top_nodes_per_op must be >= 1, got {top_nodes_per_op}")
    kept = aggregate.keep_runs(events, skip_runs=skip_runs)
    if kept.empty:
        return _no_data_figure(title)
    # Named aggregation; pandas-stubs cannot tell that the unpacked names are not `engine` or `engine_kwargs`.
    nodes = kept.groupby([C.OP_TYPE, C.NODE], sort=False)[C.DUR_US].agg(  # type: ignore[call-overload]
        **{C.DUR_US: "sum", C.CALLS: "size"})
    nodes = nodes.reset_index()
    # Ids are positional because node names hold '/' and any other character a path would split on.
    ids, parents, labels = ["root"], [""], ["all kernels"]
    values, calls = [int(nodes[C.DUR_US].sum())], [int(nodes[C.CALLS].sum())]

    def add(id_: str, parent: str, label: str, rows: pd.DataFrame) -> None:
        ids.append(id_)
        parents.append(parent)
        labels.append(label)
        values.append(int(rows[C.DUR_US].sum()))
        calls.append(int(rows[C.CALLS].sum()))

    for i, (op, op_nodes) in enumerate(nodes.groupby(C.OP_TYPE, sort=False)):
        op_id = f"op{i}"
        add(op_id, "root", str(op), op_nodes)
        op_nodes = op_nodes.sort_values([C.DUR_US, C.NODE], ascending=[False, True])
        shown, rest = op_nodes.iloc[:top_nodes_per_op], op_nodes.iloc[top_nodes_per_op:]
        ids.extend(f"{op_id}/n{j}" for j in range(len(shown)))
        parents.extend([op_id] * len(shown))
        labels.extend(shown[C.NODE].astype(str))
        values.extend(shown[C.DUR_US].astype(int).tolist())
        calls.extend(shown[C.CALLS].astype(int).tolist())
        if not rest.empty:
            add(f"{op_id}/other", op_id, f"{_OTHER} x{len(rest)}", rest)
    fig = go.Figure(
        go.Treemap(
            ids=ids,
            parents=parents,
            labels=labels,
            values=values,
            customdata=calls,
            branchvalues="total",
            sort=True,
            texttemplate="%{label}<br>%{value:,.0f} µs<br>%{percentRoot:.1%}",
            hovertemplate=(
                "<b>%{label}</b><br>%{value:,.0f} µs, %{percentRoot:.1%} of kernel time"
                "<br>calls %{customdata:,.0f}<extra></extra>"
            ),
        )
    )
    fig.update_layout(title=title, height=_TREEMAP_HEIGHT_PX, margin={"t": 60, "l": 10, "r": 10, "b": 10})
    return fig


def comparison_chart(diff: pd.DataFrame, *, title: str, top: int = 20) -> go.Figure:
    """Baseline and attempt time per run, side by side, for the keys that changed the most.

    Args:
        diff: the output of `aggregate.diff_summaries` (`tracker.profile.columns.DIFF_COLUMNS`).
        title: the figure's title.
        top: how many keys to show, those with the largest absolute time delta.

    Returns:
        Grouped horizontal bars, largest change on top; keys only in one side end in "[added]" or
        "[removed]".
    """
    _require_columns(diff, C.DIFF_COLUMNS, "diff")
    if top < 1:
        raise ValueError(f"top must be >= 1, got {top}")
    if diff.empty:
        return _no_data_figure(title)
    ranked = diff.assign(_abs=diff[C.DELTA_US_PER_RUN].abs())
    ranked = ranked.sort_values(["_abs", C.KEY], ascending=[False, True], ignore_index=True).head(top)
    labels = [f"{k}{_STATUS_MARKS.get(s, '')}" for k, s in zip(ranked[C.KEY], ranked[C.STATUS], strict=True)]
    customdata = ranked[[C.DELTA_US_PER_RUN, C.BASE_CALLS_PER_RUN, C.ATTEMPT_CALLS_PER_RUN]].to_numpy()
    hover = (
        "<b>%{y}</b><br>%{fullData.name}: %{x:,.1f} µs per run<br>delta %{customdata[0]:+,.1f} µs"
        "<br>calls per run %{customdata[1]:,.1f} -> %{customdata[2]:,.1f}<extra></extra>"
    )
    fig = go.Figure()
    for name, column in (("baseline", C.BASE_US_PER_RUN), ("attempt", C.ATTEMPT_US_PER_RUN)):
        fig.add_trace(
            go.Bar(
                name=name,
                x=ranked[column],
                y=labels,
                orientation="h",
                customdata=customdata,
                hovertemplate=hover,
            )
        )
    shown = title if len(diff) <= top else f"{title} (top {top} of {len(diff)} by |delta|)"
    _layout_bars(fig, shown, "time per run (µs)", n_bars=2 * len(ranked))
    fig.update_layout(barmode="group", legend={"orientation": "h", "y": 1.02, "yanchor": "bottom"})
    return fig


_ROOFLINE_HOVER = (
    "<b>%{customdata[0]}</b><br>%{y:,.2f} GFLOP/s, %{customdata[1]:,.2f} GB/s<br>%{x:,.3g} FLOP/byte"
    "<br>%{customdata[2]:.1f} % of the roof at this intensity<br>%{customdata[3]:,.1f} µs per run, "
    "%{customdata[4]:.1f} % of kernel time<extra>%{fullData.name}</extra>"
)
_ROOF_COLOR = "#555555"


def roofline_chart(
    table: pd.DataFrame, *, machine: MachinePeaks | None, title: str, series: str | None = None
) -> go.Figure:
    """Op types as points on log-log axes, arithmetic intensity against achieved GFLOP/s, sized by their time,
    under the machine's two roofs: the bandwidth slope and the compute ceiling.

    Args:
        table: a roofline table (`tracker.measure.costmodel.roofline.ROOFLINE_COLUMNS`), e.g. `Roofline.table`.
        machine: the roofs; None draws the points alone.
        title: the figure's title.
        series: a column of `table` naming each row's series (one trace each, e.g. the attempt in a study's
            chart); None draws one trace, each point labelled with its op type.

    Returns:
        The figure. Op types without FLOPs (data movement, not covered) or without time cannot sit on log
        axes: the title says how many are left out.
    """
    _require_columns(table, (R.OP_TYPE, R.US_PER_RUN, R.TIME_PCT, R.GFLOPS, R.GBPS, R.INTENSITY, R.PCT_PEAK),
                     "roofline table")
    if series is not None:
        _require_columns(table, (series,), "roofline table")
    drawn = table[(table[R.GFLOPS] > 0) & (table[R.INTENSITY] > 0) & np.isfinite(table[R.GFLOPS])]
    left_out = len(table) - len(drawn)
    shown = title if not left_out else f"{title} ({left_out} op types without FLOPs or time not drawn)"
    if drawn.empty and machine is None:
        return _no_data_figure(shown)
    fig = go.Figure()
    largest = float(drawn[R.US_PER_RUN].max()) if len(drawn) else 1.0
    groups = drawn.groupby(series, sort=False) if series is not None else [("op types", drawn)]
    for name, rows in groups:
        size = 8 + 36 * np.sqrt(rows[R.US_PER_RUN].to_numpy(dtype=float) / largest)
        fig.add_trace(go.Scatter(
            x=rows[R.INTENSITY], y=rows[R.GFLOPS], name=str(name),
            mode="markers" if series is not None else "markers+text",
            text=rows[R.OP_TYPE].astype(str) if series is None else None, textposition="top center",
            marker={"size": size, "opacity": 0.75, "line": {"width": 1, "color": "#333333"}},
            customdata=np.stack([rows[R.OP_TYPE].astype(str), rows[R.GBPS], rows[R.PCT_PEAK],
                                 rows[R.US_PER_RUN], rows[R.TIME_PCT]], axis=1),
            hovertemplate=_ROOFLINE_HOVER,
        ))
    if machine is not None:
        _draw_roofs(fig, machine, drawn[R.INTENSITY].to_numpy(dtype=float))
    fig.update_layout(
        title=shown, height=520, margin={"t": 60, "l": 10, "r": 10, "b": 40},
        xaxis={"type": "log", "title": "arithmetic intensity (FLOP per byte moved)"},
        yaxis={"type": "log", "title": "achieved GFLOP/s", "automargin": True},
        showlegend=series is not None or machine is not None,
    )
    return fig


def _draw_roofs(fig: go.Figure, machine: MachinePeaks, intensities: np.ndarray) -> None:
    """The bandwidth slope up to the ridge, then the compute ceiling, each named with its value in the legend."""
    ridge = machine.ridge_flop_per_byte
    low = min([ridge / 100, *(intensities / 4)])
    high = max([ridge * 10, *(intensities * 4)])
    hover = "roof %{y:,.1f} GFLOP/s at %{x:,.3g} FLOP/byte<extra></extra>"
    fig.add_trace(go.Scatter(x=[low, ridge], y=[machine.bandwidth_gbps * low, machine.peak_gflops], mode="lines",
                             name=f"bandwidth {machine.bandwidth_gbps:,.1f} GB/s (copy or sum)", hovertemplate=hover,
                             line={"color": _ROOF_COLOR, "width": 2, "dash": "dash"}))
    fig.add_trace(go.Scatter(x=[ridge, high], y=[machine.peak_gflops, machine.peak_gflops], mode="lines",
                             name=f"peak {machine.peak_gflops:,.1f} GFLOP/s (fp32 GEMM)", hovertemplate=hover,
                             line={"color": _ROOF_COLOR, "width": 2}))


# The step's parts, in the order stacked, with their names and colours on the chart.
_SPLIT_PARTS = ((Part.LAYER_MATMULS, "layers' matrix products", "#4575b4"), (Part.LM_HEAD, "lm_head", "#91bfdb"),
                (Part.ATTENTION, "attention", "#fc8d59"), (Part.KV_IO, "KV cache I/O", "#d73027"),
                (Part.OTHER, "other", "#b0b0b0"))


def step_split_chart(splits: Mapping[str, StepSplit], *, title: str) -> go.Figure:
    """A stacked horizontal bar per label (an attempt) of a step's time by part (`StepSplit`), in ms.

    Args:
        splits: the splits, by label, in the order to show them (top to bottom).
        title: the figure's title.
    """
    if not splits:
        return _no_data_figure(title)
    labels = list(splits)
    fig = go.Figure()
    for part, name, color in _SPLIT_PARTS:
        ms = [splits[label].part_ms(part) for label in labels]
        shares = [100.0 * splits[label].share(part) for label in labels]
        steps = [splits[label].step_ms for label in labels]
        fig.add_trace(go.Bar(
            name=name, x=ms, y=labels, orientation="h", marker_color=color,
            customdata=np.stack([shares, steps], axis=1),
            hovertemplate=("<b>%{y}</b><br>" + name + ": %{x:,.2f} ms, %{customdata[0]:.1f} % of the "
                           "%{customdata[1]:,.2f} ms step<extra></extra>"),
        ))
    _layout_bars(fig, title, "ms per step", n_bars=len(labels))
    fig.update_layout(barmode="stack", legend={"orientation": "h", "y": 1.02, "yanchor": "bottom"},
                      margin={"t": 90, "l": 10, "r": 10, "b": 40})
    return fig


def write_html(figures: Sequence[go.Figure], path: str | Path, *, title: str) -> Path:
    """Writes figures into one HTML page that renders offline, with plotly.js inlined once (`page.write_page`).

    Args:
        figures: the figures, in page order.
        path: the file to write; missing parent directories are created.
        title: the page's <title> and heading.

    Returns:
        The path written.
    """
    if not figures:
        raise ValueError("write_html needs at least one figure, got none")
    return write_page(path, title=title, parts=figures, css=_CSS)


def _layout_bars(fig: go.Figure, title: str, axis_title: str, *, n_bars: int) -> None:
    fig.update_layout(
        title=title,
        height=max(_MIN_HEIGHT_PX, 120 + _BAR_PX * n_bars),
        margin={"t": 60, "l": 10, "r": 10, "b": 40},
        xaxis_title=axis_title,
        # A category axis keeps names like "12" from becoming numbers; reversed puts row 0 on top.
        yaxis={"type": "category", "autorange": "reversed", "automargin": True},
    )


def _no_data_figure(title: str) -> go.Figure:
    fig = go.Figure()
    fig.add_annotation(
        text="no data", x=0.5, y=0.5, xref="paper", yref="paper", showarrow=False, font_size=18
    )
    fig.update_layout(title=title, height=_MIN_HEIGHT_PX)
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return fig


def _require_columns(frame: pd.DataFrame, columns: Sequence[str], what: str) -> None:
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise ValueError(
            f"{what} lacks columns {missing}; expected {list(columns)}, got {list(frame.columns)}"
        )
