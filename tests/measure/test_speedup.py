"""Speed-up in rounds of fresh sessions: the interval over rounds, the detectable change, the verdict."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from tracker.base.vocabulary import Verdict
from tracker.measure.timing.interval import MIN_EFFECT, SYSTEMATIC_SE, Round, Speedup, estimate_speedup
from tracker.measure.timing.speedup import SpeedupConfig, describe, judge, time_in_rounds


def rounds(attempt_median: float, *, n_rounds: int = 6, pairs: int = 50, noise: float = 0.05, seed: int = 0,
           first_made_slower: float = 1.0) -> list[Round]:
    """Block times of a baseline (median 1 s) and an attempt, with multiplicative noise on each block;
    the orders alternate, and the session made first runs `first_made_slower` times slower."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n_rounds):
        attempt_first = i % 2 == 1
        base = np.exp(noise * rng.standard_normal(pairs)) * (1.0 if attempt_first else first_made_slower)
        attempt = attempt_median * np.exp(noise * rng.standard_normal(pairs)) * (
            first_made_slower if attempt_first else 1.0)
        out.append(Round(base, attempt, attempt_first=attempt_first))
    return out


@pytest.mark.parametrize(
    ("attempt_median", "expected"),
    [(0.5, "better"), (2.0, "worse"), (1.0, "same")],
    ids=["twice-as-fast", "twice-as-slow", "same"],
)
def test_the_verdict_follows_the_interval(attempt_median, expected):
    result = estimate_speedup(rounds(attempt_median))
    assert result.ci_low <= result.speedup <= result.ci_high
    assert result.speedup == pytest.approx(1.0 / attempt_median, rel=0.05)
    assert result.interval_verdict == expected
    assert judge(result, accuracy_passed=True) == expected
    assert (result.rounds, result.pairs) == (6, 300)


def test_a_one_and_a_half_percent_change_is_not_better_however_narrow_its_interval():
    result = estimate_speedup(rounds(0.985, pairs=2000, noise=0.001))
    assert result.ci_low > 1.0  # significant...
    assert result.interval_verdict == "same"  # ...but below the 2 % worth calling a change, and surely under 5 %


def test_no_interval_is_narrower_than_what_the_rounds_cannot_see():
    # rounds that agree to the last digit still leave the error they all share (SYSTEMATIC_SE)
    result = estimate_speedup([Round(np.ones(10), np.ones(10), attempt_first=i % 2 == 1) for i in range(20)])
    assert result.speedup == 1.0
    assert result.ci_high == pytest.approx(math.exp(stats.t.ppf(0.975, 18) * SYSTEMATIC_SE))
    assert result.ci_low < 0.99 < 1.01 < result.ci_high


def test_a_change_inside_the_interval_but_below_what_could_be_detected_is_not_called():
    # noisy rounds: the 95 % interval excludes 1, the change is 5 %, yet the measurement could only
    # detect more than that: calling it would be a coin toss an A/A pair loses 2-5 % of the time
    result = estimate_speedup([Round(np.ones(5), np.full(5, a)) for a in (0.9, 0.99, 0.95, 0.98, 0.94, 0.97)])
    assert result.ci_low > 1.0 and result.speedup < 1.0 + result.mde
    assert result.interval_verdict == "inconclusive"


def test_the_interval_is_as_wide_as_the_spread_between_rounds_not_within_them():
    # Each round alone is very precise, but the rounds disagree (a session-to-session effect of +-3 %):
    # the interval must count that disagreement, or an A/A pair would read "significant".
    shifts = [1.03, 0.97, 1.02, 0.98, 1.0, 1.01]
    spread = [Round(np.ones(500), np.full(500, s), attempt_first=i % 2 == 1) for i, s in enumerate(shifts)]
    result = estimate_speedup(spread)
    assert result.ci_low < 1.0 < result.ci_high
    assert result.ci_high / result.ci_low > 1.04
    assert result.interval_verdict in ("same", "inconclusive")


def test_which_session_is_made_first_neither_biases_nor_widens_the_interval():
    plain = estimate_speedup(rounds(1.0, noise=0.02))
    ordered = estimate_speedup(rounds(1.0, noise=0.02, first_made_slower=1.10))
    assert ordered.speedup == pytest.approx(plain.speedup, rel=1e-9)
    assert ordered.ci_high / ordered.ci_low == pytest.approx(plain.ci_high / plain.ci_low, rel=1e-9)
    assert ordered.interval_verdict == "same"
    # with one order only, the same effect would be read as a 10 % speed-up
    one_order = [r for r in rounds(1.0, noise=0.02, first_made_slower=1.10, n_rounds=12) if not r.attempt_first]
    assert estimate_speedup(one_order).speedup == pytest.approx(1.10, rel=0.02)


def test_the_detectable_change_shrinks_with_less_noise_and_never_drops_below_the_min_effect():
    noisy = estimate_speedup(rounds(1.0, noise=0.5, pairs=9))
    quiet = estimate_speedup(rounds(1.0, noise=0.005))
    assert noisy.mde > quiet.mde
    assert quiet.mde == MIN_EFFECT
    half_width = math.log(noisy.ci_high / noisy.speedup)
    assert math.log1p(noisy.mde) > half_width  # 80 % power needs more than the interval's half-width


