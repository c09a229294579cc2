"""`tracker upload` reads only what its records own, says what it refuses, and finishes a study's report."""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Callable
from pathlib import Path

import onnx
import pytest
from mlflow import MlflowClient
from mlflow.entities import ViewType

from tests.conftest import FAST_SPEEDUP
from tests.models import make_linear_model
from tracker import MeasureConfig, SessionConfig, Study, TimingConfig
from tracker.cli import main
from tracker.run.record import RECORD_FILE, AttemptRecord, find_records, find_summaries, save_record

FAST = MeasureConfig(profile_runs=3, speedup=FAST_SPEEDUP,
                     timing=TimingConfig(warmup_runs=1, min_runs=3, min_seconds=0.0), trace_levels=(1,))


@pytest.fixture
def store(tmp_path, monkeypatch) -> str:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    return uri


@pytest.fixture
def outbox(tmp_path) -> Path:
    """An outbox holding two records, "good" and "bad", each with an artifact folder, a file and a model."""
    (tmp_path / "secret.txt").write_text("not for the tracking server\n")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "private.txt").write_text("not for the tracking server either\n")
    for name in ("good", "bad"):
        work = tmp_path / "work" / name
        (work / "artifacts").mkdir(parents=True)
        (work / "artifacts" / "notes.txt").write_text(f"notes of {name}\n")
        (work / "profile.json").write_text("[]")
        onnx.save(make_linear_model(n_features=4), str(work / "model.onnx"))
        record = AttemptRecord(name, "kept", "onnxruntime", metrics={"latency.p50_ms": 1.0},
                               artifact_dir=str(work / "artifacts"), files={str(work / "profile.json"): "profile"},
                               model_path=str(work / "model.onnx"), model_flavor=False)
        save_record(record, tmp_path / "outbox")
    return tmp_path / "outbox"


# Ways to spoil the saved record "bad": functions of its folder and of the folder outside the outbox.
Spoil = Callable[[Path, Path], None]


def _set(**values) -> Spoil:
    def spoil(folder: Path, outside: Path) -> None:
        data = json.loads((folder / RECORD_FILE).read_text())
        data.update(values)
        (folder / RECORD_FILE).write_text(json.dumps(data))
    return spoil


def _drop(*keys: str) -> Spoil:
    def spoil(folder: Path, outside: Path) -> None:
        data = json.loads((folder / RECORD_FILE).read_text())
        (folder / RECORD_FILE).write_text(json.dumps({k: v for k, v in data.items() if k not in keys}))
    return spoil


def _write(text: str) -> Spoil:
    return lambda folder, outside: (folder / RECORD_FILE).write_text(text)


def _fifo(folder: Path, outside: Path) -> None:
    (folder / RECORD_FILE).unlink()
    os.mkfifo(folder / RECORD_FILE)


def _link(relative: str, target: str) -> Spoil:
    def spoil(folder: Path, outside: Path) -> None:
        (folder / relative).unlink(missing_ok=True)
        (folder / relative).symlink_to(outside / target)
    return spoil


def _artifacts_elsewhere(folder: Path, outside: Path) -> None:
    _set(artifact_dir=str(outside / "elsewhere"))(folder, outside)


def _link_record_file(folder: Path, outside: Path) -> None:
    moved = folder.parent / "record-elsewhere.json"
    (folder / RECORD_FILE).rename(moved)
    (folder / RECORD_FILE).symlink_to(moved)


def _external_data_outside(folder: Path, outside: Path) -> None:
    model = onnx.load(str(folder / "model" / "model.onnx"))
    tensor = model.graph.initializer[0]
    tensor.ClearField("raw_data")
    tensor.data_location = onnx.TensorProto.EXTERNAL
    for key, value in (("location", "../../../secret.txt"), ("offset", "0"), ("length", "16")):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    onnx.save(model, str(folder / "model" / "model.onnx"))


