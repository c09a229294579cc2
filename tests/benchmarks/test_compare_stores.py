"""benchmarks/compare_stores.py on two small sqlite stores made through MlflowClient: a study run and two attempts."""

from __future__ import annotations

from pathlib import Path

import pytest
from compare_stores import main  # benchmarks/compare_stores.py (pytest pythonpath)
from mlflow import MlflowClient

from tests.conftest import seed_sqlite_store


def make_store(folder: Path, tmp_path_factory: pytest.TempPathFactory, attempt_params: dict[str, str]) -> str:
    """A store holding a study run 'linreg' and, nested under it, attempts 'baseline' and 'int8' that log
    `attempt_params`, a metric and an artifact; its tracking URI."""
    folder.mkdir()
    uri = seed_sqlite_store(folder / "mlflow.db", tmp_path_factory)
    client = MlflowClient(uri)
    experiment_id = client.create_experiment("onnx-optimization", artifact_location=str(folder / "artifacts"))
    study = client.create_run(experiment_id, run_name="linreg").info.run_id
    (folder / "notes.txt").write_text("notes")
    for name in ("baseline", "int8"):
        run_id = client.create_run(experiment_id, run_name=name, tags={"mlflow.parentRunId": study}).info.run_id
        for key, value in attempt_params.items():
            client.log_param(run_id, key, value)
        client.log_metric(run_id, "latency.p50_ms", 1.5 if folder.name == "old" else 1.2)  # values not compared
        client.log_artifact(run_id, str(folder / "notes.txt"), "report")
        client.set_terminated(run_id)
    client.set_terminated(study)
    return uri


PARAMS = {"precision": "fp32", "machine.gemm": "onnxruntime MatMul fp32 1024x1024x1024, best of 66"}


@pytest.mark.parametrize(
    ("new_params", "exit_code", "reported"),
    [
        pytest.param(PARAMS, 0, "3 runs matched, 0 differ", id="the same params"),
        pytest.param({**PARAMS, "machine.gemm": "onnxruntime MatMul fp32 1024x1024x1024, best of 70"}, 0,
                     "3 runs matched, 0 differ", id="an ignored value changed"),
        pytest.param({**PARAMS, "precision": "int8"}, 1, "changed param:precision: 'fp32' -> 'int8'",
                     id="a param changed"),
        pytest.param({"precision": "fp32"}, 1, "missing param:machine.gemm", id="a param missing"),
    ],
)
def test_a_changed_param_is_reported_and_the_same_runs_exit_0(tmp_path, tmp_path_factory, capsys, new_params,
                                                              exit_code, reported):
    old = make_store(tmp_path / "old", tmp_path_factory, PARAMS)
    new = make_store(tmp_path / "new", tmp_path_factory, new_params)
    assert main([old, new]) == exit_code
    out = capsys.readouterr().out
    assert reported in out
    shown = "differs" if exit_code else "same   "
    assert f"{shown} onnx-optimization / linreg > int8" in out


def test_a_run_on_one_side_only_is_reported(tmp_path, tmp_path_factory, capsys):
    old = make_store(tmp_path / "old", tmp_path_factory, PARAMS)
    new = make_store(tmp_path / "new", tmp_path_factory, PARAMS)
    client = MlflowClient(new)
    experiment = client.get_experiment_by_name("onnx-optimization")
    assert experiment is not None
    client.create_run(experiment.experiment_id, run_name="gpt2")
    assert main([old, new]) == 1
    assert "new only: onnx-optimization / gpt2" in capsys.readouterr().out
