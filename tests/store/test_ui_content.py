"""What a user expects to find in the MLflow UI, read back from a real sqlite store: the study's last log line
links to its run in the runs view, logged models are named after the study and attempt, the feeds are each
run's dataset input, and every attempt run has its session's creation time, first run and memory."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

import numpy as np
import pytest
from mlflow import MlflowClient

from tests.conftest import FAST_SPEEDUP, isolate_mlflow, new_sqlite_store
from tests.models import make_linear_model
from tracker import FP32, MeasureConfig, Study, TimingConfig, log_attempt, upload
from tracker.base.errors import RecordError
from tracker.measure.inputs.feeds_description import describe_feeds
from tracker.run.loading import load_record
from tracker.run.record import RECORD_FILE, AttemptRecord, save_record
from tracker.store import connect, write

FAST = MeasureConfig(profile_runs=3, speedup=FAST_SPEEDUP,
                     timing=TimingConfig(warmup_runs=1, min_runs=3, min_seconds=0.0), trace_levels=(1,))
STUDY = "lin.v1"  # a dot: MLflow refuses it in a logged model's name
FEEDS = {"X": np.random.default_rng(0).standard_normal((2, 8)).astype(np.float32)}
SESSION_METRICS = ("session.create_ms", "latency.first_run_ms", "memory.session_mb")


@dataclass(frozen=True)
class Logged:
    uri: str
    experiment_id: str
    study_run_id: str
    run_ids: dict[str, str]
    results: dict[str, object]
    log_lines: list[str]


@pytest.fixture(scope="module")
def logged(tmp_path_factory) -> Logged:
    """A study of two attempts, one per runtime, with its models logged; and what it logged."""
    folder, uri, experiment_id = new_sqlite_store(tmp_path_factory, "ui")
    lines: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())
    tracker_logger = logging.getLogger("tracker")
    level = tracker_logger.level
    tracker_logger.addHandler(handler)
    tracker_logger.setLevel(logging.INFO)
    try:
        with pytest.MonkeyPatch.context() as mp:
            isolate_mlflow(mp)
            with Study(STUDY, feeds=FEEDS, experiment="ui", config=FAST, tracking_uri=uri) as study:
                study.attempt("baseline", make_linear_model(n_features=8))
                study.attempt("reference.eval", make_linear_model(n_features=8), runtime="reference", tolerance=FP32)
    finally:
        tracker_logger.removeHandler(handler)
        tracker_logger.setLevel(level)
    assert all(r.ok for r in study.results), [r.error for r in study.results]
    return Logged(uri, experiment_id, study.run.info.run_id, {r.attempt.name: r.run_id for r in study.results},
                  {r.attempt.name: r for r in study.results}, lines)


@pytest.mark.slow
def test_the_studys_last_log_line_links_to_its_run_in_the_runs_view(logged):
    link = (f"http://127.0.0.1:5000/#/experiments/{logged.experiment_id}/runs/{logged.study_run_id}"
            "?workflowType=machine_learning")
    assert logged.log_lines[-1] == (f"study {STUDY}: view it at {link} after "
                                    f"`mlflow ui --backend-store-uri {logged.uri}`")


@pytest.mark.slow
def test_the_link_to_a_run_on_a_server_carries_no_credentials(logged, monkeypatch):
    isolate_mlflow(monkeypatch)
    run = MlflowClient(logged.uri).get_run(logged.study_run_id)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://alice:s3cret@tracking.example:5000/")  # nothing is contacted
    assert write.run_link(run) == (f"http://tracking.example:5000/#/experiments/{logged.experiment_id}/runs/"
                                   f"{logged.study_run_id}?workflowType=machine_learning")


@pytest.mark.slow
@pytest.mark.parametrize("attempt", ["baseline", "reference.eval"])
def test_every_attempt_run_has_its_sessions_creation_time_first_run_and_memory(logged, attempt):
    metrics = MlflowClient(logged.uri).get_run(logged.run_ids[attempt]).data.metrics
    result = logged.results[attempt]
    assert [metrics[k] for k in SESSION_METRICS] == pytest.approx(
        [result.session_create_ms, result.first_run_ms, result.session_bytes / 2**20])
    assert metrics["session.create_ms"] > 0 and metrics["latency.first_run_ms"] > 0
    assert abs(metrics["memory.session_mb"]) < 3  # 8x8 weights: next to nothing


@pytest.mark.slow
@pytest.mark.parametrize(("attempt", "name"), [("baseline", "lin_v1-baseline"),
                                                ("reference.eval", "lin_v1-reference_eval")])
def test_the_logged_model_is_named_after_the_study_and_the_attempt(logged, attempt, name):
    client = MlflowClient(logged.uri)
    (model,) = client.search_logged_models([logged.experiment_id],
                                           filter_string=f"source_run_id = '{logged.run_ids[attempt]}'")
    assert model.name == name
    assert (model.tags["tracker.study"], model.tags["tracker.attempt"]) == (STUDY, attempt)  # the exact names


@pytest.mark.slow
@pytest.mark.parametrize("attempt", ["baseline", "reference.eval"])
def test_the_feeds_are_the_runs_dataset_input_by_name_dtype_and_shape(logged, attempt):
    (logged_input,) = MlflowClient(logged.uri).get_run(logged.run_ids[attempt]).inputs.dataset_inputs
    dataset = logged_input.dataset
    assert (dataset.name, dataset.digest) == (f"{STUDY}.feeds", describe_feeds(FEEDS).digest)
    assert {t.key: t.value for t in logged_input.tags} == {"mlflow.data.context": "inference"}
    (spec,) = json.loads(dataset.schema)["mlflow_colspec"]
    assert (spec["name"], spec["tensor-spec"]) == ("X", {"dtype": "float32", "shape": [2, 8]})
    assert json.loads(dataset.profile) == {"X": "float32 [2, 8]", "total inputs": 1, "total nbytes": 64}
    assert json.loads(dataset.source) == {"tags": {"tracker.study": STUDY}}


def test_the_digest_follows_the_values_not_only_the_shapes():
    changed = {"X": FEEDS["X"] + 1}
    assert describe_feeds(changed).digest != describe_feeds(FEEDS).digest
    assert describe_feeds({"X": FEEDS["X"].copy()}).digest == describe_feeds(FEEDS).digest
    assert describe_feeds({"X": FEEDS["X"].reshape(4, 4)}).digest != describe_feeds(FEEDS).digest


@pytest.mark.slow
def test_an_attempt_outside_a_study_names_its_model_and_dataset_after_itself(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    result = log_attempt(make_linear_model(n_features=8), FEEDS, name="solo", experiment="lone", config=FAST,
                         tracking_uri=uri)
    client = MlflowClient(uri)
    run = client.get_run(result.run_id)
    (model,) = client.search_logged_models([run.info.experiment_id])
    assert model.name == "solo" and "tracker.study" not in model.tags
    assert [d.dataset.name for d in run.inputs.dataset_inputs] == ["solo.feeds"]


@pytest.mark.slow
def test_a_record_kept_in_the_outbox_is_uploaded_with_its_feeds_as_the_dataset_input(tmp_path, monkeypatch):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    feeds = {"input_ids": np.zeros((1, 32), dtype=np.int64), "mask": np.ones((1, 32), dtype=np.int64)}
    record = AttemptRecord("kept", "offline", "onnxruntime", metrics={"latency.p50_ms": 1.0},
                           feeds=describe_feeds(feeds))
    folder = save_record(record, tmp_path / "outbox")
    assert load_record(folder).feeds == record.feeds
    connect.setup_tracking(uri)
    (run_id,) = upload.upload_outbox(tmp_path / "outbox").run_ids
    (logged_input,) = MlflowClient(uri).get_run(run_id).inputs.dataset_inputs
    assert (logged_input.dataset.name, logged_input.dataset.digest) == ("offline.feeds", record.feeds.digest)
    assert json.loads(logged_input.dataset.profile)["input_ids"] == "int64 [1, 32]"


@pytest.mark.parametrize(
    "feeds",
    [{"digest": 5, "inputs": []}, {"digest": "ab", "inputs": [{"name": "X", "dtype": "float32", "shape": "2x8",
                                                               "nbytes": 64}]}, "X float32"],
    ids=["digest-not-text", "shape-not-a-list", "not-an-object"],
)
def test_a_record_whose_feeds_are_malformed_is_refused_before_any_upload(tmp_path, feeds):
    folder = save_record(AttemptRecord("kept", "offline", "onnxruntime", feeds=describe_feeds(FEEDS)),
                         tmp_path / "outbox")
    data = json.loads((folder / RECORD_FILE).read_text())
    data["feeds"] = feeds
    (folder / RECORD_FILE).write_text(json.dumps(data))
    with pytest.raises(RecordError, match=r"Expected `(str|array|object \| null)`, got `\w+` - at `\$\.feeds"):
        load_record(folder)