# How a record is made to name a file outside its folder, and the path the refusal must name.
UNSAFE = {
    "absolute file": (_set(files={"/etc/passwd": "profile"}), "/etc/passwd"),
    "file above the folder": (_set(files={"../../../../etc/hostname": "profile"}), "../../../../etc/hostname"),
    "absolute artifact folder": (_artifacts_elsewhere, "elsewhere"),
    "absolute model path": (_set(model_path="/etc/passwd"), "/etc/passwd"),
    "linked file in the artifacts": (_link("artifacts/leak.txt", "secret.txt"), "artifacts/leak.txt"),
    "linked folder in the artifacts": (_link("artifacts/more", "elsewhere"), "artifacts/more"),
    "linked file named in files": (_link("files/0/profile.json", "secret.txt"), "files/0/profile.json"),
    "linked record file": (_link_record_file, "record-elsewhere.json"),
    "table name above the folder": (_set(tables=["../../../../secret"]), "../../../../secret"),
    "model data outside the folder": (_external_data_outside, "../../../secret.txt"),
}


@pytest.mark.slow
@pytest.mark.parametrize("spoil, offending", UNSAFE.values(), ids=UNSAFE.keys())
def test_a_record_naming_a_file_outside_its_folder_is_refused_before_any_run_and_the_others_upload(
    store, outbox, tmp_path, spoil, offending, capsys
):
    bad = outbox / "kept-no-parent" / "bad"
    spoil(bad, tmp_path)

    assert main(["upload", str(outbox)]) == 2
    err = capsys.readouterr().err
    runs = MlflowClient(store).search_runs(["0"], run_view_type=ViewType.ALL)
    assert [r.info.run_name for r in runs] == ["good"], "the refused record created no run, not even a FAILED one"
    assert [p.name for p in find_records(outbox)] == ["bad"], "the refused record stays in the outbox"
    (line,) = [line for line in err.splitlines() if line.startswith("error:")]
    assert line.startswith(f"error: record {bad / RECORD_FILE}: ")
    assert offending in line
    assert line.endswith(f"not uploaded: it stays in {bad}")
    assert "not for the tracking server" not in err
    assert "Traceback" not in err


# A record.json that is not a record, and what the one-line error must name.
MALFORMED = {
    "not JSON": (_write("{'attempt': 'bad',"), ["not valid JSON"]),
    "not an object": (_write("[1, 2]"), ["Expected `object`, got `array`"]),
    "unknown keys": (_set(colour="blue"), ["Object contains unknown field `colour` - at `$` (known fields: "]),
    "missing keys": (_drop("attempt", "runtime"), ["Object missing required field `attempt`"]),
    "wrong types": (_set(metrics={"latency.p50_ms": "fast"}), ["Expected `float`, got `str` - at `$.metrics[...]`"]),
    "unknown status": (_set(status="DONE"), ["Invalid enum value 'DONE' - at `$.status`"]),
    # third probe: a RecursionError traceback stopped every upload; a FIFO hung it, holding its lock
    "nested too deep": (_write("[" * 200_000 + "]" * 200_000), ["nested too deeply for Python's JSON reader"]),
    "a FIFO": (_fifo, ["cannot be read", "must be a regular file (a record), got prw"]),
}


@pytest.mark.slow
@pytest.mark.parametrize("spoil, expected", MALFORMED.values(), ids=MALFORMED.keys())
def test_a_malformed_record_gets_a_one_line_error_naming_it_and_the_others_upload(
    store, outbox, tmp_path, spoil, expected, capsys
):
    bad = outbox / "kept-no-parent" / "bad"
    spoil(bad, tmp_path)

    assert main(["upload", str(outbox)]) == 2
    err = capsys.readouterr().err
    (line,) = [line for line in err.splitlines() if line.startswith("error:")]
    assert line.startswith(f"error: record {bad / RECORD_FILE}: ")
    for part in expected:
        assert part in line
    assert "Traceback" not in err
    runs = MlflowClient(store).search_runs(["0"], run_view_type=ViewType.ALL)
    assert [r.info.run_name for r in runs] == ["good"]
    assert [p.name for p in find_records(outbox)] == ["bad"]


@pytest.mark.parametrize("make, code, expected", [
    pytest.param(False, 2, "error: outbox folder {folder} does not exist", id="missing folder"),
    pytest.param(True, 0, "nothing to upload under {folder}", id="empty folder"),
])
def test_upload_of_a_missing_folder_is_an_error_and_of_an_empty_one_is_not(store, tmp_path, make, code, expected,
                                                                           capsys):
    folder = tmp_path / "typo-folder"
    if make:
        folder.mkdir()

    assert main(["upload", str(folder)]) == code
    out = capsys.readouterr()
    assert expected.format(folder=folder) in out.out + out.err
    assert not (tmp_path / "mlflow.db").exists(), "nothing was sent, the store was not even opened"


