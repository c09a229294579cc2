"""Bad input, round two (issue 22, item 12): `--dim` of 0, a `--config` too deep or of the wrong type, an
`--experiment` name MLflow refuses, external data cut short, and control characters in names printed as tables.

Each refusal is one line `error: ...`, exit 2, no traceback, before any run or work folder is made.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import mlflow
import mlflow.utils.validation
import onnx
import pytest

import tracker.study
from tests.conftest import seed_sqlite_store
from tests.test_bad_input import assert_one_line_error, run_cli, run_names
from tracker.api import Study
from tracker.base.keys import MAX_EXPERIMENT_NAME_LENGTH
from tracker.optimize.add_eyelike import make_linear_model

FIXTURES = Path(__file__).parent / "fixtures"
QUICK_OPTIMIZE = ["--min-runs", "1", "--min-seconds", "0", "--profile-runs", "2", "--speedup-seconds", "0"]
LONG_NAME = "e" * 501  # MLflow's limit is 500 (mlflow.utils.validation.MAX_EXPERIMENT_NAME_LENGTH)


@pytest.fixture
def store(tmp_path, monkeypatch, tmp_path_factory) -> str:
    uri = seed_sqlite_store(tmp_path / "mlflow.db", tmp_path_factory)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    return uri


@pytest.fixture
def temp_root(tmp_path, monkeypatch) -> Path:
    """The folder tempfile makes work folders in, watched for leftovers."""
    root = tmp_path / "tmp"
    root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    return root


@pytest.fixture
def linear(tmp_path) -> Path:
    path = tmp_path / "linear.onnx"
    onnx.save_model(make_linear_model(n_features=8), str(path))
    return path


@pytest.mark.parametrize("command", ["profile", "inspect", "optimize"])
def test_a_dim_of_zero_is_refused_naming_it(store, linear, capsys, command):
    code, _, err = run_cli(capsys, command, str(linear), "--dim", "N=0")
    assert_one_line_error(code, err, "--dim N=0: a dimension must be at least 1")
    assert run_names(store) == []


def test_a_past_length_of_zero_is_a_decoders_first_step_and_stays_allowed():
    from tracker.experiment_args import parse_dims as _dims

    assert _dims(["batch=1,past_sequence_length=0"]) == {"batch": 1, "past_sequence_length": 0}
    with pytest.raises(ValueError, match="a dimension must be at least 1"):
        _dims(["sequence_length=0"])


def test_a_config_nested_too_deep_is_a_one_line_error_naming_the_file(store, linear, tmp_path, capsys):
    config = tmp_path / "config.json"
    config.write_text('{"model_type": ' + "[" * 100_000 + "]" * 100_000 + "}")
    code, _, err = run_cli(capsys, "optimize", str(linear), "--config", str(config), "--dim", "N=2", "--dry-run")
    assert_one_line_error(code, err, f"config_json must be a readable Hugging Face config.json, got {config}",
                          "nested too deeply")


def test_a_config_that_is_a_fifo_or_a_device_is_refused_without_reading_it(store, linear, tmp_path, capsys):
    fifo = tmp_path / "config.json"
    os.mkfifo(fifo)  # opened, it would block the plan (--dry-run included) until a writer came
    for config, mode in ((fifo, "prw"), (Path("/dev/zero"), "crw")):  # /dev/zero would be read until memory ran out
        code, _, err = run_cli(capsys, "optimize", str(linear), "--config", str(config), "--dim", "N=2", "--dry-run")
        assert_one_line_error(code, err, f"config_json: {config} must be a regular file (a Hugging Face "
                                         f"config.json), got {mode}")
    assert run_names(store) == []


def test_a_config_larger_than_any_hugging_face_config_is_refused_with_its_size(store, linear, tmp_path, capsys):
    from tracker.optimize.model_info import MAX_CONFIG_BYTES

    config = tmp_path / "config.json"
    config.write_text('{"model_type": "bert", "pad": "' + "x" * MAX_CONFIG_BYTES + '"}')
    code, _, err = run_cli(capsys, "optimize", str(linear), "--config", str(config), "--dim", "N=2", "--dry-run")
    assert_one_line_error(code, err, f"config_json: {config} has {config.stat().st_size} bytes, more than a Hugging "
                                     f"Face config.json holds (at most {MAX_CONFIG_BYTES} are read)")


@pytest.mark.parametrize("model_type", [["bert"], {"name": "bert"}, 3])
def test_a_model_type_that_is_not_a_string_is_the_reason_no_transformer_info_is_read(linear, tmp_path, capsys,
                                                                                       model_type):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": model_type, "num_attention_heads": 2, "hidden_size": 8}))
    code, out, err = run_cli(capsys, "optimize", str(linear), "--config", str(config), "--dim", "N=2", "--dry-run")
    assert code == 0 and "Traceback" not in err, err
    assert f"no transformer info: {config}: model_type must be a string (e.g. \"bert\"), got {model_type!r}" in out


@pytest.mark.parametrize("command", ["profile", "optimize"])
def test_an_experiment_name_over_mlflows_limit_is_refused_before_any_work(store, linear, temp_root, capsys, command):
    code, _, err = run_cli(capsys, command, str(linear), "--dim", "N=2", "--experiment", LONG_NAME)
    assert_one_line_error(code, err, "experiment name must be at most 500 characters (MLflow's limit), got 501")
    assert run_names(store) == [] and list(temp_root.iterdir()) == []


def test_a_study_refuses_a_long_experiment_name_when_made(temp_root):
    with pytest.raises(ValueError, match="experiment name must be at most 500 characters"):
        Study("s", feeds={}, experiment=LONG_NAME)
    assert list(temp_root.iterdir()) == []


def test_the_experiment_name_limit_is_mlflows():
    assert MAX_EXPERIMENT_NAME_LENGTH == mlflow.utils.validation.MAX_EXPERIMENT_NAME_LENGTH


def test_a_study_whose_run_cannot_start_leaves_no_work_folder(store, temp_root, monkeypatch):
    monkeypatch.setattr(tracker.study, "measure_machine_or_none", lambda: None)  # no roofs: seconds saved, nothing else
    client = mlflow.MlflowClient(store)
    client.delete_experiment(client.create_experiment("gone"))
    with pytest.raises(mlflow.exceptions.MlflowException, match="deleted experiment"):
        with Study("s", feeds={}, experiment="gone"):
            pass
    assert list(temp_root.iterdir()) == []


def _cut_external_data(tmp_path: Path) -> Path:
    """linear.onnx whose weight A claims an offset past the end of linear.weights."""
    path = tmp_path / "linear.onnx"
    onnx.save_model(make_linear_model(n_features=8), str(path), save_as_external_data=True,
                    all_tensors_to_one_file=True, location="linear.weights", size_threshold=0)
    model = onnx.load(str(path), load_external_data=False)
    for entry in model.graph.initializer[0].external_data:
        if entry.key == "offset":
            entry.value = "1000000"
    onnx.save_model(model, str(path))
    return path


@pytest.mark.parametrize("command", ["profile", "optimize", "inspect"])
def test_external_data_past_the_end_of_its_file_is_refused_alike_by_every_command(store, tmp_path, capsys, command):
    path = _cut_external_data(tmp_path)
    quick = QUICK_OPTIMIZE if command == "optimize" else ()
    code, _, err = run_cli(capsys, command, str(path), "--dim", "N=2", *quick)
    assert_one_line_error(code, err, repr(str(path)), "tensor 'A'", "past the end of",
                          repr(str(tmp_path / "linear.weights")), "offset 1000000", "file of 288 bytes")
    assert run_names(store) == []


def _profile_with_node_name(tmp_path: Path, name: str) -> Path:
    events = json.loads((FIXTURES / "profile_ort_1_32.json").read_text())
    for event in events:
        if event.get("name") == "mm_kernel_time":
            event["name"] = f"{name}_kernel_time"
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(events))
    return path


def test_summarize_prints_control_characters_of_node_names_escaped(tmp_path, capsys):
    path = _profile_with_node_name(tmp_path, "mm\x1b]0;owned\x07\x1b[2J\r\x9b")
    code, out, _ = run_cli(capsys, "summarize", str(path), "--by", "node")
    assert code == 0
    assert "mm\\x1b]0;owned\\x07\\x1b[2J\\x0d\\x9b" in out
    assert not any(c in out for c in "\x1b\x07\r\x9b")
    lines = out.splitlines()
    assert len({len(line) for line in lines[1:]}) == 1  # the table stays aligned


def test_a_negative_seed_is_a_one_line_error_naming_the_option(store, linear, capsys):
    for command in ("profile", "optimize"):
        code, _, err = run_cli(capsys, command, str(linear), "--dim", "N=2", "--seed", "-1")
        assert_one_line_error(code, err, "the feeds' seed must be an integer >= 0", "got -1 (CLI: --seed)")
    assert run_names(store) == []


def test_a_models_own_static_zero_is_refused_like_a_dim_of_zero(store, tmp_path, capsys):
    x = onnx.helper.make_tensor_value_info("features", onnx.TensorProto.FLOAT, [0, 4])
    y = onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [0, 4])
    graph = onnx.helper.make_graph([onnx.helper.make_node("Relu", ["features"], ["y"])], "g", [x], [y])
    path = tmp_path / "empty.onnx"
    onnx.save_model(onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)]), str(path))
    for args in (["optimize", str(path), "--dry-run"], ["profile", str(path)]):
        code, _, err = run_cli(capsys, *args)
        assert_one_line_error(code, err, "input 'features' declares axis 0 of size 0", "expected a size of at least 1")
    assert run_names(store) == []


def test_a_chain_named_past_the_limit_is_refused_in_the_plan_before_the_baseline(store, tmp_path, capsys):
    import numpy as np

    # Y = X @ W with W a float initializer: int8_dynamic applies, so only the name can refuse the chain.
    x = onnx.helper.make_tensor_value_info("X", onnx.TensorProto.FLOAT, ["N", 16])
    y = onnx.helper.make_tensor_value_info("Y", onnx.TensorProto.FLOAT, ["N", 16])
    weight = onnx.numpy_helper.from_array(np.random.default_rng(0).random((16, 16), dtype=np.float32), "W")
    graph = onnx.helper.make_graph([onnx.helper.make_node("MatMul", ["X", "W"], ["Y"], name="mm")], "mm", [x], [y],
                                   [weight])
    path = tmp_path / "mm.onnx"
    onnx.save_model(onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)]), str(path))
    chain = "int8_dynamic:per_channel=true+" + "+".join(["ort_opt_disabled", "io_binding", "ort_threads_1"] * 3)
    for extra in (["--dry-run"], QUICK_OPTIMIZE):
        code, _, err = run_cli(capsys, "optimize", str(path), "--dim", "N=2", "--attempts", chain, *extra)
        assert_one_line_error(code, err, f"attempt {chain!r} is named", "an attempt name is at most 100")
    assert run_names(store) == []
