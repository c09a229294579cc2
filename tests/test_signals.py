"""Signals and first use (issue 22, items 5-6): Ctrl-C while ./mlflow.db is built leaves no half-built store, and
SIGTERM always ends the process with 143, even where Python swallows the exception its handler raises."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import mlflow
import numpy as np
import onnx
import pytest

from tracker import log_attempt
from tracker.base.termination import EXIT_CODE, Terminated, sigterm_as_exit
from tracker.cli import main
from tracker.optimize.add_eyelike import make_linear_model

ROOT = Path(__file__).resolve().parents[1]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "TRACKER_OUTBOX")}
    return {**env, "PYTHONPATH": str(ROOT), **extra}


def _migrating(folder: Path) -> bool:
    """Whether a store being built in `folder` (in place, or beside and renamed in) has begun its migrations."""
    for name in ("mlflow.db", ".mlflow.db.building"):
        try:
            with sqlite3.connect(f"file:{folder / name}?mode=ro", uri=True, timeout=0.01) as connection:
                if connection.execute("SELECT 1 FROM sqlite_master WHERE name = 'alembic_version'").fetchone():
                    return True
        except sqlite3.Error:
            pass
    return False


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.timing  # Ctrl-C must land while the migrations run (seconds): retried when it lands after them
def test_ctrl_c_while_the_default_store_is_built_leaves_none_half_built(tmp_path):
    onnx.save(make_linear_model(n_features=4), str(tmp_path / "m.onnx"))
    command = [sys.executable, "-m", "tracker", "profile", "m.onnx", "--dim", "N=2", "--profile-runs", "2",
               "--min-seconds", "0"]
    # Ctrl-C as a user's terminal sends it, even when this test runs with SIGINT ignored (a shell's `&` job)
    cut = subprocess.Popen(command, cwd=tmp_path, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 120
    while not _migrating(tmp_path):  # MLflow has made its tables and is running its migrations (seconds)
        assert cut.poll() is None and time.monotonic() < deadline, "the command never began building the store"
        time.sleep(0.01)
    cut.send_signal(signal.SIGINT)
    assert cut.wait(timeout=120) == 130
    left = _revision(tmp_path / "mlflow.db")

    again = subprocess.run(command, cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    assert not (tmp_path / ".mlflow.db.building").exists()
    assert left in (None, _revision(tmp_path / "mlflow.db")), "the cut command left a store that was not finished"


def _revision(db: Path) -> str | None:
    """The schema revision a sqlite store's migrations reached; None if there is no store."""
    if not db.exists():
        return None
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as connection:
        try:
            (revision,) = connection.execute("SELECT version_num FROM alembic_version").fetchone() or ("none",)
        except sqlite3.Error:
            return "no revision"
    return revision


def test_a_half_built_default_store_gets_advice_that_fits_it(tmp_path, monkeypatch, capsys):
    # What an interrupted MLflow left before: some of its tables, no runs; every open fails "already exists".
    with sqlite3.connect(tmp_path / "mlflow.db") as connection:
        connection.execute("CREATE TABLE registered_models (name VARCHAR(256) PRIMARY KEY)")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)

    assert main(["compare", "--study", "s", "--experiment", "e"]) == 2
    err = capsys.readouterr().err
    assert "already exists" in err
    assert f"the sqlite store {tmp_path / 'mlflow.db'} is half-built (its creation was cut off; it holds no runs): " \
           "remove it" in err
    assert "fix MLFLOW_TRACKING_URI" not in err, "the advice must fit: the variable is not set"


_SWALLOWED = """
import os, signal, weakref
from tracker.base.termination import sigterm_as_exit

class Pooled:
    pass

def on_collect(_):  # like SQLAlchemy's pool: the handler runs inside a weakref callback, whose errors are ignored
    os.kill(os.getpid(), signal.SIGTERM)
    sum(range(10000))

with sigterm_as_exit():
    pooled = Pooled()
    ref = weakref.ref(pooled, on_collect)
    del pooled
    print("work went on", flush=True)
print("finished normally", flush=True)
"""


@pytest.mark.subprocess
def test_sigterm_swallowed_in_a_weakref_callback_still_ends_the_process_with_143(tmp_path):
    done = subprocess.run([sys.executable, "-c", _SWALLOWED], cwd=tmp_path, env=_env(), capture_output=True,
                          text=True, timeout=60)
    assert "Exception ignored" in done.stderr, "the case itself: Python dropped the handler's exception"
    assert done.returncode == EXIT_CODE
    assert "finished normally" not in done.stdout


@pytest.mark.slow
def test_sigterm_that_surfaces_as_another_error_is_an_interruption_not_an_attempt_failure(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.setenv("TRACKER_OUTBOX", str(tmp_path / "outbox"))
    monkeypatch.setattr(mlflow.tracking.fluent, "_active_experiment_id", None)

    def evaluate(outputs):  # a C extension's import cut by the signal re-raises it as an ImportError
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1)
        except BaseException as e:
            raise ImportError("initialization failed") from e
        return {}

    feeds = {"X": np.ones((2, 4), np.float32)}
    with pytest.raises(Terminated), sigterm_as_exit():
        log_attempt(make_linear_model(n_features=4), feeds, name="cut", evaluate=evaluate)
    (run,) = mlflow.MlflowClient().search_runs(["0"])
    assert run.info.status == "FAILED"
    assert run.data.tags["tracker.error"].startswith("interrupted (SIGTERM) while measuring; it surfaced as "
                                                     "ImportError: initialization failed")
