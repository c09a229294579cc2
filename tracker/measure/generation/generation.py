"""Generation with a decode-ready ONNX model (`decoder.DecoderSession`): the generation scenario's figures (prefill,
decode per past length, time to first token, tokens/s, and for each phase
its speed-up over a baseline and its roofline). Its accuracy check against a baseline is `generation_check`.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import onnx

from tracker.base.vocabulary import GENERATION_PHASES, Phase
from tracker.measure.costmodel.roofline import Roofline, build_roofline, count_tokens
from tracker.measure.costmodel.step_split import StepSplit
from tracker.measure.generation.binding import BoundDecoder, loop_step
from tracker.measure.generation.decode_split import profile_steps
from tracker.measure.generation.decoder import DecoderSession, Generation
from tracker.measure.generation.phase_timing import PhaseTiming, time_phase
from tracker.measure.runtimes.ort_runtime import SessionConfig, profile_ort
from tracker.measure.schema import Scope, phase_prefix, speedup_metrics
from tracker.measure.timing.latency import Latency, TimingConfig, time_runs
from tracker.measure.timing.speedup import Speedup, SpeedupConfig
from tracker.profile.parse import parse_profile

if TYPE_CHECKING:
    from tracker.measure.costmodel.machine import MachinePeaks

logger = logging.getLogger(__name__)

# The two phases of a generation: the prompt pass, and one token against a past.
PREFILL, DECODE = Phase.PREFILL, Phase.DECODE


@dataclass(frozen=True)
class GenerationConfig:
    """What the generation scenario measures.

    Attributes:
        prefill_lens: prompt lengths whose prompt pass is timed.
        decode_past_lens: past lengths at which one-token steps are timed.
        prompt_len: the prompt of the timed greedy generations (time to first token, tokens/s).
        new_tokens: tokens each greedy generation makes; also those compared against the baseline.
        generation_runs: timed greedy generations (after one untimed).
        speedup_past_len: the past length at which the decode step is timed interleaved against the baseline;
            one of `decode_past_lens`, or None for no speed-up.
        speedup_prefill_len: the prompt length whose prompt pass is timed interleaved against the baseline; one of
            `prefill_lens`, or None for no speed-up.
        roofline_runs: profiled runs (the first one dropped) of each phase at its length (`phase_lens`), for
            the phase's roofline; 0 for none.
        timing: how each prefill and decode step is timed.
        seed: seed of the random prompts.
    """

    prefill_lens: tuple[int, ...] = (32, 128)
    decode_past_lens: tuple[int, ...] = (32, 128, 512)
    prompt_len: int = 32
    new_tokens: int = 64
    generation_runs: int = 5
    speedup_past_len: int | None = 512
    speedup_prefill_len: int | None = 128
    roofline_runs: int = 10
    timing: TimingConfig = field(default_factory=TimingConfig)
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.prefill_lens or min(self.prefill_lens) < 1:
            raise ValueError(f"prefill_lens must be positive integers, got {self.prefill_lens}")
        if not self.decode_past_lens or min(self.decode_past_lens) < 1:
            raise ValueError(f"decode_past_lens must be positive integers, got {self.decode_past_lens}")
        if min(self.prompt_len, self.new_tokens, self.generation_runs) < 1:
            raise ValueError(f"prompt_len, new_tokens and generation_runs must be >= 1, got {self.prompt_len}, "
                             f"{self.new_tokens} and {self.generation_runs}")
        if self.speedup_past_len is not None and self.speedup_past_len not in self.decode_past_lens:
            raise ValueError(f"speedup_past_len must be one of decode_past_lens {self.decode_past_lens} or None, "
                             f"got {self.speedup_past_len}")
        if self.speedup_prefill_len is not None and self.speedup_prefill_len not in self.prefill_lens:
            raise ValueError(f"speedup_prefill_len must be one of prefill_lens {self.prefill_lens} or None, "
                             f"got {self.speedup_prefill_len}")
        if self.roofline_runs == 1 or self.roofline_runs < 0:
            raise ValueError(f"roofline_runs must be 0 (no roofline) or >= 2 (the first is dropped), "
                             f"got {self.roofline_runs}")

    @property
    def phase_lens(self) -> dict[str, int]:
        """The length each phase is timed against the baseline and costed at: the prompt length of the prefill,
        the past length of the decode step (the longest when no speed-up is asked for)."""
        return {PREFILL: self.speedup_prefill_len or max(self.prefill_lens),
                DECODE: self.speedup_past_len or max(self.decode_past_lens)}

    def speedup_len(self, phase: Phase) -> int | None:
        return {PREFILL: self.speedup_prefill_len, DECODE: self.speedup_past_len}[phase]

    def check_positions(self, max_positions: int) -> None:
        """Raises ValueError when a prompt, a past plus its new token, or the generation is longer than the model's
        position table (ONNX Runtime would stop on the Gather of positions mid-measurement)."""
        longest = {
            "the longest prefill": max(self.prefill_lens),
            "the longest past plus one token": max(self.decode_past_lens) + 1,
            "prompt_len + new_tokens": self.prompt_len + self.new_tokens,
        }
        over = {k: v for k, v in longest.items() if v > max_positions}
        if over:
            raise ValueError(f"the model has {max_positions} positions; too long: {over}")

    def params(self) -> dict[str, str]:
        return {
            "gen.prefill_lens": ",".join(map(str, self.prefill_lens)),
            "gen.decode_past_lens": ",".join(map(str, self.decode_past_lens)),
            "gen.prompt_len": str(self.prompt_len),
            "gen.new_tokens": str(self.new_tokens),
            "gen.generation_runs": str(self.generation_runs),
            "gen.speedup_past_len": str(self.speedup_past_len),
            "gen.speedup_prefill_len": str(self.speedup_prefill_len),
            "gen.roofline_runs": str(self.roofline_runs),
        }


@dataclass(frozen=True)
class GenerationResult:
    """The generation scenario's figures for one model.

    Attributes:
        prefill: latency of the prompt pass, by prompt length.
        decode: latency of one token against a past, by past length.
        ttft_ms: median time to first token of the greedy generations (prompt pass and argmax).
        tokens_per_s: new tokens over the median wall time of a whole greedy generation, prompt pass included.
        decode_tokens_per_s: the tokens after the first over the median time they took.
        generation: the last timed greedy generation.
        phase_lens: each phase's length (`GenerationConfig.phase_lens`): the keys of its speed-up and roofline.
        speedups: by phase, the phase at its length timed against the baseline; only phases that were.
        rooflines: by phase, the phase's profiled kernels at its length against the machine's roofs.
        decode_split: where the decode step's time goes at its length (`phase_lens`), from the decode phase's
            profiled steps; None without a roofline.
        phase_timings: by phase, the tokens per second of the interleaved timing that gave its speed-up.
        io_binding: the decode loop ran through IO binding (`binding.BoundDecoder`), not numpy.
        along_reference: the next-token logits [batch, vocab] of each step when the reference's tokens are fed
            (the reference's prompt, then its generated tokens one at a time), or None without a reference.
    """

    prefill: Mapping[int, Latency]
    decode: Mapping[int, Latency]
    ttft_ms: float
    tokens_per_s: float
    decode_tokens_per_s: float
    generation: Generation
    phase_lens: Mapping[str, int] = field(default_factory=dict)
    speedups: Mapping[str, Speedup] = field(default_factory=dict)
    rooflines: Mapping[str, Roofline] = field(default_factory=dict)
    decode_split: StepSplit | None = None
    phase_timings: Mapping[str, PhaseTiming] = field(default_factory=dict)
    io_binding: bool = False
    along_reference: tuple[np.ndarray, ...] | None = None

    def metrics(self) -> dict[str, float]:
        """`gen.*` metric values: `gen.<phase>.<length>.speedup*` and `gen.<phase>.<length>.roofline.*` per phase
        (`phase_prefix`), and the decode step's split at its length, `gen.decode.<length>.split.*`."""
        metrics = {phase_prefix(phase, n) + "p50_ms": lat.p50_ms
                   for phase, latencies in ((PREFILL, self.prefill), (DECODE, self.decode))
                   for n, lat in latencies.items()}
        metrics.update({"gen.ttft_ms": self.ttft_ms, "gen.tokens_per_s": self.tokens_per_s,
                        "gen.decode_tokens_per_s": self.decode_tokens_per_s})
        for phase, speedup in self.speedups.items():
            metrics.update(speedup_metrics(speedup, Scope(Phase(phase), self.phase_lens[phase])))
        for phase, timing in self.phase_timings.items():
            metrics.update(timing.metrics(phase_prefix(phase, self.phase_lens[phase])))
        for phase, roofline in self.rooflines.items():
            prefix = phase_prefix(phase, self.phase_lens[phase])
            metrics.update({prefix + key: value for key, value in roofline.metrics().items()})
        if self.decode_split is not None:
            prefix = phase_prefix(DECODE, self.phase_lens[DECODE])
            metrics.update({prefix + key: value for key, value in self.decode_split.metrics().items()})
        return metrics


def measure_generation(
    model: onnx.ModelProto | str | Path,
    *,
    session: SessionConfig,
    config: GenerationConfig,
    max_positions: int | None = None,
    baseline: onnx.ModelProto | str | Path | None = None,
    baseline_session: SessionConfig | None = None,
    speedup: SpeedupConfig | None = None,
    reference: Generation | None = None,
    machine: MachinePeaks | None = None,
    workdir: str | Path | None = None,
) -> GenerationResult:
    """Times a decode-ready model's prompt passes, decode steps and greedy generations (batch 1), and costs each
    phase against the machine's roofs.

    Each prefill and decode step is timed with `time_runs` (warm-up, then >= N runs and >= T s) in one session with
    ONNX Runtime's default spinning, like the forward latency. A decode step at past length p runs one token against
    the past a prompt pass of p random tokens made, the same past every run. When `baseline` is given, each phase
    at its `config.speedup_*_len` is timed interleaved against it in rounds of fresh sessions (`measure_speedup`),
    each session with its own past from the same tokens. With `config.roofline_runs`, each phase at its
    `config.phase_lens` length is profiled in a session of its own and its kernels costed (`build_roofline`); the
    decode step's profiled steps, each timed as the decode loop runs it, also give where its time goes
    (`decode_split`).

    Args:
        model: the decode-ready model.
        session: ONNX Runtime settings of every session.
        config: what to measure.
        max_positions: the model's position table size; lengths beyond it are refused before anything runs.
        baseline: the decode-ready baseline to time the phases against.
        baseline_session: the baseline's ONNX Runtime settings (default: `session` without IO binding): an attempt's
            session entry changes the attempt's, not the baseline's.
        speedup: how the interleaved timing runs (default `SpeedupConfig()`).
        reference: a generation (the baseline's) whose tokens the model is fed, for `along_reference`.
        machine: the roofs of the phases' rooflines (without them, no share of peak).
        workdir: where the phases' profiles are written (default: a temporary folder, removed).

    Raises:
        ValueError: the model is not decode-ready, or a length exceeds `max_positions`.
        ModelError: ONNX Runtime refuses the model.
    """
    if max_positions is not None:
        config.check_positions(max_positions)
    decoder = DecoderSession.open(model, session)
    io_binding = session.decode_io_binding
    vocab = decoder.vocab_size
    lens = config.phase_lens
    latencies: dict[str, dict[int, Latency]] = {PREFILL: {}, DECODE: {}}
    phase_feeds: dict[Phase, dict[str, np.ndarray]] = {}  # each phase's feeds at its length, for its roofline
    for phase, lengths in ((PREFILL, config.prefill_lens), (DECODE, config.decode_past_lens)):
        for n in lengths:
            feeds = decoder.phase_feeds(phase_tokens(config, phase, n, vocab), _past_len(phase, n))
            logger.info("generation: timing the %s at %d", phase, n)
            latencies[phase][n] = time_runs(loop_step(decoder, feeds, io_binding=io_binding), config.timing)
            if n == lens[phase]:
                phase_feeds[phase] = feeds
    prompt = _random_tokens(np.random.default_rng([config.seed, 1]), config.prompt_len, vocab)
    logger.info("generation: %d greedy generations of %d tokens", config.generation_runs, config.new_tokens)
    capacity = max(config.prompt_len, reference.prompt.shape[1] if reference is not None else 0) + config.new_tokens
    looper = BoundDecoder(decoder, batch=1, capacity=capacity) if io_binding else decoder
    looper.greedy(prompt, config.new_tokens)  # untimed: the first generation allocates the growing pasts
    runs = [looper.greedy(prompt, config.new_tokens) for _ in range(config.generation_runs)]
    first_s = float(np.median([g.first_token_s for g in runs]))
    total_s = float(np.median([g.total_s for g in runs]))
    rest_s = float(np.median([g.total_s - g.first_token_s for g in runs]))
    along = None
    if reference is not None:
        logger.info("generation: feeding the reference's %d tokens", reference.tokens.shape[1])
        along = tuple(looper.forced_logits(reference.prompt, reference.tokens))
    del decoder, looper  # free this session before the profiled and the interleaved ones
    rooflines: dict[str, Roofline] = {}
    split = None
    if config.roofline_runs:
        with tempfile.TemporaryDirectory(prefix="tracker-generation-") as tmp:
            folder = Path(workdir) if workdir is not None else Path(tmp)
            for phase, feeds in phase_feeds.items():
                logger.info("generation: profiling %d runs of the %s at %d", config.roofline_runs, phase, lens[phase])
                if phase == DECODE:
                    rooflines[phase], split = _decode_roofline(model, feeds, session, config.roofline_runs, machine,
                                                               folder / phase)
                else:
                    rooflines[phase] = _phase_roofline(model, feeds, session, config.roofline_runs, machine,
                                                       folder / phase)
    speedups: dict[str, Speedup] = {}
    timings: dict[str, PhaseTiming] = {}
    for phase in GENERATION_PHASES:
        length = config.speedup_len(phase)
        if baseline is None or length is None:
            continue
        logger.info("generation: timing the %s at %d against the baseline", phase, length)
        tokens, past_len = phase_tokens(config, phase, length, vocab), _past_len(phase, length)
        timings[phase] = time_phase(baseline, model, tokens=tokens, past_len=past_len, session=session,
                                    baseline_session=baseline_session or replace(session, decode_io_binding=False),
                                    config=speedup or SpeedupConfig())
        speedups[phase] = timings[phase].speedup
    return GenerationResult(
        prefill=latencies[PREFILL],
        decode=latencies[DECODE],
        ttft_ms=first_s * 1e3,
        tokens_per_s=config.new_tokens / total_s,
        decode_tokens_per_s=(config.new_tokens - 1) / rest_s if config.new_tokens > 1 else float("nan"),
        generation=runs[-1],
        phase_lens=lens,
        speedups=speedups,
        rooflines=rooflines,
        decode_split=split,
        phase_timings=timings,
        io_binding=io_binding,
        along_reference=along,
    )


def _past_len(phase: str, length: int) -> int:
    """The past a phase's step runs after: none for a prompt pass, `length` for a decode step."""
    return 0 if phase == PREFILL else length


def phase_tokens(config: GenerationConfig, phase: str, length: int, vocab: int) -> np.ndarray:
    """The random tokens of a phase at a length: a prompt of `length`, or a past of `length` and one token."""
    if phase == PREFILL:
        return _random_tokens(np.random.default_rng([config.seed, 0, length]), length, vocab)
    return _random_tokens(np.random.default_rng([config.seed, length]), length + 1, vocab)


def _phase_roofline(model, feeds: Mapping[str, np.ndarray], session: SessionConfig, runs: int,
                    machine: MachinePeaks | None, workdir: Path) -> Roofline:
    """The phase's kernels (one profiled session, its first run dropped) against the machine's roofs."""
    profiled = profile_ort(model, feeds, config=session, runs=runs, workdir=workdir, save_optimized_model=False)
    events = parse_profile(profiled.profile_path).events
    return build_roofline(events, machine=machine, skip_runs=1, tokens_per_run=count_tokens(feeds))


def _decode_roofline(model, feeds: Mapping[str, np.ndarray], session: SessionConfig, runs: int,
                     machine: MachinePeaks | None, workdir: Path) -> tuple[Roofline, StepSplit]:
    """The decode step's roofline (as `_phase_roofline`) and where its time goes, from one profiled session whose
    steps are timed as the decode loop runs them, numpy or IO binding (the first step dropped from both)."""
    io_binding = session.decode_io_binding
    steps = profile_steps(model, session, lambda s: loop_step(DecoderSession(s), feeds, io_binding=io_binding),
                          runs=runs, workdir=workdir)
    roofline = build_roofline(steps.profile.events, machine=machine, skip_runs=1, tokens_per_run=count_tokens(feeds))
    return roofline, steps.split(skip_runs=1)


def _random_tokens(rng: np.random.Generator, n: int, vocab: int) -> np.ndarray:
    return rng.integers(0, vocab, size=(1, n), dtype=np.int64)
