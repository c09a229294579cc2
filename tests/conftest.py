"""Fixtures every test gets: MLflow's process-wide state is put back after each test."""

from __future__ import annotations

import os
import shutil
import sqlite3
import tempfile
from pathlib import Path

import mlflow
import numpy as np
import onnx
import pytest
from mlflow import MlflowClient

from tests.models import make_linear_model
from tracker.measure.timing.speedup import SpeedupConfig

# The least interleaved timing that still gives an interval, for tests that do not check the speed-up.
FAST_SPEEDUP = SpeedupConfig(rounds=4, seconds=0.0, round_seconds=0.0, min_pairs=3, warmup_runs=1, block_ms=0.0)

_MLFLOW_ENV = ("MLFLOW_RUN_ID", "MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_ID", "MLFLOW_EXPERIMENT_NAME",
               # set by tracker.store.connect.setup_tracking for a server URI (bounded retries, no URL printing)
               "MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "MLFLOW_HTTP_REQUEST_TIMEOUT",
               "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT")


TESTS = Path(__file__).resolve().parent
# Folders whose every test is one kind: their markers come from the folder, not from each file. Each of them
# starts a real `mlflow server` process (20-30 s on 2 cores), so they are `subprocess` and `slow` too.
FOLDER_MARKERS = {"server": ("server", "subprocess", "slow"), "browser": ("browser", "subprocess", "slow")}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Marks the tests of a one-kind folder (FOLDER_MARKERS), and retries `timing` tests.

    A `timing` test checks a measurement statistically on a shared machine: a burst of noise from
    outside the test can move one try, so a failure is tried twice more (pytest-rerunfailures). A broken
    measurement fails every try."""
    for item in items:
        folder = item.path.relative_to(TESTS).parts[0] if item.path.is_relative_to(TESTS) else ""
        for name in FOLDER_MARKERS.get(folder, ()):
            item.add_marker(name)
        if item.get_closest_marker("timing") and not item.get_closest_marker("flaky"):
            item.add_marker(pytest.mark.flaky(reruns=2))


def isolate_mlflow(mp: pytest.MonkeyPatch) -> None:
    """Undoes, when `mp` does, the MLflow variables a test or the tracker sets (the tracker points MLflow at a store
    through MLFLOW_TRACKING_URI): a later test's runs would land in the previous test's store.

    Tests choose their store and experiment through these variables or by id, never with `mlflow.set_tracking_uri`
    or `mlflow.set_experiment`, whose process globals nothing public undoes (`tests/test_types.py` checks).
    """
    for name in _MLFLOW_ENV:
        mp.setenv(name, "")  # recorded first, so the variable is removed again at the end
        mp.delenv(name)


def child_env(tracking_uri: str | None, **extra: str) -> dict[str, str]:
    """The environment of a child process that logs to `tracking_uri` on its own, in no run of this process; with None,
    to the default store (./mlflow.db of its working folder) and outbox."""
    env = {**os.environ, **extra}
    for name in ("MLFLOW_RUN_ID", "MLFLOW_EXPERIMENT_ID"):
        env.pop(name, None)
    if tracking_uri is None:
        for name in ("MLFLOW_TRACKING_URI", "TRACKER_OUTBOX"):
            env.pop(name, None)
    else:
        env["MLFLOW_TRACKING_URI"] = tracking_uri
    return env


def seed_sqlite_store(db: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    """Makes `db` a new MLflow sqlite database, as a copy of one made once per session; its tracking URI.

    MLflow's migrations take seconds for each new database; a copy takes milliseconds. The copy holds every
    table and no experiment: MLflow adds its Default experiment when it first opens the copy, with the
    artifact root of that process's working directory, as it does in a new database.
    """
    blank = tmp_path_factory.getbasetemp() / "blank-sqlite-store" / "mlflow.db"
    if not blank.exists():
        blank.parent.mkdir(exist_ok=True)
        MlflowClient(tracking_uri=f"sqlite:///{blank}").search_experiments()
        db_connection = sqlite3.connect(blank)
        with db_connection:
            db_connection.execute("DELETE FROM experiments WHERE experiment_id = 0")
        db_connection.close()
    shutil.copyfile(blank, db)
    return f"sqlite:///{db}"


def use_sqlite_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> str:
    """Makes a new sqlite store in `tmp_path` this test's only one (the variable, and MLflow's own URI and experiment,
    which win over it), its outbox `tmp_path/outbox`, and `tmp_path` the working folder; its tracking URI."""
    uri = seed_sqlite_store(tmp_path / "mlflow.db", tmp_path_factory)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("TRACKER_OUTBOX", str(tmp_path / "outbox"))
    monkeypatch.delenv("MLFLOW_EXPERIMENT_ID", raising=False)
    monkeypatch.chdir(tmp_path)  # the Default experiment's artifacts (./mlruns) land here
    return uri


def new_sqlite_store(tmp_path_factory: pytest.TempPathFactory, experiment: str) -> tuple[Path, str, str]:
    """A new sqlite tracking store holding one experiment: (its folder, tracking URI, experiment id).

    The experiment's artifacts go to `<folder>/artifacts`: the default (./mlruns) would land in the working
    directory, which a module-scoped fixture shares with the test that first asked for it.
    """
    folder = tmp_path_factory.mktemp(f"{experiment}-store")
    uri = seed_sqlite_store(folder / "mlflow.db", tmp_path_factory)
    experiment_id = mlflow.MlflowClient(uri).create_experiment(experiment, artifact_location=str(folder / "artifacts"))
    return folder, uri, experiment_id


@pytest.fixture(autouse=True)
def _isolated_mlflow(monkeypatch, tmp_path):
    isolate_mlflow(monkeypatch)
    # A sqlite store's default artifact root is ./mlruns of the working directory: keep it in tmp_path.
    monkeypatch.chdir(tmp_path)
    yield
    while mlflow.active_run():
        mlflow.end_run()


@pytest.fixture
def model():
    """A small real model: Y = Add(MatMul(X, Add(A, EyeLike(A))), B) with 8 features."""
    return make_linear_model(n_features=8)


@pytest.fixture
def linear_file(tmp_path) -> Path:
    """The same model (8 features) saved as tmp_path/linear.onnx, for a command to read."""
    path = tmp_path / "linear.onnx"
    onnx.save_model(make_linear_model(n_features=8), str(path))
    return path


@pytest.fixture
def feeds():
    return {"X": np.random.default_rng(0).standard_normal((2, 8)).astype(np.float32)}


@pytest.fixture
def store(tmp_path, monkeypatch, tmp_path_factory):
    """A sqlite tracking store of its own, made the active one; a client of it. (Some modules define their own.)"""
    uri = seed_sqlite_store(tmp_path / "mlflow.db", tmp_path_factory)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_ID", raising=False)
    yield MlflowClient(tracking_uri=uri)
    while mlflow.active_run():
        mlflow.end_run()


@pytest.fixture
def store_uri(tmp_path, monkeypatch) -> str:
    """The URI of a sqlite store in tmp_path that the commands a test runs use; the first one that opens it makes it
    (a test of a refusal checks it was never made, or holds no run: `tests.commands.run_names`)."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    return uri


