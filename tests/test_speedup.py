"""Speed-up with a bootstrap interval, and the verdict it gives."""

from __future__ import annotations

import numpy as np
import pytest

from tracker.latency import TimingConfig
from tracker.speedup import Speedup, estimate_speedup, time_interleaved, verdict


def samples(median_s: float, n: int, seed: int, noise: float = 0.05) -> np.ndarray:
    return median_s * (1 + noise * np.random.default_rng(seed).standard_normal(n))


@pytest.mark.parametrize(
    ("attempt_median", "expected"),
    [(0.5, "better"), (2.0, "worse"), (1.0, "inconclusive")],
    ids=["twice-as-fast", "twice-as-slow", "same"],
)
def test_the_verdict_follows_the_interval(attempt_median, expected):
    result = estimate_speedup(samples(1.0, 200, 0), samples(attempt_median, 200, 1))
    assert result.ci_low <= result.speedup <= result.ci_high
    assert result.speedup == pytest.approx(1.0 / attempt_median, rel=0.05)
    assert result.verdict == expected
    assert verdict(result, accuracy_passed=True) == expected


def test_a_one_percent_change_is_inconclusive_however_narrow_its_interval():
    result = estimate_speedup(samples(1.0, 20_000, 0, noise=0.001), samples(0.99, 20_000, 1, noise=0.001))
    assert result.ci_low > 1.0  # significant...
    assert result.verdict == "inconclusive"  # ...but below the 2 % worth calling a change


def test_a_noisy_small_gain_is_inconclusive():
    result = estimate_speedup(samples(1.0, 12, 0, noise=0.5), samples(0.9, 12, 1, noise=0.5))
    assert result.ci_low < 1.0 < result.ci_high
    assert result.verdict == "inconclusive"


def test_a_failed_accuracy_check_rejects_whatever_the_speed():
    fast = Speedup(3.0, 2.5, 3.5, 0.95, 100)
    assert verdict(fast, accuracy_passed=False) == "rejected"


@pytest.mark.parametrize("bad", [(np.ones(10), np.ones(9)), (np.ones(3), np.ones(3))], ids=["unpaired", "too-few"])
def test_samples_that_cannot_give_an_interval_are_refused(bad):
    with pytest.raises(ValueError):
        estimate_speedup(*bad)


def test_interleaved_timing_alternates_which_runs_first():
    calls = []
    base, attempt = time_interleaved(
        lambda: calls.append("B"), lambda: calls.append("A"),
        TimingConfig(warmup_runs=1, min_runs=4, min_seconds=0.0),
    )
    assert len(base) == len(attempt) == 4
    assert "".join(calls) == "BA" + "BA" + "AB" + "BA" + "AB"  # warm-up, then alternating pairs
