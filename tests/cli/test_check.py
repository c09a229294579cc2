"""`tracker check`: a new model against the registry's champion, read from a real sqlite store and timed in real ONNX
Runtime sessions: the champion itself passes (A/A), a model computing other outputs fails on accuracy, a clearly slower
one fails naming `worse` and the interval, and bad input is one line, exit 2."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import mlflow
import numpy as np
import onnx
import pytest
import yaml
from onnx import helper

from tests.commands import assert_one_line_error, run_cli
from tests.conftest import child_env, new_sqlite_store
from tests.models import make_linear_model, with_matmul_chain

DOCS = Path(__file__).resolve().parents[2] / "docs" / "ci.md"
N_FEATURES = 64
CHAMPION = "models:/gate-model@champion"
# The shortest timing that gives an interval (as tests/conftest.FAST_SPEEDUP), and a batch that makes a call cost
# more than the session's own overhead.
QUICK = ["--speedup-rounds", "4", "--speedup-seconds", "0", "--dim", "N=64"]


def register_champion(uri: str, experiment_id: str, model: onnx.ModelProto, name: str = "gate-model") -> None:
    """Logs `model` with the onnx flavor as version 1 of the registered model `name`, aliased `champion`. MLflow saves
    its weights as external data beside it (`save_as_external_data`), on a copy: it changes the proto it is given."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    client = mlflow.MlflowClient(uri)
    with pytest.MonkeyPatch.context() as mp:  # MLflow's fluent API (log_model) reads the store from the variable
        mp.setenv("MLFLOW_TRACKING_URI", uri)
        with mlflow.start_run(experiment_id=experiment_id):
            mlflow.onnx.log_model(copy, name="model", registered_model_name=name, pip_requirements=[])
    client.set_registered_model_alias(name, "champion", "1")


@pytest.fixture(scope="module")
def registry(tmp_path_factory) -> str:
    """A sqlite store holding the registered model gate-model, version 1 aliased champion: the linear model."""
    _, uri, experiment_id = new_sqlite_store(tmp_path_factory, "check")
    register_champion(uri, experiment_id, make_linear_model(n_features=N_FEATURES))
    return uri


@pytest.fixture
def store(registry, monkeypatch) -> str:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", registry)
    return registry


def save(tmp_path: Path, model: onnx.ModelProto, name: str = "new.onnx") -> str:
    path = tmp_path / name
    onnx.save_model(model, str(path))
    return str(path)


@pytest.mark.timing
def test_the_champion_against_itself_passes(store, tmp_path, capsys):
    code, out, _ = run_cli(capsys, "check", save(tmp_path, make_linear_model(n_features=N_FEATURES)),
                           "--against", CHAMPION, *QUICK)

    assert code == 0, out
    assert "registered model gate-model version 1" in out
    assert "raw check passed" in out and "pass: not worse than the champion" in out


def test_a_model_computing_other_outputs_fails_on_accuracy_with_its_figures(store, tmp_path, capsys):
    other = make_linear_model(n_features=N_FEATURES, seed=1)
    code, out, err = run_cli(capsys, "check", save(tmp_path, other), "--against", CHAMPION, *QUICK, "--json")

    assert code == 1
    report = json.loads(out)
    assert report["verdict"] == "rejected" and report["passed"] is False and report["exit_code"] == 1
    assert report["accuracy"]["passed"] is False and report["accuracy"]["figures"]["diff.max_abs"] > 1e-2
    assert report["accuracy"]["bounds"]["diff.tolerance"] == "fp32"
    assert {k: report["champion"][k] for k in ("uri", "name", "version", "aliases")} == {
        "uri": CHAMPION, "name": "gate-model", "version": "1", "aliases": ["champion"]}
    assert report["ci_low"] <= report["speedup"] <= report["ci_high"] and report["rounds"] == 4
    assert len(report["model"]["sha256"]) == len(report["champion"]["sha256"]) == 64
    (fail,) = [line for line in err.splitlines() if line.startswith("FAIL: ")]
    assert "verdict rejected: the accuracy check against the champion failed" in fail and "max_abs" in fail


@pytest.mark.timing
def test_a_clearly_slower_model_fails_naming_worse_and_the_interval(store, tmp_path, capsys):
    slower = with_matmul_chain(make_linear_model(n_features=N_FEATURES), length=16)  # the same outputs, ~10x the time
    code, out, _ = run_cli(capsys, "check", save(tmp_path, slower), "--against", CHAMPION, *QUICK)

    assert code == 1, out
    (fail,) = [line for line in out.splitlines() if line.startswith("FAIL: ")]
    assert fail.startswith("FAIL: verdict worse: speed-up 0.") and "x [0." in fail and "slower" in fail
    assert "raw check passed" in out


def test_the_champion_may_be_a_file(tmp_path, capsys):
    model = make_linear_model(n_features=N_FEATURES)
    code, out, _ = run_cli(capsys, "check", save(tmp_path, model), "--against", save(tmp_path, model, "champion.onnx"),
                           *QUICK, "--json")

    assert code in (0, 1)  # an A/A verdict is a measurement; what is checked here is where the champion came from
    report = json.loads(out)
    assert report["champion"]["path"].endswith("champion.onnx") and report["accuracy"]["passed"] is True


