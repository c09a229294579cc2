import re
from pathlib import Path

import numpy as np
import pandas as pd
import plotly
import pytest

from tracker.profile import aggregate
from tracker.profile import columns as C
from tracker.profile.parse import parse_profile
from tracker.report.charts import comparison_chart, op_views, treemap, write_html

FIXTURES = Path(__file__).parents[1] / "fixtures"
PROFILES = ["profile_ort_1_32.json", "profile_ort_1_16_fences.json"]


@pytest.fixture(params=PROFILES, ids=["ort_1_32", "ort_1_16_fences"])
def events(request) -> pd.DataFrame:
    return parse_profile(FIXTURES / request.param).events


def synthetic_events(n_ops: int, nodes_per_op: int = 1, runs: int = 2) -> pd.DataFrame:
    """Kernel invocations of `n_ops` op types with distinct times; node names contain '/'."""
    rows = []
    for run in range(runs):
        for i in range(n_ops):
            for j in range(nodes_per_op):
                rows.append(
                    {
                        C.OP_TYPE: f"Op{i:03d}",
                        C.NODE: f"/model/layer.{i}/Op{i:03d}_{j}",
                        C.PROVIDER: "CPUExecutionProvider",
                        C.RUN: run,
                        C.DUR_US: 1000 - 7 * i + j,
                        C.TS_US: len(rows),
                        C.THREAD: "1",
                        C.INPUT_SHAPES: "[]",
                        C.OUTPUT_SHAPES: "[]",
                        C.OUTPUT_SIZE: 0,
                        C.ACTIVATION_SIZE: 0,
                        C.PARAMETER_SIZE: 0,
                        C.MEM_IN_USE_DELTA: pd.NA,
                    }
                )
    return pd.DataFrame(rows, columns=list(C.EVENT_COLUMNS))


def test_the_three_views_show_every_op_with_the_summary_values(events):
    summary = aggregate.summarize(events)
    time_fig, calls_fig, share_fig = op_views(summary, title="baseline")

    for fig, column in ((time_fig, C.TOTAL_US), (calls_fig, C.CALLS), (share_fig, C.PCT)):
        (bar,) = fig.data
        expected = summary.sort_values([column, C.KEY], ascending=[False, True])
        assert bar.orientation == "h"
        assert list(bar.y) == list(expected[C.KEY])
        np.testing.assert_allclose(bar.x, expected[column])
        assert fig.layout.yaxis.autorange == "reversed"  # the first (largest) bar is drawn on top
    assert "µs" in time_fig.layout.xaxis.title.text
    assert "%" in share_fig.layout.xaxis.title.text


def test_the_bars_are_largest_first_in_each_view(events):
    for fig in op_views(aggregate.summarize(events), title="baseline"):
        values = list(fig.data[0].x)
        assert values == sorted(values, reverse=True)


def test_hover_shows_time_calls_and_share_of_each_op(events):
    summary = aggregate.summarize(events)
    (bar,) = op_views(summary, title="baseline")[0].data
    hover_values = pd.DataFrame(bar.customdata, columns=[C.TOTAL_US, C.CALLS, C.PCT, C.US_PER_RUN])
    pd.testing.assert_frame_equal(
        hover_values, summary[[C.TOTAL_US, C.CALLS, C.PCT, C.US_PER_RUN]], check_dtype=False
    )
    assert "µs" in bar.hovertemplate and "calls" in bar.hovertemplate


def test_a_model_with_many_op_types_shows_the_top_n_and_one_other_bar():
    summary = aggregate.summarize(synthetic_events(n_ops=50))

    for fig in op_views(summary, title="big", top=10):
        (bar,) = fig.data
        assert len(bar.y) == 11
        assert bar.y[-1] == "(other) x40"
    time_bar = op_views(summary, title="big", top=10)[0].data[0]
    assert time_bar.x.sum() == summary[C.TOTAL_US].sum()


def test_an_empty_summary_gives_no_data_figures_instead_of_raising(events):
    empty = aggregate.summarize(events.iloc[:0])

    figures = op_views(empty, title="nothing")

    assert len(figures) == 3
    for fig in figures:
        assert [a.text for a in fig.layout.annotations] == ["no data"]


def test_treemap_areas_add_up_to_the_total_kernel_time(events):
    (tree,) = treemap(events, title="perf").data
    values = dict(zip(tree.ids, tree.values, strict=True))
    parents = dict(zip(tree.ids, tree.parents, strict=True))
    leaves = [i for i in tree.ids if i not in set(tree.parents)]

    assert values["root"] == events[C.DUR_US].sum()
    assert sum(values[i] for i in leaves) == events[C.DUR_US].sum()
    assert tree.branchvalues == "total"
    for op_id in (i for i in tree.ids if parents[i] == "root"):
        assert values[op_id] == sum(values[i] for i in tree.ids if parents[i] == op_id)


def test_treemap_groups_nodes_under_their_op_type(events):
    (tree,) = treemap(events, title="perf").data
    label_of = dict(zip(tree.ids, tree.labels, strict=True))
    drawn = {
        (label_of[parent], label)
        for parent, label in zip(tree.parents, tree.labels, strict=True)
        if parent not in ("", "root")
    }
    assert drawn == set(events[[C.OP_TYPE, C.NODE]].itertuples(index=False, name=None))


