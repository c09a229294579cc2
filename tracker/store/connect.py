"""Connecting to the tracking store: pointing MLflow at it and checking, before any work, that it answers."""

from __future__ import annotations

import contextlib
import json
import os
import urllib.error
import urllib.request
from pathlib import Path

import mlflow

from tracker.base.errors import TrackerError, TrackingServerError
from tracker.base.redaction import protect_uri, redact_uri, without_credentials
from tracker.base.redaction import redact as redact_text
from tracker.base.settings import resolve_tracking_uri, server_timeout_s
from tracker.base.termination import defers_sigterm


def setup_tracking(uri: str | None = None, *, timeout_s: float | None = None) -> str:
    """Points MLflow at `uri` (default: `settings.resolve_tracking_uri()`) and checks its store answers.

    Before any work is done: an http(s) server must answer a real read of its store (its /health stays
    200 while its database is down), and a local store must open. MLflow's HTTP retries are bounded by
    `timeout_s` (default `settings.server_timeout_s()`), and the URI's password is kept out of all output.

    Raises:
        TrackingServerError: the server or its store does not answer, or the store cannot be opened.
    """
    uri = uri or resolve_tracking_uri()
    protect_uri(uri)
    timeout_s = server_timeout_s() if timeout_s is None else timeout_s
    if uri.startswith(("http://", "https://")):
        bound_http_retries(timeout_s)
        _check_server(uri, timeout_s)
    else:
        _open_store(uri)
    # The variable MLflow reads (and its child processes inherit); its process-global URI only where the caller set
    # that to another store, which would otherwise win.
    os.environ["MLFLOW_TRACKING_URI"] = uri
    if mlflow.get_tracking_uri() != uri:
        mlflow.set_tracking_uri(uri)
    return uri


def bound_http_retries(timeout_s: float) -> None:
    """Makes one MLflow HTTP call give up after about `timeout_s` instead of ~4 minutes of retries.

    MLflow's defaults (7 retries, backoff 2 s doubling, 120 s per request) suit a rate-limited hosted
    service; against a team server whose database is down they stall a study for minutes per call.
    Settings the user made (the `MLFLOW_HTTP_REQUEST_*` variables) are kept.
    """
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1")  # waits 0 s, then 2 s
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", str(max(1, int(timeout_s / 3))))


def ensure_reachable(*, timeout_s: float = 5.0) -> None:
    """Checks the current tracking server and its store answer (no-op for a local store).

    Raises:
        TrackingServerError: they do not.
    """
    uri = mlflow.get_tracking_uri()
    if uri.startswith(("http://", "https://")):
        _check_server(uri, timeout_s)


