"""Tests of tracker.measure.accuracy.output_diff.compare_outputs: tolerances, shapes, non-finite values, dtypes."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from tracker.measure.accuracy.output_diff import EXACT, FP16, FP32, INT8, OutputDiff, Tolerance, compare_outputs


@pytest.fixture
def logits() -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.standard_normal((2, 8)).astype(np.float32), rng.standard_normal((2, 3)).astype(np.float32)]


@pytest.mark.parametrize("tolerance", [EXACT, FP32, FP16, INT8], ids=lambda t: t.name)
def test_identical_outputs_pass_with_zero_error(logits, tolerance):
    diff = compare_outputs(logits, [x.copy() for x in logits], tolerance)
    assert diff.passed is True
    assert (diff.max_abs, diff.max_rel, diff.mean_abs, diff.nonfinite_mismatches) == (0.0, 0.0, 0.0, 0)
    assert diff.tolerance is tolerance


def test_float_noise_passes_fp32_and_fails_exact(logits):
    noisy = [x + np.float32(3e-6) for x in logits]
    fp32 = compare_outputs(logits, noisy, FP32)
    exact = compare_outputs(logits, noisy, EXACT)
    assert fp32.passed is True
    assert exact.passed is False
    assert 0 < fp32.max_abs < 1e-5
    assert fp32.max_abs == exact.max_abs  # the errors do not depend on the tolerance


def test_a_large_error_fails_and_is_returned_not_raised(logits):
    broken = [logits[0] + 0.5, logits[1]]
    diff = compare_outputs(logits, broken, FP32)
    assert isinstance(diff, OutputDiff)
    assert diff.passed is False
    assert diff.max_abs == pytest.approx(0.5, abs=1e-6)
    assert diff.mean_abs == pytest.approx(0.5 * 16 / 22, rel=1e-5)  # 16 of 22 values are off by 0.5
    assert diff.metrics()["diff.passed"] == 0.0


def test_errors_are_measured_against_the_baseline():
    diff = compare_outputs([np.array([2.0, 4.0])], [np.array([3.0, 4.0])], FP32)
    assert diff.max_abs == 1.0
    assert diff.max_rel == 0.5


def test_an_error_within_atol_plus_rtol_times_baseline_passes():
    tol = Tolerance("custom", rtol=0.1, atol=0.5)
    assert compare_outputs([np.array([10.0])], [np.array([11.4])], tol).passed is True
    assert compare_outputs([np.array([10.0])], [np.array([11.6])], tol).passed is False


@pytest.mark.parametrize(
    ("baseline_shape", "attempt_shape"),
    [((2, 3), (3, 2)), ((4,), (4, 1)), ((1, 8), (8,)), ((), (1,))],
    ids=["transposed", "extra-axis", "missing-axis", "scalar-vs-vector"],
)
def test_mismatched_shapes_raise_value_error_naming_both_shapes(baseline_shape, attempt_shape):
    with pytest.raises(ValueError) as info:
        compare_outputs([np.zeros(baseline_shape)], [np.zeros(attempt_shape)], FP32)
    message = str(info.value)
    assert f"baseline shape {baseline_shape}" in message
    assert f"attempt shape {attempt_shape}" in message
    assert "output 0" in message


def test_a_shape_mismatch_in_a_later_output_names_that_output(logits):
    with pytest.raises(ValueError, match=r"output 1: baseline shape \(2, 3\) differs from attempt shape \(3, 2\)"):
        compare_outputs(logits, [logits[0], logits[1].T], FP32)


@pytest.mark.parametrize(("n_baseline", "n_attempt"), [(2, 1), (1, 2), (2, 0)], ids=["fewer", "more", "none"])
def test_mismatched_output_counts_raise_value_error_naming_both_counts(logits, n_baseline, n_attempt):
    baseline = (logits * 2)[:n_baseline]
    attempt = (logits * 2)[:n_attempt]
    with pytest.raises(ValueError, match=rf"baseline has {n_baseline} outputs but the attempt has {n_attempt}"):
        compare_outputs(baseline, attempt, FP32)


@pytest.mark.parametrize(
    ("baseline", "attempt", "mismatches"),
    [
        pytest.param([1.0, 2.0, 3.0], [1.0, np.nan, 3.0], 1, id="nan-in-the-attempt"),
        pytest.param([np.nan, 2.0, 3.0], [1.0, np.nan, 3.0], 2, id="nans-at-different-places"),
        pytest.param([1.0, 2.0, np.nan], [1.0, 2.0, 3.0], 1, id="nan-in-the-baseline"),
        pytest.param([1.0, np.inf, 3.0], [1.0, 2.0, 3.0], 1, id="inf-vs-finite"),
        pytest.param([1.0, np.inf, 3.0], [1.0, -np.inf, 3.0], 1, id="opposite-infinities"),
        pytest.param([1.0, np.inf, 3.0], [1.0, np.nan, 3.0], 1, id="inf-vs-nan"),
    ],
)
@pytest.mark.parametrize("tolerance", [EXACT, FP32, INT8], ids=lambda t: t.name)
def test_nan_or_infinity_on_one_side_only_is_never_called_equal(baseline, attempt, mismatches, tolerance):
    diff = compare_outputs([np.array(baseline, np.float32)], [np.array(attempt, np.float32)], tolerance)
    assert diff.passed is False
    assert diff.nonfinite_mismatches == mismatches
    # The finite positions agree: the non-finite ones do not leak NaN into the error metrics.
    assert (diff.max_abs, diff.max_rel, diff.mean_abs) == (0.0, 0.0, 0.0)


@pytest.mark.parametrize("value", [np.inf, -np.inf], ids=["plus-inf", "minus-inf"])
def test_the_same_infinity_on_both_sides_is_equal(value):
    baseline = [np.array([1.0, value, 3.0], np.float32)]
    diff = compare_outputs(baseline, [baseline[0].copy()], EXACT)
    assert diff.passed is True
    assert diff.nonfinite_mismatches == 0
    assert math.isfinite(diff.max_abs) and math.isfinite(diff.mean_abs)


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.uint8, np.int8])
def test_integer_outputs_compare_exactly_and_report_the_difference(dtype):
    baseline = np.array([[1, 5, 7], [0, 2, 9]], dtype=dtype)
    assert compare_outputs([baseline], [baseline.copy()], EXACT).passed is True
    changed = baseline.copy()
    changed[1, 2] = 8
    diff = compare_outputs([baseline], [changed], EXACT)
    assert diff.passed is False
    assert diff.max_abs == 1.0
    assert diff.max_rel == pytest.approx(1 / 9)


def test_unsigned_outputs_do_not_wrap_around_when_subtracted():
    diff = compare_outputs([np.array([0], np.uint8)], [np.array([255], np.uint8)], EXACT)
    assert diff.max_abs == 255.0


def test_argmax_style_outputs_of_different_int_widths_compare_by_value():
    diff = compare_outputs([np.array([3, 1], np.int64)], [np.array([3, 1], np.int32)], EXACT)
    assert diff.passed is True


def test_bool_outputs_pass_when_equal_and_fail_when_one_flips():
    mask = np.array([True, False, True, True])
    assert compare_outputs([mask], [mask.copy()], EXACT).passed is True
    flipped = mask.copy()
    flipped[1] = True
    diff = compare_outputs([mask], [flipped], FP32)
    assert diff.passed is False
    assert diff.max_abs == 1.0
    assert diff.nonfinite_mismatches == 0


def test_string_outputs_compare_by_equality():
    labels = np.array(["cat", "dog"])
    assert compare_outputs([labels], [labels.copy()], EXACT).passed is True
    diff = compare_outputs([labels], [np.array(["cat", "cow"])], FP32)
    assert diff.passed is False


@pytest.mark.parametrize("error", [1e-6, 1.0, 10.0, 1e6, 3e38],
                         ids=["tiny", "one", "ten", "million", "near-float32-max"])
def test_max_rel_is_finite_when_the_baseline_has_zeros(error):
    baseline = np.array([0.0, 0.0, 2.0], np.float32)
    attempt = np.array([error, 0.0, 2.0], np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no overflow on the way either
        diff = compare_outputs([baseline], [attempt], FP32)
    assert math.isfinite(diff.max_rel)
    assert diff.max_rel > 0
    assert diff.max_abs == pytest.approx(float(np.float32(error)))
    assert diff.passed is (error <= FP32.atol)


def test_a_zero_baseline_with_a_zero_attempt_has_zero_relative_error():
    diff = compare_outputs([np.zeros(4, np.float32)], [np.zeros(4, np.float32)], EXACT)
    assert diff.max_rel == 0.0
    assert diff.passed is True


def test_metrics_and_params_carry_the_result_and_the_tolerance(logits):
    diff = compare_outputs(logits, [x + np.float32(1.0) for x in logits], FP32)
    assert diff.metrics() == {
        "diff.max_abs": diff.max_abs,
        "diff.max_rel": diff.max_rel,
        "diff.mean_abs": diff.mean_abs,
        "diff.nonfinite_mismatches": 0.0,
        "diff.passed": 0.0,
    }
    assert diff.params() == {"diff.tolerance": "fp32", "diff.rtol": "0.0001", "diff.atol": "0.0001"}


@pytest.mark.parametrize(("rtol", "atol"), [(-1e-4, 0.0), (0.0, -1.0)], ids=["negative-rtol", "negative-atol"])
def test_a_negative_tolerance_is_rejected(rtol, atol):
    with pytest.raises(ValueError, match=r"tolerances must be >= 0"):
        Tolerance("bad", rtol=rtol, atol=atol)
