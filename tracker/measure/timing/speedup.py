"""Speed-up of an attempt over its baseline: interleaved timing in rounds of fresh sessions, estimated by
`tracker.measure.timing.interval` (the interval over rounds, the smallest change it could detect), and the verdict.

Why it is measured this way (each point was an A/A failure before; the README's "How sure is a verdict"
has the figures):
- Both models run in the same process, in alternating blocks (B A, A B, ...), so drift and other load hit
  both alike. ONNX Runtime's threads spin after a run and would steal the cores from the other session,
  so the two sessions stop spinning when a run returns (`SessionConfig.stop_spinning_after_run`).
- A timed sample is a block of calls lasting at least `block_ms` (10 ms): a model that runs in
  microseconds no longer ties at the timer's resolution, which collapsed the bootstrap of the median to a
  zero-width interval, and what switching sessions costs is spread over many calls.
- Each block starts with an untimed call: the first run of a session after the other one ran is slow
  (gpt2-small with 2 threads: ~80 ms against ~55 ms), and without that call a 2-thread baseline against
  a 1-thread attempt read 0.68 where isolated runs read 0.55.
- Sessions are created anew for every round, and the interval is a Student t interval over the rounds'
  estimates, so the differences between two sessions of one model count as noise instead of showing up
  as a "significant" A/A speed-up. On the project's VMs they are large: gpt2-small's A/A rounds spread
  by +-7 %, and the session made first in a round ran ~10 % slower in 10 rounds of 12 (pinning threads did
  not change it: it is the memory, not the cores). So the order alternates between rounds, and the
  estimate is the mean of the two orders' means, with the order's effect taken out of the spread.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from tracker.base.vocabulary import Verdict
from tracker.measure.timing.cpu_load import watch_cpu_load
from tracker.measure.timing.interval import MIN_EFFECT, MIN_ROUNDS, SAME_WITHIN, Round, Speedup, bounds_so_far

logger = logging.getLogger(__name__)

Runner = Callable[[], object]  # one inference
MakeRunner = Callable[[], Runner]  # a fresh session (or evaluator) and its inference
Stop = Callable[["Speedup"], "str | None"]  # racing: why to stop timing, given the bounds so far; None to go on


@dataclass(frozen=True)
class SpeedupConfig:
    """How an attempt is timed against its baseline.

    Attributes:
        rounds: fresh pairs of sessions, made in alternating order, at least; the interval is over their
            estimates (>= 4, even to balance the orders).
        max_rounds: at most this many rounds.
        seconds: wall time of the whole measurement, sessions included: while some is left after
            `rounds`, two more rounds are timed (up to `max_rounds`). A model that runs in microseconds
            gets ~20 rounds in 3 s; gpt2-small, whose sessions take seconds to make, gets `rounds`.
        round_seconds: timing per round, at least.
        min_pairs: block pairs per round, at least, whatever `round_seconds` says.
        block_ms: a timed block of calls lasts at least this long.
        settle_runs: untimed calls at the start of each block, after the other session ran.
        warmup_runs: untimed runs of each session at the start of a round.
        confidence: of the interval, e.g. 0.95.
        redo_disturbed: rounds timed again, in all, when other processes kept the cores busy.
    """

    rounds: int = 6
    max_rounds: int = 20
    seconds: float = 3.0
    round_seconds: float = 0.1
    min_pairs: int = 8
    block_ms: float = 10.0
    settle_runs: int = 1
    warmup_runs: int = 2
    confidence: float = 0.95
    redo_disturbed: int = 2

    def __post_init__(self) -> None:
        if self.rounds < MIN_ROUNDS:
            raise ValueError(f"rounds must be >= {MIN_ROUNDS} (the interval is over rounds), got {self.rounds}")
        if self.max_rounds < self.rounds:
            raise ValueError(f"max_rounds ({self.max_rounds}) must be >= rounds ({self.rounds})")
        if min(self.seconds, self.round_seconds, self.block_ms) < 0:
            raise ValueError(f"seconds, round_seconds and block_ms must be >= 0, got {self.seconds}, "
                             f"{self.round_seconds} and {self.block_ms}")
        if self.min_pairs < 1 or min(self.settle_runs, self.warmup_runs, self.redo_disturbed) < 0:
            raise ValueError(
                f"min_pairs must be >= 1, settle_runs, warmup_runs and redo_disturbed >= 0; got {self.min_pairs}, "
                f"{self.settle_runs}, {self.warmup_runs}, {self.redo_disturbed}"
            )
        if not 0 < self.confidence < 1:
            raise ValueError(f"confidence must be in (0, 1), got {self.confidence}")

    def params(self) -> dict[str, str]:
        return {
            "measure.speedup_rounds": str(self.rounds),
            "measure.speedup_max_rounds": str(self.max_rounds),
            "measure.speedup_seconds": str(self.seconds),
            "measure.speedup_block_ms": str(self.block_ms),
            "measure.confidence": str(self.confidence),
        }


BASELINE_SPEEDUP = Speedup(1.0, 1.0, 1.0, 0.95, 0, mde=0.0)  # what a baseline run carries


def judge(speedup: Speedup | None, *, accuracy_passed: bool | None, baseline: bool = False) -> Verdict | None:
    """The one rule that decides a verdict, in every scenario and wherever it is read (a live attempt, a run read
    back, a generation phase): `BASELINE` for a runtime's reference; `REJECTED` when the accuracy check failed
    (whatever the speed); else the speed-up's interval (`Speedup.interval_verdict`); None when there is no
    speed-up to judge (the attempt was not timed against its baseline)."""
    if baseline:
        return Verdict.BASELINE
    if accuracy_passed is False:
        return Verdict.REJECTED
    return speedup.interval_verdict if speedup is not None else None


def describe(speedup: float | None, mde: float | None, verdict_: str | None) -> str:
    """One sentence on what a verdict means, for the report and `tracker compare`."""
    if speedup is None or verdict_ not in [v for v in Verdict if v.measured]:
        return ""
    change = f"{abs(speedup - 1):.1%} {'faster' if speedup >= 1 else 'slower'}"
    floor = f"{max(mde or 0.0, MIN_EFFECT):.1%}"
    if verdict_ in (Verdict.BETTER, Verdict.WORSE):
        return f"{change}, beyond the {floor} this measurement could detect"
    if verdict_ == Verdict.SAME:
        return f"{change}: no change larger than {SAME_WITHIN:.0%} either way (the whole interval is within it)"
    return f"{change}: below the {floor} this measurement could detect, so no difference was found"


def time_in_rounds(make_baseline: MakeRunner, make_attempt: MakeRunner, config: SpeedupConfig,
                   stop: Stop | None = None) -> list[Round]:
    """Times baseline and attempt in rounds, each with freshly made sessions: `config.rounds` rounds,
    then two more at a time while `config.seconds` (wall time, from the start) lasts, up to
    `config.max_rounds`.

    In a round, the two sessions are made (the first one made alternates between rounds), warmed up,
    then timed in alternating blocks (B A, A B, ...) of the same number of calls, at least
    `config.block_ms` long for the faster of the two, each after `config.settle_runs` untimed calls, until
    `config.min_pairs` pairs and `config.round_seconds` are reached. A round during which other
    processes took more than `tracker.measure.timing.cpu_load.DISTURBED_LOAD` of the machine is timed again, up to
    `config.redo_disturbed` times in all. Given `stop`, it is asked after each round with the bounds so far
    (`bounds_so_far`), and a reason it returns ends the timing there (racing: a candidate that cannot win).
    """
    start = time.perf_counter()
    rounds: list[Round] = []
    redone = 0
    while (len(rounds) < config.rounds or len(rounds) % 2
           or (len(rounds) < config.max_rounds and time.perf_counter() - start < config.seconds)):
        # a round timed again keeps its order, so the orders stay balanced
        timed = _time_round(make_baseline, make_attempt, config, attempt_first=len(rounds) % 2 == 1)
        logger.info(
            "speed-up round %d: %d pairs of %d call(s), median ratio %.4f, other load %.0f%%",
            len(rounds) + 1, timed.baseline_s.size, timed.calls_per_block,
            math.exp(timed.log_ratio), 100 * timed.other_load,
        )
        if timed.disturbed and redone < config.redo_disturbed:
            redone += 1
            logger.warning("speed-up round disturbed: other processes used %.0f%% of the CPU; timing it again",
                           100 * timed.other_load)
            continue
        rounds.append(timed)
        if stop is not None and len(rounds) < config.max_rounds:
            why = stop(bounds_so_far(rounds, confidence=config.confidence))
            if why:
                logger.info("speed-up: stopped after %d round(s), %d pairs: %s", len(rounds),
                            sum(r.baseline_s.size for r in rounds), why)
                break
    return rounds


def _time_round(
    make_baseline: MakeRunner, make_attempt: MakeRunner, config: SpeedupConfig, *, attempt_first: bool
) -> Round:
    if attempt_first:
        run_attempt = make_attempt()
        run_baseline = make_baseline()
    else:
        run_baseline = make_baseline()
        run_attempt = make_attempt()
    for _ in range(config.warmup_runs):
        run_baseline()
        run_attempt()
    per_call = min(_time_block(run_baseline, 1, 0), _time_block(run_attempt, 1, 0))
    calls = max(1, math.ceil(config.block_ms * 1e-3 / max(per_call, 1e-9)))
    settle = config.settle_runs
    base: list[float] = []
    attempt: list[float] = []
    with watch_cpu_load() as load:
        start = time.perf_counter()
        while len(base) < config.min_pairs or time.perf_counter() - start < config.round_seconds:
            if len(base) % 2 == 0:
                base.append(_time_block(run_baseline, calls, settle))
                attempt.append(_time_block(run_attempt, calls, settle))
            else:
                attempt.append(_time_block(run_attempt, calls, settle))
                base.append(_time_block(run_baseline, calls, settle))
    return Round(np.asarray(base), np.asarray(attempt), calls, load.other_load, load.disturbed, attempt_first)


def _time_block(run: Runner, calls: int, settle: int) -> float:
    """Seconds per call over `calls` back-to-back calls, after `settle` untimed ones."""
    for _ in range(settle):
        run()
    t0 = time.perf_counter()
    for _ in range(calls):
        run()
    return (time.perf_counter() - t0) / calls


def measure_speedup(make_baseline: MakeRunner, make_attempt: MakeRunner, config: SpeedupConfig, *,
                    stop: Stop | None = None) -> Speedup:
    """Times the two in rounds (`time_in_rounds`) and estimates the speed-up (`estimate_speedup`); stopped early by
    `stop`, the bounds of the rounds it got (`bounds_so_far`)."""
    return bounds_so_far(time_in_rounds(make_baseline, make_attempt, config, stop=stop), confidence=config.confidence)