@pytest.mark.parametrize(("against", "fragments"), [
    pytest.param("models:/gate-model@nope", ["no alias 'nope'", "its versions: 1", "its aliases: champion (version 1)"],
                 id="an alias"),
    pytest.param("models:/gate-model/7", ["no version '7'", "its versions: 1"], id="a version"),
    pytest.param("models:/nope@champion", ["no registered model 'nope'", "its registered models: gate-model"],
                 id="a model"),
    pytest.param("models:/gate-model", ["names no registered model's version", "models:/NAME@ALIAS"],
                 id="no version or alias"),
    pytest.param("runs:/abc/model", ["--against expects models:/NAME@ALIAS"], id="another URI"),
    pytest.param("missing.onnx", ["--against: model file 'missing.onnx' does not exist"], id="a missing file"),
])
def test_a_champion_that_does_not_exist_is_one_line_naming_what_does(store, tmp_path, capsys, against, fragments):
    code, _, err = run_cli(capsys, "check", save(tmp_path, make_linear_model(n_features=N_FEATURES)),
                           "--against", against, *QUICK)

    assert_one_line_error(code, err, *fragments)


def _renamed_input(model: onnx.ModelProto) -> onnx.ModelProto:
    renamed = onnx.ModelProto()
    renamed.CopyFrom(model)
    renamed.graph.input[0].name = "features"
    for node in renamed.graph.node:
        node.input[:] = ["features" if i == "X" else i for i in node.input]
    return renamed


def _double_input(model: onnx.ModelProto) -> onnx.ModelProto:
    """The linear model on float64 inputs, cast to float32 first."""
    double = onnx.ModelProto()
    double.CopyFrom(model)
    double.graph.input[0].type.tensor_type.elem_type = onnx.TensorProto.DOUBLE
    double.graph.node.insert(0, helper.make_node("Cast", ["X"], ["X32"], to=onnx.TensorProto.FLOAT))
    for node in double.graph.node[1:]:
        node.input[:] = ["X32" if i == "X" else i for i in node.input]
    return double


@pytest.mark.parametrize(("model", "fragment"), [
    pytest.param(make_linear_model(n_features=16), "input 'X' has shape [N, 16], the champion's [N, 64]", id="shape"),
    pytest.param(_renamed_input(make_linear_model(n_features=N_FEATURES)),
                 "input names ['features'] against the champion's ['X']", id="names"),
    pytest.param(_double_input(make_linear_model(n_features=N_FEATURES)),
                 "input 'X' has dtype float64, the champion's float32", id="dtype"),
])
def test_a_champion_whose_inputs_differ_is_one_line_saying_which(store, tmp_path, capsys, model, fragment):
    code, _, err = run_cli(capsys, "check", save(tmp_path, model), "--against", CHAMPION, *QUICK)

    assert_one_line_error(code, err, "differ from the champion's", fragment)


@pytest.mark.parametrize(("content", "fragment"), [
    pytest.param(b"not a model", "is not a readable ONNX model", id="corrupt"),
    pytest.param(None, "does not exist", id="missing"),
])
def test_a_corrupt_or_missing_model_is_one_line(store, tmp_path, capsys, content, fragment):
    path = tmp_path / "new.onnx"
    if content is not None:
        path.write_bytes(content)
    code, _, err = run_cli(capsys, "check", str(path), "--against", CHAMPION, *QUICK)

    assert_one_line_error(code, err, "new.onnx", fragment)


def test_no_reachable_tracking_store_is_one_line(tmp_path, monkeypatch, capsys):
    with socket.socket() as s:  # a loopback port nothing listens on once the socket is closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{port}")
    code, _, err = run_cli(capsys, "check", save(tmp_path, make_linear_model(n_features=N_FEATURES)),
                           "--against", CHAMPION, *QUICK)

    assert_one_line_error(code, err, f"http://127.0.0.1:{port}", "unreachable")


def test_the_feeds_may_be_given(store, tmp_path, capsys):
    feeds = tmp_path / "feeds.npz"
    np.savez(feeds, X=np.random.default_rng(1).standard_normal((3, N_FEATURES)).astype(np.float32))
    code, out, _ = run_cli(capsys, "check", save(tmp_path, make_linear_model(n_features=N_FEATURES, seed=1)),
                           "--against", CHAMPION, "--feeds", str(feeds), "--speedup-rounds", "4",
                           "--speedup-seconds", "0", "--json")

    assert code == 1
    assert json.loads(out)["feeds"] == {"source": str(feeds), "inputs": {"X": "float32[3, 64]"}}


def documented_commands() -> tuple[str, str]:
    """The `tracker check` line of the GitHub Actions step and of the GitLab CI job in docs/ci.md."""
    github, gitlab = (yaml.safe_load(block) for block in re.findall(r"```yaml\n(.*?)```", DOCS.read_text(), re.S))
    (step,) = [s for s in github["jobs"]["gate"]["steps"] if s.get("name") == "Regression gate"]
    (line,) = [line for line in gitlab["model-gate"]["script"] if line.startswith("tracker check")]
    return step["run"], line


@pytest.mark.timing
@pytest.mark.subprocess
@pytest.mark.slow
def test_the_documented_ci_command_passes_the_champion_and_writes_its_figures(tmp_path_factory, tmp_path):
    github, gitlab = documented_commands()
    assert github == gitlab
    _, uri, experiment_id = new_sqlite_store(tmp_path_factory, "ci-docs")
    model = make_linear_model(n_features=N_FEATURES)
    register_champion(uri, experiment_id, model, name="my-model")
    save(tmp_path, model, "model.onnx")
    env = child_env(uri, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    done = subprocess.run(["bash", "-c", github], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)

    assert done.returncode == 0, done.stderr
    report = json.loads((tmp_path / "check.json").read_text())
    assert report["champion"]["uri"] == "models:/my-model@champion" and report["accuracy"]["passed"] is True
    assert report["verdict"] in ("same", "inconclusive", "better") and report["exit_code"] == 0
