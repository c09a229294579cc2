"""`tracker compare` of a study measured on a cluster (a real sqlite store): one row per (attempt, node type) and a
best attempt per node type when it ran on several; a local study's output when it ran on one node type."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mlflow import MlflowClient

from tests.report.cluster_runs import BEST, RUNS, SHOWN
from tracker.cli import main

pytestmark = pytest.mark.slow  # each store takes seconds to log


@pytest.fixture
def compare(monkeypatch, capsys):
    """Runs `tracker compare ARGS` on `study`'s store: (exit code, stdout)."""
    def run(study, *args: str) -> tuple[int, str]:
        monkeypatch.setenv("MLFLOW_TRACKING_URI", study.uri)
        code = main(["compare", *args])
        return code, capsys.readouterr().out
    return run


def _table_lines(out: str) -> list[list[str]]:
    """The table's rows (header and notes left out), split into cells (a star is its own cell)."""
    lines = out.splitlines()[2:]
    return [line.split() for line in lines if line and not line.startswith(("note:", "require "))]


def test_compare_shows_one_row_per_attempt_and_node_type_and_stars_each_types_best(compare, two_node_types):
    code, out = compare(two_node_types, "--study-run", two_node_types.study_run_id)
    assert code == 0
    first, head = out.splitlines()[:2]
    assert first.endswith(": 9 attempts, best per node type: cpu-a: int8; cpu-b: fused")
    assert head.split()[:3] == ["attempt", "node", "type"]
    rows = _table_lines(out)
    starred = [(cells[1], cells[2]) for cells in rows if cells[0] == "*"]
    assert starred == [("int8", "cpu-a"), ("fused", "cpu-b")]
    assert [tuple(c.lstrip("*") for c in cells if c != "*")[:2] for cells in rows] == [
        (a, t or "-") for a, t in SHOWN]


def test_compare_json_has_the_node_columns_and_the_best_per_node_type(compare, two_node_types, tmp_path):
    code, out = compare(two_node_types, "--study-run", two_node_types.study_run_id, "--json")
    data = json.loads(out)
    assert code == 0 and data["best_by_node_type"] == BEST and data["best"] == "int8"
    attempts = data["attempts"]
    assert [(a["attempt"], a["node_type"]) for a in attempts] == SHOWN
    assert [(a["attempt"], a["node_type"]) for a in attempts if a["best"]] == [("int8", "cpu-a"), ("fused", "cpu-b")]
    assert {a["node"] for a in attempts if a["node_type"] == "cpu-a"} == {"node-a1", "node-a2"}
    # the same rows as the study run's own attempts table
    path = MlflowClient(two_node_types.uri).download_artifacts(two_node_types.study_run_id, "report/attempts.json",
                                                               str(tmp_path))
    logged = json.loads(Path(path).read_text())
    assert logged["columns"] == list(attempts[0])
    assert [r[:3] for r in logged["data"]] == [[a["attempt"], a["node_type"], a["node"]] for a in attempts]


def test_a_node_baseline_run_given_by_id_is_left_out(compare, two_node_types):
    node_baseline = two_node_types.run_ids[[r.role for r in RUNS].index("node_baseline")]
    ids = [two_node_types.run_ids[i] for i in (0, 1, 3, 4)]  # baseline and int8 on each type
    code, out = compare(two_node_types, "--run-ids", node_baseline, *ids, "--json")
    data = json.loads(out)
    assert code == 0
    assert [(a["attempt"], a["node_type"]) for a in data["attempts"]] == [
        ("baseline", "cpu-a"), ("int8", "cpu-a"), ("baseline", "cpu-b"), ("int8", "cpu-b")]
    assert data["best_by_node_type"] == {"cpu-a": "int8", "cpu-b": "baseline"}


def test_a_failed_requirement_says_on_which_node_type(compare, two_node_types):
    code, out = compare(two_node_types, "--study-run", two_node_types.study_run_id, "--require", "broken",
                        "--require", "fused")
    assert code == 1
    assert "require broken: FAIL: broken on cpu-a failed: RuntimeError: broken failed; broken on cpu-b failed" in out
    assert "require fused: pass" in out


def test_compare_writes_the_report_with_each_node_types_best(compare, two_node_types, tmp_path):
    path = tmp_path / "report.html"
    code, _ = compare(two_node_types, "--study-run", two_node_types.study_run_id, "--html", str(path))
    page = path.read_text(encoding="utf-8")
    assert code == 0 and "on cpu-a: <b>int8</b>; on cpu-b: <b>fused</b>" in page
    assert page.count('<tr class="best">') == 2


def test_one_node_type_compares_as_a_local_study(compare, one_node_type, no_node_tags):
    outputs = []
    for study in (one_node_type, no_node_tags):
        code, out = compare(study, "--study-run", study.study_run_id, "--json")
        data = json.loads(out)
        assert code == 0 and "best_by_node_type" not in data
        outputs.append([{k: v for k, v in a.items() if k != "run_id"} for a in data["attempts"]])
        code, out = compare(study, "--study-run", study.study_run_id)
        assert out.splitlines()[0].endswith(": 5 attempts, best: int8") and "node type" not in out
    cluster, local = outputs
    assert cluster == local
    assert [a["attempt"] for a in local] == ["baseline", "int8", "fused", "broken", "unexportable"]
