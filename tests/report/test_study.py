"""The study report: tables and the offline HTML page from a real small study, and logging it on a run."""

from __future__ import annotations

import re

import mlflow
import numpy as np
import pandas as pd
import pytest
from mlflow import MlflowClient

from tests.conftest import FAST_SPEEDUP, isolate_mlflow, new_sqlite_store
from tests.models import make_linear_model
from tracker import EXACT, FP32, MeasureConfig, SessionConfig, Study, TimingConfig
from tracker.optimize.add_eyelike import WRONG_ADD_EYELIKE, AddEyeLike, fuse_add_eyelike
from tracker.profile import columns as C
from tracker.report.rows import (
    ATTEMPT,
    ATTEMPT_COLUMNS,
    BEST,
    OP_TYPE,
    P50_MS,
    SPEEDUP,
    SPEEDUP_CI_LOW,
    TABLES,
    AttemptRow,
    attempt_labels,
    attempt_status,
    attempts_table,
    graph_changes_by_attempt,
    ops_by_attempt,
    pick_best,
    runtime_baselines,
    speedup_vs_baseline,
)
from tracker.report.study import build_study_report, write_report
from tracker.run.content import rows_from_results
from tracker.store.summary import log_study_report

FAST = MeasureConfig(profile_runs=3, speedup=FAST_SPEEDUP,
                     timing=TimingConfig(warmup_runs=1, min_runs=3, min_seconds=0.0),
                     trace_levels=(1,))


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> Study:
    """Two ORT attempts, three reference-runtime attempts (one with a wrong kernel), one crash."""
    _, uri, _ = new_sqlite_store(tmp_path_factory, "report")
    model = make_linear_model(n_features=8)
    fused = fuse_add_eyelike(model).model
    feeds = {"X": np.random.default_rng(0).standard_normal((2, 8)).astype(np.float32)}
    with pytest.MonkeyPatch.context() as mp:
        isolate_mlflow(mp)
        with Study("report", feeds=feeds, experiment="report", config=FAST, tracking_uri=uri, log_models=False) as s:
            s.attempt("baseline", model)
            s.attempt("ort_opt_disabled", model, session=SessionConfig(graph_optimization_level="disable"))
            s.attempt("reference_runtime", model, runtime="reference", tolerance=FP32)
            s.attempt("reference_fused", fused, runtime="reference", new_ops=(AddEyeLike,), tolerance=EXACT)
            s.attempt("reference_fused_wrong", fused, runtime="reference", new_ops=(WRONG_ADD_EYELIKE,),
                      tolerance=EXACT)
            s.record_failure("optimizer_crashed", RuntimeError("the optimizer raised"))
    return s


@pytest.fixture(scope="module")
def rows(study) -> list[AttemptRow]:
    return rows_from_results(study.results, failures=study.failures, skip_runs=FAST.skip_runs)


@pytest.mark.slow
def test_rows_from_results_hold_one_row_per_attempt_in_study_order(study, rows):
    assert [r.attempt for r in rows] == [r.attempt.name for r in study.results] + ["optimizer_crashed"]
    by_name = {r.attempt: r for r in rows}
    assert by_name["baseline"].verdict == "baseline" and by_name["baseline"].speedup == 1.0
    assert by_name["reference_runtime"].verdict == "baseline"  # the first attempt of its runtime
    wrong = by_name["reference_fused_wrong"]
    assert (wrong.verdict, wrong.status, wrong.diff_passed) == ("rejected", "diff_failed", False)
    assert wrong.diff_max_abs > 0.1
    crashed = by_name["optimizer_crashed"]
    assert crashed.failed and "the optimizer raised" in crashed.error and crashed.ops_by_op is None
    for result in study.results:
        row = by_name[result.attempt.name]
        assert row.run_id == result.run_id
        assert row.p50_ms == result.latency.p50_ms
        assert row.node_count == result.graph.node_count


@pytest.mark.parametrize(
    ("failed", "diff_passed", "status"),
    [(False, True, "ok"), (False, None, "ok"), (False, False, "diff_failed"), (True, True, "failed"),
     (True, None, "failed")],
    ids=["passed", "no-check", "outside-tolerance", "crashed-after-its-check", "crashed"],
)
def test_an_attempts_status_is_failed_when_it_crashed_else_its_accuracy_check(failed, diff_passed, status):
    assert attempt_status(failed=failed, diff_passed=diff_passed) == status


@pytest.mark.slow
def test_each_runtimes_baseline_is_its_first_attempt_that_succeeded(study):
    baselines = {runtime: r.attempt.name for runtime, r in runtime_baselines(study.results).items()}
    assert baselines == {"onnxruntime": "baseline", "reference": "reference_runtime"}


@pytest.mark.slow
def test_a_rows_speedup_vs_baseline_is_the_ratio_of_its_runtimes_baseline_p50_to_its_own(study, rows):
    by_name = {r.attempt: r for r in rows}
    baselines = runtime_baselines(study.results)
    for result in study.results:
        expected = baselines[result.attempt.runtime].latency.p50_ms / result.latency.p50_ms
        assert by_name[result.attempt.name].speedup_vs_baseline == expected
    assert by_name["baseline"].speedup_vs_baseline == by_name["reference_runtime"].speedup_vs_baseline == 1.0
    assert speedup_vs_baseline(None, 1.0) is None and speedup_vs_baseline(2.0, 1.0) == 0.5


