"""Tests of tracker.measure.accuracy.task_diff: the accuracy check of each task (regression, classification, embedding),
on arrays whose answers are known by hand and on a real skl2onnx classifier run in onnxruntime."""

from __future__ import annotations

import copy
import math
import warnings

import numpy as np
import onnxruntime as ort
import pytest

from tests.conftest import FAST_SPEEDUP
from tracker import MeasureConfig, Study, TimingConfig
from tracker.measure.accuracy.lm_diff import LOGITS_TOLERANCES
from tracker.measure.accuracy.output_diff import INT8, TOLERANCES
from tracker.measure.accuracy.task_compare import (
    ClassificationDiff,
    ClassificationTolerance,
    EmbeddingDiff,
    EmbeddingTolerance,
    RegressionDiff,
    RegressionTolerance,
    compare_classification,
    compare_embeddings,
    compare_regression,
)
from tracker.measure.accuracy.task_diff import (
    CLASSIFICATION_TOLERANCES,
    EMBEDDING_TOLERANCES,
    REGRESSION_TOLERANCES,
    TASKS,
    task_tolerances,
)

PRECISIONS = ("fp32", "fp16", "int8", "int4")
RNG = np.random.default_rng(0)
# One set of outputs each task can judge, [batch 2, ...].
SAMPLE = {
    "raw": [RNG.standard_normal((2, 3)).astype(np.float32)],
    "regression": [RNG.standard_normal((2, 1)).astype(np.float32)],
    "classification": [np.array([0, 2]), np.array([[0.7, 0.2, 0.1], [0.1, 0.3, 0.6]], dtype=np.float32)],
    "embedding": [RNG.standard_normal((2, 4, 8)).astype(np.float32)],
    "lm": [RNG.standard_normal((2, 4, 10)).astype(np.float32)],
}
LOOSE_CLASSIFIER = ClassificationTolerance("loose", min_top1=0.0, max_prob_diff=1.0)
ANY_COSINE = EmbeddingTolerance("any", min_cosine=-1.0)


def _with_nan(outputs: list[np.ndarray]) -> list[np.ndarray]:
    changed = [o.copy() for o in outputs]
    last = changed[-1]  # the float output of every sample
    last.reshape(-1)[0] = np.nan
    return changed


# -- every task ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("task", TASKS)
def test_every_task_has_a_check_for_every_precision(task):
    tolerances = task_tolerances(task)
    assert set(tolerances) == set(PRECISIONS)
    assert all(t.name == precision for precision, t in tolerances.items())


def test_raw_is_todays_check_and_lm_the_gpt2_studys():
    assert task_tolerances("raw") == TOLERANCES
    assert task_tolerances("lm") == LOGITS_TOLERANCES


def test_the_tables_are_handed_out_as_copies():
    task_tolerances("embedding").clear()
    assert set(task_tolerances("embedding")) == set(PRECISIONS)


def test_an_unknown_task_names_the_known_ones():
    with pytest.raises(ValueError, match="unknown task 'segmentation'; known tasks: raw, regression, classification"):
        task_tolerances("segmentation")


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("task", TASKS)
def test_identical_outputs_pass_and_carry_the_common_keys(task, precision):
    tolerance = task_tolerances(task)[precision]
    outputs = SAMPLE[task]
    diff = tolerance.compare(outputs, [o.copy() for o in outputs])
    assert diff.passed is True
    assert diff.max_abs == 0.0
    assert {"diff.max_abs", "diff.max_rel", "diff.passed", "diff.nonfinite_mismatches"} <= set(diff.metrics())
    assert diff.metrics()["diff.passed"] == 1.0
    assert diff.params()["diff.tolerance"] == precision


@pytest.mark.parametrize("task", TASKS)
def test_a_nan_fails_every_task_as_data_not_as_an_exception(task):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no RuntimeWarning from NaN arithmetic either
        diff = task_tolerances(task)["int4"].compare(SAMPLE[task], _with_nan(SAMPLE[task]))
    assert diff.passed is False
    assert diff.metrics()["diff.nonfinite_mismatches"] >= 1
    assert diff.metrics()["diff.passed"] == 0.0


@pytest.mark.parametrize("tolerance", [
    pytest.param(lambda: RegressionTolerance("r", max_scaled_error=-1e-3), id="negative scaled error"),
    pytest.param(lambda: RegressionTolerance("r", max_scaled_error=math.nan), id="NaN scaled error"),
    pytest.param(lambda: ClassificationTolerance("c", min_top1=1.5, max_prob_diff=0.1), id="top-1 above 1"),
    pytest.param(lambda: ClassificationTolerance("c", min_top1=0.9, max_prob_diff=-0.1), id="negative prob diff"),
    pytest.param(lambda: EmbeddingTolerance("e", min_cosine=1.01), id="cosine above 1"),
])
def test_bounds_outside_their_range_are_refused(tolerance):
    with pytest.raises(ValueError, match="got"):
        tolerance()


