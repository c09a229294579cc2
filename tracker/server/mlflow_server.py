"""`mlflow server` on 127.0.0.1 (started, stopped, killed), and the PostgreSQL-backed pair of both."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from tracker.server.common import HOST, LocalServerError, free_port, health_ok
from tracker.server.postgres import LocalPostgres

logger = logging.getLogger(__name__)


class LocalMlflowServer:
    """`mlflow server` on 127.0.0.1 with one worker, serving its artifacts from `artifacts_folder`.

    Its own process group, so that `kill()` can take the whole server down at once, as a crash would.
    """

    def __init__(
        self, backend_store_uri: str, artifacts_folder: str | Path, *, port: int | None = None,
        log_path: str | Path | None = None, env: dict[str, str] | None = None,
    ) -> None:
        self.backend_store_uri = backend_store_uri
        self.artifacts_folder = Path(artifacts_folder).resolve()
        self.port = port or free_port()
        self.log_path = Path(log_path) if log_path else self.artifacts_folder.parent / "mlflow-server.log"
        self._env = dict(env or {})
        self._proc: subprocess.Popen | None = None

    @property
    def uri(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self, *, timeout_s: float = 180, wait: bool = True) -> None:
        """Starts the server (again, on the same port, after `stop` or `kill`) and waits for /health.

        Args:
            wait: False to return at once and call `wait_healthy` later (it takes 10-30 s to answer).
        """
        if self.running:
            return
        self.artifacts_folder.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", self.backend_store_uri,
               "--artifacts-destination", str(self.artifacts_folder), "--host", HOST, "--port", str(self.port),
               "--workers", "1"]
        # The GenAI job runner (six extra processes) is of no use to a tracking-only server.
        env = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", **os.environ, **self._env}
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                          env=env, start_new_session=True)
        if wait:
            self.wait_healthy(timeout_s)

    def wait_healthy(self, timeout_s: float = 180) -> None:
        """Waits until the server started answers /health; kills it if it does not within `timeout_s`."""
        if self._proc is None:
            raise LocalServerError("the mlflow server was not started")
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise LocalServerError(f"mlflow server exited ({self._proc.returncode}):\n{self._log_tail()}")
            if health_ok(self.uri):
                if not self._listens():
                    self.kill()
                    raise LocalServerError(f"port {self.port} on {HOST} is already in use (by another service)")
                logger.info("MLflow server at %s (log %s)", self.uri, self.log_path)
                return
            time.sleep(0.25)
        self.kill()
        raise LocalServerError(f"mlflow server did not answer {self.uri}/health within {timeout_s:.0f} s:\n"
                               f"{self._log_tail()}")

    def _listens(self) -> bool:
        """Whether the server started (its process or uvicorn's, a child) listens on the port: that whoever
        answers /health there is this server, not another service that holds the port."""
        assert self._proc is not None, "asked while waiting for a started server"
        try:
            root = psutil.Process(self._proc.pid)
            processes = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return False
        for process in processes:
            try:
                sockets = process.net_connections(kind="tcp")
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            if any(s.status == psutil.CONN_LISTEN and s.laddr.port == self.port for s in sockets):
                return True
        return False

    def _log_tail(self, lines: int = 25) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, *, timeout_s: float = 30) -> None:
        """Graceful stop: SIGTERM (mlflow forwards it to its workers), then SIGKILL past `timeout_s`."""
        if self._proc is None or not self.running:
            return
        self._proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(timeout_s)
        self.kill()

    def kill(self) -> None:
        """Takes the server down abruptly (SIGKILL to its whole process group), as a crash would."""
        if self._proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._proc.pid, signal.SIGKILL)
        self._proc.wait()


class LocalTrackingServer:
    """PostgreSQL + `mlflow server` under one folder: `postgres/`, `artifacts/`, `mlflow-server.log`.

    Example:
        with LocalTrackingServer(folder) as server:
            os.environ["MLFLOW_TRACKING_URI"] = server.tracking_uri
    """

    def __init__(self, folder: str | Path, *, port: int | None = None, pg_port: int | None = None) -> None:
        _require_psycopg2()
        self.folder = Path(folder).resolve()
        self.postgres = LocalPostgres(self.folder / "postgres", port=pg_port)
        self.mlflow = LocalMlflowServer(self.postgres.backend_store_uri, self.folder / "artifacts", port=port,
                                        log_path=self.folder / "mlflow-server.log", env=self.postgres.client_env())

    @property
    def tracking_uri(self) -> str:
        return self.mlflow.uri

    def start(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        self.postgres.start()
        try:
            self.mlflow.start()
        except BaseException:
            self.postgres.stop()
            raise

    def stop(self) -> None:
        try:
            self.mlflow.stop()
        finally:
            self.postgres.stop()

    def __enter__(self) -> LocalTrackingServer:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _require_psycopg2() -> None:
    """The server reaches PostgreSQL through psycopg2: say so before starting anything, not in a log tail."""
    import importlib.util

    if importlib.util.find_spec("psycopg2") is None:
        raise LocalServerError(
            "the MLflow server needs the PostgreSQL driver psycopg2, which is not installed in "
            f"{sys.prefix}: pip install 'onnx-optimization-tracker[server]' (or psycopg2-binary)"
        )
