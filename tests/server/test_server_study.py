"""A study logged to a real `mlflow server` on PostgreSQL, read back over HTTP with MlflowClient."""

from __future__ import annotations

from pathlib import Path

import mlflow
import numpy as np
from log_study import FAST
from readback import verify_experiment

from tracker import SessionConfig, Study


def test_a_study_logged_to_the_server_reads_back_whole_over_http(
    tracking_server, server_client, model, feeds, tmp_path
):
    with Study("linear", feeds=feeds, experiment="server-study", config=FAST) as study:
        baseline = study.attempt("baseline", model)
        study.attempt("ort_opt_disabled", model, session=SessionConfig(graph_optimization_level="disable"))
    assert all(r.ok for r in study.results), [r.error for r in study.results]

    counts = verify_experiment(
        server_client, tracking_server.mlflow.artifacts_folder, "server-study",
        {"linear": ["baseline", "ort_opt_disabled"]}, {r.run_id: r.latency.p50_ms for r in study.results},
    )
    assert (counts.runs, counts.logged_models) == (3, 2)

    # The logged model comes back through the server's artifact proxy, loads and predicts as measured.
    [logged] = server_client.search_logged_models(
        experiment_ids=[server_client.get_experiment_by_name("server-study").experiment_id],
        filter_string=f"source_run_id = '{baseline.run_id}'",
    )
    loaded = mlflow.onnx.load_model(f"models:/{logged.model_id}")
    assert [n.op_type for n in loaded.graph.node] == [n.op_type for n in model.graph.node]
    predicted = mlflow.pyfunc.load_model(f"models:/{logged.model_id}").predict(feeds)
    np.testing.assert_array_equal(predicted["Y"], baseline.outputs[0])
    assert not (tmp_path / "tracker-outbox").exists(), "nothing should be left waiting for an upload"


def test_a_crashing_attempt_is_a_failed_run_on_the_server_and_the_study_goes_on(server_client, model, feeds, tmp_path):
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"not a protobuf \x00\xff" * 10)
    with Study("with-crash", feeds=feeds, experiment="server-crash", config=FAST, log_models=False) as study:
        study.attempt("baseline", model)
        broken = study.attempt("broken", garbage)
    assert not broken.ok
    exp = server_client.get_experiment_by_name("server-crash")
    runs = {r.info.run_name: r for r in server_client.search_runs([exp.experiment_id])}
    assert runs["broken"].info.status == "FAILED"
    assert "garbage.onnx" in runs["broken"].data.tags["tracker.error"]
    assert runs["broken"].data.tags["mlflow.parentRunId"] == runs["with-crash"].info.run_id
    assert runs["with-crash"].info.status == "FINISHED" and runs["baseline"].info.status == "FINISHED"
    error_file = server_client.download_artifacts(runs["broken"].info.run_id, "error.txt", str(tmp_path))
    assert "garbage.onnx" in Path(error_file).read_text()
