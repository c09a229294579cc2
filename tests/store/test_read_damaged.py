"""`tracker compare` on a study one of whose attempts' tables is damaged: that attempt's row says which file and
why ("unreadable"), the rest of the study compares, the exit code stays 0, and the HTML report is still written."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from mlflow import MlflowClient

from tests.conftest import FAST_SPEEDUP, isolate_mlflow, new_sqlite_store
from tests.models import make_linear_model
from tracker import MeasureConfig, SessionConfig, Study, TimingConfig
from tracker.cli import main

FAST = MeasureConfig(profile_runs=3, speedup=FAST_SPEEDUP, timing=TimingConfig(warmup_runs=1, min_runs=3,
                                                                               min_seconds=0.0), trace_levels=(1,))


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> tuple[str, dict[str, str]]:
    """A study "dmg" of two attempts, its store's URI and each attempt's run id."""
    _, uri, _ = new_sqlite_store(tmp_path_factory, "damaged")
    feeds = {"X": np.random.default_rng(0).standard_normal((2, 8)).astype(np.float32)}
    with pytest.MonkeyPatch.context() as mp:
        isolate_mlflow(mp)
        with Study("dmg", feeds=feeds, experiment="damaged", config=FAST, tracking_uri=uri, log_models=False) as s:
            s.attempt("baseline", make_linear_model(n_features=8))
            s.attempt("ort_opt_disabled", make_linear_model(n_features=8),
                      session=SessionConfig(graph_optimization_level="disable"))
    return uri, {r.attempt.name: r.run_id for r in s.results}


def _table_file(uri: str, run_id: str, name: str) -> Path:
    return Path(MlflowClient(uri).get_run(run_id).info.artifact_uri.removeprefix("file://")) / "tables" / name


DAMAGE = {
    "empty object": ("{}", "not a table: expected a JSON object with lists 'columns' and 'data', got dict"),
    "a list": ("[1, 2]", "not a table: expected a JSON object with lists 'columns' and 'data', got list"),
    "other columns": ('{"columns": ["a", "b"], "data": [[1, 2]]}', "no column key, us_per_run (it has a, b)"),
    "ragged rows": ('{"columns": ["key", "us_per_run"], "data": [[1]]}', "every row of 'data' must be a list of 2"),
    "text for time": ('{"columns": ["key", "us_per_run"], "data": [["Add", "fast"]]}', "fast"),
    "truncated": ('{"columns": ["key", "us_per_run"], "data": [["Add", 1.', "Expecting"),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_table_makes_its_row_unreadable_and_the_rest_compares(study, tmp_path, monkeypatch, capsys,
                                                                         damage):
    uri, runs = study
    content, reason = DAMAGE[damage]
    path = _table_file(uri, runs["ort_opt_disabled"], "ops_by_op.json")
    kept = path.read_bytes()
    path.write_text(content)
    try:
        isolate_mlflow(monkeypatch)
        monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
        report = tmp_path / "report.html"
        code = main(["compare", "--experiment", "damaged", "--study", "dmg", "--html", str(report)])
        out, err = capsys.readouterr()
    finally:
        path.write_bytes(kept)
    assert code == 0 and "Traceback" not in err, err
    row = next(line for line in out.splitlines() if line.lstrip("* ").split()[:1] == ["ort_opt_disabled"])
    assert "unreadable: tables/ops_by_op.json: " in row and reason in out
    assert "2 attempts" in out.splitlines()[0]
    assert "note: ort_opt_disabled: unreadable (tables/ops_by_op.json: " in out
    assert report.stat().st_size > 0


def test_a_table_that_is_a_folder_is_unreadable_not_a_crash(study, monkeypatch, capsys):
    uri, runs = study
    path = _table_file(uri, runs["ort_opt_disabled"], "graph_diff.json")
    kept = path.read_bytes()
    path.unlink()
    path.mkdir()
    try:
        isolate_mlflow(monkeypatch)
        monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
        code = main(["compare", "--experiment", "damaged", "--study", "dmg", "--json"])
        out, err = capsys.readouterr()
    finally:
        shutil.rmtree(path)
        path.write_bytes(kept)
    assert code == 0 and "Traceback" not in err, err
    import json

    attempts = {a["attempt"]: a for a in json.loads(out)["attempts"]}
    assert attempts["ort_opt_disabled"]["unreadable"].startswith("tables/graph_diff.json: ")
    assert attempts["baseline"]["unreadable"] is None
