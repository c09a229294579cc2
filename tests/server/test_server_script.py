"""`python -m tracker.server` against what is not its own: a pid file naming another process, a garbled or
stale pid file, a port another service holds, a port out of range; and, without the `server` extra, one line saying
which to install."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import probe_common  # benchmarks/probe_common.py (pytest pythonpath)
import pytest

from tests.server.conftest import wait_for_export
from tracker.server import LocalMlflowServer, LocalServerError, free_port, health_ok

ROOT = Path(__file__).resolve().parents[2]


def _script(*args: str, timeout_s: float = 20) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "tracker.server", *args], capture_output=True, text=True,
                          env=env, stdin=subprocess.DEVNULL, timeout=timeout_s)


@pytest.fixture
def bystander():
    """An unrelated process (what a reused or a made-up pid names)."""
    with probe_common.bystander() as proc:
        yield proc


@pytest.fixture
def foreign_service():
    """Another HTTP service on 127.0.0.1 that answers /health with 200, as an MLflow server would; its port."""
    with probe_common.foreign_service() as port:
        yield port


def _one_error_line(done: subprocess.CompletedProcess) -> str:
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    return lines[0]


@pytest.mark.parametrize("recorded", ["bare-pid", "other-start-time"])
def test_stop_never_signals_a_live_process_the_pid_file_names_but_the_script_did_not_start(
    tmp_path, bystander, recorded
):
    """A bare pid (what the script used to write, or anyone can) or a pid reused since the server recorded it."""
    text = str(bystander.pid) if recorded == "bare-pid" else json.dumps({"pid": bystander.pid, "started_s": 1.0})
    (tmp_path / "server.pid").write_text(text)
    done = _script("stop", "--dir", str(tmp_path))
    time.sleep(0.2)
    assert bystander.poll() is None, "stop killed an unrelated process"
    assert done.returncode == 1
    line = _one_error_line(done)
    assert "stale" in line and str(bystander.pid) in line and "nothing stopped" in line, line
    assert not (tmp_path / "server.pid").exists(), "the stale pid file was kept"


@pytest.mark.parametrize("content", ["not-a-pid", "", "12 34 x", '{"pid": "x"}', "\x00\xff",
                                     '{"pid": 99999999999, "started_s": 1}', "-1"],
                         ids=["word", "empty", "three-fields", "json-without-a-number", "binary", "pid-too-large",
                              "negative"])
def test_stop_with_a_garbled_pid_file_says_so_in_one_line_and_removes_it(tmp_path, content):
    (tmp_path / "server.pid").write_text(content, errors="surrogateescape")
    done = _script("stop", "--dir", str(tmp_path))
    assert done.returncode == 1
    line = _one_error_line(done)
    assert "server.pid" in line and "stale" in line, line
    assert not (tmp_path / "server.pid").exists()


def test_stop_with_a_pid_file_naming_an_ended_process_says_it_is_stale(tmp_path):
    ended = subprocess.Popen(["true"])
    ended.wait()
    (tmp_path / "server.pid").write_text(json.dumps({"pid": ended.pid, "started_s": 1.0}))
    done = _script("stop", "--dir", str(tmp_path))
    assert done.returncode == 1
    assert "no longer running" in _one_error_line(done)
    assert not (tmp_path / "server.pid").exists()


def test_stop_without_a_pid_file_says_nothing_runs_there(tmp_path):
    done = _script("stop", "--dir", str(tmp_path))
    assert done.returncode == 1
    assert f"no server running from {tmp_path}" in done.stderr and "Traceback" not in done.stderr


def test_start_with_a_stale_pid_file_removes_it_and_goes_on(tmp_path, bystander, foreign_service):
    """It goes on as far as the next check (a port in use, which needs no PostgreSQL to fail): not 'already running'."""
    (tmp_path / "server.pid").write_text(str(bystander.pid))
    done = _script("start", "--dir", str(tmp_path), "--port", str(foreign_service))
    assert "already running" not in done.stderr, done.stderr
    assert "stale" in done.stderr and "removed" in done.stderr, done.stderr
    assert f"port {foreign_service} on 127.0.0.1 is already in use" in done.stderr, done.stderr
    assert not (tmp_path / "server.pid").exists()
    assert bystander.poll() is None


@pytest.mark.parametrize("option", ["--port", "--pg-port"])
def test_a_port_another_http_service_holds_fails_at_once_without_an_export_line(tmp_path, foreign_service, option):
    started = time.monotonic()
    done = _script("start", "--dir", str(tmp_path / "server"), option, str(foreign_service))
    assert time.monotonic() - started < 8
    assert done.returncode == 2
    assert _one_error_line(done) == (f"error: port {foreign_service} on 127.0.0.1 is already in use (by another "
                                     f"service); choose another {option} or omit it")
    assert "export" not in done.stdout, done.stdout
    assert health_ok(f"http://127.0.0.1:{foreign_service}"), "the other service was disturbed"


@pytest.mark.parametrize("args", [["--port", "99999"], ["--port", "0"], ["--pg-port", "70000"], ["--port", "-1"],
                                  ["--port", "http"], ["stop", "--dir", ".", "--port", "65536"]],
                         ids=["port-99999", "port-0", "pg-port-70000", "port-negative", "port-word", "stop"])
def test_a_port_out_of_range_is_refused_when_the_arguments_are_read(tmp_path, args):
    started = time.monotonic()
    done = _script(*args)
    assert time.monotonic() - started < 8
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert "1..65535" in done.stderr.strip().splitlines()[-1], done.stderr


def test_the_same_port_for_mlflow_and_postgresql_is_refused_when_the_arguments_are_read():
    port = str(free_port())
    done = _script("--port", port, "--pg-port", port)
    assert done.returncode == 2 and "--port and --pg-port" in done.stderr, done.stderr


def test_the_mlflow_server_does_not_take_a_service_that_grabbed_its_port_during_startup_for_itself(tmp_path):
    """The port is free when checked; another service binds it while `mlflow server` is still importing."""
    port = free_port()
    server = LocalMlflowServer(f"sqlite:///{tmp_path / 'mlflow.db'}", tmp_path / "artifacts", port=port)
    server.start(wait=False)
    try:
        with probe_common.foreign_service(port), pytest.raises(LocalServerError, match="in use"):
            server.wait_healthy(60)
        assert not server.running
    finally:
        server.kill()


# With PostgreSQL: the whole cycle, through the pid file the script writes.

def test_start_over_a_stale_pid_file_then_stop_dir_stops_exactly_that_server(server_folder, bystander):
    folder = server_folder / "server"
    folder.mkdir()
    (folder / "server.pid").write_text(f"{bystander.pid}\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-m", "tracker.server", "start", "--dir", str(folder)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    try:
        uri = wait_for_export(lines, proc, timeout_s=180)
        assert health_ok(uri)
        again = _script("start", "--dir", str(folder))
        assert again.returncode == 2 and "already running" in _one_error_line(again), again.stderr
        stopped = _script("stop", "--dir", str(folder), timeout_s=120)
        assert stopped.returncode == 0, stopped.stderr
        assert proc.wait(30) == 0, "".join(lines)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    reader.join(10)
    assert bystander.poll() is None
    assert not health_ok(uri)
    assert not (folder / "postgres" / "data" / "postmaster.pid").exists(), "PostgreSQL still running"
    assert not (folder / "server.pid").exists()
    assert "stale" in "".join(lines)


def test_a_temporary_server_that_dies_keeps_the_log_it_points_at(server_folder):
    """Without --dir the folder is removed on exit; the logs a failure names are kept."""
    env = {**os.environ, "TMPDIR": str(server_folder),
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-m", "tracker.server"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    try:
        wait_for_export(lines, proc, timeout_s=180)
        (folder,) = server_folder.glob("tracker-server-*")
        os.killpg(_mlflow_child(proc.pid), signal.SIGKILL)  # the server crashes, with its workers
        assert proc.wait(120) == 1, "".join(lines)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    reader.join(10)
    output = "".join(lines)
    log = folder / "mlflow-server.log"
    assert f"see {log}" in output, output
    assert log.exists(), "the message points at a deleted log"
    assert not (folder / "postgres" / "data").exists() and not (folder / "artifacts").exists()


def _mlflow_child(pid: int) -> int:
    import psutil

    (child,) = [c for c in psutil.Process(pid).children() if "mlflow" in " ".join(c.cmdline())]
    return child.pid


def test_the_server_wrapper_without_psycopg2_says_which_extra_to_install_before_starting_anything(
    tmp_path, monkeypatch, capsys
):
    from tracker.server.__main__ import main as server_main

    monkeypatch.setitem(sys.modules, "psycopg2", None)  # what an environment without the `server` extra has
    assert server_main(["--dir", str(tmp_path / "server")]) == 2
    err = capsys.readouterr().err
    assert "psycopg2" in err and "pip install 'onnx-optimization-tracker[server]'" in err
    assert len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "server" / "postgres").exists(), "PostgreSQL was started anyway"
