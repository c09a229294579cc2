"""Faults around the tracking server (unreachable, killed, its database stopped behind a live server, a bad store URI)
and secrets kept out of every output: the PostgreSQL password, and the URI's password in what a study, a profile or an
upload prints."""

from __future__ import annotations

import logging
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from log_study import FAST

from tests.conftest import child_env
from tests.models import make_linear_model
from tests.server.conftest import wait_for_export
from tracker import Study, StudySetup, log_attempt
from tracker.base.errors import TrackingServerError
from tracker.run.record import AttemptRecord, find_records, find_summaries, save_record
from tracker.server import LocalTrackingServer, free_port, health_ok
from tracker.store import connect

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "local_server.sh"


def test_an_unreachable_server_fails_at_once_naming_the_uri_without_its_password(
    monkeypatch, tmp_path, model, feeds, caplog, capsys
):
    port = free_port()  # nothing listens there
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://alice:hunter2-secret@127.0.0.1:{port}")
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    monkeypatch.chdir(tmp_path)
    caplog.set_level(logging.DEBUG)

    started = time.monotonic()
    with pytest.raises(TrackingServerError) as study_error:
        with Study("s", feeds=feeds, experiment="x", config=FAST, setup=StudySetup(workdir=tmp_path / "work")) as study:
            study.attempt("baseline", model)
    with pytest.raises(TrackingServerError) as attempt_error:
        log_attempt(model, feeds, name="solo", config=FAST)
    assert time.monotonic() - started < 10
    assert not (tmp_path / "work").exists(), "the study measured something before checking the server"

    for error in (study_error.value, attempt_error.value):
        assert f"http://***@127.0.0.1:{port}" in str(error)  # the whole user info masked
        assert "refused" in str(error).lower()  # the real reason, not a failed lookup of "alice:...@127.0.0.1"
    captured = capsys.readouterr()
    shown = "\n".join([str(study_error.value), str(attempt_error.value), caplog.text, captured.out, captured.err])
    assert "hunter2" not in shown


def test_the_postgres_password_is_on_no_command_line_and_in_no_log(tracking_server):
    password = tracking_server.postgres.client_env()["PGPASSWORD"]
    assert len(password) >= 16
    assert password not in tracking_server.postgres.backend_store_uri
    for log in (tracking_server.mlflow.log_path, tracking_server.postgres.log_path):
        assert password not in log.read_text(errors="replace"), log
    command_lines = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            command_lines.append(cmdline.read_bytes().decode(errors="replace"))
        except OSError:
            continue  # the process ended meanwhile
    assert any(tracking_server.postgres.backend_store_uri in c for c in command_lines)
    assert not [c for c in command_lines if password in c]


def test_postgres_and_mlflow_listen_on_loopback_only(tracking_server):
    ports = {tracking_server.postgres.port, tracking_server.mlflow.port}
    listening = _listening_addresses()
    assert {port for _, port in listening} >= ports
    assert {addr for addr, port in listening if port in ports} == {"127.0.0.1"}
    # and PostgreSQL has no Unix socket either: TCP on loopback, with a password, is the only way in
    socket_name = f".s.PGSQL.{tracking_server.postgres.port}"
    assert not [p for d in ("/tmp", "/var/run/postgresql") for p in Path(d).glob(socket_name)]


def _listening_addresses() -> set[tuple[str, int]]:
    """(address, port) of every listening TCP socket, IPv4 and IPv6, from /proc/net."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            if state != "0A":  # LISTEN
                continue
            addr, port = local.split(":")
            if len(addr) == 8:
                shown = ".".join(str(b) for b in reversed(bytes.fromhex(addr)))
            else:
                shown = "::1" if addr == "00000000000000000000000001000000" else addr
            found.add((shown, int(port, 16)))
    return found


def test_a_killed_server_is_reported_and_after_a_restart_still_holds_what_was_logged(
    tracking_server, server_client, model, feeds
):
    with Study("before-kill", feeds=feeds, experiment="kill", config=FAST, log_models=False) as study:
        study.attempt("baseline", model)
    try:
        tracking_server.mlflow.kill()
        assert not tracking_server.mlflow.running and not health_ok(tracking_server.tracking_uri)
        with pytest.raises(TrackingServerError, match="unreachable"):
            connect.setup_tracking(tracking_server.tracking_uri)
    finally:
        tracking_server.mlflow.start()
    experiment = server_client.get_experiment_by_name("kill")
    runs = server_client.search_runs([experiment.experiment_id])
    assert sorted((r.info.run_name, r.info.status) for r in runs) == [
        ("baseline", "FINISHED"), ("before-kill", "FINISHED"),
    ]


@pytest.mark.parametrize("sigint_ignored", [False, True], ids=["foreground", "started-with-sigint-ignored"])
def test_the_local_server_script_prints_the_uri_to_export_and_stops_both_on_ctrl_c(server_folder, sigint_ignored):
    """Also when it starts with SIGINT ignored, as a shell without job control leaves a command run with `&`."""
    password = secrets.token_urlsafe(18)
    folder = server_folder / "server"
    proc = subprocess.Popen(
        ["bash", str(SCRIPT), "--dir", str(folder)], env={**os.environ, "PGPASSWORD": password},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True,
        preexec_fn=(lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if sigint_ignored else None,
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    try:
        uri = wait_for_export(lines, proc, timeout_s=180)
        assert uri.startswith("http://127.0.0.1:") and health_ok(uri)
        assert (folder / "postgres" / "data" / "postmaster.pid").exists()
        proc.send_signal(signal.SIGINT)  # Ctrl-C
        # The script's own bounds: mlflow's graceful stop (30 s, then SIGKILL) and PostgreSQL's fast stop (pg_ctl -w,
        # up to 60 s); past them, say what it was doing.
        try:
            code = proc.wait(120)
        except subprocess.TimeoutExpired:
            log = folder / "mlflow-server.log"
            tail = "".join(log.read_text(errors="replace").splitlines(keepends=True)[-20:]) if log.exists() else ""
            pytest.fail(f"still stopping 120 s after Ctrl-C; its output:\n{''.join(lines)}\nmlflow log:\n{tail}")
        assert code == 0, "".join(lines)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    reader.join(10)
    output = "".join(lines)
    assert not health_ok(uri)
    assert not (folder / "postgres" / "data" / "postmaster.pid").exists(), "PostgreSQL still running"
    assert not (folder / "server.pid").exists()
    assert password not in output
    for log in (folder / "mlflow-server.log", folder / "postgres" / "postgres.log"):
        assert password not in log.read_text(errors="replace"), log


SECRET = "s3cr3t-Probe-Pw"
STUDY = """
import logging, numpy as np, tracker
logging.basicConfig(level=logging.INFO)
from tracker.studies.fusion import make_linear_model
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
