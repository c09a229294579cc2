"""Every attempt's logged model carries its figures: the latency, the calibrated speed-up and its
interval, the accuracy check, size and nodes are linked to the model (MLflow 3's `model_id`), so the experiment's
Models tab compares them; the verdict is a tag of the model, and the study's best model is marked. Read back from a
real sqlite store."""

from __future__ import annotations

import numpy as np
import pytest
from mlflow import MlflowClient

from tests.conftest import FAST_SPEEDUP, isolate_mlflow, new_sqlite_store
from tests.models import make_linear_model
from tracker import MeasureConfig, Study, TimingConfig
from tracker.store.model_and_feeds import model_figures

FAST = MeasureConfig(profile_runs=3, speedup=FAST_SPEEDUP, timing=TimingConfig(warmup_runs=1, min_runs=3,
                                                                                   min_seconds=0.0))
FEEDS = {"X": np.random.default_rng(0).standard_normal((2, 8)).astype(np.float32)}


@pytest.fixture(scope="module")
def logged(tmp_path_factory):
    """A study of a baseline and a session entry with their models logged: (client, experiment id, study,
    its attempt runs by name)."""
    _, uri, experiment_id = new_sqlite_store(tmp_path_factory, "figures")
    with pytest.MonkeyPatch.context() as mp:
        isolate_mlflow(mp)
        with Study("lin", feeds=FEEDS, experiment="figures", config=FAST, tracking_uri=uri) as study:
            study.attempt("baseline", make_linear_model(n_features=8))
            study.optimize("ort_threads_1", make_linear_model(n_features=8))
    client = MlflowClient(uri)
    runs = client.search_runs([experiment_id], filter_string=f"tags.mlflow.parentRunId = '{study.run.info.run_id}'")
    return client, experiment_id, study, {r.data.tags["tracker.attempt"]: r for r in runs}


def _model(client, experiment_id, run):
    (model,) = client.search_logged_models([experiment_id], filter_string=f"source_run_id = '{run.info.run_id}'")
    return model


@pytest.mark.slow
def test_each_attempts_model_holds_its_figures_and_verdict(logged):
    client, experiment_id, _, runs = logged
    for name, run in runs.items():
        model = _model(client, experiment_id, run)
        figures = {m.key: m.value for m in model.metrics}
        assert {"latency.p50_ms", "model.size_bytes", "graph.node_count"} <= set(figures), name
        assert figures["latency.p50_ms"] == run.data.metrics["latency.p50_ms"], "the run's own figure, linked"
        assert all(m.model_id == model.model_id for m in model.metrics)
        assert run.data.tags["tracker.model_id"] == model.model_id
        assert model.tags["tracker.verdict"] == run.data.tags["tracker.verdict"]
        assert model.params == run.data.params, "the run's params, as MLflow's log_model copies them"
        assert model.experiment_id == experiment_id and model.status == "READY"
    entry = {m.key: m.value for m in _model(client, experiment_id, runs["ort_threads_1"]).metrics}
    assert entry["latency.speedup_ci_low"] <= entry["latency.speedup"] <= entry["latency.speedup_ci_high"]
    assert entry["diff.passed"] == 1.0


@pytest.mark.slow
def test_a_figure_is_logged_once_on_the_run_not_again_for_the_model(logged):
    client, _, _, runs = logged
    history = client.get_metric_history(runs["ort_threads_1"].info.run_id, "latency.p50_ms")
    assert len(history) == 1


@pytest.mark.slow
def test_the_studys_best_model_and_only_it_is_marked(logged):
    client, experiment_id, study, runs = logged
    best = study.best.attempt.name
    marked = {name for name, run in runs.items()
              if _model(client, experiment_id, run).tags.get("tracker.best") == "true"}
    assert marked == {best}


def test_the_figures_are_the_comparing_ones_and_each_phases_speedup():
    metrics = {"latency.p50_ms": 1.0, "latency.speedup": 2.0, "latency.speedup_ci_low": 1.9,
               "latency.speedup_pairs": 40.0,
               "gen.decode.past512.speedup": 3.0, "gen.decode.past512.speedup_ci_high": 3.1,
               "gen.prefill.s128.speedup": 1.2, "gen.decode.past512.p50_ms": 9.0, "ops.MatMul.share": 0.5}
    assert set(model_figures(metrics)) == {"latency.p50_ms", "latency.speedup", "latency.speedup_ci_low",
                                           "gen.decode.past512.speedup", "gen.decode.past512.speedup_ci_high",
                                           "gen.prefill.s128.speedup"}
