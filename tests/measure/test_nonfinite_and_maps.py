"""Outputs the diff must judge although they are not plain finite tensors: NaN or inf carried from the feeds, a
scikit-learn classifier's ZipMap probabilities (a sequence of maps) and a sequence of tensors. Real
skl2onnx models run in real onnxruntime sessions."""

from __future__ import annotations

import logging
import warnings

import mlflow
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.conftest import FAST_SPEEDUP
from tests.models import make_linear_model
from tracker import MeasureConfig, Study, TimingConfig
from tracker.measure.accuracy.output_diff import EXACT, FP32, compare_outputs
from tracker.measure.accuracy.output_values import output_parts
from tracker.measure.accuracy.task_diff import CLASSIFICATION_TOLERANCES, task_tolerances
from tracker.measure.inputs.feeds_description import describe_feeds

FAST = MeasureConfig(profile_runs=2, speedup=FAST_SPEEDUP, timing=TimingConfig(warmup_runs=1, min_runs=3,
                                                                               min_seconds=0.0))
NAN_ROW = np.array([[1.0, np.nan, 3.0], [np.inf, 2.0, -np.inf]], dtype=np.float32)


def _run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


# -- item 10: NaN and inf ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("tolerance", [EXACT, FP32], ids=lambda t: t.name)
def test_nan_at_the_same_place_on_both_sides_is_equal(tolerance):
    diff = compare_outputs([NAN_ROW], [NAN_ROW.copy()], tolerance)
    assert (diff.passed, diff.nonfinite_mismatches, diff.max_abs) == (True, 0, 0.0)


@pytest.mark.parametrize(("attempt", "mismatches"), [
    pytest.param([[1.0, 2.0, 3.0], [np.inf, 2.0, -np.inf]], 1, id="the attempt lost a NaN"),
    pytest.param([[np.nan, np.nan, 3.0], [np.inf, 2.0, -np.inf]], 1, id="a NaN the baseline does not have"),
    pytest.param([[1.0, np.nan, 3.0], [np.nan, 2.0, np.inf]], 2, id="infinities turned"),
])
def test_a_nonfinite_value_on_one_side_only_fails_and_is_counted(attempt, mismatches):
    diff = compare_outputs([NAN_ROW], [np.array(attempt, np.float32)], FP32)
    assert (diff.passed, diff.nonfinite_mismatches) == (False, mismatches)


# One set of outputs per task holding NaN where the feeds would put it; lm is the GPT-2 study's (token ids).
NAN_SAMPLES = {
    "raw": [NAN_ROW],
    "regression": [np.array([[0.5], [np.nan], [2.0]], np.float32)],
    "classification": [np.array([[0.7, 0.3], [np.nan, np.nan], [0.1, 0.9]], np.float32)],
    "embedding": [np.array([[[1.0, 2.0], [3.0, 4.0]], [[np.nan, 1.0], [1.0, 1.0]]], np.float32)],
}


@pytest.mark.parametrize("task", NAN_SAMPLES)
def test_every_task_passes_identical_outputs_that_hold_nan(task):
    outputs = NAN_SAMPLES[task]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        diff = task_tolerances(task)["fp32"].compare(outputs, [o.copy() for o in outputs])
    assert diff.passed is True, diff.metrics()
    assert diff.metrics()["diff.nonfinite_mismatches"] == 0


@pytest.mark.parametrize("task", NAN_SAMPLES)
def test_every_task_fails_a_nan_the_baseline_does_not_have(task):
    outputs = NAN_SAMPLES[task]
    changed = [o.copy() for o in outputs]
    changed[0].reshape(-1)[-1] = np.nan
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        diff = task_tolerances(task)["int4"].compare(outputs, changed)
    assert diff.passed is False
    assert diff.metrics()["diff.nonfinite_mismatches"] == 1


def test_the_feeds_description_counts_nonfinite_values_per_input():
    feeds = {"X": np.array([[np.nan, 1.0], [np.inf, -np.inf]], np.float32), "ids": np.array([1, 2]),
             "ok": np.ones(3, np.float32)}
    described = describe_feeds(feeds)
    assert {s.name: s.nonfinite for s in described.inputs} == {"X": 3, "ids": 0, "ok": 0}
    assert described.nonfinite == 3
    assert describe_feeds({"ok": feeds["ok"]}).nonfinite == 0


