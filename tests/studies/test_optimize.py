"""`tracker optimize MODEL.onnx` end to end on models users bring: a scikit-learn classifier pipeline, a small
convolutional net from torch, a tiny BERT encoder. Each study goes to a sqlite store and is read back."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from mlflow import MlflowClient

from tests.conftest import child_env

# Every test runs `python -m tracker optimize` in a child process.
pytestmark = pytest.mark.subprocess

ROOT = Path(__file__).resolve().parents[2]
FAST = ["--profile-runs", "3", "--min-runs", "3", "--min-seconds", "0", "--speedup-rounds", "4",
        "--speedup-seconds", "0", "--threads", "1"]


def optimize(tmp_path: Path, model: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = child_env(uri, TRACKER_OUTBOX=str(tmp_path / "outbox"))
    done = subprocess.run([sys.executable, "-m", "tracker", "optimize", str(model), "--experiment", "own", *FAST,
                           *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    if check:
        assert done.returncode == 0, done.stderr[-5000:]
    return done


def runs_of(tmp_path: Path) -> dict[str, object]:
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("own")
    runs = client.search_runs([experiment.experiment_id], max_results=1000)
    return {r.info.run_name: r for r in runs}


@pytest.fixture(scope="module")
def classifier(tmp_path_factory) -> Path:
    """A scikit-learn pipeline (scaler + logistic regression) on iris, converted without zipmap."""
    from skl2onnx import to_onnx
    from sklearn.datasets import load_iris
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    X, y = load_iris(return_X_y=True)
    pipeline = make_pipeline(StandardScaler(), LogisticRegression(max_iter=500)).fit(X, y)
    onx = to_onnx(pipeline, X[:1].astype(np.float32), options={id(pipeline.steps[-1][1]): {"zipmap": False}},
                  target_opset=18)
    folder = tmp_path_factory.mktemp("classifier")
    path = folder / "iris-classifier.onnx"
    onnx.save_model(onx, str(path))
    np.savez(folder / "feeds.npz", **{onx.graph.input[0].name: X[:32].astype(np.float32)})
    return path


@pytest.fixture(scope="module")
def convnet(tmp_path_factory) -> Path:
    """A small seeded convolutional net, exported from torch with the dynamo exporter."""
    torch = pytest.importorskip("torch")

    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(8, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(), torch.nn.Linear(16, 10),
    ).eval()
    path = tmp_path_factory.mktemp("convnet") / "convnet.onnx"
    x = torch.randn(2, 3, 32, 32)
    torch.onnx.export(net, (x,), str(path), input_names=["image"], output_names=["logits"], dynamo=True,
                      dynamic_shapes=({0: torch.export.Dim("batch")},), external_data=False)
    return path


@pytest.mark.slow
def test_a_classifier_pipeline_is_optimized_and_judged_by_its_classes(tmp_path, classifier):
    done = optimize(tmp_path, classifier, "--task", "classification", "--feeds", str(classifier.parent / "feeds.npz"))
    runs = runs_of(tmp_path)
    study = runs["iris-classifier"]
    assert study.data.params["task"] == "classification"
    assert study.data.params["feeds.source"].endswith("feeds.npz")
    attempts = {n: r for n, r in runs.items() if n != "iris-classifier"}
    assert {"baseline", "ort_opt_disabled", "ort_opt_enabled"} <= set(attempts)
    # No transformer, no EyeLike, no MatMul weights: those entries do not apply and make no run.
    assert not {"ort_opt_basic", "attention_fused", "add_eyelike"} & set(attempts)
    for name, run in attempts.items():
        assert run.info.status == "FINISHED", (name, run.data.tags.get("tracker.error"))
        assert run.data.tags["mlflow.parentRunId"] == study.info.run_id
        assert run.data.metrics["diff.top1_agreement"] == 1.0, name
        assert run.data.tags["tracker.verdict"] != "rejected", name
    assert "best:" in done.stdout and "ort_opt_disabled" in done.stdout


@pytest.mark.slow
def test_a_convolutional_net_gets_its_quantized_attempts_and_a_verdict_for_each(tmp_path, convnet):
    # The int8 attempts only (the session entries are the same on any model, and tested on others).
    optimize(tmp_path, convnet, "--task", "classification", "--dim", "batch=4",
             "--attempts", "int8_dynamic,int8_static_minmax,int8_static_percentile")
    runs = runs_of(tmp_path)
    assert runs["baseline"].info.status == "FINISHED"
    quantized = [n for n, r in runs.items() if r.data.params.get("precision") == "int8"]
    assert quantized, f"no int8 attempt ran on the conv net: {sorted(runs)}"
    for name in quantized:
        run = runs[name]
        assert run.info.status == "FINISHED", (name, run.data.tags.get("tracker.error"))
        assert run.data.tags["tracker.verdict"] in ("better", "same", "worse", "inconclusive", "rejected")
        assert 0 <= run.data.metrics["diff.top1_agreement"] <= 1


@pytest.fixture(scope="module")
def tiny_bert(tiny_bert_export, tmp_path_factory) -> Path:
    """The tiny seeded BERT encoder of tests/optimize, exported with the dynamo exporter (dims batch, seq).

    A copy of the session's export (one file, no external data), named as the study is: `tiny-bert`."""
    path = tmp_path_factory.mktemp("bert") / "tiny-bert.onnx"
    shutil.copyfile(tiny_bert_export, path)
    return path


