"""Runs and work folders a SIGKILL leaves: the next study in the experiment, `tracker compare` and
`tracker upload` end KILLED the RUNNING runs of a process gone from this host, leave other hosts' and live processes'
runs alone, compare says the study did not finish, and the next study removes the dead process's work folder."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from mlflow import MlflowClient

from tests.conftest import FAST_SPEEDUP, use_sqlite_store
from tests.models import make_linear_model
from tracker import MeasureConfig, Study, TimingConfig
from tracker.base.files import WORK_MARKER, make_work_folder, process_gone, this_process
from tracker.base.keys import TAG_HOST, TAG_KILLED, TAG_PID, TAG_PID_STARTED
from tracker.cli import main
from tracker.run.record import save_summary
from tracker.store.abandoned import end_abandoned_in
from tracker.upload import upload_outbox

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
FAST = MeasureConfig(profile_runs=3, speedup=FAST_SPEEDUP,
                     timing=TimingConfig(warmup_runs=1, min_runs=3, min_seconds=0.0), trace_levels=(1,))

# A study that logs its baseline, keeps a second attempt in the outbox, makes its work folder, then waits to be
# killed: what a study killed during its second attempt leaves.
_KILLED_STUDY = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from tracker.base.files import make_work_folder
    from tracker.pipeline import log_or_keep
    from tracker.run.record import AttemptRecord, save_record
    from tracker.store import connect, write

    connect.setup_tracking(None)
    with write.study_run("killed", experiment="abandoned", params={}, tags={}) as run:
        ids = (run.info.run_id, run.info.experiment_id)
        log_or_keep(AttemptRecord("baseline", "killed", "onnxruntime", metrics={"latency.p50_ms": 1.0},
                                  parent_run_id=ids[0], experiment_id=ids[1]))
        save_record(AttemptRecord("second", "killed", "onnxruntime", metrics={"latency.p50_ms": 0.5},
                                  parent_run_id=ids[0], experiment_id=ids[1]))
        folder = make_work_folder("tracker-killed-")
        (folder / "model.onnx").write_bytes(b"0" * 1000)
        print(ids[0], folder, flush=True)
        time.sleep(600)
""")


@pytest.fixture
def store(tmp_path, monkeypatch, tmp_path_factory) -> str:
    return use_sqlite_store(tmp_path, monkeypatch, tmp_path_factory)


@pytest.fixture
def killed(store, tmp_path) -> tuple[str, Path]:
    """(the study run id, its work folder) of a study process killed with SIGKILL."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen([sys.executable, "-c", _KILLED_STUDY], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, text=True)
    try:
        line = process.stdout.readline().split()
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
    assert len(line) == 2, "the study process did not get as far as its second attempt"
    run_id, folder = line[0], Path(line[1])
    assert MlflowClient(store).get_run(run_id).info.status == "RUNNING"
    return run_id, folder


def test_compare_ends_a_killed_studys_run_killed_and_says_it_did_not_finish(killed, store, capsys):
    run_id, _ = killed

    code = main(["compare", run_id])

    out = capsys.readouterr().out
    assert code == 0
    assert f"Study killed (run {run_id}) [did not finish]: 1 attempts, best: " in out
    assert "note: the study did not finish (KILLED: process " in out
    run = MlflowClient(store).get_run(run_id)
    assert run.info.status == "KILLED"
    assert run.data.tags[TAG_KILLED].endswith("ended without ending this run (found by tracker compare)")


def test_the_next_study_ends_the_killed_run_and_removes_its_work_folder(killed, store):
    run_id, folder = killed
    assert folder.is_dir()
    feeds = {"X": np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)}
    with Study("next", feeds=feeds, config=FAST, experiment="abandoned") as study:
        assert not folder.exists(), "the dead process's work folder is removed"
        assert (study._work / WORK_MARKER).is_file(), "this study's own folder is marked as its"
        study.attempt("baseline", make_linear_model(n_features=4))
    run = MlflowClient(store).get_run(run_id)
    assert run.info.status == "KILLED" and run.data.tags[TAG_KILLED].endswith("(found by study next)")


def test_upload_ends_the_killed_study_before_its_kept_records_join_it(killed, store, tmp_path):
    run_id, _ = killed

    done = upload_outbox(tmp_path / "outbox")

    assert len(done.uploaded) == 1 and not done.refused
    run = MlflowClient(store).get_run(run_id)
    assert run.info.status == "KILLED", "upload does not call a killed study FINISHED"
    assert run.data.tags[TAG_KILLED].endswith("(found by tracker upload)")


def test_upload_ends_finished_a_study_whose_process_reached_its_end_and_kept_its_summary(killed, store, tmp_path):
    run_id, _ = killed
    save_summary({"metrics": {"study.wall_s": 3.0}, "best": None, "tags": {}}, study="killed", parent_run_id=run_id,
                 root=tmp_path / "outbox")  # what a study whose end the store did not take keeps

    done = upload_outbox(tmp_path / "outbox")

    assert done.studies == [run_id] and not done.refused
    run = MlflowClient(store).get_run(run_id)
    assert run.info.status == "FINISHED", "the process had gone, but its study had reached its end"
    assert TAG_KILLED not in run.data.tags and run.data.metrics["study.wall_s"] == 3.0


def test_runs_of_another_host_and_of_a_live_process_are_left_alone(store, tmp_path):
    client = MlflowClient(store)
    experiment = client.create_experiment("others", artifact_location=str(tmp_path / "artifacts"))
    me = this_process()
    other_host = client.create_run(experiment, tags={TAG_HOST: me["host"] + "-elsewhere", TAG_PID: "999999",
                                                     TAG_PID_STARTED: "1.0"}).info.run_id
    alive = client.create_run(experiment, tags={TAG_HOST: me["host"], TAG_PID: me["pid"],
                                                TAG_PID_STARTED: me["started_s"]}).info.run_id
    reused = client.create_run(experiment, tags={TAG_HOST: me["host"], TAG_PID: me["pid"],  # the pid, reused
                                                 TAG_PID_STARTED: str(float(me["started_s"]) - 100)}).info.run_id

    ended = end_abandoned_in([experiment], by="a test")

    assert set(ended) == {reused}
    assert [client.get_run(r).info.status for r in (other_host, alive, reused)] == ["RUNNING", "RUNNING", "KILLED"]


def test_only_marked_folders_of_processes_gone_are_removed(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", None)
    unmarked = tmp_path / "tracker-someone-else"
    unmarked.mkdir()
    mine = make_work_folder("tracker-mine-")
    other_host = make_work_folder("tracker-other-")
    (other_host / WORK_MARKER).write_text('{"host": "elsewhere", "pid": "999999", "started_s": "1"}')
    garbled = make_work_folder("tracker-garbled-")
    (garbled / WORK_MARKER).write_text("[" * 5000)

    make_work_folder("tracker-next-")

    assert all(folder.is_dir() for folder in (unmarked, mine, other_host, garbled))
    assert not process_gone(this_process())
