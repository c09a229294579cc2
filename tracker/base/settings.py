"""The one place that decides where runs are tracked, and where the search cache lives beside them."""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_DB = "mlflow.db"


def resolve_tracking_uri(cwd: str | Path | None = None) -> str:
    """The user's `MLFLOW_TRACKING_URI` if set, else an absolute sqlite database in `cwd`.

    An absolute path (`sqlite:////abs/mlflow.db`) makes scripts, `mlflow run`, the UI and tests agree
    on one store; the deprecated `./mlruns` file store is never chosen.
    """
    uri = os.environ.get("MLFLOW_TRACKING_URI", "").strip()
    if uri:
        return uri
    db = Path(cwd or os.getcwd()).resolve() / DEFAULT_DB
    return f"sqlite:///{db}"


CACHE_ENV = "TRACKER_CACHE"
CACHE_FOLDER = "tracker-cache"


def cache_folder(cwd: str | Path | None = None) -> Path:
    """The search cache's folder (`tracker.search.cache`): `$TRACKER_CACHE`, else `tracker-cache` beside a local
    sqlite store (the database's folder), else in `cwd` (a tracking server's store is not a folder here)."""
    chosen = os.environ.get(CACHE_ENV, "").strip()
    if chosen:
        return Path(chosen).expanduser().resolve()
    uri = resolve_tracking_uri(cwd)
    if uri.startswith("sqlite:///"):
        return Path(uri.removeprefix("sqlite:///")).resolve().parent / CACHE_FOLDER
    return Path(cwd or os.getcwd()).resolve() / CACHE_FOLDER


SERVER_TIMEOUT_ENV = "TRACKER_SERVER_TIMEOUT_S"
DEFAULT_SERVER_TIMEOUT_S = 30.0


def server_timeout_s() -> float:
    """How long one call to a tracking server may take, retries included: `$TRACKER_SERVER_TIMEOUT_S`, else 30.

    After that the attempt goes to the outbox (`tracker upload` sends it later) instead of stalling.
    """
    text = os.environ.get(SERVER_TIMEOUT_ENV, "").strip()
    if not text:
        return DEFAULT_SERVER_TIMEOUT_S
    try:
        seconds = float(text)
    except ValueError:
        seconds = float("nan")
    if not 1 <= seconds <= 3600:  # also rejects nan
        raise ValueError(f"{SERVER_TIMEOUT_ENV} must be a number of seconds from 1 to 3600, got {text!r}")
    return seconds
