"""Logging faults: a refusal is not an outage, one bad record blocks nothing, an upload is idempotent
and locked, and a measurement always finds a place."""

from __future__ import annotations

import fcntl
import json
import logging
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import mlflow
import numpy as np
import onnx
import pytest
from mlflow import MlflowClient
from mlflow.entities import ViewType
from onnx import TensorProto, helper

from tests.conftest import FAST_SPEEDUP, seed_sqlite_store
from tests.models import make_linear_model
from tracker import MeasureConfig, Study, TimingConfig, upload
from tracker.base.keys import TAG_NOT_LOGGED
from tracker.cli import main
from tracker.run.record import RECORD_FILE, AttemptRecord, find_records, save_record
from tracker.store import kept_runs

# Each test logs or uploads whole attempts.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
FAST = MeasureConfig(profile_runs=3, speedup=FAST_SPEEDUP,
                     timing=TimingConfig(warmup_runs=1, min_runs=3, min_seconds=0.0), trace_levels=(1,))


@pytest.fixture
def store(tmp_path, monkeypatch, tmp_path_factory) -> str:
    uri = seed_sqlite_store(tmp_path / "mlflow.db", tmp_path_factory)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("TRACKER_OUTBOX", str(tmp_path / "outbox"))
    return uri


def _zipmap_classifier() -> onnx.ModelProto:
    """A RandomForest as skl2onnx converts it by default: `label` plus ZipMap probabilities (a sequence of maps)."""
    from skl2onnx import to_onnx
    from sklearn.datasets import load_iris
    from sklearn.ensemble import RandomForestClassifier

    x, y = load_iris(return_X_y=True)
    forest = RandomForestClassifier(n_estimators=3, max_depth=3, random_state=0).fit(x, y)
    return to_onnx(forest, x[:1].astype(np.float32), target_opset={"": 17, "ai.onnx.ml": 3})


def _sequence_output() -> onnx.ModelProto:
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, [2])
    seq = helper.make_value_info("S", helper.make_sequence_type_proto(
        helper.make_tensor_type_proto(TensorProto.FLOAT, [2])))
    graph = helper.make_graph([helper.make_node("SequenceConstruct", ["X", "X"], ["S"])], "seq", [x], [seq])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _no_inputs() -> onnx.ModelProto:
    y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2])
    const = helper.make_node("Constant", [], ["Y"], value=helper.make_tensor("c", TensorProto.FLOAT, [2], [1, 2]))
    return helper.make_model(helper.make_graph([const], "const", [], [y]),
                             opset_imports=[helper.make_opsetid("", 17)])


def _kept(tmp_path: Path, name: str, model: onnx.ModelProto | None = None, **fields) -> Path:
    """A record saved in the outbox as a study's process would have, with an artifact and a model."""
    work = tmp_path / "work" / name
    (work / "artifacts").mkdir(parents=True)
    (work / "artifacts" / "notes.txt").write_text(f"notes of {name}\n")
    onnx.save(model or make_linear_model(n_features=4), str(work / "model.onnx"))
    record = AttemptRecord(name, "kept", "onnxruntime", metrics={"latency.p50_ms": 1.0}, params={"knob": "1"},
                           artifact_dir=str(work / "artifacts"), model_path=str(work / "model.onnx"), **fields)
    return save_record(record, tmp_path / "outbox")


def _runs(uri: str) -> list:
    client = MlflowClient(uri)
    experiments = [e.experiment_id for e in client.search_experiments(view_type=ViewType.ALL)]
    return client.search_runs(experiments, run_view_type=ViewType.ACTIVE_ONLY)


# Item 1: models MLflow's tensor signature cannot describe, and what the note must name.
UNSIGNABLE = {
    "skl2onnx ZipMap classifier": (_zipmap_classifier, "'output_probability' is a sequence of map"),
    "sequence output": (_sequence_output, "output 'S' is a sequence of tensor"),
    "no inputs": (_no_inputs, "the model has no inputs"),
}


