"""A tracking server that dies in the middle of a study, or of an upload: nothing measured is lost, and it uploads
later."""

from __future__ import annotations

import logging

import mlflow
import numpy as np
import onnx
import pytest
from mlflow import MlflowClient

from tests.conftest import FAST_SPEEDUP, isolate_mlflow
from tests.models import make_linear_model
from tracker import MeasureConfig, SessionConfig, Study, TimingConfig
from tracker.cli import main
from tracker.run.record import find_records
from tracker.server import LocalMlflowServer

# Each test starts an `mlflow server` and logs studies to it.
pytestmark = pytest.mark.slow

FAST = MeasureConfig(profile_runs=3, speedup=FAST_SPEEDUP,
                     timing=TimingConfig(warmup_runs=1, min_runs=3, min_seconds=0.0))


@pytest.fixture
def server(tmp_path):
    """A real `mlflow server` the test may kill and start again. MLflow's URI and the HTTP settings the test's commands
    export for it are put back when it goes: a later test must never retry a server that no longer runs (each call
    retries for minutes)."""
    server = LocalMlflowServer(f"sqlite:///{tmp_path / 'server.db'}", tmp_path / "artifacts")
    server.start()
    with pytest.MonkeyPatch.context() as mp:
        isolate_mlflow(mp)
        yield server
    server.kill()


def test_attempts_measured_after_the_server_died_are_kept_and_uploaded_later(
    server, tmp_path, monkeypatch, caplog
):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", server.uri)
    monkeypatch.setenv("TRACKER_OUTBOX", str(tmp_path / "outbox"))
    model = make_linear_model(n_features=8)
    feeds = {"X": np.random.default_rng(0).standard_normal((2, 8)).astype(np.float32)}
    caplog.set_level(logging.ERROR, logger="tracker")
    with Study("outage", feeds=feeds, experiment="outage", config=FAST) as study:
        study.attempt("baseline", model)
        server.kill()
        late = study.attempt("ort_opt_disabled", model, session=SessionConfig(graph_optimization_level="disable"))
    parent_id = study.run.info.run_id

    assert late.ok and late.latency is not None, "measuring does not need the server"
    assert late.outbox is not None and late.outbox.is_dir()
    assert f"tracker upload {late.outbox}" in caplog.text
    assert "could not log the summary of study outage" in caplog.text
    assert [p.name for p in find_records(tmp_path / "outbox")] == ["ort_opt_disabled"]
    assert mlflow.active_run() is None, "no dead run is left on this process's run stack"

    server.start()
    assert main(["upload", str(tmp_path / "outbox")]) == 0
    client = MlflowClient(tracking_uri=server.uri)
    runs = {r.info.run_name: r for r in client.search_runs([client.get_experiment_by_name("outage").experiment_id])}
    assert set(runs) == {"outage", "baseline", "ort_opt_disabled"}
    uploaded = runs["ort_opt_disabled"]
    assert uploaded.data.tags["mlflow.parentRunId"] == parent_id
    assert uploaded.info.status == "FINISHED"
    assert uploaded.data.metrics["latency.p50_ms"] == pytest.approx(late.latency.p50_ms)
    assert uploaded.data.params["ort.graph_optimization_level"] == "disable"
    artifacts = {a.path for a in client.list_artifacts(uploaded.info.run_id, "profile")}
    assert "profile/ort_profile.json" in artifacts
    assert runs["outage"].info.status == "FINISHED"
    assert runs["outage"].data.tags["tracker.uploaded_later"] == "true"
    assert runs["outage"].data.tags["tracker.best_attempt"] in ("baseline", "ort_opt_disabled")
    assert runs["outage"].data.metrics["study.attempts"] == 2
    assert not find_records(tmp_path / "outbox"), "uploaded records are removed"


def test_an_outage_midway_through_an_upload_keeps_the_rest_and_the_next_upload_makes_one_run_each(
    server, tmp_path, monkeypatch, capsys
):
    from tracker import upload
    from tracker.run.record import AttemptRecord, save_record

    monkeypatch.setenv("MLFLOW_TRACKING_URI", server.uri)
    for name in "abc":
        onnx_path = tmp_path / f"{name}.onnx"
        onnx.save(make_linear_model(n_features=4), str(onnx_path))
        save_record(AttemptRecord(name, "kept", "onnxruntime", metrics={"latency.p50_ms": 1.0},
                                  model_path=str(onnx_path)), tmp_path / "outbox")
    uploaded = upload._upload_record

    def then_the_server_dies(folder, record):
        result = uploaded(folder, record)
        server.kill()  # after the first record: the next one meets an outage
        return result

    # Only this patch is undone before the next upload: `monkeypatch.undo()` would also undo what the autouse fixture
    # isolates (MLflow's URI among it), and leave the stopped server's URI to the tests after this one.
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(upload, "_upload_record", then_the_server_dies)
        assert main(["upload", str(tmp_path / "outbox")]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    kept = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(kept) == 2 and all("once the tracking store answers" in line for line in kept), err
    assert [p.name for p in find_records(tmp_path / "outbox")] == ["b", "c"]

    server.start()
    assert main(["upload", str(tmp_path / "outbox")]) == 0
    client = MlflowClient(tracking_uri=server.uri)
    runs = client.search_runs(["0"])
    assert sorted(r.info.run_name for r in runs) == ["a", "b", "c"], "one run per record, none left FAILED"
    assert {r.info.status for r in runs} == {"FINISHED"}
