"""Opening the tracking store (`tracker.store.connect`): the sqlite init lock beside the database, never a planted
symlink; a default ./mlflow.db built beside and renamed in when whole, so that Ctrl-C leaves none half-built; and advice
that fits a half-built store an older version left."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import time

import onnx
import pytest
from probe_common import store_migrating, store_revision  # benchmarks/probe_common.py (pytest pythonpath)

from tests.conftest import child_env
from tests.models import make_linear_model
from tracker.base.errors import TrackingServerError
from tracker.cli import main
from tracker.store import connect


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
@pytest.mark.subprocess
@pytest.mark.timing  # Ctrl-C must land while the migrations run (seconds): retried when it lands after them
def test_ctrl_c_while_the_default_store_is_built_leaves_none_half_built(tmp_path):
    onnx.save(make_linear_model(n_features=4), str(tmp_path / "m.onnx"))
    command = [sys.executable, "-m", "tracker", "profile", "m.onnx", "--dim", "N=2", "--profile-runs", "2",
               "--min-seconds", "0"]
    # Ctrl-C as a user's terminal sends it, even when this test runs with SIGINT ignored (a shell's `&` job)
    cut = subprocess.Popen(command, cwd=tmp_path, env=child_env(None), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 120
    while not store_migrating(tmp_path):  # MLflow has made its tables and is running its migrations (seconds)
        assert cut.poll() is None and time.monotonic() < deadline, "the command never began building the store"
        time.sleep(0.01)
    cut.send_signal(signal.SIGINT)
    assert cut.wait(timeout=120) == 130
    left = store_revision(tmp_path / "mlflow.db")

    again = subprocess.run(command, cwd=tmp_path, env=child_env(None), capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    assert not (tmp_path / ".mlflow.db.building").exists()
    assert left in (None, store_revision(tmp_path / "mlflow.db")), "the cut command left a store that was not finished"


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
