"""Speed-up of an attempt over its baseline with a bootstrap confidence interval, and the verdict."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from tracker.latency import TimingConfig

VERDICTS = ("better", "worse", "inconclusive", "rejected")
# Smallest speed-up change worth a verdict. With tens of thousands of interleaved pairs (a model that
# runs in microseconds) the interval gets so narrow that a 1 % order effect would count as a change.
MIN_EFFECT = 0.02


@dataclass(frozen=True)
class Speedup:
    """Median baseline latency / median attempt latency, with a bootstrap interval.

    Attributes:
        speedup: > 1 means the attempt is faster.
        ci_low, ci_high: the `confidence` bootstrap interval of `speedup`.
        confidence: e.g. 0.95.
        pairs: interleaved (baseline, attempt) run pairs it was estimated from.
    """

    speedup: float
    ci_low: float
    ci_high: float
    confidence: float
    pairs: int

    @property
    def verdict(self) -> str:
        """"better" or "worse" only when the whole interval is on one side of 1 and the change is at
        least MIN_EFFECT (2 %), else "inconclusive"."""
        if self.ci_low > 1.0 and self.speedup >= 1.0 + MIN_EFFECT:
            return "better"
        if self.ci_high < 1.0 and self.speedup <= 1.0 - MIN_EFFECT:
            return "worse"
        return "inconclusive"

    def metrics(self) -> dict[str, float]:
        return {
            "latency.speedup": self.speedup,
            "latency.speedup_ci_low": self.ci_low,
            "latency.speedup_ci_high": self.ci_high,
            "latency.speedup_pairs": float(self.pairs),
        }


def verdict(speedup: Speedup | None, *, accuracy_passed: bool) -> str:
    """The attempt's verdict: "rejected" when its accuracy check failed, else the speed-up's."""
    if not accuracy_passed:
        return "rejected"
    return speedup.verdict if speedup is not None else "inconclusive"


def time_interleaved(
    run_baseline: Callable[[], object], run_attempt: Callable[[], object], timing: TimingConfig
) -> tuple[np.ndarray, np.ndarray]:
    """Times baseline and attempt alternately, so drift on a noisy machine hits both alike.

    The order inside each pair alternates too (B A, A B, ...). Runs until `timing.min_runs` pairs
    and `timing.min_seconds` seconds (or `timing.max_runs` pairs) after `timing.warmup_runs` of each.

    Returns:
        Per-run seconds of the baseline and of the attempt, pair by pair.
    """
    for _ in range(timing.warmup_runs):
        run_baseline()
        run_attempt()
    base, attempt = [], []
    start = time.perf_counter()
    while len(base) < timing.max_runs:
        order = ((run_baseline, base), (run_attempt, attempt))
        for fn, samples in order if len(base) % 2 == 0 else order[::-1]:
            t0 = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - t0)
        if len(base) >= timing.min_runs and time.perf_counter() - start >= timing.min_seconds:
            break
    return np.asarray(base), np.asarray(attempt)


def estimate_speedup(
    baseline_s: np.ndarray,
    attempt_s: np.ndarray,
    *,
    confidence: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
) -> Speedup:
    """Bootstrap (resampling pairs) of median(baseline) / median(attempt).

    Raises:
        ValueError: the samples are not paired or too few (< 5 pairs).
    """
    baseline_s, attempt_s = np.asarray(baseline_s, float), np.asarray(attempt_s, float)
    if baseline_s.shape != attempt_s.shape or baseline_s.ndim != 1:
        raise ValueError(f"need paired 1-D samples, got shapes {baseline_s.shape} and {attempt_s.shape}")
    if baseline_s.size < 5:
        raise ValueError(f"need at least 5 pairs for an interval, got {baseline_s.size}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    rng = np.random.default_rng(seed)
    index = rng.integers(0, baseline_s.size, size=(resamples, baseline_s.size))
    ratios = np.median(baseline_s[index], axis=1) / np.median(attempt_s[index], axis=1)
    tail = (1 - confidence) / 2
    low, high = np.quantile(ratios, [tail, 1 - tail])
    point = float(np.median(baseline_s) / np.median(attempt_s))
    return Speedup(point, float(low), float(high), confidence, int(baseline_s.size))
