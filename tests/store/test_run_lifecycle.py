"""The project owns its runs' lifecycle: a run whose ending the store refuses leaves this process's
run stack alone, the study keeps its own run, and what the outbox cannot take (a full disk) lands in one emergency
folder, the folder that failed named."""

from __future__ import annotations

import json
import logging
import sqlite3
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from mlflow import MlflowClient

from tests.conftest import FAST_SPEEDUP, use_sqlite_store
from tests.models import make_linear_model
from tracker import MeasureConfig, Study, TimingConfig
from tracker.base.files import no_space_note
from tracker.base.keys import TAG_BEST, TAG_ROLE
from tracker.cli import main
from tracker.run.record import RECORD_FILE, SUMMARY_FILE

# Each test logs whole attempts.
pytestmark = pytest.mark.slow

FAST = MeasureConfig(profile_runs=3, speedup=FAST_SPEEDUP,
                     timing=TimingConfig(warmup_runs=1, min_runs=3, min_seconds=0.0), trace_levels=(1,))
FEEDS = {"X": np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)}


@pytest.fixture
def store(tmp_path, monkeypatch, tmp_path_factory) -> str:
    return use_sqlite_store(tmp_path, monkeypatch, tmp_path_factory)


def _sql(tmp_path: Path, statement: str) -> None:
    with sqlite3.connect(tmp_path / "mlflow.db") as connection:
        connection.execute(statement)


def test_a_run_whose_ending_the_store_refuses_leaves_the_study_its_own_run(store, tmp_path, caplog):
    model = make_linear_model(n_features=4)
    caplog.set_level(logging.WARNING, logger="tracker")
    with Study("lifecycle", feeds=FEEDS, config=FAST, experiment="lifecycle") as study:
        study_id = study.run.info.run_id
        study.attempt("baseline", model)
        # Attempt "second": its artifacts cannot be written (the experiment's folder is a file for a moment), and
        # the store refuses to end its run: MLflow's end_run pops the run off its stack before the store refuses.
        _sql(tmp_path, "CREATE TRIGGER refuse BEFORE UPDATE OF status ON runs WHEN NEW.name = 'second' "
                       "AND NEW.status != 'RUNNING' BEGIN SELECT RAISE(ABORT, 'refused'); END")
        artifacts = Path(MlflowClient(store).get_experiment(study.run.info.experiment_id).artifact_location)
        artifacts.rename(artifacts.with_name("moved"))
        artifacts.write_text("a file for a moment")
        second = study.attempt("second", model)
        artifacts.unlink()
        artifacts.with_name("moved").rename(artifacts)
        third = study.attempt("third", model)

    client = MlflowClient(store)
    runs = client.search_runs([study.run.info.experiment_id])
    assert all(TAG_ROLE in r.data.tags for r in runs), \
        f"no automatically named run: {[r.info.run_name for r in runs if TAG_ROLE not in r.data.tags]}"
    study_run = client.get_run(study_id)
    assert study_run.info.status == "FINISHED" and study_run.data.tags[TAG_BEST] == "baseline"
    assert client.get_run(third.run_id).data.tags["mlflow.parentRunId"] == study_id
    assert second.run_id is None and second.outbox is not None, "kept whole: its run could not be ended"
    kept = json.loads((second.outbox / RECORD_FILE).read_text())
    assert kept["parent_run_id"] == study_id
    assert f"that run {kept['run_id']} ended FAILED" in caplog.text, "the run named is the attempt's"
    assert study_id not in caplog.text.split("could not tell")[1].splitlines()[0]


def test_what_the_outbox_cannot_take_lands_in_one_emergency_folder_naming_the_full_one(store, tmp_path, caplog):
    model = make_linear_model(n_features=4)
    caplog.set_level(logging.ERROR, logger="tracker")
    with Study("full", feeds=FEEDS, config=FAST, experiment="full") as study:
        study.attempt("baseline", model)
        # The store refuses every new run and the summary; the outbox's summary file is a full device.
        _sql(tmp_path, "CREATE TRIGGER refuse BEFORE INSERT ON runs BEGIN SELECT RAISE(ABORT, 'no'); END")
        _sql(tmp_path, "CREATE TRIGGER no_summary BEFORE INSERT ON tags WHEN NEW.key = 'tracker.best_attempt' "
                       "BEGIN SELECT RAISE(ABORT, 'no'); END")
        parent = tmp_path / "outbox" / f"full-{study.run.info.run_id}"
        parent.mkdir(parents=True)
        (parent / SUMMARY_FILE).symlink_to("/dev/full")
        first = study.attempt("first", model)
        (parent / "second").symlink_to(tmp_path / "nowhere")  # the next record's folder cannot be made
        second = study.attempt("second", model)
    assert first.outbox is not None and first.outbox.parent.parent == tmp_path / "outbox"
    emergency = second.outbox.parent.parent
    assert emergency.name.startswith("tracker-outbox-")
    summary = json.loads((emergency / f"full-{study.run.info.run_id}" / SUMMARY_FILE).read_text())
    assert summary["best"] == "baseline", "the summary is kept beside the records, in the same folder"
    assert f"could not keep the summary of study full in the outbox {tmp_path / 'outbox'} (OSError: [Errno 28] " \
           in caplog.text


def test_a_full_disk_names_the_folders_written_to_and_their_space(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(OSError) as raised, open("/dev/full", "w") as full:
        full.write("x")
        full.flush()
    note = no_space_note(raised.value)
    assert note.startswith(" (space left: ")
    assert "(the temporary folder, $TMPDIR) " in note and f"{tmp_path} (the working folder) " in note
    assert " MB" in note
    assert no_space_note(FileNotFoundError(2, "gone")) == ""


@pytest.fixture
def full_tmpdir(tmp_path, monkeypatch):
    """$TMPDIR on a 1 MB tmpfs with 64 KB left: enough for Python to pick it, too little for a profile."""
    folder = tmp_path / "full"
    folder.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(folder)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"no tmpfs can be mounted here: {mounted.stderr.decode().strip()}")
    try:
        (folder / "fill").write_bytes(b"\0" * (1024 * 1024 - 64 * 1024))
        monkeypatch.setenv("TMPDIR", str(folder))
        monkeypatch.setattr(tempfile, "tempdir", None)  # read $TMPDIR again
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def test_a_full_tmpdir_is_named_with_the_space_left_in_it(store, tmp_path, full_tmpdir, capsys):
    model = tmp_path / "model.onnx"
    onnx.save(make_linear_model(n_features=4), str(model))

    code = main(["profile", str(model), "--dim", "N=2", "--profile-runs", "3", "--min-seconds", "0"])

    err = capsys.readouterr().err
    assert code == 2
    assert f"No space left on device (space left: {full_tmpdir} (the temporary folder, $TMPDIR) 0.0 MB" in err
    assert "Traceback" not in err
