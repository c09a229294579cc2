"""What an outside probe broke around the tracking server: a printed password, a database that stops
behind a live server, and a bad store URI that used to exit 0."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from log_study import FAST

from tests.conftest import child_env
from tracker import Study
from tracker.base.errors import TrackingServerError
from tracker.optimize.add_eyelike import make_linear_model
from tracker.run.record import AttemptRecord, find_records, find_summaries, save_record
from tracker.server import LocalTrackingServer
from tracker.store import connect

SECRET = "s3cr3t-Probe-Pw"
STUDY = """
import logging, numpy as np, tracker
logging.basicConfig(level=logging.INFO)
from tracker.optimize.add_eyelike import make_linear_model
from log_study import FAST
feeds = {"X": np.ones((2, 8), np.float32)}
with tracker.Study("leak", feeds=feeds, experiment="leak", config=FAST) as study:
    study.attempt("baseline", make_linear_model(n_features=8))
    study.attempt("again", make_linear_model(n_features=8))
"""


def _with_password(uri: str) -> str:
    return uri.replace("http://", f"http://alice:{SECRET}@")


def _run(args: list[str], cwd: Path, uri: str) -> subprocess.CompletedProcess:
    env = child_env(uri, TRACKER_OUTBOX=str(cwd / "outbox"),
                    PYTHONPATH=os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_no_output_of_a_study_a_profile_or_an_upload_holds_the_password_of_the_uri(tracking_server, tmp_path):
    uri = _with_password(tracking_server.tracking_uri)
    model_path = tmp_path / "model.onnx"
    onnx.save(make_linear_model(n_features=8), model_path)
    record = AttemptRecord("kept", "kept-study", "onnxruntime", params={"p": "1"}, metrics={"m": 1.0},
                           model_path=str(model_path), model_flavor=False)
    save_record(record, tmp_path / "outbox")

    runs = {
        "study": _run([sys.executable, "-c", STUDY], tmp_path, uri),
        "profile": _run([sys.executable, "-m", "tracker", "profile", str(model_path), "--dim", "N=2",
                         "--profile-runs", "3", "--min-seconds", "0", "--experiment", "leak"], tmp_path, uri),
        "upload": _run([sys.executable, "-m", "tracker", "upload", str(tmp_path / "outbox")], tmp_path, uri),
    }
    for name, done in runs.items():
        output = done.stdout + done.stderr
        assert done.returncode == 0, f"{name}:\n{output}"
        assert SECRET not in output, f"{name} printed the password:\n{output}"
    study_output = runs["study"].stdout + runs["study"].stderr
    # MLflow's own links (which held the password) are replaced by one the user can click
    assert f"view it at {tracking_server.tracking_uri}/#/experiments/" in study_output


def test_a_bad_store_uri_fails_before_any_work_naming_the_uri_without_its_password(tmp_path, monkeypatch, capsys):
    from tracker.cli import main

    model_path = tmp_path / "model.onnx"
    onnx.save(make_linear_model(n_features=8), model_path)
    for uri, reason in [
        ("file:///nonexistent/store", "MlflowException"),
        (f"postgresql+pg8000://u:{SECRET}@127.0.0.1:1/db", "No module named 'pg8000'"),  # no such driver
        (f"postgresql+psycopg2://u:{SECRET}@127.0.0.1:1/db", "Connection refused"),
    ]:
        monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
        started = time.monotonic()
        code = main(["profile", str(model_path), "--dim", "N=2", "--profile-runs", "3", "--min-seconds", "0"])
        err = capsys.readouterr().err
        assert code == 2, err
        assert time.monotonic() - started < 20, "the store was retried instead of failing at once"
        assert "cannot open the MLflow tracking store" in err and reason in err, err
        assert SECRET not in err and "run None" not in err
    assert not (tmp_path / "tracker-outbox").exists(), "work was done before the store was checked"


def test_a_stopped_database_behind_a_live_server_sends_attempts_to_the_outbox_within_seconds(
    server_folder, tmp_path, monkeypatch, caplog
):
    server = LocalTrackingServer(server_folder / "server")
    server.start()
    try:
        monkeypatch.setenv("MLFLOW_TRACKING_URI", server.tracking_uri)
        monkeypatch.setenv("TRACKER_OUTBOX", str(tmp_path / "outbox"))
        monkeypatch.setenv("TRACKER_SERVER_TIMEOUT_S", "10")
        for name in ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR",
                     "MLFLOW_HTTP_REQUEST_TIMEOUT"):
            monkeypatch.delenv(name, raising=False)
        model = make_linear_model(n_features=8)
        feeds = {"X": np.ones((2, 8), np.float32)}
        caplog.set_level("INFO", logger="tracker")
        with Study("db-down", feeds=feeds, experiment="db-down", config=FAST, log_models=False) as study:
            study.attempt("baseline", model)
            server.postgres.stop()
            started = time.monotonic()
            for i in range(3):
                study.attempt(f"after{i}", model)
        elapsed = time.monotonic() - started

        assert elapsed < 120, f"3 attempts and the summary took {elapsed:.0f} s with the database down"
        assert [r.run_id is not None for r in study.results] == [True, False, False, False]
        assert len(find_records(tmp_path / "outbox")) == 3 and len(find_summaries(tmp_path / "outbox")) == 1
        assert "a read of its store failed with HTTP" in caplog.text
        started = time.monotonic()
        with pytest.raises(TrackingServerError, match="answers, but a read of its store failed"):
            connect.setup_tracking(server.tracking_uri)
        assert time.monotonic() - started < 15
    finally:
        server.stop()
