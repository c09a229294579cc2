"""`Study(register=NAME)` against a real sqlite registry: the first study's best becomes the champion, a slower one
only the candidate (a tag says why), a faster passing one the new champion, a faster one computing other outputs
stays candidate; and the name, and a store without a registry, are refused before any work."""

from __future__ import annotations

import mlflow
import numpy as np
import pytest

from tests.commands import assert_one_line_error, run_cli, run_names
from tests.conftest import FAST_SPEEDUP
from tests.models import make_linear_model, with_matmul_chain
from tracker import MeasureConfig, Study, TimingConfig
from tracker.base.keys import ALIAS_CANDIDATE, ALIAS_CHAMPION, TAG_CHAMPION_KEPT, TAG_REGISTERED

FAST = MeasureConfig(profile_runs=3, speedup=FAST_SPEEDUP,
                     timing=TimingConfig(warmup_runs=1, min_runs=3, min_seconds=0.0))
N_FEATURES = 64
FEEDS = {"X": np.random.default_rng(0).standard_normal((64, N_FEATURES)).astype(np.float32)}


def registered_by(name: str, model, client: mlflow.MlflowClient):
    """A study of `model` (its baseline only) registering its best as `name`; the study run's tags."""
    with Study(name, feeds=FEEDS, experiment="register", config=FAST, register="m") as study:
        study.attempt("baseline", model)
    assert study.registered is not None
    return study.registered, client.get_run(study.run.info.run_id).data.tags


def alias(client: mlflow.MlflowClient, which: str) -> str:
    return str(client.get_model_version_by_alias("m", which).version)


@pytest.mark.timing
@pytest.mark.slow
def test_the_champion_moves_only_to_a_faster_version_that_passes_against_its_outputs(store):
    base = make_linear_model(n_features=N_FEATURES)

    first, _ = registered_by("medium", with_matmul_chain(base, length=8), store)
    assert (first.version, first.champion) == ("1", "1")

    slower, tags = registered_by("slower", with_matmul_chain(base, length=32), store)
    assert (alias(store, ALIAS_CHAMPION), alias(store, ALIAS_CANDIDATE)) == ("1", "2")
    kept = store.get_model_version("m", "2").tags[TAG_CHAMPION_KEPT]
    assert kept.startswith("verdict worse") and "against version 1: slower than the champion" in kept
    assert tags[TAG_REGISTERED] == slower.line() and "@champion stays on version 1" in slower.line()

    faster, _ = registered_by("faster", base, store)
    assert faster.is_champion and faster.why.startswith("verdict better")
    assert (alias(store, ALIAS_CHAMPION), alias(store, ALIAS_CANDIDATE)) == ("3", "3")

    other, _ = registered_by("other_weights", make_linear_model(n_features=N_FEATURES, seed=1), store)
    assert (alias(store, ALIAS_CHAMPION), alias(store, ALIAS_CANDIDATE)) == ("3", "4")
    assert "the accuracy check against its outputs failed" in other.why
    version = store.get_model_version("m", "4")
    assert version.tags["tracker.attempt"] == "baseline" and version.tags["tracker.study_run"]


@pytest.mark.parametrize("name", ["a/b", "m@champion", "", " m"])
def test_a_name_mlflow_or_an_alias_uri_would_refuse_is_refused_before_any_run(name, store_uri, linear_file, capsys):
    code, _, err = run_cli(capsys, "optimize", str(linear_file), "--register", name or " ")

    assert_one_line_error(code, err, "registered model name")
    assert run_names(store_uri) == []


def test_a_file_store_has_no_registry_one_line_before_any_run(tmp_path, monkeypatch, linear_file, capsys):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", (tmp_path / "mlruns").as_uri())
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 refuses a file store unless told otherwise

    code, _, err = run_cli(capsys, "optimize", str(linear_file), "--register", "m")

    assert_one_line_error(code, err, "is a file store, which has no model registry")
    assert not list((tmp_path / "mlruns").glob("*/*/meta.yaml"))  # no run made
