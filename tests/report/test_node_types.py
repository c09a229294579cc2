"""A study measured on a cluster, read back from a real sqlite store: one row per (attempt, node type) and a best
attempt per node type when it ran on several, the shape of a local study when it ran on one, and a node's
repeated baseline kept out of the table and the counts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mlflow import MlflowClient

from tests.report.cluster_runs import BEST, SHOWN
from tracker import compare
from tracker.base.keys import NO_BEST, TAG_BEST
from tracker.report.rows import (
    ATTEMPT,
    ATTEMPT_COLUMNS,
    NODE,
    NODE_TYPE,
    AttemptRow,
    attempt_labels,
    attempt_rows,
    attempts_table,
    best_by_node_type,
    pick_best,
    study_counts,
)
from tracker.report.scenarios import node_type_best_tag, scenario_tags
from tracker.store import read

pytestmark = pytest.mark.slow  # each store takes seconds to log


def _all_rows(study) -> list[AttemptRow]:
    """Every run the study logged (its node_baseline run too), as rows."""
    return [compare.row_from_run(r) for r in read.fetch_runs(study.run_ids, tables=())]


def _logged_table(study, tmp_path: Path, name: str = "attempts") -> list[dict]:
    path = MlflowClient(study.uri).download_artifacts(study.study_run_id, f"report/{name}.json", str(tmp_path))
    logged = json.loads(Path(path).read_text())
    return [dict(zip(logged["columns"], row)) for row in logged["data"]]


@pytest.fixture
def tracking(monkeypatch):
    def use(study):
        monkeypatch.setenv("MLFLOW_TRACKING_URI", study.uri)
        return study
    return use


def test_rows_carry_the_node_and_node_type_their_run_was_tagged_with(tracking, two_node_types):
    rows = _all_rows(tracking(two_node_types))
    assert [(r.attempt, r.node, r.node_type) for r in rows][:4] == [
        ("baseline", "node-a1", "cpu-a"), ("baseline", "node-b1", "cpu-b"), ("baseline", "node-a2", "cpu-a"),
        ("int8", "node-a2", "cpu-a")]
    assert [r.node_baseline for r in rows] == [False, False, True] + [False] * 7
    assert rows[-1].node is None and rows[-1].node_type is None and rows[-1].failed


def test_two_node_types_give_one_row_per_attempt_and_node_type_grouped_by_type(tracking, two_node_types):
    rows = attempt_rows(_all_rows(tracking(two_node_types)))
    assert [(r.attempt, r.node_type) for r in rows] == SHOWN
    table = attempts_table(rows, best=pick_best(rows))
    assert list(table.columns) == [ATTEMPT, NODE_TYPE, NODE, *ATTEMPT_COLUMNS[1:]]
    assert table[table["best"]][[ATTEMPT, NODE_TYPE]].values.tolist() == [["int8", "cpu-a"], ["fused", "cpu-b"]]
    assert table["speedup"].tolist()[:7] == pytest.approx([1.0, 1.8, 1.2, float("nan"), 1.0, 0.7, 1.3], nan_ok=True)
    assert attempt_labels(rows)[:2] == ["baseline @ cpu-a", "int8 @ cpu-a"]
    assert attempt_labels(rows)[-1] == "unexportable"
    assert attempt_labels(rows, with_node_type=False)[:5] == ["baseline", "int8", "fused", "broken", "baseline"]


def test_the_best_attempt_is_picked_within_each_node_type(tracking, two_node_types):
    rows = _all_rows(tracking(two_node_types))
    assert best_by_node_type(rows) == BEST
    assert pick_best(rows) == "int8"  # the overall rule, over every row: the largest speed-up anywhere


def test_the_study_run_names_the_best_attempt_of_each_node_type(tracking, two_node_types):
    study = tracking(two_node_types)
    tags = MlflowClient(study.uri).get_run(study.study_run_id).data.tags
    best_tags = {k: v for k, v in tags.items() if k.startswith(TAG_BEST)}
    assert best_tags == {TAG_BEST: "int8", "tracker.best_attempt.node_type.cpu-a": "int8",
                         "tracker.best_attempt.node_type.cpu-b": "fused"}


def test_a_node_type_mlflow_would_refuse_in_a_key_is_sanitized_and_none_passed_is_said():
    tag = node_type_best_tag("forward", "Intel(R) Xeon(R) 8480+")
    assert tag.startswith("tracker.best_attempt.node_type.Intel_R_ Xeon_R_ 8480_") and "(" not in tag
    assert node_type_best_tag("decode", "m5") == "tracker.best_attempt.decode.node_type.m5"
    rows = [AttemptRow("base", verdict="baseline", speedup=1.0, node_type="m5"),
            AttemptRow("base", verdict="rejected", speedup=1.0, node_type="c7")]
    assert scenario_tags(rows) == {"tracker.best_attempt.node_type.m5": "base",
                                   "tracker.best_attempt.node_type.c7": NO_BEST}


def test_node_baseline_runs_are_kept_out_of_the_table_and_the_counts(tracking, two_node_types, tmp_path):
    study = tracking(two_node_types)
    rows = _all_rows(study)
    assert len(rows) == 10
    assert study_counts(rows) == {"study.attempts": 9, "study.failed": 3}
    assert MlflowClient(study.uri).get_run(study.study_run_id).data.metrics["study.attempts"] == 9
    logged = _logged_table(study, tmp_path)
    assert [(r[ATTEMPT], r[NODE_TYPE]) for r in logged] == SHOWN
    assert "node-a2" in {r[NODE] for r in logged if r[ATTEMPT] == "int8"}
    assert not any(r[ATTEMPT] == "baseline" and r[NODE] == "node-a2" for r in logged)


def test_the_report_page_shows_the_node_type_column_and_each_types_best(tracking, two_node_types, tmp_path):
    study = tracking(two_node_types)
    path = MlflowClient(study.uri).download_artifacts(study.study_run_id, "report/study_report.html", str(tmp_path))
    page = Path(path).read_text(encoding="utf-8")
    assert "Best attempt per node type (on cpu-a: <b>int8</b>; on cpu-b: <b>fused</b>)" in page
    assert "<th class=\"\">node type</th>" in page
    assert page.count('<tr class="best">') == 2
    assert "int8 @ cpu-b" in page and "fused @ cpu-a" in page


def test_one_node_type_gives_the_shape_of_a_local_study(tracking, one_node_type, no_node_tags, tmp_path):
    cluster, local = _logged_table(tracking(one_node_type), tmp_path / "c"), _logged_table(no_node_tags, tmp_path / "l")
    assert list(cluster[0]) == list(local[0]) == list(ATTEMPT_COLUMNS)
    drop = {"run_id"}
    assert [{k: v for k, v in r.items() if k not in drop} for r in cluster] == [
        {k: v for k, v in r.items() if k not in drop} for r in local]
    for study in (one_node_type, no_node_tags):
        run = MlflowClient(study.uri).get_run(study.study_run_id).data
        assert {k: v for k, v in run.tags.items() if k.startswith(TAG_BEST)} == {TAG_BEST: "int8"}
        assert run.metrics["study.attempts"] == 5  # the cluster's node_baseline run is not counted
