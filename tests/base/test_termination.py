"""SIGTERM (`tracker.base.termination`) always ends the process with 143: a study ends like Ctrl-C (its runs FAILED, its
work folder removed), even where Python swallows the exception the handler raises, or turns it into another error."""

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
import pytest
from probe_common import SIGTERM_IN_A_WEAKREF_CALLBACK  # benchmarks/probe_common.py (pytest pythonpath)

from tests.conftest import child_env
from tests.models import make_linear_model
from tracker import log_attempt
from tracker.base.termination import EXIT_CODE, Terminated, sigterm_as_exit

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.subprocess
def test_sigterm_swallowed_in_a_weakref_callback_still_ends_the_process_with_143(tmp_path):
    done = subprocess.run([sys.executable, "-c", SIGTERM_IN_A_WEAKREF_CALLBACK], cwd=tmp_path, env=child_env(None),
                          capture_output=True, text=True, timeout=60)
    assert "Exception ignored" in done.stderr, "the case itself: Python dropped the handler's exception"
    assert done.returncode == EXIT_CODE
    assert "finished normally" not in done.stdout


@pytest.mark.slow
def test_sigterm_that_surfaces_as_another_error_is_an_interruption_not_an_attempt_failure(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.setenv("TRACKER_OUTBOX", str(tmp_path / "outbox"))

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


@pytest.mark.slow
@pytest.mark.subprocess
def test_sigterm_ends_a_study_like_ctrl_c_runs_failed_work_folder_removed_exit_143(tmp_path):
    db = tmp_path / "mlflow.db"
    work_tmp = tmp_path / "tmp"
    work_tmp.mkdir()
    env = child_env(f"sqlite:///{db}", TMPDIR=str(work_tmp), TRACKER_OUTBOX=str(tmp_path / "outbox"))
    proc = subprocess.Popen([sys.executable, "-m", "experiments.linreg", "--speedup-seconds", "30",
                             "--experiment", "term"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        _wait_for_attempt_runs(db, proc, count=2)  # the study run, and an attempt being measured
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, output
    assert "Traceback" not in output
    client = mlflow.MlflowClient(f"sqlite:///{db}")
    runs = client.search_runs([client.get_experiment_by_name("term").experiment_id])
    statuses = {r.info.run_name: r.info.status for r in runs}
    assert statuses["linreg"] == "FAILED" and "RUNNING" not in statuses.values(), statuses
    assert not list(work_tmp.glob("tracker-*")), "the study's work folder was left behind"


def _wait_for_attempt_runs(db: Path, proc: subprocess.Popen, *, count: int, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stdout.read()
        if db.exists():
            try:
                with sqlite3.connect(db) as connection:
                    (found,) = connection.execute("SELECT count(*) FROM runs WHERE status = 'RUNNING'").fetchone()
            except sqlite3.OperationalError:  # tables not made yet
                found = 0
            if found >= count:
                return
        time.sleep(0.1)
    raise AssertionError(f"fewer than {count} runs started within {timeout_s} s")
