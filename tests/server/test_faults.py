"""Faults around the tracking server (unreachable, killed) and secrets kept out of every output."""

from __future__ import annotations

import logging
import os
import secrets
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from log_study import FAST

from tracker import Study, StudySetup, log_attempt
from tracker.base.errors import TrackingServerError
from tracker.server import free_port, health_ok
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
        uri = _wait_for_export(lines, proc, timeout_s=180)
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


def _wait_for_export(lines: list[str], proc: subprocess.Popen, *, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for line in list(lines):
            if "export MLFLOW_TRACKING_URI=" in line:
                return line.split("=", 1)[1].strip()
        assert proc.poll() is None, "".join(lines)
        time.sleep(0.1)
    raise AssertionError("no MLFLOW_TRACKING_URI printed:\n" + "".join(lines))
