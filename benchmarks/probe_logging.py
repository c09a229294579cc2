"""Probe cases of issue 22, items 1-6: logging and the outbox (records MLflow refuses, a bad record among good
ones, two uploads at once, a file as the outbox) and signals (Ctrl-C while ./mlflow.db is built, SIGTERM swallowed
in a weakref callback).

Each case works from outside, on a sqlite store in an empty folder, through `python -m tracker` (or a `python -c`
child), and returns (held, one-line observation). Records are written with `tracker.run.record.save_record`, whose
format has not changed, so the cases run against an older checkout too (PYTHONPATH).
"""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
from probe_common import (
    SIGTERM_IN_A_WEAKREF_CALLBACK,
    Case,
    last_line,
    linear_model,
    run_tracker,
    store_migrating,
    store_revision,
    tracker_env,
)


def _runs(tmp: Path) -> list[tuple[str, str]]:
    """(name, status) of the live runs in the store, from its tables (no MLflow in this process)."""
    with sqlite3.connect(tmp / "mlflow.db") as connection:
        return sorted(connection.execute("SELECT name, status FROM runs WHERE lifecycle_stage = 'active'"))


def _forest() -> onnx.ModelProto:
    from skl2onnx import to_onnx
    from sklearn.datasets import load_iris
    from sklearn.ensemble import RandomForestClassifier

    x, y = load_iris(return_X_y=True)
    forest = RandomForestClassifier(n_estimators=3, max_depth=3, random_state=0).fit(x, y)
    return to_onnx(forest, x[:1].astype(np.float32), target_opset={"": 17, "ai.onnx.ml": 3})


def _keep(tmp: Path, name: str, model: onnx.ModelProto, **fields) -> Path:
    """A record in `tmp/outbox`, as a study's process keeps it when the store does not take it."""
    from tracker.run.record import AttemptRecord, save_record

    work = tmp / "work" / name
    work.mkdir(parents=True)
    onnx.save(model, str(work / "model.onnx"))
    record = AttemptRecord(name, "probe", "onnxruntime", metrics={"latency.p50_ms": 1.0},
                           model_path=str(work / "model.onnx"), **fields)
    return save_record(record, tmp / "outbox")


def _new_store(tmp: Path) -> None:
    done = subprocess.run([sys.executable, "-c", "from tracker.store.connect import setup_tracking; "
                           "setup_tracking()"], cwd=tmp, env=tracker_env(tmp), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-500:]


def zipmap_record_uploaded(tmp: Path) -> tuple[bool, str]:
    _keep(tmp, "forest", _forest())
    done = run_tracker(tmp, "upload", str(tmp / "outbox"))
    runs = _runs(tmp)
    held = done.returncode == 0 and runs == [("forest", "FINISHED")] and "Traceback" not in done.stderr
    return held, f"rc {done.returncode}, runs {runs}: {last_line(done)}"


def bad_record_among_good_ones(tmp: Path) -> tuple[bool, str]:
    _new_store(tmp)
    with sqlite3.connect(tmp / "mlflow.db") as connection:  # an experiment deleted since its study ran
        connection.execute("INSERT INTO experiments (experiment_id, name, artifact_location, lifecycle_stage) "
                           "VALUES (7, 'gone', 'mlruns/7', 'deleted')")
    _keep(tmp, "a", linear_model())
    _keep(tmp, "b", linear_model(), experiment_id="7")
    _keep(tmp, "c", linear_model())
    tries = [run_tracker(tmp, "upload", str(tmp / "outbox")) for _ in range(2)]
    runs = _runs(tmp)
    clean = all("Traceback" not in t.stderr for t in tries)
    held = clean and runs == [("a", "FINISHED"), ("c", "FINISHED")] and all(t.returncode == 2 for t in tries)
    return held, f"rc {[t.returncode for t in tries]}, runs after 2 tries {runs}: {last_line(tries[-1])}"


