"""The Python API against a real sqlite MLflow store: studies, single attempts, failures, and a study whose run cannot
start leaving no work folder."""

from __future__ import annotations

from pathlib import Path

import mlflow
import numpy as np
import onnx
import pytest
from mlflow import MlflowClient

import tracker
import tracker.study.study
from tests.conftest import FAST_SPEEDUP
from tracker import EXACT, Failed, MeasureConfig, SessionConfig, Study, TimingConfig, log_attempt
from tracker.base.settings import resolve_tracking_uri

FAST = MeasureConfig(profile_runs=3, speedup=FAST_SPEEDUP,
                     timing=TimingConfig(warmup_runs=1, min_runs=3, min_seconds=0.0))


def runs_of(client: MlflowClient, experiment: str) -> dict[str, object]:
    exp = client.get_experiment_by_name(experiment)
    return {r.info.run_name: r for r in client.search_runs([exp.experiment_id])}


@pytest.mark.slow
def test_a_crashing_attempt_fails_its_own_run_and_the_study_goes_on(store, model, feeds, tmp_path):
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"this is not a protobuf \x00\xff" * 10)
    with Study("s", feeds=feeds, experiment="api", config=FAST) as study:
        study.attempt("baseline", model)
        broken = study.attempt("broken", garbage)
        study.attempt("threads1", model, session=SessionConfig(intra_op_num_threads=1))
    assert not broken.ok and "not a readable ONNX model" in broken.error
    runs = runs_of(store, "api")
    assert runs["broken"].info.status == "FAILED"
    assert "garbage.onnx" in runs["broken"].data.tags["tracker.error"]
    assert runs["threads1"].info.status == "FINISHED"
    assert runs["s"].info.status == "FINISHED"
    assert runs["s"].data.metrics["study.failed"] == 1
    assert runs["s"].data.metrics["study.attempts"] == 3
    error_file = store.download_artifacts(runs["broken"].info.run_id, "error.txt", str(tmp_path))
    assert "ModelError" in Path(error_file).read_text()


@pytest.mark.slow
def test_feeds_that_do_not_match_fail_the_attempt_before_timing(store, model, tmp_path):
    bad = {"X": np.zeros((2, 8), dtype=np.float64)}
    with Study("s", feeds=bad, experiment="api", config=FAST) as study:
        result = study.attempt("baseline", model)
    assert "dtype float64, expected float32" in result.error
    run = runs_of(store, "api")["baseline"]
    assert run.info.status == "FAILED"
    assert "latency.p50_ms" not in run.data.metrics


@pytest.mark.slow
def test_log_attempt_outside_a_run_makes_a_top_level_run(store, model, feeds):
    result = log_attempt(model, feeds, name="solo", experiment="api", config=FAST)
    run = store.get_run(result.run_id)
    assert "mlflow.parentRunId" not in run.data.tags
    assert run.data.metrics["diff.passed"] == 1.0
    assert run.data.metrics["latency.runs"] >= 3
    assert run.data.params["ort.graph_optimization_level"] == "all"


@pytest.mark.slow
def test_log_attempt_inside_an_active_run_nests_and_checks_against_given_outputs(store, model, feeds):
    expected = [feeds["X"] @ (onnx.numpy_helper.to_array(model.graph.initializer[0]) + np.eye(8)) + 1.0]
    with mlflow.start_run(run_name="training", experiment_id=store.create_experiment("api")) as parent:
        result = log_attempt(model, feeds, name="exported", config=FAST, baseline_outputs=expected,
                             tolerance=EXACT)
    run = store.get_run(result.run_id)
    assert run.data.tags["mlflow.parentRunId"] == parent.info.run_id
    assert result.diff is not None and not result.diff.passed
    assert run.data.metrics["diff.passed"] == 0.0
    assert run.data.tags["tracker.diff"] == "failed"


@pytest.mark.slow
def test_a_model_given_as_a_path_with_external_data_is_measured_and_sized(store, model, feeds, tmp_path):
    path = tmp_path / "ext" / "model.onnx"
    path.parent.mkdir()
    onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="weights.bin", size_threshold=0)
    with Study("s", feeds=feeds, experiment="api", config=FAST) as study:
        result = study.attempt("baseline", path)
    assert result.ok, result.error
    weights = (path.parent / "weights.bin").stat().st_size
    assert result.graph.size_bytes == path.stat().st_size + weights
    assert result.graph.initializer_bytes == (8 * 8 + 8) * 4


def test_the_tracking_uri_is_the_users_or_an_absolute_sqlite_file(monkeypatch, tmp_path):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert resolve_tracking_uri(tmp_path) == f"sqlite:///{tmp_path.resolve()}/mlflow.db"
    assert resolve_tracking_uri(tmp_path).startswith("sqlite:////")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5000")
    assert resolve_tracking_uri(tmp_path) == "http://127.0.0.1:5000"


@pytest.mark.slow
def test_an_attempt_that_fails_before_measuring_is_a_failed_run_and_the_best_attempt_is_named(store, model, feeds):
    with Study("s", feeds=feeds, experiment="api", config=FAST) as study:
        study.attempt("baseline", model)
        study.record_failure("optimizer_crash", IndexError("list index out of range in the optimizer"))
    runs = runs_of(store, "api")
    crash = runs["optimizer_crash"]
    assert crash.info.status == "FAILED"
    assert crash.data.tags["tracker.error"] == "IndexError: list index out of range in the optimizer"
    assert crash.data.tags["mlflow.parentRunId"] == runs["s"].info.run_id
    assert runs["s"].data.tags["tracker.best_attempt"] == "baseline"
    assert runs["s"].data.metrics["study.failed"] == 1