def test_each_task_logs_its_bounds_as_params_and_its_measures_as_metrics():
    regression = REGRESSION_TOLERANCES["int8"].compare(SAMPLE["regression"], SAMPLE["regression"])
    classification = CLASSIFICATION_TOLERANCES["int8"].compare(SAMPLE["classification"], SAMPLE["classification"])
    embedding = EMBEDDING_TOLERANCES["int8"].compare(SAMPLE["embedding"], SAMPLE["embedding"])
    assert isinstance(regression, RegressionDiff)
    assert regression.params() == {"diff.tolerance": "int8", "diff.task": "regression", "diff.max_scaled_error": "0.05"}
    assert regression.metrics()["diff.scaled_error"] == 0.0
    assert isinstance(classification, ClassificationDiff)
    assert classification.params() == {"diff.tolerance": "int8", "diff.task": "classification",
                                       "diff.min_top1": "0.97", "diff.max_prob_diff_bound": "0.05"}
    assert (classification.metrics()["diff.top1_agreement"], classification.metrics()["diff.max_prob_diff"]) == (1, 0)
    assert isinstance(embedding, EmbeddingDiff)
    assert embedding.params() == {"diff.tolerance": "int8", "diff.task": "embedding", "diff.min_cosine": "0.99"}
    assert (embedding.metrics()["diff.cosine_min"], embedding.metrics()["diff.cosine_mean"]) == pytest.approx((1, 1))


def test_outputs_that_cannot_be_compared_are_an_error():
    with pytest.raises(ValueError, match="baseline has 1 outputs but the attempt has 2"):
        compare_embeddings(SAMPLE["embedding"], SAMPLE["embedding"] * 2, ANY_COSINE)


# -- regression ------------------------------------------------------------------------------------------------


def test_the_scaled_error_is_the_largest_error_over_the_largest_prediction():
    base = np.array([[100.0], [-50.0], [1.0]])
    diff = compare_regression([base], [base + [[0.0], [0.5], [0.0]]], REGRESSION_TOLERANCES["int8"])
    assert diff.scaled_error == pytest.approx(0.5 / 100)
    assert diff.max_abs == pytest.approx(0.5)


def test_each_target_is_scaled_by_its_own_predictions():
    base = np.array([[1000.0, 1.0], [-800.0, 0.5]])
    other = base + [[0.0, 0.01], [0.0, 0.0]]
    assert compare_regression([base], [other], REGRESSION_TOLERANCES["int8"]).scaled_error == pytest.approx(0.01)


def test_a_target_near_zero_is_judged_on_its_scale_not_per_element():
    base = np.array([10.0, 1e-9, -10.0])
    other = base + [0.0, 0.01, 0.0]  # per element this is 1e7 times the prediction
    diff = compare_regression([base], [other], REGRESSION_TOLERANCES["fp16"])
    assert diff.scaled_error == pytest.approx(1e-3)
    assert diff.passed and diff.outputs.max_rel > 1e6


@pytest.mark.parametrize(("other", "passed"), [(np.zeros(3), True), (np.array([0.0, 1e-30, 0.0]), False)],
                         ids=["zero stays zero", "any change of a zero target"])
def test_an_all_zero_target_passes_only_when_the_attempt_is_zero_too(other, passed):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        diff = compare_regression([np.zeros(3)], [other], REGRESSION_TOLERANCES["int4"])
    assert diff.passed is passed
    assert math.isfinite(diff.scaled_error)


def test_the_predictions_are_the_first_floating_point_output():
    ids = np.array([1, 2])
    base = np.array([1.0, 2.0])
    diff = compare_regression([ids, base], [ids, base * 1.02], REGRESSION_TOLERANCES["int8"])
    assert diff.scaled_error == pytest.approx(0.02)


@pytest.fixture(scope="module")
def linear_regression():
    from skl2onnx import to_onnx
    from sklearn.linear_model import LinearRegression

    X = RNG.standard_normal((64, 5)).astype(np.float32)
    model = LinearRegression(fit_intercept=False).fit(X, X @ np.arange(1.0, 6.0))
    changed = copy.deepcopy(model)
    changed.coef_ = model.coef_ * 1.02  # every prediction 2% larger
    return [_run(to_onnx(m, X[:1]), X) for m in (model, changed)]