@pytest.mark.slow
def test_the_attempts_table_has_the_report_columns_and_marks_the_best(study, rows):
    table = attempts_table(rows, best=study.best.attempt.name)
    assert tuple(table.columns) == ATTEMPT_COLUMNS
    assert table[BEST].sum() == 1
    assert table.loc[table[BEST], ATTEMPT].item() == study.best.attempt.name
    speedups = table.set_index(ATTEMPT)
    assert speedups.loc["ort_opt_disabled", SPEEDUP_CI_LOW] <= speedups.loc["ort_opt_disabled", SPEEDUP]
    assert pd.isna(speedups.loc["optimizer_crashed", P50_MS])


@pytest.mark.slow
def test_ops_by_attempt_puts_each_attempts_profiled_time_per_op_type_side_by_side(study, rows):
    table = ops_by_attempt(rows)
    assert list(table.columns) == [OP_TYPE, *(r.attempt.name for r in study.results)]
    for result in study.results:
        expected = result.summary(skip_runs=FAST.skip_runs).set_index(C.KEY)[C.US_PER_RUN]
        shown = table.set_index(OP_TYPE)[result.attempt.name].dropna()
        pd.testing.assert_series_equal(shown.sort_index(), expected.sort_index(), check_names=False)
    ops = table.set_index(OP_TYPE)
    assert pd.isna(ops.loc["EyeLike", "reference_fused"])  # fused away
    assert ops.loc["AddEyeLike", "reference_fused"] > 0


@pytest.mark.slow
def test_graph_changes_by_attempt_list_only_the_op_types_an_attempt_changed(rows):
    table = graph_changes_by_attempt(rows).set_index(OP_TYPE)
    assert set(table.index) == {"Add", "EyeLike", "tracker.fusions:AddEyeLike"}
    assert table["reference_fused"].to_dict() == {"Add": -1, "EyeLike": -1, "tracker.fusions:AddEyeLike": 1}
    assert (table[["baseline", "ort_opt_disabled", "reference_runtime"]] == 0).all().all()
    assert "optimizer_crashed" not in table.columns


@pytest.mark.parametrize(
    ("verdicts", "best"),
    [
        ([("base", "baseline", 1.0), ("a", "better", 1.2), ("b", "better", 1.5), ("c", "rejected", 3.0)], "b"),
        ([("base", "baseline", 1.0), ("a", "inconclusive", 1.4), ("b", "worse", 0.5)], "base"),
        ([("a", "rejected", 2.0), ("b", None, None)], None),
    ],
    ids=["fastest-better-attempt", "nothing-better-so-the-baseline", "nothing-passed"],
)
def test_the_best_attempt_is_the_fastest_better_one_else_the_first_baseline(verdicts, best):
    rows = [AttemptRow(attempt=name, verdict=v, speedup=s) for name, v, s in verdicts]
    assert pick_best(rows) == best


def test_attempts_with_the_same_name_get_distinct_columns():
    rows = [AttemptRow(attempt="baseline", run_id="aaaaaaaa1111"),
            AttemptRow(attempt="baseline", run_id="bbbbbbbb2222"), AttemptRow(attempt="fp16")]
    assert attempt_labels(rows) == ["baseline (aaaaaaaa)", "baseline (bbbbbbbb)", "fp16"]


@pytest.mark.slow
def test_the_html_report_renders_offline_with_plotly_inlined_once(study, rows, tmp_path):
    best = study.best.attempt.name
    built = build_study_report(rows, tmp_path / "report", study="report", best=best)
    page = built.html.read_text(encoding="utf-8")
    assert built.html == tmp_path / "report" / "study_report.html"
    assert '<script src="http' not in page and not re.search(r"<script[^>]+src=", page)
    assert page.count("Plotly.newPlot") == 2  # speed-up chart, per-op stacked bars
    assert len(re.findall(r"\* plotly\.js v\d", page)) == 1  # the bundle, once
    for r in rows:
        assert f">{r.attempt}<" in page or f"&#9733; {r.attempt}<" in page
    assert 'class="verdict v-rejected"' in page and 'class="verdict v-failed"' in page
    assert page.count('<tr class="best">') == 1 and f"&#9733; {best}" in page
    assert set(built.tables) == set(TABLES)


def test_a_report_needs_an_attempt(tmp_path):
    with pytest.raises(ValueError, match="at least one attempt"):
        write_report([], tmp_path / "r.html", title="empty", best=None)


@pytest.mark.slow
def test_log_study_report_logs_the_page_and_each_table_for_the_ui(rows, tmp_path, monkeypatch):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    experiment_id = client.create_experiment("logged", artifact_location=str(tmp_path / "artifacts"))
    built = build_study_report(rows, tmp_path / "built", study="report", best="baseline")
    isolate_mlflow(monkeypatch)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    with mlflow.start_run(experiment_id=experiment_id) as run:
        log_study_report(run.info.run_id, built.html, built.tables)
    logged = {a.path for a in client.list_artifacts(run.info.run_id, "report")}
    assert logged == {"report/study_report.html", "report/attempts.json", "report/ops_by_attempt.json",
                      "report/graph_changes_by_attempt.json"}
    ops = client.load_table(experiment_id, "report/ops_by_attempt.json", run_ids=[run.info.run_id])
    assert list(ops.columns) == list(built.tables["ops_by_attempt"].columns)
    attempts = client.load_table(experiment_id, "report/attempts.json", run_ids=[run.info.run_id])
    assert list(attempts[ATTEMPT]) == [r.attempt for r in rows]
