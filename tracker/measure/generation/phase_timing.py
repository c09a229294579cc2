"""A generation phase timed against the baseline's, interleaved (`measure_speedup`), and the tokens per second that
the same measurement gives, so that the figure a user quotes and the verdict's interval are one measurement.

Why this one: at decode scale (2-70 ms per step) a step timed alone and the baseline's timed alone minutes apart drift
apart by more than the effect (the machine's other load, its clock), and the generation loop's tokens per second are
at other past lengths (the prompt's, growing). Interleaved, in fresh sessions whose threads stop spinning after each
run, the same harness reads an A/A pair as 1.01-1.03 and a decode graph computed twice as 0.509-0.515 on gpt2-small at
a past of 512, in fp32 and int4 (docs/methodology.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from tracker.measure.generation.binding import loop_step
from tracker.measure.generation.decoder import DecoderSession
from tracker.measure.runtimes.ort_runtime import SessionConfig
from tracker.measure.timing.speedup import Runner, Speedup, SpeedupConfig, Stop, bounds_so_far, time_in_rounds


@dataclass(frozen=True)
class PhaseTiming:
    """A phase timed against the baseline: the speed-up and its interval, and the tokens per second of both.

    Attributes:
        speedup: the attempt's speed-up over the baseline (`estimate_speedup`).
        baseline_tokens_per_s: new tokens of one step over the baseline's median time per step, in these rounds.
        tokens_per_s: the baseline's tokens per second times the speed-up; its interval is the speed-up's, scaled.
    """

    speedup: Speedup
    baseline_tokens_per_s: float
    tokens_per_s: float
    tokens_per_s_low: float
    tokens_per_s_high: float

    def metrics(self, prefix: str) -> dict[str, float]:
        """`<prefix>tokens_per_s` (with `_ci_low`/`_ci_high`) and `<prefix>baseline_tokens_per_s`."""
        return {prefix + "tokens_per_s": self.tokens_per_s, prefix + "tokens_per_s_ci_low": self.tokens_per_s_low,
                prefix + "tokens_per_s_ci_high": self.tokens_per_s_high,
                prefix + "baseline_tokens_per_s": self.baseline_tokens_per_s}


def time_phase(baseline: onnx.ModelProto | str | Path, model: onnx.ModelProto | str | Path, *, tokens: np.ndarray,
               past_len: int, baseline_session: SessionConfig, session: SessionConfig,
               config: SpeedupConfig, stop: Stop | None = None) -> PhaseTiming:
    """Times `tokens[:, past_len:]` after the past of `tokens[:, :past_len]`, in `model` against `baseline`, each run
    as its decode loop runs it (numpy, or IO binding where its session says `decode_io_binding`). Given `stop` (a
    search's racing), the rounds end early once it gives a reason (`time_in_rounds`)."""
    rounds = time_in_rounds(phase_runners(baseline, baseline_session, tokens, past_len),
                            phase_runners(model, session, tokens, past_len), config, stop=stop)
    speedup = bounds_so_far(rounds, confidence=config.confidence)  # `estimate_speedup`'s unless stopped early
    new_tokens = tokens.shape[0] * (tokens.shape[1] - past_len)
    baseline_s = float(np.median(np.concatenate([r.baseline_s for r in rounds])))
    base = new_tokens / baseline_s
    return PhaseTiming(speedup, base, base * speedup.speedup, base * speedup.ci_low, base * speedup.ci_high)


def phase_runners(model: onnx.ModelProto | str | Path, session: SessionConfig, tokens: np.ndarray, past_len: int):
    """Fresh sessions (threads that stop spinning after a run) bound to one step of a phase, for `measure_speedup`."""
    if not isinstance(model, onnx.ModelProto):
        model = str(model)  # a path stays a path: each session reads it (and its external data) itself

    def make() -> Runner:
        decoder = DecoderSession.open(model, session, stop_spinning_after_run=True)
        return loop_step(decoder, decoder.phase_feeds(tokens, past_len), io_binding=session.decode_io_binding)

    return make