@pytest.fixture
def no_machine(monkeypatch):
    """The study's machine roofs are not what these tests look at: skip their 6 s."""
    import tracker.study.study

    monkeypatch.setattr(tracker.study.study, "measure_machine_or_none", lambda: None)


def _nan_bias(model: onnx.ModelProto) -> onnx.ModelProto:
    """The same linear model with a NaN in its bias: column 0 of every output row is NaN."""
    changed = onnx.ModelProto()
    changed.CopyFrom(model)
    for i, tensor in enumerate(changed.graph.initializer):
        if tensor.name == "B":
            values = numpy_helper.to_array(tensor).copy()
            values[0, 0] = np.nan
            changed.graph.initializer[i].CopyFrom(numpy_helper.from_array(values, "B"))
    return changed


@pytest.mark.slow
def test_a_study_on_feeds_with_nan_passes_its_baseline_and_an_identical_attempt_and_says_why(
        store, no_machine, caplog):
    model = make_linear_model(n_features=4)
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    x[0, 1], x[2, 3] = np.nan, np.inf
    with caplog.at_level(logging.WARNING, logger="tracker"):
        with Study("nan-feeds", feeds={"X": x}, experiment="nan", config=FAST) as study:
            baseline = study.attempt("baseline", model)
            same = study.attempt("same_graph", model)
    assert baseline.diff.passed and same.diff.passed, (baseline.diff, same.diff)
    assert same.verdict != "rejected"
    assert "feeds hold 2 NaN or infinite values (X: 2)" in caplog.text
    exp = store.get_experiment_by_name("nan")
    runs = {r.info.run_name: r.data for r in store.search_runs([exp.experiment_id])}
    for name in ("baseline", "same_graph"):
        assert runs[name].params["feeds.nonfinite"] == "2"
        assert runs[name].metrics["diff.passed"] == 1.0
        assert runs[name].tags["tracker.diff"] == "passed"


@pytest.mark.slow
def test_an_attempt_whose_outputs_hold_nan_where_the_baseline_does_not_is_rejected_and_the_log_says_so(
        store, no_machine, caplog):
    model = make_linear_model(n_features=4)
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    with caplog.at_level(logging.WARNING, logger="tracker"):
        with Study("nan-outputs", feeds={"X": x}, experiment="nan", config=FAST) as study:
            study.attempt("baseline", model)
            broken = study.attempt("nan_bias", _nan_bias(model))
    assert broken.diff.passed is False and broken.diff.nonfinite_mismatches == 3
    assert broken.verdict == "rejected"
    assert "attempt nan_bias: 3 output values are NaN or infinite where the baseline's are not" in caplog.text
    run = mlflow.get_run(broken.run_id)
    assert "feeds.nonfinite" not in run.data.params  # finite feeds: nothing to say
    assert run.data.metrics["diff.nonfinite_mismatches"] == 3.0
    # `tracker compare` says why its max |diff| of the finite positions is not the whole story.
    from tracker.compare import format_table, load_comparison

    table = format_table(load_comparison(study_run_id=study.run.info.run_id))
    (line,) = [line for line in table.splitlines() if "nan_bias" in line]
    assert "FAILED (max" in line and ", 3 NaN/inf on one side only)" in line


# -- item 13: sequences and maps --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def iris():
    from sklearn.datasets import load_iris

    X, y = load_iris(return_X_y=True)
    return X.astype(np.float32), y


def _default_skl2onnx(estimator, X: np.ndarray) -> onnx.ModelProto:
    """Converted as a user would: default options, so zipmap is on."""
    from skl2onnx import to_onnx

    return to_onnx(estimator, X[:1], target_opset=18)


@pytest.fixture(scope="module")
def forests(iris):
    """Outputs of two default-converted random forests on iris: (label, ZipMap probabilities) each."""
    from sklearn.ensemble import RandomForestClassifier

    X, y = iris
    out = {}
    for name, seed in (("a", 0), ("b", 1)):
        forest = RandomForestClassifier(n_estimators=4, max_depth=3, random_state=seed).fit(X, y)
        model = _default_skl2onnx(forest, X)
        out[name] = _run(model, {model.graph.input[0].name: X})
    out["again"] = _run(model, {model.graph.input[0].name: X})
    return out


def test_zipmap_probabilities_become_a_table_in_sorted_class_key_order():
    maps = [{2: 0.1, 0: 0.6, 1: 0.3}, {0: 0.2, 1: 0.2, 2: 0.6}]  # insertion order does not matter
    (part,) = output_parts(maps, 1)
    assert part.keys == (0, 1, 2)
    np.testing.assert_array_equal(part.values, [[0.6, 0.3, 0.1], [0.2, 0.2, 0.6]])