def _check_server(uri: str, timeout_s: float) -> None:
    """One search of the store's experiments, authenticated as MLflow's client would be, no retries."""
    import base64
    from urllib.parse import unquote, urlsplit

    # urllib does not take credentials from the URL (it would resolve "user:pw@host" as a host name);
    # MLflow's client sends them as basic auth, so the check does too.
    parts = urlsplit(uri)
    base = without_credentials(uri).rstrip("/")
    request = urllib.request.Request(base + "/api/2.0/mlflow/experiments/search?max_results=1")
    username = parts.username if parts.username is not None else os.environ.get("MLFLOW_TRACKING_USERNAME")
    password = parts.password if parts.username is not None else os.environ.get("MLFLOW_TRACKING_PASSWORD")
    if username is not None:
        token = base64.b64encode(f"{unquote(username)}:{unquote(password or '')}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    elif os.environ.get("MLFLOW_TRACKING_TOKEN"):
        request.add_header("Authorization", f"Bearer {os.environ['MLFLOW_TRACKING_TOKEN']}")
    shown = redact_uri(uri)
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as e:
        detail = redact_text(_error_detail(e.read(4000)))
        if e.code in (401, 403):
            hint = "check the user name and password (MLFLOW_TRACKING_USERNAME/PASSWORD)"
        else:
            hint = "is the server's database running? see the server's log"
        raise TrackingServerError(
            f"MLflow tracking server {shown} answers, but a read of its store failed with HTTP {e.code} "
            f"({detail or e.reason}); {hint}"
        ) from None
    except (urllib.error.URLError, OSError, ValueError) as e:
        raise TrackingServerError(
            f"MLflow tracking server {shown} is unreachable ({redact_text(str(e))}); start it or fix "
            "MLFLOW_TRACKING_URI"
        ) from None


def _error_detail(body: bytes) -> str:
    """The first line of an MLflow error response's message (its JSON holds a whole SQL error)."""
    text = body.decode(errors="replace").strip()
    with contextlib.suppress(ValueError, AttributeError):
        text = str(json.loads(text).get("message") or text)
    lines = text.strip().splitlines()
    return lines[0][:300] if lines else ""


@defers_sigterm  # a store half-created by MLflow's migrations could not be opened again
def _open_store(uri: str) -> None:
    """Opens a local store (sqlite, a database URI, a file store) with one read; creates a new one."""
    try:
        if uri.startswith("sqlite:///"):
            _create_sqlite_tables(uri)
        else:
            if uri.split(":", 1)[0].split("+")[0] in _DATABASE_SCHEMES:
                _connect_once(uri)  # MLflow itself retries a refused connection for ~100 s, silently
            mlflow.MlflowClient(uri).search_experiments(max_results=1)
    except TrackerError:
        raise
    except Exception as e:  # whatever the store's library raises: a missing driver, a bad path, a refused login
        if os.environ.get("MLFLOW_TRACKING_URI", "").strip():
            fix = "fix MLFLOW_TRACKING_URI, or unset it to use ./mlflow.db"
        else:
            fix = "it is the default store ./mlflow.db (MLFLOW_TRACKING_URI is not set)"
        raise TrackingServerError(
            f"cannot open the MLflow tracking store {redact_uri(uri)} ({type(e).__name__}: "
            f"{redact_text(str(e)).strip().splitlines()[0] if str(e).strip() else 'no detail'}); "
            f"{_half_built_hint(uri, e) or fix}"
        ) from None


_DATABASE_SCHEMES = ("postgresql", "mysql", "mssql")


def _connect_once(uri: str) -> None:
    """One connection to a database store, so that a wrong address fails at once."""
    import sqlalchemy
    from sqlalchemy.pool import NullPool

    engine = sqlalchemy.create_engine(uri, poolclass=NullPool)
    try:
        with engine.connect():
            pass
    finally:
        engine.dispose()


def _create_sqlite_tables(uri: str) -> None:
    """Creates a new sqlite store's tables while holding a file lock beside the database.

    MLflow creates them unlocked on first use: two processes that start on the same new file race, and
    one fails with "table ... already exists". Once they exist, concurrent runs are fine. The lock lives
    in the database's own folder (whoever can write the database can write there), not in a shared
    /tmp where a planted symlink could redirect it; it is never followed if it is a symlink.
    """
    import fcntl

    path = uri[len("sqlite:///"):].split("?")[0]
    if not path or path == ":memory:":
        return
    db = Path(path)
    lock_path = db.with_name(f".{db.name}.init-lock")
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as e:
        raise TrackingServerError(
            f"cannot create the lock {lock_path} beside the sqlite store {db} ({e.strerror}); the folder must "
            "exist and be writable, and the lock must not be a symlink"
        ) from None
    with os.fdopen(fd, "r+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if db.exists() and db.stat().st_size > 0:
            mlflow.MlflowClient(uri).search_experiments(max_results=1)  # an existing store: migrations, if any
            return
        _build_sqlite_store(db)


def _build_sqlite_store(db: Path) -> None:
    """Builds a new sqlite store (MLflow's tables and migrations, seconds) in a file beside `db`, then renames
    it into place: Ctrl-C or a kill while it is built leaves no `db`, never a half-built one."""
    building = db.with_name(f".{db.name}.building")
    building.unlink(missing_ok=True)  # left by a build that was cut off
    try:
        client = mlflow.MlflowClient(f"sqlite:///{building}")
        client.search_experiments(max_results=1)
        with contextlib.suppress(Exception):  # MLflow keeps the store of each URI: let go of the file
            client._tracking_client.store.engine.dispose()
        building.replace(db)
    finally:
        building.unlink(missing_ok=True)


def _half_built_hint(uri: str, error: Exception) -> str | None:
    """What to do with a sqlite store whose creation an older tracker (or MLflow itself) left half done: its
    tables exist in part, it holds no runs, and every open fails with "table ... already exists"."""
    import sqlite3

    if not uri.startswith("sqlite:///") or "already exists" not in str(error):
        return None
    db = Path(uri[len("sqlite:///"):].split("?")[0])
    try:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as connection:
            tables = {row[0] for row in connection.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            runs = connection.execute("SELECT COUNT(*) FROM runs").fetchone()[0] if "runs" in tables else 0
    except sqlite3.Error:
        return None
    if runs:
        return None
    return (f"the sqlite store {db} is half-built (its creation was cut off; it holds no runs): remove it, and the "
            "next command builds it again")
