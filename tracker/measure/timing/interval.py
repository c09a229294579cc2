"""The speed-up's interval: the rounds' timed block pairs (`Round`) estimated into a speed-up with its Student t
interval and the smallest change it could detect (`Speedup`), and what its interval alone says.

The verdict is "better" or "worse" only for a change at least as large as the measurement could detect
(`Speedup.mde`, never under 2 %); "same" when the whole interval lies within +-5 %: no change that
size, which is a finding too; else "inconclusive". A 95 % interval alone excludes 1 in 5 % of A/A
pairs, and with wide intervals every such miss would have been a false "better" or "worse".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tracker.base.vocabulary import Verdict

# Smallest speed-up change worth a verdict: even a calibrated interval can exclude 1 for a 1 % change
# that no user would ship for.
MIN_EFFECT = 0.02
# An attempt whose whole interval lies within +-5 % of its baseline's speed is "same".
SAME_WITHIN = 0.05
# The minimum detectable effect is the change a measurement like this one finds 4 times in 5.
MDE_POWER = 0.8
# Two of the rounds' degrees of freedom go to the mean and the order effect: 4 rounds leave 2.
MIN_ROUNDS = 4
# A standard error the rounds cannot see, added to theirs (in logs, in quadrature). Repeating a whole A/A
# measurement of a microsecond model (20 rounds each) on the project's machines, the estimates spread by
# up to 0.8 % where the rounds predicted 0.46 %, and interleaved blocks read ratios up to 1.7 % away from
# long isolated runs: effects of the process's state that every round of one measurement shares.
SYSTEMATIC_SE = 0.005

# Racing (a search's screens, `measure_speedup(stop=...)`): before the rounds give an interval (MIN_ROUNDS), how far
# the rounds so far may be from the final estimate either way. Two sessions of one model can differ by up to ~20 %
# (without huge pages; see tracker/measure/environment.py), so an early bound is the pairs' median ratio times or over
# 1.3: only a candidate far behind is dropped before its interval exists.
EARLY_SLACK = math.log(1.3)


@dataclass(frozen=True)
class Round:
    """One round: per-call seconds of each block, pair by pair, and the load of other processes."""

    baseline_s: np.ndarray
    attempt_s: np.ndarray
    calls_per_block: int = 1
    other_load: float = 0.0
    disturbed: bool = False
    attempt_first: bool = False  # the attempt's session was made before the baseline's

    @property
    def log_ratio(self) -> float:
        """Median over the block pairs of log(baseline / attempt): > 0 when the attempt is faster."""
        return float(np.median(np.log(self.baseline_s / self.attempt_s)))


@dataclass(frozen=True)
class Speedup:
    """Baseline time / attempt time, with its interval and what it could detect.

    Attributes:
        speedup: > 1 means the attempt is faster (the geometric mean of the rounds' median pair ratios).
        ci_low, ci_high: the `confidence` interval of `speedup`.
        confidence: e.g. 0.95.
        pairs: timed block pairs, all rounds together.
        rounds: rounds (fresh session pairs) the interval is over.
        mde: the smallest relative change (0.03 = 3 %) this measurement detects with 80 % power,
            never below MIN_EFFECT; a difference under it is not a finding either way.
        calls_per_block: inferences per timed block (the largest over the rounds).
        other_load: the largest share of the machine's CPU that other processes took during a round.
        disturbed_rounds: rounds kept although other processes disturbed them (after the redos).
    """

    speedup: float
    ci_low: float
    ci_high: float
    confidence: float
    pairs: int
    rounds: int = 0
    mde: float = MIN_EFFECT
    calls_per_block: int = 1
    other_load: float = 0.0
    disturbed_rounds: int = 0

    @property
    def interval_verdict(self) -> Verdict:
        """What the interval alone says (`judge` adds the baseline and the accuracy check): `BETTER` or `WORSE`
        when the change is at least `mde` (so at least MIN_EFFECT, and the whole interval is on one side of 1);
        `SAME` when the whole interval is within +-SAME_WITHIN; else `INCONCLUSIVE`. Changes are compared in
        logs, so 2x faster and 2x slower are alike."""
        called = math.log1p(max(self.mde, MIN_EFFECT))
        change = math.log(self.speedup)
        if change >= called and self.ci_low > 1.0:
            return Verdict.BETTER
        if change <= -called and self.ci_high < 1.0:
            return Verdict.WORSE
        if self.ci_low >= 1.0 / (1.0 + SAME_WITHIN) and self.ci_high <= 1.0 + SAME_WITHIN:
            return Verdict.SAME
        return Verdict.INCONCLUSIVE


def estimate_speedup(rounds: Sequence[Round], *, confidence: float = 0.95) -> Speedup:
    """The speed-up, its Student t interval over the rounds, and the smallest change it could detect.

    Each round gives the median of its block pairs' log ratios; the rounds are the independent units
    (each has its own sessions), so the spread between them carries every source of noise at once.
    When both creation orders are present, the estimate is the mean of the two orders' means and the
    spread is measured around each order's own mean (a two-group model: one degree of freedom more is
    spent), so a constant effect of which session is made first neither biases nor widens the result.
    SYSTEMATIC_SE is added to the rounds' standard error: no interval is narrower than about +-1 %.

    Raises:
        ValueError: fewer than MIN_ROUNDS rounds, unpaired samples, or times that are not positive.
    """
    from scipy import stats

    if len(rounds) < MIN_ROUNDS:
        raise ValueError(f"need at least {MIN_ROUNDS} rounds for an interval, got {len(rounds)}")
    for r in rounds:
        if r.baseline_s.shape != r.attempt_s.shape or r.baseline_s.ndim != 1 or r.baseline_s.size == 0:
            raise ValueError(f"need paired 1-D samples, got shapes {r.baseline_s.shape} and {r.attempt_s.shape}")
        if not (np.all(r.baseline_s > 0) and np.all(r.attempt_s > 0)):
            raise ValueError("block times must be positive")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    logs = np.array([r.log_ratio for r in rounds])
    groups = [g for g in (logs[[r.attempt_first for r in rounds]], logs[[not r.attempt_first for r in rounds]])
              if g.size]
    mean = float(np.mean([g.mean() for g in groups]))
    df = logs.size - len(groups)
    residual_sd = math.sqrt(sum(float(((g - g.mean()) ** 2).sum()) for g in groups) / df)
    se = math.hypot(residual_sd * math.sqrt(sum(1 / g.size for g in groups)) / len(groups), SYSTEMATIC_SE)
    t = float(stats.t.ppf(0.5 + confidence / 2, df))
    detectable = (t + float(stats.t.ppf(MDE_POWER, df))) * se
    return Speedup(
        speedup=math.exp(mean),
        ci_low=math.exp(mean - t * se),
        ci_high=math.exp(mean + t * se),
        confidence=confidence,
        pairs=int(sum(r.baseline_s.size for r in rounds)),
        rounds=len(rounds),
        mde=max(MIN_EFFECT, math.expm1(detectable)),
        calls_per_block=max(r.calls_per_block for r in rounds),
        other_load=max(r.other_load for r in rounds),
        disturbed_rounds=sum(r.disturbed for r in rounds),
    )


def bounds_so_far(rounds: Sequence[Round], *, confidence: float = 0.95) -> Speedup:
    """The speed-up of the rounds timed so far, with bounds to stop on: `estimate_speedup`'s from MIN_ROUNDS rounds
    on; before that the median of every block pair's ratio, widened by EARLY_SLACK either way (the spread between
    sessions is not known yet, so these bounds are a screen's, not an interval)."""
    if len(rounds) >= MIN_ROUNDS:
        return estimate_speedup(rounds, confidence=confidence)
    logs = np.concatenate([np.log(r.baseline_s / r.attempt_s) for r in rounds])
    middle = float(np.median(logs))
    return Speedup(math.exp(middle), math.exp(middle - EARLY_SLACK), math.exp(middle + EARLY_SLACK), confidence,
                   pairs=int(logs.size), rounds=len(rounds), mde=math.expm1(EARLY_SLACK),
                   calls_per_block=max(r.calls_per_block for r in rounds),
                   other_load=max(r.other_load for r in rounds), disturbed_rounds=sum(r.disturbed for r in rounds))
