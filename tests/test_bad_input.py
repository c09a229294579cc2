"""Bad input to `tracker profile`, `inspect` and `compare`: one line `error: ...`, exit 2, no traceback.

`profile` must refuse bad input before it creates an MLflow run: each profile case checks the store holds no run.
"""

from __future__ import annotations

from pathlib import Path

import mlflow
import onnx
import pytest
from onnx import TensorProto, helper

from tracker.base.model_io import load_model
from tracker.cli import main
from tracker.optimize.add_eyelike import make_linear_model

COMMANDS = ["inspect", "profile"]


@pytest.fixture
def store(tmp_path, monkeypatch) -> str:
    """A sqlite tracking store in tmp_path (created by the first command that opens it)."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    return uri


def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def run_names(uri: str) -> list[str]:
    """Names of every run in the store; none when the store was never created."""
    if not Path(uri.removeprefix("sqlite:///")).exists():
        return []
    client = mlflow.MlflowClient(uri)
    experiments = [e.experiment_id for e in client.search_experiments()]
    return [r.info.run_name for r in client.search_runs(experiments)]


def assert_one_line_error(code: int, err: str, *fragments: str) -> None:
    lines = [line for line in err.splitlines() if line.startswith("error: ")]
    assert code == 2
    assert len(lines) == 1 and "Traceback" not in err, err
    for fragment in fragments:
        assert fragment in lines[0]


def custom_op_model() -> onnx.ModelProto:
    """Y = my.domain.Foo(X): valid for the ONNX checker, but no runtime has a kernel for Foo."""
    graph = helper.make_graph(
        [helper.make_node("Foo", ["X"], ["Y"], name="foo", domain="my.domain")],
        "custom",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2])],
    )
    opsets = [helper.make_opsetid("", 18), helper.make_opsetid("my.domain", 1)]
    return helper.make_model(graph, opset_imports=opsets)


def test_a_protobuf_model_named_json_loads_by_its_content(tmp_path, capsys):
    path = tmp_path / "linear.json"  # onnx alone would read it as ONNX JSON, from the extension
    model = make_linear_model(n_features=8)
    path.write_bytes(model.SerializeToString())
    assert load_model(path).SerializeToString() == model.SerializeToString()
    code, out, _ = run_cli(capsys, "inspect", str(path), "--dim", "N=2")
    assert code == 0 and "MatMul" in out


@pytest.mark.slow
def test_profile_of_a_protobuf_model_named_json_logs_it(store, tmp_path, capsys):
    path = tmp_path / "linear.json"
    path.write_bytes(make_linear_model(n_features=8).SerializeToString())
    code, out, err = run_cli(capsys, "profile", str(path), "--dim", "N=2", "--profile-runs", "3", "--min-seconds", "0",
                             "--name", "from-json")
    assert code == 0, err
    assert run_names(store) == ["from-json"]


def test_profile_of_a_custom_domain_op_fails_before_any_run_naming_the_op(store, tmp_path, capsys):
    path = tmp_path / "custom.onnx"
    onnx.save_model(custom_op_model(), str(path))
    code, _, err = run_cli(capsys, "profile", str(path))
    assert_one_line_error(code, err, "ONNX Runtime cannot load", "no kernel for op 'Foo' of domain 'my.domain'")
    assert run_names(store) == []


@pytest.mark.parametrize("command", COMMANDS)
def test_a_json_file_that_is_not_a_model_is_a_model_error(store, tmp_path, capsys, command):
    path = tmp_path / "notes.json"
    path.write_text('{"latency_ms": 3.5}')
    code, _, err = run_cli(capsys, command, str(path))
    assert_one_line_error(code, err, "notes.json", "is not a readable ONNX model",
                          "neither an ONNX protobuf nor ONNX json", 'no field named "latency_ms"')
    assert run_names(store) == []


@pytest.mark.parametrize("command", COMMANDS)
def test_a_missing_external_data_file_is_named(store, tmp_path, capsys, command):
    path = tmp_path / "linear.onnx"
    onnx.save_model(make_linear_model(n_features=8), str(path), save_as_external_data=True,
                    all_tensors_to_one_file=True, location="linear.weights", size_threshold=0)
    (tmp_path / "linear.weights").unlink()
    code, _, err = run_cli(capsys, command, str(path), "--dim", "N=2")
    assert_one_line_error(code, err, "external data that is missing", repr(str(tmp_path / "linear.weights")),
                          "(tensors A, B)")
    assert run_names(store) == []


def test_inspect_of_a_custom_domain_op_names_it_and_what_the_reference_runtime_runs(tmp_path, capsys):
    path = tmp_path / "custom.onnx"
    onnx.save_model(custom_op_model(), str(path))
    code, _, err = run_cli(capsys, "inspect", str(path))
    assert_one_line_error(code, err, "reference runtime", "no kernel for op 'Foo' of domain 'my.domain' (node 'foo')",
                          "'ai.onnx.ml'", "local functions (none)", "new_ops (none)")


@pytest.mark.parametrize("command", COMMANDS)
def test_feeds_too_large_for_memory_are_refused_before_allocating(store, tmp_path, capsys, command):
    path = tmp_path / "linear.onnx"
    onnx.save_model(make_linear_model(n_features=8), str(path))
    code, _, err = run_cli(capsys, command, str(path), "--dim", "N=99999999999")
    assert_one_line_error(code, err, "would take 2.9 TiB", "X: float32[99999999999, 8]", "more than the limit of",
                          "a quarter of the memory available now", "--dim")
    assert run_names(store) == []


def test_compare_html_where_no_folder_can_be_made_fails_before_reading_runs(store, tmp_path, capsys):
    (tmp_path / "results").write_text("a file, where the report wants a folder")
    path = tmp_path / "results" / "report.html"
    code, _, err = run_cli(capsys, "compare", "--run-ids", "0123456789abcdef", "--html", str(path))
    assert_one_line_error(code, err, repr(str(path)), f"{str(tmp_path / 'results')!r} is a file, not a folder")
    assert not (tmp_path / "mlflow.db").exists()  # the store was not opened
