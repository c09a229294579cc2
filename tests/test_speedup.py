"""Speed-up in rounds of fresh sessions: the interval over rounds, the detectable change, the verdict."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tracker.speedup import (
    MIN_EFFECT,
    Round,
    Speedup,
    SpeedupConfig,
    describe,
    estimate_speedup,
    time_in_rounds,
    verdict,
)


def rounds(attempt_median: float, *, n_rounds: int = 5, pairs: int = 50, noise: float = 0.05, seed: int = 0) -> list[Round]:
    """Block times of a baseline (median 1 s) and an attempt, with multiplicative noise on each block."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n_rounds):
        base = np.exp(noise * rng.standard_normal(pairs))
        attempt = attempt_median * np.exp(noise * rng.standard_normal(pairs))
        out.append(Round(base, attempt, calls_per_block=1, other_load=0.0))
    return out


@pytest.mark.parametrize(
    ("attempt_median", "expected"),
    [(0.5, "better"), (2.0, "worse"), (1.0, "inconclusive")],
    ids=["twice-as-fast", "twice-as-slow", "same"],
)
def test_the_verdict_follows_the_interval(attempt_median, expected):
    result = estimate_speedup(rounds(attempt_median))
    assert result.ci_low <= result.speedup <= result.ci_high
    assert result.speedup == pytest.approx(1.0 / attempt_median, rel=0.05)
    assert result.verdict == expected
    assert verdict(result, accuracy_passed=True) == expected
    assert (result.rounds, result.pairs) == (5, 250)


def test_a_one_percent_change_is_inconclusive_however_narrow_its_interval():
    result = estimate_speedup(rounds(0.99, pairs=2000, noise=0.001))
    assert result.ci_low > 1.0  # significant...
    assert result.verdict == "inconclusive"  # ...but below the 2 % worth calling a change


def test_the_interval_is_as_wide_as_the_spread_between_rounds_not_within_them():
    # Each round alone is very precise, but the rounds disagree (a session-to-session effect of +-3 %):
    # the interval must count that disagreement, or an A/A pair would read "significant".
    shifts = [1.03, 0.97, 1.02, 0.98, 1.0]
    spread = [Round(np.ones(500), np.full(500, s), 1, 0.0) for s in shifts]
    result = estimate_speedup(spread)
    assert result.ci_low < 1.0 < result.ci_high
    assert result.ci_high / result.ci_low > 1.04
    assert result.verdict == "inconclusive"


def test_the_detectable_change_shrinks_with_less_noise_and_never_drops_below_the_min_effect():
    noisy = estimate_speedup(rounds(1.0, noise=0.5, pairs=9))
    quiet = estimate_speedup(rounds(1.0, noise=0.005))
    assert noisy.mde > quiet.mde
    assert quiet.mde == MIN_EFFECT
    half_width = math.log(noisy.ci_high / noisy.speedup)
    assert math.log1p(noisy.mde) > half_width  # 80 % power needs more than the interval's half-width


def test_a_failed_accuracy_check_rejects_whatever_the_speed():
    fast = Speedup(3.0, 2.5, 3.5, 0.95, 100)
    assert verdict(fast, accuracy_passed=False) == "rejected"


@pytest.mark.parametrize(
    "bad",
    [
        [Round(np.ones(10), np.ones(9), 1, 0.0)] * 3,
        [Round(np.ones(10), np.ones(10), 1, 0.0)] * 2,
        [Round(np.ones(10), np.zeros(10), 1, 0.0)] * 3,
    ],
    ids=["unpaired", "too-few-rounds", "zero-times"],
)
def test_samples_that_cannot_give_an_interval_are_refused(bad):
    with pytest.raises(ValueError):
        estimate_speedup(bad)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"rounds": 2}, "rounds must be >= 3"), ({"confidence": 1.0}, "confidence"), ({"min_pairs": 0}, "min_pairs")],
)
def test_a_config_that_cannot_work_is_refused_with_what_was_expected(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SpeedupConfig(**kwargs)


def test_rounds_make_fresh_sessions_in_alternating_order_and_alternate_the_blocks():
    calls: list[str] = []

    def maker(name: str):
        def make():
            calls.append(f"new {name}")
            return lambda: calls.append(name)
        return make

    config = SpeedupConfig(rounds=3, seconds=0.0, min_pairs=2, block_ms=0.0, warmup_runs=1)
    timed = time_in_rounds(maker("B"), maker("A"), config)
    assert [r.baseline_s.size for r in timed] == [2, 2, 2]
    # round 1: baseline made first; round 2: attempt first; round 3: baseline first again. Each round:
    # warm-up (B A), one calibration call each (B A), then blocks B A, A B.
    assert " ".join(calls) == " ".join([
        "new B", "new A", "B A", "B A", "B A A B",
        "new A", "new B", "B A", "B A", "B A A B",
        "new B", "new A", "B A", "B A", "B A A B",
    ])


def test_a_microsecond_function_is_timed_in_blocks_and_gets_an_interval_of_real_width():
    # Two identical calls of a few microseconds tie at the timer's resolution one by one; in blocks
    # of >= 2 ms they do not, and the A/A interval has a width and contains 1.
    x = np.ones(16)
    config = SpeedupConfig(rounds=5, seconds=0.5, block_ms=2.0)
    timed = time_in_rounds(lambda: lambda: x.sum(), lambda: lambda: x.sum(), config)
    assert min(r.calls_per_block for r in timed) > 20
    result = estimate_speedup(timed)
    assert result.ci_high > result.ci_low
    assert result.verdict == "inconclusive"


@pytest.mark.parametrize(
    ("speedup", "mde", "verdict_", "expected"),
    [
        (1.004, 0.031, "inconclusive", "0.4% faster: below the 3.1% this measurement could detect"),
        (0.99, 0.001, "inconclusive", "1.0% slower: below the 2.0% this measurement"),
        (1.5, 0.02, "better", "50.0% faster, beyond the noise"),
        (1.0, None, "baseline", ""),
    ],
)
def test_a_verdict_is_explained_in_plain_words(speedup, mde, verdict_, expected):
    assert describe(speedup, mde, verdict_).startswith(expected)
