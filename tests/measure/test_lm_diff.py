"""Tests of tracker.measure.accuracy.lm_diff: top-1 agreement, next-token KL divergence and the pass/fail bounds,
on small logits whose answers are known by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tracker.measure.accuracy.lm_diff import (
    LOGITS_FP16,
    LOGITS_FP32,
    LOGITS_INT8,
    LogitsDiff,
    LogitsTolerance,
    compare_logits,
)

LOOSE = LogitsTolerance("loose", max_abs=10.0, min_top1=0.0, max_kl=10.0)

# batch 1, 4 positions, vocabulary of 4: the argmax tokens are 0, 1, 3, 0
LOGITS = np.array([[[3.0, 1.0, 0.0, 0.0], [0.0, 2.0, 1.0, 0.0], [0.0, 0.0, 0.0, 5.0], [1.0, 0.0, 0.0, 0.0]]])


def _one_token_flipped() -> np.ndarray:
    flipped = LOGITS.copy()
    flipped[0, 1] = [0.0, 1.0, 2.0, 0.0]  # position 1 now picks token 2, not 1
    return flipped


@pytest.mark.parametrize("tolerance", [LOGITS_FP32, LOGITS_FP16, LOGITS_INT8], ids=lambda t: t.name)
def test_identical_logits_agree_everywhere_and_pass(tolerance):
    diff = compare_logits([LOGITS], [LOGITS.copy()], tolerance)
    assert (diff.top1_agreement, diff.kl_divergence, diff.max_abs) == (1.0, 0.0, 0.0)
    assert diff.passed is True
    assert diff.tolerance is tolerance


def test_top1_agreement_is_the_share_of_positions_whose_argmax_token_agrees():
    diff = compare_logits([LOGITS], [_one_token_flipped()], LOOSE)
    assert diff.top1_agreement == 0.75  # 3 of 4 positions


def test_top1_agreement_counts_positions_over_batch_and_sequence():
    base = np.zeros((2, 3, 5))
    base[..., 4] = 1.0  # every position picks token 4
    other = base.copy()
    other[1, 2] = [0.0, 2.0, 0.0, 0.0, 1.0]  # one of 6 positions picks token 1
    assert compare_logits([base], [other], LOOSE).top1_agreement == pytest.approx(5 / 6)


def test_a_flipped_token_fails_a_tolerance_that_wants_every_token_to_agree():
    strict_top1 = LogitsTolerance("top1", max_abs=10.0, min_top1=1.0, max_kl=10.0)
    assert compare_logits([LOGITS], [_one_token_flipped()], strict_top1).passed is False
    assert compare_logits([LOGITS], [_one_token_flipped()], LOOSE).passed is True


def test_kl_divergence_is_that_of_the_next_token_distributions():
    # softmax([0, 0]) = (1/2, 1/2); softmax([ln 3, 0]) = (3/4, 1/4): KL = 1/2 ln(2/3) + 1/2 ln 2 = 1/2 ln(4/3)
    base = np.array([[0.0, 0.0]])
    other = np.array([[math.log(3.0), 0.0]])
    diff = compare_logits([base], [other], LOOSE)
    assert diff.kl_divergence == pytest.approx(0.5 * math.log(4 / 3), rel=1e-12)
    assert diff.top1_agreement == 1.0  # token 0 in both (argmax takes the first of a tie)


def test_kl_divergence_is_averaged_over_positions():
    base = np.array([[0.0, 0.0], [0.0, 0.0]])
    other = np.array([[math.log(3.0), 0.0], [0.0, 0.0]])  # only the first position differs
    assert compare_logits([base], [other], LOOSE).kl_divergence == pytest.approx(0.25 * math.log(4 / 3), rel=1e-12)


def test_a_changed_next_token_distribution_fails_on_kl_alone():
    base = np.array([[0.0, 0.0]])
    other = np.array([[math.log(3.0), 0.0]])  # KL 0.144, max_abs 1.1, same top-1 token
    diff = compare_logits([base], [other], LOGITS_INT8)
    assert diff.max_abs <= LOGITS_INT8.max_abs and diff.top1_agreement >= LOGITS_INT8.min_top1
    assert diff.kl_divergence > LOGITS_INT8.max_kl
    assert diff.passed is False
    assert compare_logits([base], [other], LogitsTolerance("kl", max_abs=2.0, min_top1=1.0, max_kl=0.2)).passed


def test_a_uniform_shift_keeps_the_next_token_distribution_and_is_judged_by_max_abs():
    shifted = LOGITS + 0.01  # softmax is unchanged by adding a constant to every logit of a position
    fp16 = compare_logits([LOGITS], [shifted], LOGITS_FP16)
    fp32 = compare_logits([LOGITS], [shifted], LOGITS_FP32)
    assert fp16.kl_divergence == pytest.approx(0.0, abs=1e-15)
    assert fp16.top1_agreement == 1.0
    assert fp16.max_abs == pytest.approx(0.01, rel=1e-9)
    assert fp16.passed is True  # 0.01 <= 5e-2
    assert fp32.passed is False  # 0.01 > 1e-3


def test_other_outputs_than_the_logits_count_for_max_abs_only():
    cache = np.ones((2, 3))
    diff = compare_logits([LOGITS, cache], [LOGITS.copy(), cache + 0.5], LogitsTolerance("t", 0.1, 1.0, 0.0))
    assert (diff.top1_agreement, diff.kl_divergence) == (1.0, 0.0)
    assert diff.max_abs == 0.5
    assert diff.passed is False


def test_a_nan_logit_fails_even_loose_bounds():
    broken = LOGITS.copy()
    broken[0, 2, 3] = np.nan
    diff = compare_logits([LOGITS], [broken], LOOSE)
    assert diff.outputs.nonfinite_mismatches == 1
    assert diff.passed is False


def test_outputs_of_different_shapes_raise():
    with pytest.raises(ValueError, match="shape"):
        compare_logits([LOGITS], [LOGITS[:, :2]], LOOSE)


def test_tolerance_compare_is_compare_logits_with_its_bounds():
    by_method = LOGITS_FP16.compare([LOGITS], [_one_token_flipped()])
    assert by_method == compare_logits([LOGITS], [_one_token_flipped()], LOGITS_FP16)
    assert isinstance(by_method, LogitsDiff)


def test_metrics_and_params_carry_the_lm_checks_and_the_bounds():
    diff = compare_logits([LOGITS], [_one_token_flipped()], LOGITS_INT8)
    metrics = diff.metrics()
    assert metrics["diff.top1_agreement"] == 0.75
    assert metrics["diff.kl_divergence"] == diff.kl_divergence > 0
    assert metrics["diff.passed"] == 0.0  # 0.75 < min_top1 0.85
    assert diff.params() == {"diff.tolerance": "int8", "diff.max_abs_bound": "2.0", "diff.min_top1": "0.85",
                             "diff.max_kl": "0.05"}


@pytest.mark.parametrize(
    "bounds",
    [
        pytest.param({"max_abs": -1.0, "min_top1": 0.9, "max_kl": 0.1}, id="negative max_abs"),
        pytest.param({"max_abs": 1.0, "min_top1": 1.5, "max_kl": 0.1}, id="min_top1 above 1"),
        pytest.param({"max_abs": 1.0, "min_top1": -0.1, "max_kl": 0.1}, id="negative min_top1"),
        pytest.param({"max_abs": 1.0, "min_top1": 0.9, "max_kl": -0.1}, id="negative max_kl"),
    ],
)
def test_bounds_out_of_range_are_refused(bounds):
    with pytest.raises(ValueError, match="need max_abs >= 0"):
        LogitsTolerance("bad", **bounds)