def test_a_real_regression_two_percent_off_fails_fp16_and_passes_int8(linear_regression):
    base, changed = linear_regression
    assert REGRESSION_TOLERANCES["fp32"].compare(base, base).passed
    fp16, int8 = (REGRESSION_TOLERANCES[p].compare(base, changed) for p in ("fp16", "int8"))
    assert fp16.scaled_error == pytest.approx(0.02, rel=1e-3)
    assert (fp16.passed, int8.passed) == (False, True)


# -- classification --------------------------------------------------------------------------------------------


def _run(model, X: np.ndarray) -> list:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: X})


@pytest.fixture(scope="module")
def classifiers():
    """A scaler + logistic regression pipeline on 4 classes, converted without zipmap, and changed copies."""
    from skl2onnx import to_onnx
    from sklearn.datasets import make_classification
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    X, y = make_classification(200, 6, n_informative=4, n_classes=4, random_state=0)
    X = X.astype(np.float32)
    pipeline = make_pipeline(StandardScaler(), LogisticRegression(max_iter=500)).fit(X, y)

    def convert(p, zipmap=False):
        return to_onnx(p, X[:1], options={id(p.steps[-1][1]): {"zipmap": zipmap}})

    shuffled = copy.deepcopy(pipeline)  # the class order of the weights rotated: other classes predicted
    order = [1, 2, 3, 0]
    shuffled[-1].coef_, shuffled[-1].intercept_ = pipeline[-1].coef_[order], pipeline[-1].intercept_[order]
    nudged = copy.deepcopy(pipeline)  # the size of an int8 rounding of the weights
    nudged[-1].coef_ = pipeline[-1].coef_ + RNG.normal(0, 2e-3, pipeline[-1].coef_.shape)
    return {
        "X": X,
        "baseline": _run(convert(pipeline), X),
        "again": _run(convert(pipeline), X),  # a second conversion, in a session of its own
        "shuffled": _run(convert(shuffled), X),
        "nudged": _run(convert(nudged), X),
        "zipmap": _run(convert(pipeline, zipmap=True), X),
    }


def test_a_real_classifier_against_itself_agrees_everywhere(classifiers):
    base = classifiers["baseline"]
    assert [o.dtype.kind for o in base] == ["i", "f"]  # label, probabilities
    for precision in PRECISIONS:
        diff = CLASSIFICATION_TOLERANCES[precision].compare(base, classifiers["again"])
        assert (diff.passed, diff.top1_agreement, diff.max_prob_diff) == (True, 1.0, 0.0)


def test_a_real_classifier_with_its_classes_shuffled_fails_every_precision(classifiers):
    base, shuffled = classifiers["baseline"], classifiers["shuffled"]
    for precision in PRECISIONS:
        diff = CLASSIFICATION_TOLERANCES[precision].compare(base, shuffled)
        assert diff.passed is False
    assert diff.top1_agreement < 0.5
    assert diff.max_prob_diff > 0.5


def test_a_real_classifier_nudged_like_int8_fails_fp32_and_passes_int8(classifiers):
    fp32, int8 = (CLASSIFICATION_TOLERANCES[p].compare(classifiers["baseline"], classifiers["nudged"])
                  for p in ("fp32", "int8"))
    assert 1e-4 < int8.max_prob_diff < 5e-2, int8.metrics()
    assert (fp32.passed, int8.passed) == (False, True)


def test_a_classifier_with_zipmap_on_is_judged_like_the_same_one_without(classifiers):
    with_maps = CLASSIFICATION_TOLERANCES["fp32"].compare(classifiers["zipmap"], classifiers["zipmap"])
    assert (with_maps.passed, with_maps.top1_agreement, with_maps.max_prob_diff) == (True, 1.0, 0.0)
    nudged = [classifiers["nudged"][0], [dict(enumerate(row)) for row in classifiers["nudged"][1]]]
    with_maps, without = (CLASSIFICATION_TOLERANCES["int8"].compare(base, other) for base, other in (
        (classifiers["zipmap"], nudged), (classifiers["baseline"], classifiers["nudged"])))
    assert with_maps.top1_agreement == without.top1_agreement
    assert with_maps.max_prob_diff == pytest.approx(without.max_prob_diff, abs=1e-7)