def _dead_server_uri() -> str:
    with socket.socket() as s:  # a port nothing listens on once the socket is closed
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


@pytest.mark.slow
def test_a_study_cut_off_by_an_outage_gets_its_summary_and_report_and_keeps_its_order_after_upload(
    store, tmp_path, monkeypatch, model, feeds, capsys
):
    monkeypatch.setenv("TRACKER_OUTBOX", str(tmp_path / "outbox"))
    with Study("order", feeds=feeds, experiment="order", config=FAST, log_models=False) as study:
        study.attempt("baseline", model)
        monkeypatch.setenv("MLFLOW_TRACKING_URI", _dead_server_uri())  # the tracking server goes away
        # Named against the alphabet: an upload in folder order must not reorder them.
        study.attempt("zz_second", model, session=SessionConfig(graph_optimization_level="disable"))
        study.attempt("aa_third", model, session=SessionConfig(graph_optimization_level="basic"))
    parent_id = study.run.info.run_id
    assert len(find_records(tmp_path / "outbox")) == 2 and find_summaries(tmp_path / "outbox")

    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)  # it is back
    assert main(["upload", str(tmp_path / "outbox")]) == 0
    client = MlflowClient(store)
    parent = client.get_run(parent_id)
    assert parent.info.status == "FINISHED"
    assert parent.data.tags["tracker.best_attempt"] == study.best.attempt.name, "the rule Study itself applies"
    assert parent.data.metrics["study.attempts"] == 3 and parent.data.metrics["study.failed"] == 0
    assert "time.wall_s" in parent.data.metrics, "the step times only the study's process knew are kept"
    report = {a.path for a in client.list_artifacts(parent_id, "report")}
    assert {"report/study_report.html", "report/attempts.json", "report/ops_by_attempt.json"} <= report
    assert not client.list_artifacts(parent_id, "study"), "one attempts table: the report's"
    assert not find_records(tmp_path / "outbox") and not find_summaries(tmp_path / "outbox")

    capsys.readouterr()
    assert main(["compare", "--study-run", parent_id]) == 0
    rows = capsys.readouterr().out.splitlines()[2:5]  # after the title and the column names
    assert [row.lstrip("* ").split()[0] for row in rows] == ["baseline", "zz_second", "aa_third"]


def _foreign_run(uri: str) -> str:
    """A run of the user's own, in the default experiment: nothing an upload made."""
    run = MlflowClient(uri).create_run("0", run_name="the users own", tags={"owner": "someone else"})
    return run.info.run_id


@pytest.mark.parametrize("done", [False, True], ids=["note says not done", "note says done"])
def test_an_upload_note_naming_a_run_of_another_leaves_that_run_alone_and_uploads_the_record(
        store, outbox, done, caplog):
    foreign = _foreign_run(store)
    bad = outbox / "kept-no-parent" / "bad"
    (bad / ".upload.json").write_text(json.dumps({"run_id": foreign, "done": done}))

    assert main(["upload", str(outbox)]) == 0
    client = MlflowClient(store)
    run = client.get_run(foreign)
    assert run.info.lifecycle_stage == "active" and run.info.status == "RUNNING"  # not deleted, not ended
    assert "tracker.superseded_by" not in run.data.tags
    names = sorted(r.info.run_name for r in client.search_runs(["0"]))
    assert names == ["bad", "good", "the users own"], "the record got a run of its own"
    assert find_records(outbox) == []
    assert f"names run {foreign}, which was not made from this record" in caplog.text


def test_a_record_naming_another_run_as_its_first_does_not_fail_or_supersede_it(store, tmp_path, caplog):
    foreign = _foreign_run(store)
    work = tmp_path / "work"
    work.mkdir()
    record = AttemptRecord("lone", None, "onnxruntime", metrics={"latency.p50_ms": 1.0}, artifact_dir=None,
                           files={}, model_path=None, model_flavor=False, run_id=foreign)
    save_record(record, tmp_path / "outbox")

    assert main(["upload", str(tmp_path / "outbox")]) == 0
    run = MlflowClient(store).get_run(foreign)
    assert run.info.status == "RUNNING" and "tracker.superseded_by" not in run.data.tags
    assert f"names run {foreign} as its first run, but that run is another's" in caplog.text
