"""The search's time budget: parsing `--budget 20m`, and what is left of it."""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

_PART = re.compile(r"(\d+(?:\.\d+)?)([hms])")
_UNIT_S = {"h": 3600.0, "m": 60.0, "s": 1.0}


def parse_budget(text: str) -> float:
    """Seconds from a duration: `20m`, `90s`, `1h30m`, `1.5h`, or a plain number of seconds.

    Raises:
        ValueError: anything else, or a duration that is not positive (the message shows what is allowed).
    """
    clean = str(text).strip().lower()
    try:
        seconds = float(clean)
    except ValueError:
        parts = _PART.findall(clean)
        if not parts or "".join(n + u for n, u in parts) != clean:
            raise ValueError(f"--budget expects a duration such as 20m, 90s, 1h30m or 1200 (seconds), "
                             f"got {text!r}") from None
        seconds = sum(float(n) * _UNIT_S[u] for n, u in parts)
    if not seconds > 0 or seconds == float("inf"):
        raise ValueError(f"--budget must be a positive duration such as 20m, got {text!r}")
    return seconds


@dataclass
class Budget:
    """Wall time a search may take, counted from its start; None: no limit.

    Each kind of work (`make`, `screen`, `measure`, ...) keeps its durations, so the search asks whether the
    next one fits (`fits`) from what the earlier ones cost, with a reserve kept for the stages after it.
    """

    seconds: float | None
    started: float = field(default_factory=time.perf_counter)
    costs: dict[str, list[float]] = field(default_factory=dict)

    def spent(self) -> float:
        return time.perf_counter() - self.started

    def left(self) -> float:
        return float("inf") if self.seconds is None else self.seconds - self.spent()

    def expected(self, kind: str, default: float) -> float:
        """What one more `kind` of work is expected to cost: the largest of the last three, else `default`."""
        seen = self.costs.get(kind)
        return max(seen[-3:]) if seen else default

    def fits(self, kind: str, default: float, *, reserve: float = 0.0) -> bool:
        """Whether one more `kind` fits in what is left, keeping `reserve` seconds for later stages."""
        return self.left() - reserve >= self.expected(kind, default)

    def covers(self, candidates: int, *, each: float, reserve: float) -> int:
        """How many of `candidates` more fit at `each` seconds apiece, keeping `reserve` seconds (all: no limit)."""
        return candidates if self.seconds is None else min(candidates, max(0, int((self.left() - reserve) / each)))

    @contextlib.contextmanager
    def timing(self, kind: str) -> Iterator[None]:
        """Counts the block's wall time as one `kind` of work (also when it raises)."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.costs.setdefault(kind, []).append(time.perf_counter() - start)
