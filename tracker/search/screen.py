"""The search's measurements short of a full attempt: a made candidate's outputs judged by the task (no timing),
and a short interleaved timing against the baseline (a screen, not a verdict)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tracker.measure.accuracy.task_diff import TaskTolerance, accuracy_margin, tolerance_for
from tracker.measure.attempt import Attempt
from tracker.measure.generation.text_scoring import TextCheck
from tracker.measure.measurement import time_against
from tracker.measure.runtimes.ort_runtime import SessionConfig
from tracker.measure.runtimes.runtime import get_runtime
from tracker.measure.timing.speedup import Speedup, SpeedupConfig
from tracker.optimize import Candidate

# Rung 1 of the speed screen: 4 rounds of fresh session pairs, a few block pairs each (~3 s on a 10 ms model).
SHORT_SCREEN = SpeedupConfig(rounds=4, max_rounds=4, seconds=0.0, round_seconds=0.05, min_pairs=4, warmup_runs=1)
# Rung 2, for the better half: longer rounds, for a tighter estimate before the full measurement.
LONG_SCREEN = SpeedupConfig(rounds=6, max_rounds=6, seconds=0.0, round_seconds=0.2, min_pairs=8, warmup_runs=2)


@dataclass(frozen=True)
class AccuracyCheck:
    """A candidate's outputs against the baseline's: passed, the margin (`accuracy_margin`), the diff's metrics."""

    passed: bool
    margin: float
    metrics: dict[str, float]


def check_accuracy(
    candidate: Candidate, feeds: Mapping[str, np.ndarray], baseline_outputs: Sequence[np.ndarray],
    tolerance: TaskTolerance | Mapping[str, TaskTolerance], *, session: SessionConfig,
) -> AccuracyCheck:
    """Runs `candidate` once on `feeds` and judges its outputs with the tolerance of its precision.

    Outputs with NaN where the baseline has none fail the check, as in a full attempt.
    """
    outputs = outputs_of(_screen_attempt(candidate, session), feeds)
    diff = tolerance_for(tolerance, candidate.precision).compare(baseline_outputs, outputs)
    return AccuracyCheck(bool(diff.passed), float(accuracy_margin(diff)), dict(diff.metrics()))


def outputs_of(attempt: Attempt, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """`attempt`'s outputs on `feeds`, from one run in its runtime (no timing)."""
    return list(get_runtime(attempt.runtime).runner(attempt, None)(dict(feeds)))


def check_text(candidate: Candidate, text: TextCheck, *, session: SessionConfig, workdir: Path) -> AccuracyCheck:
    """Scores `candidate` on the study's real text (`TextCheck`, its baseline scored first) and judges it by the bound
    of its precision: a language model's check, in place of its logits on the feeds."""
    quality = text.measure(candidate.path, candidate.session_on(session), precision=candidate.precision,
                           workdir=workdir)
    metrics = quality.metrics(prefix="diff.quality.")
    return AccuracyCheck(bool(quality.passed), quality.margin, metrics)


def screen_speed(
    candidate: Candidate, baseline: Attempt, feeds: Mapping[str, np.ndarray], *, session: SessionConfig,
    config: SpeedupConfig = SHORT_SCREEN, must_beat: float | None = None,
) -> tuple[Speedup, str | None]:
    """A short interleaved timing of `candidate` against the baseline: a screen that ranks candidates, not the
    calibrated speed-up of a full attempt.

    Racing: given `must_beat` (the leader's lower bound, at least 1.0: the baseline), the screen stops after the
    first round whose upper bound lies below it (`speedup.bounds_so_far`). Returns the speed-up, and why it stopped
    early (None when it ran its rounds).
    """
    race = Race(must_beat)
    found = time_against(_screen_attempt(candidate, session), baseline, feeds, config, stop=race.stop)
    return found, race.why


class Race:
    """A screen's racing rule (`speedup.Stop`): stop once the upper bound so far lies below `must_beat` (the leader's
    lower bound, at least 1.0: the baseline; None: never); `why` then says so, else it stays None."""

    def __init__(self, must_beat: float | None) -> None:
        self.must_beat = must_beat
        self.why: str | None = None

    def stop(self, so_far: Speedup) -> str | None:
        if self.must_beat is None or so_far.ci_high >= self.must_beat:
            return None
        behind = "1.0 (the baseline)" if self.must_beat <= 1.0 else f"the leader's {self.must_beat:.2f}x"
        self.why = f"dropped after {so_far.pairs} pairs (upper bound {so_far.ci_high:.2f}x < {behind})"
        return self.why


def _screen_attempt(candidate: Candidate, session: SessionConfig) -> Attempt:
    """The candidate as an attempt under the study's session settings, with its own on top."""
    return Attempt(name="screen", model=Path(candidate.path), session=candidate.session_on(session))