@pytest.mark.slow
def test_a_bert_encoder_is_judged_as_an_embedding_int8_passes_and_attention_fuses_in_every_layer(tmp_path, tiny_bert):
    from tests.optimize.conftest import BERT_HEADS, BERT_HIDDEN, BERT_LAYERS

    # The two attempts the test judges: every entry on this encoder is tests/optimize/test_encoders.py's.
    done = optimize(tmp_path, tiny_bert, "--task", "embedding", "--dim", "batch=2,seq=32",
                    "--attempts", "int8_dynamic,attention_fused")
    runs = runs_of(tmp_path)
    study = runs["tiny-bert"].data.params
    assert (study["model.type"], study["model.num_heads"], study["model.hidden_size"]) == (
        "bert", str(BERT_HEADS), str(BERT_HIDDEN))
    for name, run in runs.items():
        if name != "tiny-bert":
            assert run.info.status == "FINISHED", (name, run.data.tags.get("tracker.error"))
    int8 = runs["int8_dynamic"].data
    assert int8.params["precision"] == "int8" and int8.params["diff.tolerance"] == "int8"
    assert int8.metrics["diff.passed"] == 1.0 and int8.metrics["diff.cosine_min"] >= 0.99
    assert runs["int8_dynamic"].data.tags["tracker.verdict"] != "rejected"
    fused = runs["attention_fused"].data.metrics
    assert fused["fusion.MultiHeadAttention"] + fused.get("fusion.Attention", 0) == BERT_LAYERS
    assert runs["attention_fused"].data.metrics["diff.cosine_min"] >= 0.999999
    assert "best:" in done.stdout
    int8_line = next(line for line in done.stdout.splitlines() if " int8_dynamic " in line)
    assert " cos 0.9" in int8_line or " cos 1.0" in int8_line, int8_line


def test_dry_run_lists_what_would_run_and_why_the_others_do_not_and_logs_nothing(tmp_path, classifier):
    done = optimize(tmp_path, classifier, "--dry-run", "--skip", "ort_opt_enabled")
    assert "study iris-classifier" in done.stdout
    assert "ort_opt_disabled" in done.stdout and "runs" in done.stdout
    assert "ort_opt_enabled" in done.stdout and "skipped (--skip)" in done.stdout
    assert "ort_opt_basic" in done.stdout and "no attention" in done.stdout
    assert not (tmp_path / "mlflow.db").exists() or not runs_of_or_empty(tmp_path)


def runs_of_or_empty(tmp_path: Path) -> dict[str, object]:
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("own")
    return {} if experiment is None else runs_of(tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize(("args", "message"), [
    (["--task", "poetry"], "unknown task 'poetry'"),
    (["--attempts", "turbo"], "unknown optimization 'turbo'; registered: ort_opt_disabled"),
    (["--attempts", "ort_opt_basic"], "ort_opt_basic does not apply"),
])
def test_bad_choices_exit_2_naming_the_problem_before_any_run(tmp_path, classifier, args, message):
    done = optimize(tmp_path, classifier, *args, check=False)
    assert done.returncode == 2, done.stderr[-3000:]
    assert message in done.stderr and "Traceback" not in done.stderr
    assert not runs_of_or_empty(tmp_path)


def test_a_feeds_file_that_does_not_fit_exits_2_naming_the_input(tmp_path, classifier):
    bad = tmp_path / "bad.npz"
    np.savez(bad, wrong_name=np.zeros((2, 4), dtype=np.float32))
    done = optimize(tmp_path, classifier, "--feeds", str(bad), check=False)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "wrong_name" in done.stderr


@pytest.mark.slow
def test_the_optimize_entry_point_of_mlflow_run_optimizes_the_given_model(tmp_path, classifier):
    from tests.studies.test_studies import mlflow_run, runs_by_name

    client = mlflow_run(tmp_path, "optimize", "-P", f"model={classifier}", "-P", "task=classification",
                        "-P", f"feeds={classifier.parent / 'feeds.npz'}", "-P", "skip=ort_threads_1,ort_parallel")
    runs = runs_by_name(client)
    assert runs["iris-classifier"].data.params["task"] == "classification"
    assert {"iris-classifier", "baseline", "ort_opt_disabled", "ort_opt_enabled"} == set(runs)