def test_a_default_skl2onnx_forest_against_itself_passes_the_classification_check(forests):
    label, probabilities = forests["again"]
    assert isinstance(probabilities, list) and isinstance(probabilities[0], dict)  # what ORT gives: ZipMap on
    for precision, tolerance in CLASSIFICATION_TOLERANCES.items():
        diff = tolerance.compare(forests["b"], forests["b"])
        assert (diff.passed, diff.top1_agreement, diff.max_prob_diff) == (True, 1.0, 0.0), precision
    assert compare_outputs(forests["b"], forests["b"], EXACT).passed is True


def test_two_forests_differ_by_class_key_and_by_label(forests):
    a, b = forests["a"], forests["b"]
    diff = CLASSIFICATION_TOLERANCES["fp32"].compare(a, b)
    expected_top1 = float(np.mean(a[0] == b[0]))
    probs = [np.array([[row[k] for k in sorted(row)] for row in side[1]]) for side in (a, b)]
    assert diff.top1_agreement == pytest.approx(expected_top1) and expected_top1 < 1
    assert diff.max_prob_diff == pytest.approx(np.abs(probs[0] - probs[1]).max())
    assert diff.passed is False
    raw = compare_outputs(a, b, FP32)
    assert raw.passed is False and raw.max_abs >= diff.max_prob_diff  # the labels count too: 1 apart at least


def test_a_classifier_with_string_labels_is_judged_by_label_and_by_class_name(iris):
    from sklearn.linear_model import LogisticRegression

    X, y = iris
    names = np.array(["setosa", "versicolor", "virginica"])[y]
    classifier = LogisticRegression(max_iter=300).fit(X, names)
    model = _default_skl2onnx(classifier, X)
    outputs = _run(model, {model.graph.input[0].name: X})
    assert output_parts(outputs[1], 1)[0].keys == ("setosa", "versicolor", "virginica")
    nudged = [outputs[0].copy(), [{k: v + (0.01 if k == "virginica" else 0.0) for k, v in row.items()}
                                  for row in outputs[1]]]
    nudged[0][:5] = "virginica"  # five rows of setosa now say virginica
    diff = CLASSIFICATION_TOLERANCES["int8"].compare(outputs, nudged)
    assert diff.top1_agreement == pytest.approx(1 - 5 / len(X))
    assert diff.max_prob_diff == pytest.approx(0.01, rel=1e-3)


def test_maps_whose_class_keys_differ_cannot_be_compared_and_say_which_keys():
    with pytest.raises(ValueError, match=r"output 0: the baseline's class keys \[0, 1\] differ from the "
                                         r"attempt's \[0, 2\]"):
        compare_outputs([[{0: 0.5, 1: 0.5}]], [[{0: 0.5, 2: 0.5}]], FP32)


def _sequence_model() -> onnx.ModelProto:
    """X -> a sequence of two tensors of different shapes, X [N, 3] and its transpose (SequenceConstruct)."""
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 3])
    seq = helper.make_tensor_sequence_value_info("S", TensorProto.FLOAT, None)
    nodes = [helper.make_node("Transpose", ["X"], ["T"]), helper.make_node("SequenceConstruct", ["X", "T"], ["S"])]
    graph = helper.make_graph(nodes, "sequence", [x], [seq])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def test_a_sequence_of_tensors_is_compared_element_by_element():
    x = np.array([[1.0, -2.0, 3.0], [4.0, 5.0, -6.0]], np.float32)
    outputs = _run(_sequence_model(), {"X": x})
    assert [o.shape for o in outputs[0]] == [(2, 3), (3, 2)]
    assert [p.label for p in output_parts(outputs[0], 0)] == ["output 0[0]", "output 0[1]"]
    assert compare_outputs(outputs, _run(_sequence_model(), {"X": x}), EXACT).passed is True
    changed = [[outputs[0][0], outputs[0][1] + 0.5]]
    diff = compare_outputs(outputs, changed, FP32)
    assert (diff.passed, diff.max_abs) == (False, 0.5)
    with pytest.raises(ValueError, match=r"output 0: the baseline's sequence has 2 elements but the attempt's has 1"):
        compare_outputs(outputs, [outputs[0][:1]], FP32)
