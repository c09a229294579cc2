"""Latency statistics and the timing loop every runtime shares (warm-up, then >= N runs and >= T s)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

logger = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True)
class TimingConfig:
    """How long to time a model.

    Attributes:
        warmup_runs: untimed runs first (allocation, kernel selection).
        min_runs: at least this many timed runs.
        min_seconds: and keep going until this much time has passed.
        max_runs: hard stop, whatever `min_seconds` says.
    """

    warmup_runs: int = 5
    min_runs: int = 50
    min_seconds: float = 1.0
    max_runs: int = 100_000

    def __post_init__(self) -> None:
        if self.warmup_runs < 0:
            raise ValueError(f"warmup_runs must be >= 0, got {self.warmup_runs}")
        if self.min_runs < 1:
            raise ValueError(f"min_runs must be >= 1, got {self.min_runs}")
        if self.min_seconds < 0:
            raise ValueError(f"min_seconds must be >= 0, got {self.min_seconds}")
        if self.max_runs < self.min_runs:
            raise ValueError(f"max_runs ({self.max_runs}) must be >= min_runs ({self.min_runs})")


@dataclass(frozen=True)
class Latency:
    """Statistics of per-run wall times, in milliseconds."""

    runs: int
    mean_ms: float
    std_ms: float
    min_ms: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float
    samples_ms: tuple[float, ...] = ()

    @classmethod
    def from_values(cls, seconds: list[float] | np.ndarray) -> Latency:
        """Builds the statistics from per-run durations in seconds."""
        ms = np.asarray(seconds, dtype=np.float64) * 1e3
        if ms.size == 0:
            raise ValueError("cannot compute latency statistics from zero runs")
        p50, p90, p99 = np.percentile(ms, [50, 90, 99])
        return cls(
            runs=int(ms.size),
            mean_ms=float(ms.mean()),
            std_ms=float(ms.std()),
            min_ms=float(ms.min()),
            p50_ms=float(p50),
            p90_ms=float(p90),
            p99_ms=float(p99),
            max_ms=float(ms.max()),
            samples_ms=tuple(float(v) for v in ms),
        )

    def metrics(self, prefix: str = "latency") -> dict[str, float]:
        """The statistics as `<prefix>.*` metric values (samples excluded)."""
        names = ("runs", "mean_ms", "std_ms", "min_ms", "p50_ms", "p90_ms", "p99_ms", "max_ms")
        return {f"{prefix}.{n}": float(getattr(self, n)) for n in names}


def time_runs(run_once: Callable[[], object], config: TimingConfig) -> Latency:
    """Times `run_once` after `config.warmup_runs` untimed calls.

    Runs until both `config.min_runs` runs and `config.min_seconds` seconds are reached
    (or `config.max_runs`), and logs a line every few seconds so long loops show progress.
    """
    for _ in range(config.warmup_runs):
        run_once()
    durations: list[float] = []
    start = last_report = time.perf_counter()
    while len(durations) < config.max_runs:
        t0 = time.perf_counter()
        run_once()
        t1 = time.perf_counter()
        durations.append(t1 - t0)
        if len(durations) >= config.min_runs and t1 - start >= config.min_seconds:
            break
        if t1 - last_report > 5.0:
            logger.info("timing: %d runs, %.1f s", len(durations), t1 - start)
            last_report = t1
    return Latency.from_values(durations)


def time_once(call: Callable[[], T]) -> tuple[T, float]:
    """Calls `call` once: (what it returned, its wall time in milliseconds)."""
    start = time.perf_counter()
    value = call()
    return value, (time.perf_counter() - start) * 1e3
