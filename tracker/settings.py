"""The one place that decides where runs are tracked."""

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