def two_uploads_at_once(tmp: Path) -> tuple[bool, str]:
    _new_store(tmp)
    for name in "abcdef":
        _keep(tmp, name, linear_model())
    command = [sys.executable, "-m", "tracker", "upload", str(tmp / "outbox")]
    procs = [subprocess.Popen(command, cwd=tmp, env=tracker_env(tmp), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
    codes = [p.wait(timeout=300) for p in procs]
    errors = [p.stderr.read() for p in procs]
    names = [name for name, _ in _runs(tmp)]
    held = names == list("abcdef") and not any("Traceback" in e for e in errors)
    return held, f"rc {codes}, {len(names)} runs for 6 records, tracebacks: {sum('Traceback' in e for e in errors)}"


def outbox_is_a_file(tmp: Path) -> tuple[bool, str]:
    _new_store(tmp)
    with sqlite3.connect(tmp / "mlflow.db") as connection:  # the store refuses the run: the outbox is needed
        connection.execute("CREATE TRIGGER refuse BEFORE INSERT ON runs BEGIN SELECT RAISE(ABORT, 'no'); END")
    onnx.save(linear_model(), str(tmp / "m.onnx"))
    (tmp / "outbox-file").write_text("a file")
    done = run_tracker(tmp, "profile", "m.onnx", "--dim", "N=2", "--profile-runs", "2", "--min-seconds", "0",
                       env=tracker_env(tmp, TRACKER_OUTBOX=str(tmp / "outbox-file")))
    held = done.returncode == 2 and "Traceback" not in done.stderr and "not a folder" in done.stderr
    return held, f"rc {done.returncode}: {last_line(done)}"


def ctrl_c_while_the_default_store_is_built(tmp: Path) -> tuple[bool, str]:
    onnx.save(linear_model(), str(tmp / "m.onnx"))
    env = {k: v for k, v in tracker_env(tmp).items() if k != "MLFLOW_TRACKING_URI"}  # ./mlflow.db
    command = [sys.executable, "-m", "tracker", "profile", "m.onnx", "--dim", "N=2", "--profile-runs", "2",
               "--min-seconds", "0"]
    cut = subprocess.Popen(command, cwd=tmp, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not store_migrating(tmp) and cut.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    cut.send_signal(signal.SIGINT)
    cut.wait(timeout=120)
    left = store_revision(tmp / "mlflow.db")
    again = subprocess.run(command, cwd=tmp, env=env, capture_output=True, text=True, timeout=300)
    whole = left in (None, store_revision(tmp / "mlflow.db"))
    held = again.returncode == 0 and whole
    return held, (f"{'no store or a whole one' if whole else f'a half-built store (revision {left})'} left; the "
                  f"command after Ctrl-C: rc {again.returncode}: {last_line(again) if again.returncode else 'ok'}")


def sigterm_in_a_weakref_callback(tmp: Path) -> tuple[bool, str]:
    done = subprocess.run([sys.executable, "-c", SIGTERM_IN_A_WEAKREF_CALLBACK], cwd=tmp, capture_output=True,
                          text=True, timeout=60)
    swallowed = 'the exception was swallowed' if 'Exception ignored' in done.stderr else 'no exception swallowed'
    return done.returncode == 143, f"exit {done.returncode} ({swallowed})"


CASES: list[Case] = [
    ("1", "a kept record of a default skl2onnx forest (ZipMap), uploaded", zipmap_record_uploaded),
    ("2", "a record MLflow refuses among two good ones, uploaded twice", bad_record_among_good_ones),
    ("3", "two `tracker upload`s of one outbox at once", two_uploads_at_once),
    ("4", "TRACKER_OUTBOX naming a file, the store refusing the run", outbox_is_a_file),
    ("5", "Ctrl-C during the first use of ./mlflow.db", ctrl_c_while_the_default_store_is_built),
    ("6", "SIGTERM landing in a weakref callback", sigterm_in_a_weakref_callback),
]
