"""Wall time per step of a study (export, optimize, latency, profiling, parsing, charts, logging)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

# The tracker's own overhead, as opposed to the work it measures (export, optimize, run the model).
TRACKER_STEPS = ("parsing", "artifacts", "mlflow_logging", "model_logging")


@dataclass
class StepTimes:
    """Seconds spent per named step, summed over every time the step ran."""

    seconds: dict[str, float] = field(default_factory=dict)

    @contextlib.contextmanager
    def step(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start

    def add(self, other: StepTimes) -> None:
        for name, seconds in other.seconds.items():
            self.seconds[name] = self.seconds.get(name, 0.0) + seconds

    def tracker_seconds(self) -> float:
        return sum(self.seconds.get(name, 0.0) for name in TRACKER_STEPS)

    def metrics(self, wall_seconds: float) -> dict[str, float]:
        """`time.<step>_s`, `time.wall_s` and `time.tracker_share` (tracker's own steps / wall time)."""
        metrics = {f"time.{name}_s": seconds for name, seconds in self.seconds.items()}
        metrics["time.wall_s"] = wall_seconds
        metrics["time.tracker_share"] = self.tracker_seconds() / wall_seconds if wall_seconds > 0 else 0.0
        return metrics

    def table(self, wall_seconds: float) -> str:
        """A printable breakdown, largest step first, the tracker's own steps marked with *."""
        lines = [f"{'step':<18}{'seconds':>10}{'share':>8}"]
        for name, seconds in sorted(self.seconds.items(), key=lambda kv: -kv[1]):
            mark = "*" if name in TRACKER_STEPS else " "
            share = seconds / wall_seconds if wall_seconds > 0 else 0.0
            lines.append(f"{name + mark:<18}{seconds:>10.2f}{share:>8.1%}")
        tracker = self.tracker_seconds()
        lines.append(f"{'wall':<18}{wall_seconds:>10.2f}")
        lines.append(f"{'tracker (*)':<18}{tracker:>10.2f}{tracker / wall_seconds if wall_seconds else 0:>8.1%}")
        return "\n".join(lines)
