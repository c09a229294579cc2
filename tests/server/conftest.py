"""A real PostgreSQL cluster and a real `mlflow server` on 127.0.0.1, shared by the server tests.

Skipped, with the reason, where PostgreSQL's server tools or psycopg2 are missing; in CI (`CI` set)
that is a failure instead: CI installs them (`.ci/run`).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import mlflow
import pytest
from mlflow import MlflowClient

from tracker.server import LocalTrackingServer, find_postgres_bin


def _require_postgres() -> None:
    """Skips the test where PostgreSQL's server tools or psycopg2 are missing; fails instead in CI."""
    if find_postgres_bin() is None:
        missing = "PostgreSQL server tools (initdb, pg_ctl) not found: apt-get install postgresql"
    elif importlib.util.find_spec("psycopg2") is None:
        missing = "psycopg2 is not installed: pip install psycopg2-binary"
    else:
        return
    if os.environ.get("CI"):
        pytest.fail(f"{missing} (CI must run the server tests)")
    pytest.skip(missing)


@pytest.fixture(scope="session")
def tracking_server():
    """PostgreSQL + `mlflow server` (one worker, artifacts served from a local folder), for the session."""
    _require_postgres()
    folder = _postgres_reachable_folder()
    server = LocalTrackingServer(folder)
    started = time.monotonic()
    try:
        server.start()
        print(f"\nPostgreSQL + mlflow server up in {time.monotonic() - started:.1f} s at {server.tracking_uri}")
        yield server
    finally:
        server.stop()
        shutil.rmtree(folder, ignore_errors=True)


def _postgres_reachable_folder() -> Path:
    # Not under pytest's tmp_path: as root, PostgreSQL runs as the `postgres` user, which must be able to
    # pass through every parent folder, and pytest's base folder is private (0700).
    folder = Path(tempfile.mkdtemp(prefix="tracker-server-test-"))
    folder.chmod(0o711)
    return folder


@pytest.fixture
def server_folder():
    """An empty folder for a second, short-lived server (see `_postgres_reachable_folder`)."""
    _require_postgres()
    folder = _postgres_reachable_folder()
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def server_client(tracking_server, monkeypatch, tmp_path):
    """This test's process points at the server (as a user would, by MLFLOW_TRACKING_URI); its client."""
    uri = tracking_server.tracking_uri
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_ID", raising=False)
    monkeypatch.setenv("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    monkeypatch.chdir(tmp_path)  # anything written to the working directory (an outbox) stays in tmp_path
    yield MlflowClient(tracking_uri=uri)
    while mlflow.active_run():
        mlflow.end_run()


def wait_for_export(lines: list[str], proc: subprocess.Popen, *, timeout_s: float) -> str:
    """The URI the server script `proc` prints to export (its output read into `lines` by a thread), within
    `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for line in list(lines):
            if "export MLFLOW_TRACKING_URI=" in line:
                return line.split("=", 1)[1].strip()
        assert proc.poll() is None, "".join(lines)
        time.sleep(0.1)
    raise AssertionError("no MLFLOW_TRACKING_URI printed:\n" + "".join(lines))
