"""The GPT-2 study on a tiny config: `mlflow run -e gpt2` end to end, and a corrupted model rejected."""

from __future__ import annotations

import mlflow
import numpy as np
import onnx
import pytest
from mlflow import MlflowClient

from tests.studies.test_studies import artifact_paths, mlflow_run
from tracker import MeasureConfig, Study, TimingConfig
from tracker.measure.lm_diff import LOGITS_FP32
from tracker.studies.gpt2 import DEFAULT_ATTEMPTS
from tests.conftest import FAST_SPEEDUP

pytest.importorskip("torch")
pytest.importorskip("transformers")

TINY = ["-P", "size=tiny", "-P", "seq_lens=8,16", "-P", "headline_seq=8"]


def test_the_gpt2_study_logs_the_baseline_and_every_attempt_with_its_evidence(tmp_path):
    client = mlflow_run(tmp_path, "gpt2", *TINY)
    experiment = client.get_experiment_by_name("studies")
    runs = {r.info.run_name: r for r in client.search_runs([experiment.experiment_id])}
    assert set(runs) == {"gpt2", "baseline", *DEFAULT_ATTEMPTS}
    parent = runs["gpt2"]
    assert parent.data.tags["tracker.weights"] == "random (seeded), not pretrained"
    assert parent.data.tags["tracker.best_attempt"] in runs
    assert parent.data.params["export.exporter"] == "dynamo"
    baseline = runs["baseline"].data
    assert baseline.metrics["export.torch_passed"] == 1.0
    assert baseline.metrics["export.torch_max_abs"] < 1e-4
    for name in ("baseline", *DEFAULT_ATTEMPTS):
        run = runs[name]
        assert run.info.status == "FINISHED", run.data.tags.get("tracker.error")
        assert run.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert run.data.tags["tracker.weights"] == "random (seeded), not pretrained"
        metrics = run.data.metrics
        for key in ("latency.s8.p50_ms", "latency.s16.p50_ms", "latency.p50_ms", "latency.speedup",
                    "latency.speedup_ci_low", "latency.speedup_ci_high", "diff.max_abs", "diff.top1_agreement",
                    "diff.kl_divergence", "diff.passed", "graph.node_count", "graph.reshape_removed",
                    "model.size_bytes"):
            assert key in metrics, f"{name} lacks {key}"
        assert run.data.tags["tracker.verdict"] in ("baseline", "better", "worse", "same", "inconclusive", "rejected")
    basic = runs["ort_opt_basic"].data
    assert basic.metrics["fusion.SkipLayerNormalization"] == 4  # 2 layers x 2
    assert basic.metrics["fusion.FastGelu"] == 2
    assert basic.metrics["graph.delta.com.microsoft:SkipLayerNormalization.nodes"] == 4
    assert basic.params["diff.tolerance"] == "fp32"
    assert runs["attention_fused"].data.metrics["fusion.MultiHeadAttention"] == 2
    assert runs["ort_opt_fp16"].data.params["diff.tolerance"] == "fp16"
    assert runs["int8_dynamic"].data.params["diff.tolerance"] == "int8"
    paths = artifact_paths(client, runs["attention_fused"].info.run_id)
    assert {"tables/op_diff.csv", "tables/ops_by_layer.csv", "tables/graph_diff.csv", "charts/profile.html",
            "profile/ort_profile.json"} <= paths


@pytest.fixture(scope="module")
def tiny_export(tmp_path_factory):
    from tracker.gpt2.export import export_gpt2
    from tracker.gpt2.model import load_gpt2

    loaded = load_gpt2(size="tiny", seed=0)
    return export_gpt2(loaded, tmp_path_factory.mktemp("gpt2") / "model.onnx", exporter="dynamo")


def test_a_corrupted_model_fails_the_accuracy_check_and_is_rejected(tiny_export, tmp_path, monkeypatch):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setattr(mlflow.tracking.fluent, "_active_experiment_id", None)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_ID", raising=False)  # mlflow.set_experiment exports it
    corrupted = onnx.load(str(tiny_export.path))
    largest = max(corrupted.graph.initializer, key=lambda t: np.prod(t.dims))
    weights = onnx.numpy_helper.to_array(largest)
    largest.CopyFrom(onnx.numpy_helper.from_array(weights * 1.5, largest.name))
    tokens = {"input_ids": np.random.default_rng(0).integers(0, 1000, (1, 8), dtype=np.int64)}
    config = MeasureConfig(profile_runs=3, speedup=FAST_SPEEDUP,
                           timing=TimingConfig(warmup_runs=1, min_runs=3, min_seconds=0))
    with Study("gpt2", feeds=tokens, experiment="corrupt", config=config, log_models=False) as study:
        study.attempt("baseline", tiny_export.path, tolerance=LOGITS_FP32)
        bad = study.attempt("corrupted", corrupted, tolerance=LOGITS_FP32)
    assert bad.ok and not bad.diff.passed
    assert bad.diff.max_abs > LOGITS_FP32.max_abs
    client = MlflowClient(tracking_uri=uri)
    run = client.get_run(bad.run_id)
    assert run.data.metrics["diff.passed"] == 0.0
    assert run.data.tags["tracker.verdict"] == "rejected"
    assert client.get_run(study.run.info.run_id).data.tags["tracker.best_attempt"] == "baseline"