@pytest.mark.parametrize("build, why", UNSIGNABLE.values(), ids=UNSIGNABLE.keys())
def test_a_model_without_a_tensor_signature_is_logged_without_one_and_says_so(store, tmp_path, build, why, capsys):
    _kept(tmp_path, "unsignable", build())

    assert main(["upload", str(tmp_path / "outbox")]) == 0
    out, err = capsys.readouterr()
    (run,) = _runs(store)
    assert run.info.status == "FINISHED"
    assert why in run.data.tags[TAG_NOT_LOGGED] and why in out
    assert run.data.metrics == {"latency.p50_ms": 1.0}, "the rest of the run is logged"
    (model,) = mlflow.search_logged_models(experiment_ids=[run.info.experiment_id], output_format="list")
    assert model.source_run_id == run.info.run_id, "the model keeps the onnx flavor, without a signature"
    assert find_records(tmp_path / "outbox") == []
    assert "Traceback" not in err


def test_a_record_mlflow_refuses_whole_stays_and_blocks_nothing_however_often_upload_runs(store, tmp_path, capsys):
    gone = MlflowClient(store).create_experiment("deleted later")
    MlflowClient(store).delete_experiment(gone)
    _kept(tmp_path, "a")
    bad = _kept(tmp_path, "b", experiment_id=gone)  # a record of a study whose experiment was deleted since
    _kept(tmp_path, "c")

    for attempt in range(2):
        assert main(["upload", str(tmp_path / "outbox")]) == 2
        err = capsys.readouterr().err
        (line,) = [line for line in err.splitlines() if line.startswith("error:")]
        assert line.startswith(f"error: record {bad / RECORD_FILE}: the tracking store refused it (MlflowException: ")
        assert "deleted" in line and line.endswith(f"not uploaded: it stays in {bad}")
        assert "Traceback" not in err
        runs = _runs(store)
        assert sorted(r.info.run_name for r in runs) == ["a", "c"], f"try {attempt + 1}: one run per good record"
        assert {r.info.status for r in runs} == {"FINISHED"}, "no FAILED duplicate of the refused record"
        assert find_records(tmp_path / "outbox") == [bad]


def test_an_upload_cut_off_midway_leaves_one_run_per_record_after_the_next(store, tmp_path):
    halfway, logged = _kept(tmp_path, "halfway"), _kept(tmp_path, "logged")
    # A try that died after creating the run of "halfway", and one that died after logging "logged" whole.
    partial = kept_runs.create_kept_run(AttemptRecord("halfway", "kept", "onnxruntime"), source=halfway)
    upload._write_marker(halfway, partial, done=False)
    whole = kept_runs.create_kept_run(AttemptRecord("logged", "kept", "onnxruntime"), source=logged)
    upload._write_marker(logged, whole, done=True)

    done = upload.upload_outbox(tmp_path / "outbox")

    runs = {r.info.run_name: r for r in _runs(store)}
    assert sorted(runs) == ["halfway", "logged"], "one run each: no duplicate"
    assert runs["logged"].info.run_id == whole, "a record logged whole is not logged again"
    assert runs["halfway"].info.run_id != partial and runs["halfway"].data.metrics == {"latency.p50_ms": 1.0}
    assert MlflowClient(store).get_run(partial).info.lifecycle_stage == "deleted"
    assert done.uploaded == {halfway: runs["halfway"].info.run_id, logged: whole}
    assert find_records(tmp_path / "outbox") == []


