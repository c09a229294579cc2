"""Each study end to end through `mlflow run` on a temporary sqlite store, read back with MlflowClient."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from mlflow import MlflowClient

from tests.studies.conftest import study_runs
from tracker.studies.gpt2 import DEFAULT_ATTEMPTS

# Every test runs `mlflow run` in a child process.
pytestmark = [pytest.mark.subprocess, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
FAST = ["-P", "profile_runs=4", "-P", "min_runs=5", "-P", "min_seconds=0.02", "-P", "threads=1",
        "-P", "speedup_rounds=4", "-P", "speedup_seconds=0"]
# Keys every attempt carries, whatever the runtime, so the MLflow UI can compare them.
COMMON_METRICS = {
    "latency.p50_ms",
    "latency.p90_ms",
    "latency.mean_ms",
    "latency.std_ms",
    "profile.overhead_ratio",
    "diff.max_abs",
    "diff.max_rel",
    "diff.passed",
    "graph.node_count",
    "model.size_bytes",
    "latency.speedup_vs_baseline",
}


def with_venv(env: dict[str, str]) -> dict[str, str]:
    """`mlflow run --env-manager local` runs `python ...`: make it this interpreter, activated or not.

    An experiment chosen by an earlier in-process test (mlflow.set_experiment exports it) must not
    leak into `mlflow run --experiment-name`, which refuses both.
    """
    env = {k: v for k, v in env.items() if k not in ("MLFLOW_EXPERIMENT_ID", "MLFLOW_EXPERIMENT_NAME")}
    return {**env, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"}


def mlflow_run(tmp_path: Path, entry: str, *params: str) -> MlflowClient:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = with_venv({**os.environ, "MLFLOW_TRACKING_URI": uri})
    command = [sys.executable, "-m", "mlflow", "run", str(ROOT), "-e", entry, "--env-manager", "local",
               "--experiment-name", "studies", *FAST, *params]
    done = subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-5000:]
    return MlflowClient(tracking_uri=uri)


def runs_by_name(client: MlflowClient) -> dict[str, object]:
    experiment = client.get_experiment_by_name("studies")
    runs = client.search_runs([experiment.experiment_id], max_results=1000)
    by_name = {r.info.run_name: r for r in runs}
    assert len(by_name) == len(runs), "run names are unique within one project run"
    return by_name


def artifact_paths(client: MlflowClient, run_id: str, path: str = "") -> set[str]:
    found = set()
    for item in client.list_artifacts(run_id, path):
        found |= artifact_paths(client, run_id, item.path) if item.is_dir else {item.path}
    return found


def assert_attempts_nested(runs: dict, study: str, attempts: list[str]) -> None:
    parent = runs[study]
    assert parent.data.tags["tracker.study"] == study
    assert parent.data.tags["tracker.role"] == "study"
    for name in attempts:
        run = runs[name]
        assert run.info.status == "FINISHED"
        assert run.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert run.data.tags["tracker.study"] == study
        assert run.data.tags["tracker.attempt"] == name
        missing = COMMON_METRICS - set(run.data.metrics)
        assert not missing, f"{name} lacks {sorted(missing)}"
        assert run.data.params["env.onnxruntime"]
        assert run.data.params["env.cpu_count"] == str(os.cpu_count())


def test_linreg_study_logs_three_ort_attempts_with_profiles_models_and_quality(main_store, tmp_path):
    client = main_store
    runs = study_runs(client, "linreg")
    attempts = ["baseline", "ort_opt_disabled", "ort_opt_enabled"]
    assert_attempts_nested(runs, "linreg", attempts)
    assert set(runs) == {"linreg", *attempts}

    from sklearn.datasets import load_diabetes
    from sklearn.linear_model import LinearRegression
    from sklearn.model_selection import train_test_split

    X, y = load_diabetes(return_X_y=True)
    X_train, X_test, y_train, y_test = train_test_split(X, y, random_state=11)
    mse = float(np.mean((LinearRegression().fit(X_train, y_train).predict(X_test) - y_test) ** 2))
    for name in attempts:
        run = runs[name]
        assert run.data.params["ort.graph_optimization_level"] == {"ort_opt_disabled": "disable"}.get(name, "all")
        assert run.data.params["ort.intra_op_num_threads"] == "1"
        assert run.data.metrics["quality.mse"] == pytest.approx(mse, rel=1e-4)
        assert run.data.metrics["quality.test_rows"] == 111
        assert run.data.metrics["diff.passed"] == 1.0
        assert run.data.metrics["op.LinearRegressor.calls"] == 3  # 4 profiled runs, the first skipped
        paths = artifact_paths(client, run.info.run_id)
        assert {"profile/ort_profile.json", "profile/ort_optimized_model.onnx", "tables/ops_by_op.csv",
                "tables/ops_by_node.json", "charts/profile.html"} <= paths
        models = client.search_logged_models([run.info.experiment_id],
                                             filter_string=f"source_run_id = '{run.info.run_id}'")
        assert len(models) == 1
    assert runs["baseline"].data.metrics["latency.speedup_vs_baseline"] == 1.0
    table = client.download_artifacts(runs["linreg"].info.run_id, "report/attempts.json", str(tmp_path))
    table = json.loads(Path(table).read_text())
    rows = [dict(zip(table["columns"], row)) for row in table["data"]]
    assert [r["attempt"] for r in rows] == attempts  # the one attempts table of the study run
    assert [r["run_id"] for r in rows] == [runs[name].info.run_id for name in attempts]
    assert rows[0]["speedup_vs_baseline"] == 1.0
    assert not client.list_artifacts(runs["linreg"].info.run_id, "study")


def test_fusion_study_has_zero_diff_for_the_fused_op_and_rejects_the_wrong_kernel(main_store, tmp_path):
    client = main_store
    runs = study_runs(client, "fusion")
    attempts = ["reference_baseline", "reference_fused", "reference_fused_wrong", "ort_baseline", "ort_fused"]
    assert_attempts_nested(runs, "fusion", attempts)
    for name in ("reference_fused", "ort_fused"):
        assert runs[name].data.metrics["diff.max_abs"] == 0.0
        assert runs[name].data.metrics["diff.passed"] == 1.0
        assert runs[name].data.metrics["fusion.AddEyeLike"] == 1.0
        assert runs[name].data.tags["tracker.diff"] == "passed"
    wrong = runs["reference_fused_wrong"]
    assert wrong.info.status == "FINISHED"  # a failed check is data, not a crash
    assert wrong.data.metrics["diff.passed"] == 0.0
    assert wrong.data.metrics["diff.max_abs"] > 0.1
    assert wrong.data.tags["tracker.diff"] == "failed"
    # ORT and the reference evaluator round differently; the cross-runtime check uses fp32 tolerance.
    assert 0 < runs["ort_baseline"].data.metrics["diff.max_abs"] < 1e-4
    fused = runs["reference_fused"]
    assert fused.data.metrics["op.AddEyeLike.calls"] == 3
    assert "op.EyeLike.calls" not in fused.data.metrics
    paths = artifact_paths(client, fused.info.run_id)
    assert {"traces/reference_verbose_2.txt", "traces/reference_verbose_4.txt", "tables/op_diff.csv",
            "tables/graph_diff.csv", "model/model.onnx", "charts/profile.html"} <= paths
    trace = Path(client.download_artifacts(fused.info.run_id, "traces/reference_verbose_2.txt", str(tmp_path)))
    assert "AddEyeLike" in trace.read_text()


def test_main_nests_each_study_under_the_project_run(main_store):
    client = main_store
    experiment = client.get_experiment_by_name("studies")
    runs = client.search_runs([experiment.experiment_id], max_results=1000)
    by_id = {r.info.run_id: r for r in runs}
    main = next(r for r in runs if r.info.run_name == "main")
    studies = {r.info.run_name: r for r in runs if r.data.tags.get("mlflow.parentRunId") == main.info.run_id}
    assert set(studies) == {"linreg", "fusion", "gpt2"}
    children = {name: sorted(r.info.run_name for r in runs if r.data.tags.get("mlflow.parentRunId") == s.info.run_id)
                for name, s in studies.items()}
    assert children == {
        "linreg": ["baseline", "ort_opt_disabled", "ort_opt_enabled"],
        "fusion": ["ort_baseline", "ort_fused", "reference_baseline", "reference_fused", "reference_fused_wrong"],
        "gpt2": sorted(["baseline", *DEFAULT_ATTEMPTS]),
    }
    assert len(by_id) == 1 + sum(1 + len(names) for names in children.values())
    assert all(r.info.status == "FINISHED" for r in runs)


@pytest.mark.parametrize(
    ("param", "option", "expected"),
    [("profile_runs=zero", "--profile-runs", "'zero'"),
     ("speedup_rounds=2", "--speedup-rounds", "expected an integer >= 4, got '2'")],
)
def test_a_bad_mlproject_parameter_fails_with_a_message_naming_it(tmp_path, param, option, expected):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    command = [sys.executable, "-m", "mlflow", "run", str(ROOT), "-e", "linreg", "--env-manager", "local",
               "-P", param]
    done = subprocess.run(command, env=with_venv({**os.environ, "MLFLOW_TRACKING_URI": uri}), cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    assert option in done.stderr and expected in done.stderr