@pytest.mark.slow
def test_an_attempt_that_fails_before_measuring_is_kept_in_the_outbox_when_the_store_refuses_it(
    store, model, feeds, tmp_path, monkeypatch
):
    import sqlite3

    from tracker.run.loading import load_record
    from tracker.run.record import find_records

    monkeypatch.setenv("TRACKER_OUTBOX", str(tmp_path / "outbox"))
    with Study("s", feeds=feeds, experiment="api", config=FAST) as study:
        with sqlite3.connect(tmp_path / "mlflow.db") as connection:  # from now on no run can be created
            connection.execute("CREATE TRIGGER refuse BEFORE INSERT ON runs BEGIN SELECT RAISE(ABORT, 'full'); END")
        study.record_failure("optimizer_crash", IndexError("list index out of range in the optimizer"))
    (kept,) = find_records(tmp_path / "outbox")
    record = load_record(kept)
    assert (record.attempt, record.status) == ("optimizer_crash", "FAILED")
    assert record.error == "IndexError: list index out of range in the optimizer"
    assert "IndexError" in record.traceback and record.parent_run_id == study.run.info.run_id


@pytest.mark.slow
def test_a_large_raw_profile_is_logged_gzip_compressed_and_still_parses(store, model, feeds, tmp_path, monkeypatch):
    from tracker.profile.parse import parse_profile
    from tracker.run import content as run_content

    monkeypatch.setattr(run_content, "GZIP_ABOVE_BYTES", 1000)  # this small model's profile is ~10 KB
    with Study("s", feeds=feeds, experiment="api", config=FAST) as study:
        result = study.attempt("baseline", model)
    listed = {a.path for a in store.list_artifacts(result.run_id, "profile")}
    assert "profile/ort_profile.json.gz" in listed and "profile/ort_profile.json" not in listed
    local = store.download_artifacts(result.run_id, "profile/ort_profile.json.gz", str(tmp_path))
    parsed = parse_profile(local)
    assert len(parsed.events) == len(result.profile.events)
    assert parsed.run_count == FAST.profile_runs


@pytest.mark.parametrize("name", ["../../etc", "a/b", "..", "", "has space", "-flag", ".hidden"],
                         ids=["parent-dirs", "slash", "dotdot", "empty", "space", "dash", "dot"])
def test_names_that_could_escape_a_folder_are_rejected_before_any_run(name, model, feeds):
    with pytest.raises(ValueError, match="name must be"):
        Study(name, feeds=feeds)
    with pytest.raises(ValueError, match="name must be"):
        tracker.Attempt(name=name, model=model)


@pytest.mark.slow
def test_study_optimize_runs_registry_entries_and_logs_what_each_one_did(store, model, feeds):
    with Study("s", feeds=feeds, experiment="api", config=FAST) as study:
        study.attempt("baseline", model)
        session = study.optimize("ort_opt_disabled", model).result
        fused = study.optimize("add_eyelike", model, tolerance=EXACT).result
        refused = study.optimize("ort_opt_basic", model)  # a transformer entry, on a model without attention
    assert isinstance(refused, Failed) and refused.result is None and "no attention" in refused.reason
    assert session.ok and session.attempt.session.graph_optimization_level == "disable"
    assert fused.ok and fused.diff.passed
    runs = runs_of(store, "api")
    made = runs["add_eyelike"].data
    assert made.metrics["fusion.AddEyeLike"] == 1 and made.metrics["optimize.seconds"] > 0
    assert made.params["precision"] == "fp32" and made.params["applied"] == "True"
    assert made.params["diff.tolerance"] == "exact"
    # A session entry makes no model: nothing was optimized, its settings are its params.
    kept = runs["ort_opt_disabled"].data
    assert "optimize.seconds" not in kept.metrics and "precision" not in kept.params
    assert kept.params["ort.graph_optimization_level"] == "disable"
    refused = runs["ort_opt_basic"]
    assert refused.info.status == "FAILED"
    assert "ort_opt_basic does not apply to this model: no attention" in refused.data.tags["tracker.error"]
    assert runs["s"].data.metrics["study.failed"] == 1


@pytest.mark.slow
def test_study_optimize_rejects_an_unknown_entry_before_any_run(store, model, feeds):
    with Study("s", feeds=feeds, experiment="api", config=FAST) as study:
        with pytest.raises(ValueError, match="unknown optimization 'turbo'; registered: ort_opt_disabled"):
            study.optimize("turbo", model)
    assert set(runs_of(store, "api")) == {"s"}


@pytest.mark.slow
def test_feeds_with_an_id_outside_the_table_it_indexes_fail_the_attempt_naming_it(store, tmp_path):
    from onnx import TensorProto, helper, numpy_helper

    table = numpy_helper.from_array(np.ones((4, 3), dtype=np.float32), "table")
    graph = helper.make_graph([helper.make_node("Gather", ["table", "ids"], ["out"], name="lookup")], "g",
                              [helper.make_tensor_value_info("ids", TensorProto.INT64, ["N"])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["N", 3])], [table])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    with Study("s", feeds={"ids": np.array([0, 9], dtype=np.int64)}, experiment="api", config=FAST) as study:
        result = study.attempt("baseline", model)
    assert not result.ok
    assert "'ids' holds values in [0, 9] but indexes 'table', a table of 4 rows" in result.error


def test_a_study_whose_run_cannot_start_leaves_no_work_folder(store, temp_root, monkeypatch):
    monkeypatch.setattr(tracker.study.study, "measure_machine_or_none", lambda: None)  # no roofs: seconds saved, nothing else
    store.delete_experiment(store.create_experiment("gone"))
    with pytest.raises(mlflow.exceptions.MlflowException, match="deleted experiment"):
        with Study("s", feeds={}, experiment="gone"):
            pass
    assert list(temp_root.iterdir()) == []
