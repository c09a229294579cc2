"""Models with string inputs run end to end: generated string feeds, `.npz` files of unicode strings, the
profile, the output check of string outputs, the feeds' dataset in MLflow and the reference runtime's trace."""

from __future__ import annotations

import json

import mlflow
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from tests.conftest import new_sqlite_store
from tests.models import string_model
from tracker.api import log_attempt
from tracker.cli import main
from tracker.measure.accuracy.output_diff import FP32
from tracker.measure.attempt import MeasureConfig
from tracker.measure.inputs.feeds import feed_rules, make_feeds
from tracker.measure.inputs.model_inputs import StringKeys, string_keys
from tracker.measure.timing.latency import TimingConfig

WORDS = ["red", "green", "blue"]
QUICK = MeasureConfig(profile_runs=2, skip_runs=1, timing=TimingConfig(min_runs=5, min_seconds=0))


def one_hot_model() -> onnx.ModelProto:
    """city: string [N] -> Reshape to [N, 1] -> OneHotEncoder over three cities; text: string [2] -> Identity."""
    nodes = [
        helper.make_node("Reshape", ["city", "shape"], ["column"], name="to_column"),
        helper.make_node("OneHotEncoder", ["column"], ["hot"], name="one_hot", domain="ai.onnx.ml",
                         cats_strings=["paris", "oslo", "lima"], zeros=1),
        helper.make_node("Identity", ["text"], ["same_text"], name="copy"),
    ]
    graph = helper.make_graph(
        nodes, "cities",
        [helper.make_tensor_value_info("city", TensorProto.STRING, ["N"]),
         helper.make_tensor_value_info("text", TensorProto.STRING, [2])],
        [helper.make_tensor_value_info("hot", TensorProto.FLOAT, ["N", 1, 3]),
         helper.make_tensor_value_info("same_text", TensorProto.STRING, [2])],
        initializer=[onnx.numpy_helper.from_array(np.array([-1, 1], np.int64), "shape")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("ai.onnx.ml", 1)])


def _run(model: onnx.ModelProto, feeds) -> list:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


@pytest.fixture(scope="module")
def shared_store(tmp_path_factory) -> str:
    """One sqlite store for the module's tests (making one takes seconds), holding the experiment "strings"."""
    return new_sqlite_store(tmp_path_factory, "strings")[1]


@pytest.fixture
def store(shared_store, monkeypatch) -> str:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", shared_store)
    return shared_store


def test_string_inputs_are_generated_from_the_keys_of_the_op_they_feed():
    model = string_model()
    assert string_keys(model) == {"color": StringKeys("encode", "LabelEncoder", "keys_strings", tuple(WORDS))}
    assert feed_rules(model) == {"color": "strings drawn from the 3 keys_strings of LabelEncoder 'encode'"}
    feeds = make_feeds(model, dims={"N": 64}, seed=1)
    color = feeds["color"]
    assert color.dtype == object and color.shape == (64,) and set(color) == set(WORDS)
    assert all(type(v) is str for v in color)
    assert list(make_feeds(model, dims={"N": 64}, seed=1)["color"]) == list(color)  # seeded
    ids, french = _run(model, feeds)
    assert (ids >= 0).all() and "?" not in set(french)  # every word is a key: the check sees real mappings


def test_string_keys_are_found_through_a_reshape_and_other_strings_are_short_words():
    model = one_hot_model()
    assert feed_rules(model) == {
        "city": "strings drawn from the 3 cats_strings of OneHotEncoder 'one_hot'",
        "text": "strings drawn from 16 short words (the, cat, sat ...)",
    }
    feeds = make_feeds(model, dims={"N": 5})
    assert feeds["text"].dtype == object and feeds["text"].shape == (2,)
    hot, text = _run(model, feeds)
    assert hot.sum() == 5 and list(text) == list(feeds["text"])


@pytest.mark.slow
def test_profile_runs_a_string_model_on_generated_feeds_and_on_a_npz_of_unicode_strings(store, tmp_path, capsys):
    path = tmp_path / "colors.onnx"
    onnx.save_model(string_model(), str(path))
    np.savez(tmp_path / "feeds.npz", color=np.array(["red", "blue", "pink"]))
    quick = ["--profile-runs", "2", "--min-seconds", "0", "--experiment", "strings"]
    assert main(["profile", str(path), "--dim", "N=4", "--name", "generated", *quick]) == 0, capsys.readouterr().err
    assert main(["profile", str(path), "--feeds", str(tmp_path / "feeds.npz"), "--name", "from-file", *quick]) == 0
    out = capsys.readouterr().out
    assert "LabelEncoder" in out
    client = mlflow.MlflowClient(store)
    runs = [r for r in client.search_runs([client.get_experiment_by_name("strings").experiment_id])
            if r.info.run_name in ("generated", "from-file")]
    assert sorted(r.info.run_name for r in runs) == ["from-file", "generated"]
    for run in runs:
        assert run.info.status == "FINISHED" and "tracker.not_logged" not in run.data.tags
        (dataset,) = run.inputs.dataset_inputs
        (spec,) = json.loads(dataset.dataset.schema)["mlflow_colspec"]
        shape = [4] if run.info.run_name == "generated" else [3]
        assert spec == {"name": "color", "type": "tensor", "tensor-spec": {"dtype": "object", "shape": shape}}


@pytest.mark.slow
def test_an_attempt_on_string_feeds_checks_string_outputs_against_the_baseline(store, tmp_path):
    model = string_model()
    feeds = {"color": np.array(["red", "blue", "pink"], dtype=object)}
    baseline = _run(model, feeds)
    same = log_attempt(model, feeds, name="same", config=QUICK, baseline_outputs=baseline, log_model=False,
                       experiment="strings")
    assert same.ok and same.diff.passed, same.error
    assert same.feeds.inputs[0].dtype == "object" and same.feeds.nonfinite == 0
    changed = [baseline[0], np.array(["rouge", "bleu", "rose"], dtype=object)]
    assert not FP32.compare(changed, same.outputs).passed


def test_inspect_traces_a_string_model_on_generated_strings(tmp_path, capsys):
    path = tmp_path / "colors.onnx"
    onnx.save_model(string_model(), str(path))
    assert main(["inspect", str(path), "--dim", "N=2"]) == 0
    assert "LabelEncoder(color) -> color_id" in capsys.readouterr().out