def test_a_failed_accuracy_check_rejects_whatever_the_speed():
    fast = Speedup(3.0, 2.5, 3.5, 0.95, 100)
    assert judge(fast, accuracy_passed=False) == "rejected"


@pytest.mark.parametrize(
    "bad",
    [
        [Round(np.ones(10), np.ones(9))] * 4,
        [Round(np.ones(10), np.ones(10))] * 3,
        [Round(np.ones(10), np.zeros(10))] * 4,
    ],
    ids=["unpaired", "too-few-rounds", "zero-times"],
)
def test_samples_that_cannot_give_an_interval_are_refused(bad):
    with pytest.raises(ValueError):
        estimate_speedup(bad)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"rounds": 3}, "rounds must be >= 4"), ({"confidence": 1.0}, "confidence"), ({"min_pairs": 0}, "min_pairs")],
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

    config = SpeedupConfig(rounds=4, seconds=0.0, round_seconds=0.0, min_pairs=2, block_ms=0.0, warmup_runs=1,
                           settle_runs=0)
    timed = time_in_rounds(maker("B"), maker("A"), config)
    assert [r.baseline_s.size for r in timed] == [2, 2, 2, 2]
    assert [r.attempt_first for r in timed] == [False, True, False, True]
    # rounds 1 and 3: the baseline's session made first; rounds 2 and 4: the attempt's. Each round:
    # warm-up (B A), one calibration call each (B A), then blocks B A, A B.
    assert " ".join(calls) == " ".join([
        "new B", "new A", "B A", "B A", "B A A B",
        "new A", "new B", "B A", "B A", "B A A B",
        "new B", "new A", "B A", "B A", "B A A B",
        "new A", "new B", "B A", "B A", "B A A B",
    ])


def test_each_block_starts_with_untimed_calls_after_the_other_session_ran():
    calls: list[str] = []
    config = SpeedupConfig(rounds=4, seconds=0.0, round_seconds=0.0, min_pairs=2, block_ms=0.0, warmup_runs=0,
                           settle_runs=2)
    time_in_rounds(lambda: lambda: calls.append("B"), lambda: lambda: calls.append("A"), config)
    # per round: one calibration call each, then blocks of 2 untimed + 1 timed calls: B A, then A B
    assert "".join(calls) == ("BA" + "BBB" + "AAA" + "AAA" + "BBB") * 4


def test_a_microsecond_function_is_timed_in_blocks_and_gets_an_interval_of_real_width():
    # Two identical calls of a few microseconds tie at the timer's resolution one by one; in blocks
    # of >= 2 ms they do not, and the A/A interval has a width and contains 1.
    x = np.ones(16)
    config = SpeedupConfig(rounds=6, seconds=0.6, block_ms=2.0)
    timed = time_in_rounds(lambda: lambda: x.sum(), lambda: lambda: x.sum(), config)
    assert min(r.calls_per_block for r in timed) > 20
    result = estimate_speedup(timed)
    assert result.ci_high > result.ci_low
    assert result.interval_verdict in ("same", "inconclusive")


def test_more_rounds_are_timed_in_pairs_while_the_time_lasts_up_to_the_cap():
    x = np.ones(16)
    quick = SpeedupConfig(rounds=4, max_rounds=9, seconds=0.5, round_seconds=0.01, block_ms=0.1)
    timed = time_in_rounds(lambda: lambda: x.sum(), lambda: lambda: x.sum(), quick)
    assert len(timed) == 9 + 1  # the cap, made even so both orders count alike
    assert sum(r.attempt_first for r in timed) == 5


@pytest.mark.parametrize(
    ("speedup", "mde", "verdict_", "expected"),
    [
        (1.004, 0.031, "inconclusive", "0.4% faster: below the 3.1% this measurement could detect"),
        (0.99, 0.001, "inconclusive", "1.0% slower: below the 2.0% this measurement"),
        (1.5, 0.02, "better", "50.0% faster, beyond the 2.0% this measurement could detect"),
        (0.995, 0.02, "same", "0.5% slower: no change larger than 5% either way"),
        (1.0, None, "baseline", ""),
    ],
)
def test_a_verdict_is_explained_in_plain_words(speedup, mde, verdict_, expected):
    assert describe(speedup, mde, verdict_).startswith(expected)


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        pytest.param({"baseline": True, "accuracy_passed": False}, Verdict.BASELINE, id="a baseline is the baseline"),
        pytest.param({"accuracy_passed": False}, Verdict.REJECTED, id="a failed check rejects a faster attempt"),
        pytest.param({"accuracy_passed": None}, Verdict.BETTER, id="no check made: the interval decides"),
        pytest.param({"accuracy_passed": True}, Verdict.BETTER, id="a passed check: the interval decides"),
    ],
)
def test_one_judge_decides_every_verdict(kwargs, expected):
    fast = Speedup(1.5, 1.4, 1.6, 0.95, 40, rounds=8, mde=0.03)
    assert judge(fast, **kwargs) is expected
    assert judge(None, accuracy_passed=True) is None  # not timed against the baseline: nothing to judge
    assert expected == expected.value  # a member is the string MLflow stores and reads back
