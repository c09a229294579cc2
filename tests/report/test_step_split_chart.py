"""The decode step's split on the study page: a stacked bar per attempt, from rows read the way `tracker compare` reads
runs back (their metrics only)."""

from __future__ import annotations

import pytest

from tracker.base.keys import TAG_VERDICT
from tracker.measure.costmodel.step_split import Part, StepSplit
from tracker.report.charts import step_split_chart
from tracker.report.rows import row_from_content
from tracker.report.scenarios import decode_splits
from tracker.report.study import build_study_report

PREFIX = "gen.decode.past512."


def split(layers: float, lm_head: float, attention: float, kv_io: float, other: float) -> StepSplit:
    return StepSplit(step_ms=layers + lm_head + attention + kv_io + other, layer_matmuls_ms=layers, lm_head_ms=lm_head,
                     attention_ms=attention, kv_io_ms=kv_io, other_ms=other, kv_host_ms=kv_io * 0.6,
                     kv_concat_ms=kv_io * 0.4, between_kernels_ms=other / 2, runs=5)


SPLITS = {"baseline": split(12.0, 4.0, 1.5, 3.0, 1.2), "int4_block32": split(3.0, 4.0, 1.5, 3.0, 1.2)}


def row(name: str, verdict: str, step: StepSplit | None):
    metrics = {"latency.speedup": 1.0, "latency.speedup_ci_low": 0.98, "latency.speedup_ci_high": 1.02,
               PREFIX + "p50_ms": 20.0, PREFIX + "roofline.memory_bound": 1.0, "gen.diff.passed": 1.0}
    if step is not None:
        metrics.update({PREFIX + key: value for key, value in step.metrics().items()})
    return row_from_content(name, metrics=metrics, tags={TAG_VERDICT: verdict})


def test_the_chart_stacks_each_part_of_each_attempt_in_ms():
    fig = step_split_chart(SPLITS, title="t")
    assert fig.layout.barmode == "stack"
    assert [t.name for t in fig.data] == ["layers' matrix products", "lm_head", "attention", "KV cache I/O", "other"]
    for trace, part in zip(fig.data, Part):
        assert list(trace.y) == list(SPLITS)
        assert list(trace.x) == pytest.approx([s.part_ms(part) for s in SPLITS.values()])
    # the bars' lengths are the steps
    totals = [sum(t.x[i] for t in fig.data) for i in range(len(SPLITS))]
    assert totals == pytest.approx([s.step_ms for s in SPLITS.values()])


def test_rows_read_back_from_metrics_carry_their_split_and_one_without_is_left_out():
    rows = [row(name, "baseline" if name == "baseline" else "better", s) for name, s in SPLITS.items()]
    rows.append(row("older_run", "same", None))
    length, splits = decode_splits(rows)
    assert length == 512
    assert splits == SPLITS


def test_the_study_page_draws_the_split_when_the_generation_scenario_ran(tmp_path):
    rows = [row(name, "baseline" if name == "baseline" else "better", s) for name, s in SPLITS.items()]
    page = build_study_report(rows, tmp_path / "with", study="s", best="baseline").html.read_text()
    assert "Where a decode step&#x27;s time goes" in page or "Where a decode step's time goes" in page
    assert "KV cache I/O" in page
    without = [row(name, "baseline" if name == "baseline" else "better", None) for name in SPLITS]
    page = build_study_report(without, tmp_path / "without", study="s", best="baseline").html.read_text()
    assert "KV cache I/O" not in page


def test_no_split_draws_an_empty_figure():
    fig = step_split_chart({}, title="nothing")
    assert not fig.data and fig.layout.annotations[0].text == "no data"