@pytest.fixture
def temp_root(tmp_path, monkeypatch) -> Path:
    """The folder tempfile makes work folders in, watched for leftovers."""
    root = tmp_path / "tmp"
    root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    return root


@pytest.fixture(scope="session")
def tiny_gpt2_export(tmp_path_factory):
    """`exporter -> ExportResult`: the tiny GPT-2 (seed 0) exported once per exporter for the whole session.

    Several modules read the same export (a GPT-2 export takes seconds); none may write to its folder.
    """
    exports = {}

    def get(exporter: str = "dynamo"):
        if exporter not in exports:
            from tracker.gpt2.export import export_gpt2
            from tracker.gpt2.model import load_gpt2

            path = tmp_path_factory.mktemp(f"tiny-gpt2-{exporter}") / "model.onnx"
            exports[exporter] = export_gpt2(load_gpt2(size="tiny", seed=0), path, exporter=exporter)
        return exports[exporter]

    return get


@pytest.fixture(scope="session")
def tiny_gpt2_decoder(tmp_path_factory):
    """The tiny GPT-2 (seed 0) exported once for decoding (past key/values in and out), for the whole session."""
    from tracker.gpt2.decode import export_decoder
    from tracker.gpt2.model import load_gpt2

    return export_decoder(load_gpt2(size="tiny", seed=0), tmp_path_factory.mktemp("tiny-gpt2-decoder") / "decoder.onnx")


@pytest.fixture(scope="session")
def tiny_bert_export(tmp_path_factory) -> Path:
    """The tiny seeded BERT encoder of tests/optimize (`make_tiny_bert()`), dynamo export, once for the session."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from tests.optimize.conftest import export_bert, make_tiny_bert

    return export_bert(make_tiny_bert(), tmp_path_factory.mktemp("tiny-bert-dynamo") / "model.onnx")
