"""`tracker profile MODEL.onnx` logs a real attempt to a real sqlite store."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from mlflow import MlflowClient

from tests.conftest import use_sqlite_store
from tests.models import make_linear_model
from tracker.cli import main


@pytest.mark.slow
def test_profile_logs_the_model_file_as_an_attempt_and_prints_its_ops(tmp_path, monkeypatch, tmp_path_factory, capsys):
    uri = use_sqlite_store(tmp_path, monkeypatch, tmp_path_factory)
    path = tmp_path / "linear.onnx"
    onnx.save(make_linear_model(n_features=16), str(path))
    code = main(["profile", str(path), "--dim", "N=3", "--profile-runs", "4", "--min-seconds", "0",
                 "--opt-level", "disable", "--threads", "1", "--name", "cli", "--experiment", "cli"])
    out = capsys.readouterr().out
    assert code == 0
    assert "MatMul" in out and "EyeLike" in out  # optimizations off: the file's own ops run
    client = MlflowClient(tracking_uri=uri)
    run = client.search_runs([client.get_experiment_by_name("cli").experiment_id])[0]
    assert run.info.run_name == "cli" and run.info.status == "FINISHED"
    assert run.data.params["ort.graph_optimization_level"] == "disable"
    assert run.data.metrics["op.EyeLike.calls"] == 3
    assert run.info.run_id in out


def test_profile_with_a_size_for_a_dim_the_model_does_not_have_names_its_dims(tmp_path, capsys):
    path = tmp_path / "linear.onnx"
    onnx.save(make_linear_model(n_features=16), str(path))
    assert main(["profile", str(path), "--dim", "seq=3"]) == 2
    assert "the model's symbolic dims are ['N']" in capsys.readouterr().err


@pytest.mark.slow
def test_profile_takes_the_users_feeds_and_names_the_run_after_the_file(tmp_path, monkeypatch, tmp_path_factory,
                                                                         capsys):
    uri = use_sqlite_store(tmp_path, monkeypatch, tmp_path_factory)
    path = tmp_path / "my encoder.onnx"
    onnx.save(make_linear_model(n_features=16), str(path))
    np.save(tmp_path / "x.npy", np.ones((5, 16), dtype=np.float32))
    code = main(["profile", str(path), "--feeds", str(tmp_path / "x.npy"), "--profile-runs", "3", "--min-seconds", "0",
                 "--opt-level", "disable",
                 "--experiment", "cli"])
    assert code == 0, capsys.readouterr().err
    client = MlflowClient(tracking_uri=uri)
    run = client.search_runs([client.get_experiment_by_name("cli").experiment_id])[0]
    assert run.info.run_name == "my_encoder"
    assert run.data.metrics["op.EyeLike.calls"] == 2  # 3 runs, the warm-up left out
    assert [(i.dataset.name, i.dataset.profile) for i in run.inputs.dataset_inputs][0][1].count("5, 16") == 1


@pytest.mark.slow
def test_the_old_spelling_runs_profiles_as_profile_runs_does_after_one_line_naming_it(tmp_path, monkeypatch,
                                                                                       tmp_path_factory, capsys):
    uri = use_sqlite_store(tmp_path, monkeypatch, tmp_path_factory)
    path = tmp_path / "linear.onnx"
    onnx.save(make_linear_model(n_features=16), str(path))
    capsys.readouterr()  # what making the store printed
    code = main(["profile", str(path), "--dim", "N=2", "--runs", "3", "--min-seconds", "0", "--opt-level", "disable",
                 "--experiment", "cli"])
    first, *rest = capsys.readouterr().err.splitlines()
    assert code == 0
    assert first == ("tracker: --runs is deprecated for 'tracker profile': use --profile-runs (the old spelling goes "
                     "in the next release)")
    assert not [line for line in rest if "deprecated" in line]
    client = MlflowClient(tracking_uri=uri)
    run = client.search_runs([client.get_experiment_by_name("cli").experiment_id])[0]
    assert run.data.metrics["op.EyeLike.calls"] == 2  # 3 runs, the warm-up left out


def test_profile_of_a_file_that_is_not_onnx_is_a_clear_error(tmp_path, capsys):
    path = tmp_path / "notes.onnx"
    path.write_text("not a model")
    assert main(["profile", str(path)]) == 2
    err = capsys.readouterr().err
    assert "notes.onnx" in err and "ONNX" in err