def test_treemap_folds_the_smaller_nodes_of_an_op_type_and_keeps_slashes_in_names():
    events = synthetic_events(n_ops=3, nodes_per_op=40)

    (tree,) = treemap(events, title="perf", top_nodes_per_op=5).data

    op_ids = [i for i, p in zip(tree.ids, tree.parents, strict=True) if p == "root"]
    assert len(tree.ids) == 1 + 3 * (1 + 5 + 1)
    for op_id in op_ids:
        children = [lab for lab, p in zip(tree.labels, tree.parents, strict=True) if p == op_id]
        assert children[-1] == "(other) x35"
        assert all(lab.startswith("/model/layer.") for lab in children[:-1])
    assert tree.values[0] == events[C.DUR_US].sum()


def test_treemap_leaves_out_the_skipped_warm_up_runs(events):
    (tree,) = treemap(events, title="perf", skip_runs=1).data
    assert tree.values[0] == events.loc[events[C.RUN] >= 1, C.DUR_US].sum()


def test_comparison_marks_an_op_the_attempt_no_longer_runs_as_removed(events):
    baseline = aggregate.summarize(events)
    attempt = aggregate.summarize(events[events[C.OP_TYPE] != "EyeLike"])

    fig = comparison_chart(aggregate.diff_summaries(baseline, attempt), title="fused")

    base_bar, attempt_bar = fig.data
    assert (base_bar.name, attempt_bar.name) == ("baseline", "attempt")
    assert fig.layout.barmode == "group"
    labels = list(base_bar.y)
    assert labels[0] == "EyeLike [removed]"  # the only change, so the largest one
    assert attempt_bar.x[0] == 0
    assert base_bar.x[0] == pytest.approx(baseline.set_index(C.KEY).loc["EyeLike", C.US_PER_RUN])
    assert sorted(labels[1:]) == sorted(set(baseline[C.KEY]) - {"EyeLike"})


def test_comparison_shows_the_keys_with_the_largest_absolute_change():
    baseline_events = synthetic_events(n_ops=30)
    attempt_events = synthetic_events(n_ops=31)
    attempt_events.loc[attempt_events[C.OP_TYPE] == "Op010", C.DUR_US] += 5_000
    attempt_events.loc[attempt_events[C.OP_TYPE] == "Op020", C.DUR_US] -= 1

    diff = aggregate.diff_summaries(aggregate.summarize(baseline_events), aggregate.summarize(attempt_events))
    fig = comparison_chart(diff, title="x", top=2)

    assert list(fig.data[0].y) == ["Op010", "Op030 [added]"]
    assert "top 2 of 31" in fig.layout.title.text


def test_an_empty_diff_gives_a_no_data_figure(events):
    empty = aggregate.summarize(events.iloc[:0])
    fig = comparison_chart(aggregate.diff_summaries(empty, empty), title="nothing")
    assert [a.text for a in fig.layout.annotations] == ["no data"]


@pytest.fixture(scope="module")
def page(tmp_path_factory) -> tuple[str, list]:
    events = parse_profile(FIXTURES / PROFILES[0]).events
    summary = aggregate.summarize(events)
    diff = aggregate.diff_summaries(summary, aggregate.summarize(events[events[C.OP_TYPE] != "EyeLike"]))
    figures = [
        *op_views(summary, title="ops"),
        treemap(events, title="tree"),
        comparison_chart(diff, title="cmp"),
    ]
    target = tmp_path_factory.mktemp("html") / "nested" / "ops.html"
    path = write_html(figures, target, title="Ops <run 1>")
    return path.read_text(encoding="utf-8"), figures


def test_the_page_inlines_plotly_js_exactly_once(page):
    text, _ = page
    banner = f"plotly.js v{plotly.offline.get_plotlyjs_version()}"
    assert text.count(banner) == 1


def test_the_page_loads_no_script_from_the_network(page):
    text, _ = page
    assert "<script src=" not in text
    assert not re.search(r"<script[^>]+src=[\"']https?:", text)


def test_the_page_holds_every_figure_and_a_title(page):
    text, figures = page
    for i, fig in enumerate(figures):
        assert f'id="figure-{i}"' in text
        assert fig.layout.title.text in text
    assert "<title>Ops &lt;run 1&gt;</title>" in text
    assert "<h1>Ops &lt;run 1&gt;</h1>" in text


def test_write_html_creates_parent_directories_and_returns_the_path(tmp_path):
    target = tmp_path / "a" / "b" / "ops.html"
    empty_summary = pd.DataFrame(columns=list(C.SUMMARY_COLUMNS))
    written = write_html(op_views(empty_summary, title="t"), target, title="t")
    assert written == target
    assert target.is_file()


@pytest.mark.parametrize(
    "call",
    [
        pytest.param(lambda: op_views(pd.DataFrame({C.KEY: []}), title="t"), id="summary-missing-columns"),
        pytest.param(
            lambda: treemap(synthetic_events(n_ops=2), title="t", top_nodes_per_op=0), id="no-nodes-per-op"
        ),
        pytest.param(lambda: write_html([], "unused.html", title="t"), id="no-figures"),
    ],
)
def test_bad_input_raises_value_error(call):
    with pytest.raises(ValueError):
        call()