def test_top1_agreement_is_the_share_of_rows_whose_label_agrees():
    probs = np.array([[0.9, 0.1], [0.8, 0.2], [0.3, 0.7], [0.4, 0.6]])
    labels = np.array([0, 0, 1, 1])
    diff = compare_classification([labels, probs], [np.array([0, 1, 1, 1]), probs], LOOSE_CLASSIFIER)
    assert diff.top1_agreement == 0.75  # the label decides, even where the scores agree
    assert diff.max_prob_diff == 0.0


def test_string_labels_are_labels_too():
    probs = np.array([[0.9, 0.1], [0.2, 0.8]])
    base = [np.array(["cat", "dog"], dtype=object), probs]
    other = [np.array(["cat", "cat"], dtype=object), probs]
    assert compare_classification(base, other, LOOSE_CLASSIFIER).top1_agreement == 0.5


def test_scores_that_are_not_probabilities_are_compared_after_a_softmax():
    # softmax([0, 1]) = (1 - s, s) with s = 1 / (1 + e^-1) = 0.7311
    base = np.array([[2.0, 0.0], [0.0, 1.0]])
    other = np.array([[2.0, 0.0], [1.0, 0.0]])
    diff = compare_classification([base], [other], LOOSE_CLASSIFIER)
    assert diff.top1_agreement == 0.5  # no label output: the argmax
    assert diff.max_prob_diff == pytest.approx(2 / (1 + math.exp(-1)) - 1)


def test_rows_of_scores_over_batch_and_sequence_are_each_one_prediction():
    base = np.zeros((2, 3, 4), dtype=np.float32)
    base[..., 0] = 1.0
    other = base.copy()
    other[1, 2] = [0.0, 1.0, 0.0, 0.0]
    assert compare_classification([base], [other], LOOSE_CLASSIFIER).top1_agreement == pytest.approx(5 / 6)


def test_a_model_without_class_scores_cannot_be_judged_as_a_classifier():
    with pytest.raises(ValueError, match=r"class scores \[..., C\] with C >= 2; the outputs are float64\[3, 1\]"):
        compare_classification([np.ones((3, 1))], [np.ones((3, 1))], LOOSE_CLASSIFIER)


# -- embedding -------------------------------------------------------------------------------------------------


def _rotated(angles: list[float]) -> tuple[np.ndarray, np.ndarray]:
    """Unit rows along x, and the same rows turned by each angle (radians) in the x-y plane."""
    base = np.zeros((len(angles), 4))
    base[:, 0] = 1.0
    turned = np.zeros_like(base)
    turned[:, 0], turned[:, 1] = np.cos(angles), np.sin(angles)
    return base, turned


def test_the_cosine_of_each_row_is_that_of_its_angle():
    base, turned = _rotated([0.0, 0.05, 0.2])
    diff = compare_embeddings([base], [turned], ANY_COSINE)
    assert diff.cosine_min == pytest.approx(math.cos(0.2))
    assert diff.cosine_mean == pytest.approx((1 + math.cos(0.05) + math.cos(0.2)) / 3)


@pytest.mark.parametrize(("precision", "passed"), [("fp16", False), ("int8", True), ("int4", True)])
def test_a_turn_of_a_tenth_of_a_radian_passes_int8_and_not_fp16(precision, passed):
    base, turned = _rotated([0.1])  # cosine 0.995
    assert compare_embeddings([base], [turned], EMBEDDING_TOLERANCES[precision]).passed is passed


def test_a_scaled_vector_points_the_same_way():
    base = RNG.standard_normal((3, 16))
    diff = compare_embeddings([base], [3.0 * base], EMBEDDING_TOLERANCES["fp32"])
    assert diff.passed and diff.cosine_min == pytest.approx(1.0)
    assert not INT8.compare([base], [3.0 * base]).passed


def test_per_token_outputs_are_mean_pooled_over_the_sequence_first():
    base = np.array([[[1.0, 0.0], [0.0, 1.0]]])  # pooled: (0.5, 0.5)
    swapped = base[:, ::-1]  # the same tokens in the other order pool the same
    tilted = np.array([[[1.0, 0.0], [1.0, 1.0]]])  # pooled: (1, 0.5), at cos = 1.5 / (sqrt(0.5) sqrt(1.25))
    assert compare_embeddings([base], [swapped], EMBEDDING_TOLERANCES["fp32"]).cosine_min == pytest.approx(1.0)
    assert compare_embeddings([base], [tilted], ANY_COSINE).cosine_min == pytest.approx(
        0.75 / math.sqrt(0.5 * 1.25))


