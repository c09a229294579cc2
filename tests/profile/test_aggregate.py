"""Tests of tracker.profile.aggregate on the committed ORT 1.32 profile and on small hand-made event tables."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tracker.profile import columns as C
from tracker.profile.aggregate import diff_summaries, keep_runs, summarize, top_n
from tracker.profile.parse import parse_profile

NEW = Path(__file__).parents[1] / "fixtures" / "profile_ort_1_32.json"
VIEWS = {"op": C.OP_TYPE, "node": C.NODE, "provider": C.PROVIDER}


@pytest.fixture(scope="module")
def events() -> pd.DataFrame:
    return parse_profile(NEW).events


def _events(rows: list[tuple[str, int, int]]) -> pd.DataFrame:
    """A kernel-invocation table from (op type, run, dur_us) rows; node name = op type."""
    return pd.DataFrame(
        {
            C.OP_TYPE: [op for op, _, _ in rows],
            C.NODE: [op for op, _, _ in rows],
            C.PROVIDER: "CPUExecutionProvider",
            C.RUN: np.array([run for _, run, _ in rows], dtype=np.int64),
            C.DUR_US: np.array([dur for _, _, dur in rows], dtype=np.int64),
        }
    )


@pytest.mark.parametrize(
    ("by", "calls"),
    [
        pytest.param("op", {"Add": 10, "EyeLike": 5, "MatMul": 5}, id="by-op"),
        pytest.param("node", {"eye": 5, "add1": 5, "mm": 5, "add2": 5}, id="by-node"),
        pytest.param("provider", {"CPUExecutionProvider": 20}, id="by-provider"),
    ],
)
def test_each_view_gives_the_total_time_and_calls_of_every_key(events, by, calls):
    summary = summarize(events, by=by)
    expected_totals = events.groupby(VIEWS[by])[C.DUR_US].sum().to_dict()
    assert dict(zip(summary[C.KEY], summary[C.TOTAL_US])) == expected_totals
    assert dict(zip(summary[C.KEY], summary[C.CALLS])) == calls
    assert summary[C.TOTAL_US].sum() == events[C.DUR_US].sum()
    assert tuple(summary.columns) == C.SUMMARY_COLUMNS


@pytest.mark.parametrize("by", ["op", "node", "provider"])
def test_each_view_has_shares_summing_to_100_and_is_sorted_by_time(events, by):
    summary = summarize(events, by=by)
    assert summary[C.PCT].sum() == pytest.approx(100.0)
    assert summary[C.PCT].tolist() == pytest.approx((100.0 * summary[C.TOTAL_US] / summary[C.TOTAL_US].sum()).tolist())
    assert summary[C.TOTAL_US].is_monotonic_decreasing
    assert summary[C.US_PER_RUN].tolist() == pytest.approx((summary[C.TOTAL_US] / 5).tolist())
    assert summary[C.CALLS_PER_RUN].tolist() == pytest.approx((summary[C.CALLS] / 5).tolist())
    assert summary[C.MEAN_US].tolist() == pytest.approx((summary[C.TOTAL_US] / summary[C.CALLS]).tolist())


def test_ties_in_total_time_are_broken_by_key_name():
    summary = summarize(_events([("B", 0, 5), ("A", 0, 5), ("C", 0, 9)]))
    assert summary[C.KEY].tolist() == ["C", "A", "B"]


@pytest.mark.parametrize("by", ["op", "node", "provider"])
def test_skipping_the_first_run_removes_exactly_its_durations(events, by):
    column = VIEWS[by]
    full = summarize(events, by=by).set_index(C.KEY)
    skipped = summarize(events, by=by, skip_runs=1).set_index(C.KEY)
    run0 = events[events[C.RUN] == 0].groupby(column)[C.DUR_US].sum()
    calls0 = events[events[C.RUN] == 0].groupby(column).size()
    for key in full.index:
        assert skipped.loc[key, C.TOTAL_US] == full.loc[key, C.TOTAL_US] - run0[key]
        assert skipped.loc[key, C.CALLS] == full.loc[key, C.CALLS] - calls0[key]
        assert skipped.loc[key, C.US_PER_RUN] == pytest.approx(skipped.loc[key, C.TOTAL_US] / 4)


def test_the_first_run_of_the_fixture_is_the_slowest(events):
    per_run = events.groupby(C.RUN)[C.DUR_US].sum()
    assert per_run.idxmax() == 0  # why skip_runs=1 is the default in studies


@pytest.mark.parametrize("skip_runs", [5, 6, 100])
def test_skipping_every_run_raises_value_error_naming_the_run_count(events, skip_runs):
    with pytest.raises(ValueError, match=rf"skip_runs={skip_runs} leaves no run: the profile holds 5 run\(s\)"):
        summarize(events, skip_runs=skip_runs)


def test_negative_skip_runs_raises_value_error(events):
    with pytest.raises(ValueError, match=r"skip_runs must be >= 0, got -1"):
        keep_runs(events, skip_runs=-1)


def test_invocations_outside_any_run_are_left_out():
    table = _events([("MatMul", 0, 10), ("MatMul", -1, 1000), ("MatMul", 1, 20)])
    summary = summarize(table)
    assert summary[C.TOTAL_US].tolist() == [30]
    assert summary[C.CALLS].tolist() == [2]


@pytest.mark.parametrize("by", ["op", "node"])
@pytest.mark.parametrize("skip_runs", [0, 2], ids=["all-runs", "skip-2"])
def test_per_run_spread_columns_match_a_hand_computation(events, by, skip_runs):
    column = VIEWS[by]
    kept = events[events[C.RUN] >= skip_runs]
    per_run = kept.groupby([column, C.RUN])[C.DUR_US].sum().unstack(fill_value=0)
    summary = summarize(events, by=by, skip_runs=skip_runs).set_index(C.KEY)
    for key, row in per_run.iterrows():
        values = row.to_numpy(dtype=float)
        assert summary.loc[key, C.RUN_MIN_US] == values.min()
        assert summary.loc[key, C.RUN_MAX_US] == values.max()
        assert summary.loc[key, C.RUN_MEAN_US] == pytest.approx(values.mean())
        assert summary.loc[key, C.RUN_STD_US] == pytest.approx(values.std(ddof=0))


def test_a_key_missing_from_a_run_counts_as_zero_in_that_run():
    table = _events([("MatMul", 0, 10), ("Add", 0, 4), ("MatMul", 1, 30)])
    spread = summarize(table).set_index(C.KEY)
    assert spread.loc["Add", C.RUN_MIN_US] == 0
    assert spread.loc["Add", C.RUN_MEAN_US] == pytest.approx(2.0)
    assert spread.loc["Add", C.US_PER_RUN] == pytest.approx(2.0)
    assert spread.loc["MatMul", C.RUN_STD_US] == pytest.approx(10.0)


def test_an_empty_table_gives_an_empty_summary_with_the_summary_columns():
    summary = summarize(_events([]))
    assert summary.empty
    assert tuple(summary.columns) == C.SUMMARY_COLUMNS


def test_top_n_folds_the_smaller_rows_into_one_other_row(events):
    summary = summarize(events, by="node")
    folded = top_n(summary, 2)
    assert len(folded) == 3
    # The NaN spread of the folded row turns the integer min/max columns to float.
    pd.testing.assert_frame_equal(folded.iloc[:2], summary.iloc[:2], check_dtype=False)
    other = folded.iloc[2]
    rest = summary.iloc[2:]
    assert other[C.KEY] == "(other) x2"
    assert other[C.TOTAL_US] == rest[C.TOTAL_US].sum()
    assert other[C.CALLS] == rest[C.CALLS].sum() == 10
    assert other[C.MEAN_US] == pytest.approx(rest[C.TOTAL_US].sum() / 10)
    assert other[C.RUN_MEAN_US] == pytest.approx(rest[C.RUN_MEAN_US].sum())
    assert np.isnan(other[C.RUN_STD_US]) and np.isnan(other[C.RUN_MIN_US]) and np.isnan(other[C.RUN_MAX_US])
    assert folded[C.PCT].sum() == pytest.approx(100.0)
    assert folded[C.TOTAL_US].sum() == summary[C.TOTAL_US].sum()
    assert tuple(folded.columns) == C.SUMMARY_COLUMNS


@pytest.mark.parametrize("n", [3, 4, 10], ids=["n-equals-rows", "n-above-rows", "n-far-above"])
def test_top_n_with_enough_room_returns_the_summary_unchanged(events, n):
    summary = summarize(events, by="op")
    pd.testing.assert_frame_equal(top_n(summary, n), summary)


@pytest.mark.parametrize("n", [0, -1])
def test_top_n_below_one_raises_value_error(events, n):
    with pytest.raises(ValueError, match=rf"top must be >= 1, got {n}"):
        top_n(summarize(events), n)


def test_diff_marks_a_removed_op_and_an_added_op():
    baseline = summarize(_events([("EyeLike", 0, 8), ("Add", 0, 6), ("MatMul", 0, 20)]))
    attempt = summarize(_events([("AddEyeLike", 0, 5), ("MatMul", 0, 20)]))
    diff = diff_summaries(baseline, attempt).set_index(C.KEY)
    assert diff[C.STATUS].to_dict() == {"EyeLike": "removed", "Add": "removed", "AddEyeLike": "added", "MatMul": "both"}
    assert diff.loc["EyeLike", C.ATTEMPT_US_PER_RUN] == 0.0
    assert diff.loc["EyeLike", C.DELTA_US_PER_RUN] == -8.0
    assert diff.loc["EyeLike", C.DELTA_CALLS_PER_RUN] == -1.0
    assert diff.loc["AddEyeLike", C.BASE_US_PER_RUN] == 0.0
    assert diff.loc["AddEyeLike", C.DELTA_US_PER_RUN] == 5.0
    assert diff.loc["AddEyeLike", C.DELTA_CALLS_PER_RUN] == 1.0
    assert diff.loc["MatMul", C.DELTA_US_PER_RUN] == 0.0


def test_diff_is_sorted_largest_gain_first_with_the_diff_columns():
    baseline = summarize(_events([("EyeLike", 0, 8), ("Add", 0, 6), ("MatMul", 0, 20)]))
    attempt = summarize(_events([("AddEyeLike", 0, 5), ("MatMul", 0, 21)]))
    diff = diff_summaries(baseline, attempt)
    assert tuple(diff.columns) == C.DIFF_COLUMNS
    assert diff[C.KEY].tolist() == ["EyeLike", "Add", "MatMul", "AddEyeLike"]
    assert diff[C.DELTA_US_PER_RUN].is_monotonic_increasing


def test_diff_normalizes_per_run_when_run_counts_differ():
    # Same cost per run; the baseline was profiled for 4 runs and the attempt for 2.
    baseline = summarize(_events([(op, run, dur) for run in range(4) for op, dur in [("MatMul", 10), ("Add", 6)]]))
    attempt = summarize(_events([(op, run, dur) for run in range(2) for op, dur in [("MatMul", 10), ("Add", 3)]]))
    assert baseline.set_index(C.KEY).loc["MatMul", C.TOTAL_US] == 40
    assert attempt.set_index(C.KEY).loc["MatMul", C.TOTAL_US] == 20
    diff = diff_summaries(baseline, attempt).set_index(C.KEY)
    assert diff.loc["MatMul", C.DELTA_US_PER_RUN] == 0.0
    assert diff.loc["MatMul", C.DELTA_CALLS_PER_RUN] == 0.0
    assert diff.loc["Add", C.BASE_US_PER_RUN] == 6.0
    assert diff.loc["Add", C.ATTEMPT_US_PER_RUN] == 3.0
    assert diff.loc["Add", C.DELTA_US_PER_RUN] == -3.0


def test_diff_of_the_fixture_with_itself_after_skipping_a_run_is_per_run(events):
    full, skipped = summarize(events, by="node"), summarize(events, by="node", skip_runs=1)
    diff = diff_summaries(full, skipped).set_index(C.KEY)
    assert set(diff[C.STATUS]) == {"both"}
    assert (diff[C.DELTA_CALLS_PER_RUN] == 0).all()
    run0 = events[events[C.RUN] == 0].groupby(C.NODE)[C.DUR_US].sum()
    rest = events[events[C.RUN] > 0].groupby(C.NODE)[C.DUR_US].sum()
    for node in run0.index:
        expected = rest[node] / 4 - (run0[node] + rest[node]) / 5
        assert diff.loc[node, C.DELTA_US_PER_RUN] == pytest.approx(expected)


@pytest.mark.parametrize("by", ["ops", "op_type", "OP", ""])
def test_an_unknown_view_raises_value_error_listing_the_allowed_ones(events, by):
    with pytest.raises(ValueError, match=r"^by must be one of \[.*\], got ") as info:
        summarize(events, by=by)
    message = str(info.value)
    assert all(f"'{allowed}'" in message for allowed in ("node", "op", "provider"))
    assert message.endswith(f"got {by!r}")
