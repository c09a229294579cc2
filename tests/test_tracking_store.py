"""The local tracking store under attack or failing: a planted lock symlink, a store that refuses writes,
and a study ended by SIGTERM."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import mlflow
import onnx
import pytest

from tests.conftest import child_env
from tracker.base.errors import TrackingServerError
from tracker.cli import main
from tracker.optimize.add_eyelike import make_linear_model
from tracker.store import connect

ROOT = Path(__file__).resolve().parents[1]


def test_the_sqlite_init_lock_lives_beside_the_database_and_a_planted_symlink_is_never_followed(tmp_path):
    store = tmp_path / "store"
    store.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    lock = store / ".mlflow.db.init-lock"
    lock.symlink_to(victim)

    with pytest.raises(TrackingServerError, match="must not be a symlink"):
        connect.setup_tracking(f"sqlite:///{store / 'mlflow.db'}")
    assert victim.read_text() == "precious"

    lock.unlink()
    connect.setup_tracking(f"sqlite:///{store / 'mlflow.db'}")
    assert lock.is_file() and not lock.is_symlink()
    assert oct(lock.stat().st_mode & 0o777) == "0o600"


@pytest.mark.slow
def test_profile_exits_2_and_names_the_outbox_when_the_store_refuses_the_run(tmp_path, monkeypatch, capsys):
    db = tmp_path / "mlflow.db"
    mlflow.MlflowClient(f"sqlite:///{db}").search_experiments()  # a real store, readable ...
    with sqlite3.connect(db) as connection:  # ... that refuses every new run
        connection.execute("CREATE TRIGGER refuse BEFORE INSERT ON runs BEGIN SELECT RAISE(ABORT, 'no room'); END")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{db}")
    monkeypatch.setenv("TRACKER_OUTBOX", str(tmp_path / "outbox"))
    model_path = tmp_path / "model.onnx"
    onnx.save(make_linear_model(n_features=8), model_path)

    code = main(["profile", str(model_path), "--dim", "N=2", "--profile-runs", "3", "--min-seconds", "0", "--name", "kept"])
    captured = capsys.readouterr()
    assert code == 2
    assert "run None" not in captured.out
    kept = tmp_path / "outbox" / "attempts-no-parent" / "kept"
    assert (kept / "record.json").is_file(), "the measurement is kept"
    # The store answers: a refusal, said as one, not an outage to wait out.
    assert f"the tracking store refused the run of attempt kept (IntegrityError: no room); it is kept in {kept}" \
        in captured.err
    assert "once the tracking store answers" not in captured.err


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