def test_an_int8_like_attempt_with_a_large_raw_diff_passes_by_cosine_and_fails_raw():
    rng = np.random.default_rng(7)
    base = rng.standard_normal((2, 32, 384)).astype(np.float32)  # [batch, seq, hidden] states
    attempt = base + rng.normal(0, 0.1, base.shape).astype(np.float32)  # pooled: cosine ~ 1 / sqrt(1 + 0.01)
    near_zero = np.unravel_index(np.argsort(np.abs(base), axis=None)[:5], base.shape)
    attempt[near_zero] = base[near_zero] + 0.93  # a few outliers, as int8 of a real encoder gives
    raw = INT8.compare([base], [attempt])
    by_cosine = EMBEDDING_TOLERANCES["int8"].compare([base], [attempt])
    assert raw.max_abs == pytest.approx(0.93, abs=1e-3) and raw.passed is False
    assert by_cosine.max_abs == raw.max_abs
    assert 0.99 < by_cosine.cosine_min < 0.999 and by_cosine.passed is True


@pytest.mark.parametrize(("other", "cosine"), [(np.zeros(3), 1.0), (np.ones(3), 0.0)],
                         ids=["both zero", "one zero"])
def test_a_zero_vector_has_cosine_one_with_zero_and_zero_with_anything_else(other, cosine):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert compare_embeddings([np.zeros((1, 3))], [other[None]], ANY_COSINE).cosine_min == cosine


def test_a_row_with_nan_counts_as_opposite_and_identical_infinities_as_equal():
    base = np.array([[1.0, 2.0], [np.inf, 1.0], [1.0, 1.0]])
    other = base.copy()
    other[2, 0] = np.nan
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        diff = compare_embeddings([base], [other], ANY_COSINE)
    assert (diff.cosine_min, diff.cosine_mean) == (-1.0, pytest.approx(1 / 3))
    assert diff.nonfinite_mismatches == 1 and diff.passed is False


def test_huge_vectors_do_not_overflow_the_cosine():
    base = np.array([[1e200, 2e200], [3e-200, 1e-200]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert compare_embeddings([base], [base.copy()], EMBEDDING_TOLERANCES["fp32"]).cosine_min == pytest.approx(1.0)


def test_the_embedding_is_the_first_floating_point_output():
    ids = np.array([[1, 2]])
    base, turned = _rotated([0.3])
    assert compare_embeddings([ids, base], [ids, turned], ANY_COSINE).cosine_min == pytest.approx(math.cos(0.3))


def test_an_output_of_four_axes_is_not_an_embedding():
    x = np.ones((1, 2, 3, 4))
    with pytest.raises(ValueError, match=r"output 0 has shape \[1, 2, 3, 4\]"):
        compare_embeddings([x], [x], ANY_COSINE)


# -- in a study ------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_study_logs_the_task_check_and_rejects_by_it(store):
    from skl2onnx import to_onnx
    from sklearn.datasets import make_classification
    from sklearn.linear_model import LogisticRegression

    X, y = make_classification(40, 4, n_informative=3, n_redundant=0, n_classes=3, random_state=1)
    X = X.astype(np.float32)
    clf = LogisticRegression(max_iter=300).fit(X, y)
    shuffled = copy.deepcopy(clf)
    shuffled.coef_, shuffled.intercept_ = clf.coef_[[2, 0, 1]], clf.intercept_[[2, 0, 1]]
    model, changed = (to_onnx(c, X[:1], options={id(c): {"zipmap": False}}) for c in (clf, shuffled))
    config = MeasureConfig(profile_runs=2, speedup=FAST_SPEEDUP,
                           timing=TimingConfig(warmup_runs=1, min_runs=3, min_seconds=0.0))
    tolerance = CLASSIFICATION_TOLERANCES["int8"]
    with Study("task", feeds={"X": X}, experiment="task", config=config) as study:
        study.attempt("baseline", model, tolerance=tolerance)
        result = study.attempt("shuffled", changed, tolerance=tolerance)
    assert result.verdict == "rejected"
    exp = store.get_experiment_by_name("task")
    runs = {r.info.run_name: r.data for r in store.search_runs([exp.experiment_id])}
    for name, passed in (("baseline", 1.0), ("shuffled", 0.0)):
        assert runs[name].metrics["diff.passed"] == passed
        assert {"diff.max_abs", "diff.max_rel", "diff.top1_agreement", "diff.max_prob_diff"} <= set(runs[name].metrics)
        assert runs[name].params["diff.task"] == "classification"
        assert runs[name].params["diff.min_top1"] == "0.97"
    assert runs["shuffled"].metrics["diff.top1_agreement"] < 0.97
    assert runs["shuffled"].tags["tracker.diff"] == "failed"