def test_a_second_upload_of_the_same_outbox_is_refused_while_the_first_holds_its_lock(store, tmp_path, capsys):
    _kept(tmp_path, "a")
    with open(tmp_path / "outbox" / upload.LOCK_FILE, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        held.write("4242")
        held.flush()
        assert main(["upload", str(tmp_path / "outbox")]) == 2
    err = capsys.readouterr().err
    assert f"error: another `tracker upload` (pid 4242) is uploading {tmp_path / 'outbox'}" in err
    assert _runs(store) == [] and len(find_records(tmp_path / "outbox")) == 1


@pytest.mark.subprocess
def test_two_uploads_at_once_make_one_run_per_record_and_no_traceback(store, tmp_path):
    for name in "abcdef":
        _kept(tmp_path, name)
    env = {**os.environ, "MLFLOW_TRACKING_URI": store, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "tracker", "upload", str(tmp_path / "outbox")]
    procs = [subprocess.Popen(command, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
    outcomes = [(p.wait(timeout=300), p.stderr.read()) for p in procs]

    assert sorted(r.info.run_name for r in _runs(store)) == list("abcdef")
    assert find_records(tmp_path / "outbox") == []
    for code, err in outcomes:
        assert "Traceback" not in err
        assert code == 0 or (code == 2 and "another `tracker upload`" in err)


def test_a_record_removed_midway_is_refused_with_its_reason_and_the_others_upload(store, tmp_path, monkeypatch,
                                                                                  capsys):
    for name in "abc":
        _kept(tmp_path, name)
    loaded = upload.load_record

    def load_then_remove(folder):  # the user deletes b's files after upload read its record
        record = loaded(folder)
        if folder.name == "b":
            os.unlink(record.model_path)
        return record

    monkeypatch.setattr(upload, "load_record", load_then_remove)
    assert main(["upload", str(tmp_path / "outbox")]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    (line,) = [line for line in err.splitlines() if line.startswith("error:")]
    b = tmp_path / "outbox" / "kept-no-parent" / "b"
    assert line.startswith(f"error: record {b / RECORD_FILE}: the tracking store refused it (ModelError: ")
    assert "model.onnx" in line and line.endswith(f"not uploaded: it stays in {b}")
    runs = MlflowClient(store).search_runs(["0"], run_view_type=ViewType.ALL)
    assert sorted(r.info.run_name for r in runs if r.info.lifecycle_stage == "active") == ["a", "c"]
    assert all(r.info.status == "FINISHED" for r in runs if r.info.lifecycle_stage == "active"), \
        "the run the cut record began is deleted, not left FAILED beside the others"
    assert find_records(tmp_path / "outbox") == [b]


def test_an_outbox_that_names_a_file_is_an_error_before_any_work(store, tmp_path, monkeypatch, capsys):
    (tmp_path / "outbox-file").write_text("not a folder")
    monkeypatch.setenv("TRACKER_OUTBOX", str(tmp_path / "outbox-file"))
    onnx.save(make_linear_model(n_features=4), str(tmp_path / "model.onnx"))

    code = main(["profile", str(tmp_path / "model.onnx"), "--dim", "N=2", "--profile-runs", "2", "--min-seconds", "0"])

    err = capsys.readouterr().err
    assert code == 2
    assert f"error: the outbox {tmp_path / 'outbox-file'} is not a folder; expected a folder" in err
    assert _runs(store) == [], "nothing was measured or logged"


def test_a_record_the_outbox_cannot_take_is_kept_in_a_folder_of_its_own(store, tmp_path, caplog):
    model = make_linear_model(n_features=4)
    feeds = {"X": np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)}
    caplog.set_level(logging.ERROR, logger="tracker")
    with Study("fallback", feeds=feeds, config=FAST, experiment="fallback") as study:
        # The outbox becomes a file, and the store refuses every new run, after the study started.
        (tmp_path / "outbox").write_text("a file now")
        with sqlite3.connect(tmp_path / "mlflow.db") as connection:
            connection.execute("CREATE TRIGGER refuse BEFORE INSERT ON runs BEGIN SELECT RAISE(ABORT, 'no'); END")
        result = study.attempt("baseline", model)
    assert result.run_id is None and result.outbox is not None
    assert result.outbox.parent.parent.name.startswith("tracker-outbox-")
    record = json.loads((result.outbox / RECORD_FILE).read_text())
    assert record["attempt"] == "baseline" and record["metrics"]["latency.p50_ms"] > 0
    assert f"it is kept in {result.outbox.parent.parent} instead" in caplog.text


def test_an_outbox_in_the_working_folder_that_cannot_be_used_does_not_say_to_unset_an_unset_variable(
        store, tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("TRACKER_OUTBOX")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tracker-outbox").write_text("not a folder")
    onnx.save(make_linear_model(n_features=4), str(tmp_path / "model.onnx"))

    code = main(["profile", str(tmp_path / "model.onnx"), "--dim", "N=2", "--profile-runs", "2", "--min-seconds", "0"])

    err = capsys.readouterr().err
    assert code == 2 and f"error: the outbox {tmp_path / 'tracker-outbox'} is not a folder" in err
    assert "$TRACKER_OUTBOX" in err and "unset" not in err, "the variable is not set: there is nothing to unset"
    assert "set $TRACKER_OUTBOX to one" in err


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
