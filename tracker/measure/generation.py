"""Generation with a decode-ready ONNX model: a session that prefills and steps a KV cache, greedy decoding, the
generation scenario's figures (prefill, decode per past length, time to first token, tokens/s) and its accuracy
check against a baseline (greedy-token agreement, KL of the first step).

A decode-ready model takes `input_ids` [batch, seq] and, per layer, `past_key_values.{i}.key/value`
[batch, heads, past, head_dim], and gives `logits` [batch, seq, vocab] and `present.{i}.key/value` (the past with the
new positions appended). A past of length 0 is the prompt pass (prefill). Positions and the all-ones attention mask
are made inside the graph from the past's length, so the rows of a batch must be unpadded and of one length.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx

from tracker.measure.latency import Latency, TimingConfig, time_runs
from tracker.measure.lm_diff import LOGITS_FP32, compare_logits
from tracker.measure.ort_runtime import SessionConfig, make_session
from tracker.measure.speedup import Runner, Speedup, SpeedupConfig, measure_speedup

logger = logging.getLogger(__name__)

INPUT_IDS = "input_ids"
LOGITS = "logits"
PAST_PREFIX = "past_key_values."
PRESENT_PREFIX = "present."
_DTYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16}


def past_names(n_layer: int) -> tuple[str, ...]:
    """The past inputs of a decode-ready model, in order: key then value of layer 0, 1, ..."""
    return tuple(f"{PAST_PREFIX}{i}.{kind}" for i in range(n_layer) for kind in ("key", "value"))


def present_name(past: str) -> str:
    """The output that carries `past` (`past_key_values.3.key`) to the next step (`present.3.key`)."""
    if not past.startswith(PAST_PREFIX):
        raise ValueError(f"a past input's name starts with {PAST_PREFIX!r}, got {past!r}")
    return PRESENT_PREFIX + past[len(PAST_PREFIX):]


@dataclass(frozen=True)
class Generation:
    """A greedy generation: the new tokens, the next-token logits of every step, and how long it took.

    Attributes:
        tokens: int64 [batch, new_tokens], the argmax of each step.
        step_logits: [batch, vocab] per step; the first is the prompt pass's last position.
        first_token_s: seconds from the start to the first token (the prompt pass and its argmax).
        total_s: seconds for the whole generation.
    """

    tokens: np.ndarray
    step_logits: tuple[np.ndarray, ...]
    first_token_s: float
    total_s: float


class DecoderSession:
    """A decode-ready ONNX model in an ONNX Runtime session: prefill, one-token steps and greedy generation.

    Raises:
        ValueError: the session's model is not decode-ready (inputs `input_ids` and `past_key_values.*` only, a
            `present.*` output for each past, past shapes with static heads and head_dim).
    """

    def __init__(self, session) -> None:
        inputs = {i.name: i for i in session.get_inputs()}
        outputs = [o.name for o in session.get_outputs()]
        pasts = tuple(n for n in inputs if n.startswith(PAST_PREFIX))
        other = sorted(set(inputs) - {INPUT_IDS} - set(pasts))
        missing = [present_name(p) for p in pasts if present_name(p) not in outputs]
        if INPUT_IDS not in inputs or LOGITS not in outputs or not pasts or other or missing:
            raise ValueError(
                f"a decode-ready model takes {INPUT_IDS!r} and {PAST_PREFIX}<i>.key/value, and gives {LOGITS!r} and "
                f"{PRESENT_PREFIX}<i>.key/value; got inputs {list(inputs)} and outputs {outputs}"
            )
        shape = inputs[pasts[0]].shape
        if len(shape) != 4 or not all(isinstance(d, int) for d in (shape[1], shape[3])):
            raise ValueError(f"past inputs are [batch, heads, past, head_dim] with static heads and head_dim, "
                             f"got {pasts[0]} of shape {shape}")
        if inputs[pasts[0]].type not in _DTYPES:
            raise ValueError(f"past inputs are float or float16, got {inputs[pasts[0]].type}")
        self.session = session
        self.past_names = pasts
        self.num_heads, self.head_dim = int(shape[1]), int(shape[3])
        self.dtype = _DTYPES[inputs[pasts[0]].type]
        self.output_names = (LOGITS, *(present_name(p) for p in pasts))

    @classmethod
    def open(
        cls, model: onnx.ModelProto | str | Path, config: SessionConfig, *, stop_spinning_after_run: bool = False
    ) -> DecoderSession:
        """A session of `model` with `config`'s settings (`make_session`)."""
        return cls(make_session(model, config, stop_spinning_after_run=stop_spinning_after_run))

    def empty_past(self, batch: int) -> dict[str, np.ndarray]:
        """A past of length 0: what the prompt pass takes."""
        return {n: np.zeros((batch, self.num_heads, 0, self.head_dim), dtype=self.dtype) for n in self.past_names}

    def feeds(self, tokens: np.ndarray, past: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The session's feeds for `tokens` [batch, seq] after `past`."""
        return {INPUT_IDS: np.asarray(tokens, dtype=np.int64), **past}

    def step(self, tokens: np.ndarray, past: Mapping[str, np.ndarray]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Runs `tokens` [batch, seq] after `past`: (logits [batch, seq, vocab], the past including them)."""
        logits, *presents = self.session.run(list(self.output_names), self.feeds(tokens, past))
        return logits, dict(zip(self.past_names, presents, strict=True))

    def prefill(self, prompt: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """The prompt pass: `step` with an empty past."""
        prompt = _check_tokens(prompt)
        return self.step(prompt, self.empty_past(prompt.shape[0]))

    def greedy(self, prompt: np.ndarray, new_tokens: int) -> Generation:
        """Generates `new_tokens` tokens after `prompt` [batch, seq], each the argmax of its step's logits."""
        if new_tokens < 1:
            raise ValueError(f"new_tokens must be >= 1, got {new_tokens}")
        start = time.perf_counter()
        logits, past = self.prefill(prompt)
        next_logits = logits[:, -1, :]
        token = next_logits.argmax(axis=-1)
        first_token_s = time.perf_counter() - start
        tokens, step_logits = [token], [next_logits]
        for _ in range(new_tokens - 1):
            logits, past = self.step(token[:, None], past)
            next_logits = logits[:, -1, :]
            token = next_logits.argmax(axis=-1)
            tokens.append(token)
            step_logits.append(next_logits)
        total_s = time.perf_counter() - start
        return Generation(np.stack(tokens, axis=1).astype(np.int64), tuple(step_logits), first_token_s, total_s)

    def forced_logits(self, prompt: np.ndarray, continuation: np.ndarray) -> list[np.ndarray]:
        """The next-token logits [batch, vocab] at each step when `continuation` [batch, n] is fed one token at a
        time after `prompt`: the first is the prompt pass's last position, the last predicts continuation[:, -1]."""
        continuation = _check_tokens(continuation)
        logits, past = self.prefill(prompt)
        result = [logits[:, -1, :]]
        for i in range(continuation.shape[1] - 1):
            logits, past = self.step(continuation[:, i : i + 1], past)
            result.append(logits[:, -1, :])
        return result


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
        timing: how each prefill and decode step is timed.
        seed: seed of the random prompts.
    """

    prefill_lens: tuple[int, ...] = (32, 128)
    decode_past_lens: tuple[int, ...] = (32, 128, 512)
    prompt_len: int = 32
    new_tokens: int = 64
    generation_runs: int = 5
    speedup_past_len: int | None = 512
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
        generation: the last timed greedy generation (for the accuracy check).
        speedup: the decode step at `speedup_past_len` against the baseline, or None.
        speedup_past_len: the past length of `speedup`.
    """

    prefill: Mapping[int, Latency]
    decode: Mapping[int, Latency]
    ttft_ms: float
    tokens_per_s: float
    decode_tokens_per_s: float
    generation: Generation
    speedup: Speedup | None = None
    speedup_past_len: int | None = None

    def metrics(self) -> dict[str, float]:
        """`gen.*` metric values."""
        metrics = {f"gen.prefill.s{n}.p50_ms": lat.p50_ms for n, lat in self.prefill.items()}
        metrics.update({f"gen.decode.past{n}.p50_ms": lat.p50_ms for n, lat in self.decode.items()})
        metrics.update({"gen.ttft_ms": self.ttft_ms, "gen.tokens_per_s": self.tokens_per_s,
                        "gen.decode_tokens_per_s": self.decode_tokens_per_s})
        if self.speedup is not None:
            prefix = f"gen.decode.past{self.speedup_past_len}."
            metrics.update({prefix + key.removeprefix("latency."): value
                            for key, value in self.speedup.metrics().items()})
        return metrics


@dataclass(frozen=True)
class GenerationDiff:
    """An attempt's greedy generation against the baseline's, from the same prompt.

    Attributes:
        token_agreement: share of the new tokens equal position by position.
        first_divergence: index of the first token that differs (the number of tokens when none does).
        first_step_kl: mean over the batch of KL(baseline || attempt) of the first next-token distribution (nats).
        first_step_max_abs: largest absolute difference of the first step's logits.
    """

    token_agreement: float
    first_divergence: int
    first_step_kl: float
    first_step_max_abs: float

    def metrics(self) -> dict[str, float]:
        return {
            "gen.token_agreement": self.token_agreement,
            "gen.first_divergence": float(self.first_divergence),
            "gen.first_step_kl": self.first_step_kl,
            "gen.first_step_max_abs": self.first_step_max_abs,
        }


def compare_generations(baseline: Generation, attempt: Generation) -> GenerationDiff:
    """Greedy-token agreement and the first step's divergence of `attempt` against `baseline`.

    Raises:
        ValueError: the two generations have different shapes.
    """
    if baseline.tokens.shape != attempt.tokens.shape:
        raise ValueError(f"generations of different shapes: {baseline.tokens.shape} and {attempt.tokens.shape}")
    equal = np.all(baseline.tokens == attempt.tokens, axis=0)  # a position agrees when every row does
    first = int(np.argmin(equal)) if not equal.all() else int(equal.size)
    # The first step's check is the forward check with one position (float64, finite-aware).
    diff = compare_logits([baseline.step_logits[0]], [attempt.step_logits[0]], LOGITS_FP32)
    return GenerationDiff(float(equal.mean()), first, diff.kl_divergence, diff.max_abs)


def measure_generation(
    model: onnx.ModelProto | str | Path,
    *,
    session: SessionConfig,
    config: GenerationConfig,
    max_positions: int | None = None,
    baseline: onnx.ModelProto | str | Path | None = None,
    speedup: SpeedupConfig | None = None,
) -> GenerationResult:
    """Times a decode-ready model's prompt passes, decode steps and greedy generations (batch 1).

    Each prefill and decode step is timed with `time_runs` (warm-up, then >= N runs and >= T s) in one session with
    ONNX Runtime's default spinning, like the forward latency. A decode step at past length p runs one token against
    the past a prompt pass of p random tokens made, the same past every run. When `baseline` is given, the decode
    step at `config.speedup_past_len` is timed interleaved against it in rounds of fresh sessions
    (`measure_speedup`), each session with its own past from the same tokens.

    Args:
        model: the decode-ready model.
        session: ONNX Runtime settings of every session.
        config: what to measure.
        max_positions: the model's position table size; lengths beyond it are refused before anything runs.
        baseline: the decode-ready baseline to time the decode step against.
        speedup: how the interleaved timing runs (default `SpeedupConfig()`).

    Raises:
        ValueError: the model is not decode-ready, or a length exceeds `max_positions`.
        ModelError: ONNX Runtime refuses the model.
    """
    if max_positions is not None:
        config.check_positions(max_positions)
    decoder = DecoderSession.open(model, session)
    vocab = _vocab_size(decoder)
    rng = np.random.default_rng(config.seed)
    prefill = {}
    for n in config.prefill_lens:
        feeds = decoder.feeds(_random_tokens(rng, n, vocab), decoder.empty_past(1))
        logger.info("generation: timing the prompt pass of %d tokens", n)
        prefill[n] = time_runs(lambda f=feeds: decoder.session.run(None, f), config.timing)
    decode = {}
    for p in config.decode_past_lens:
        feeds = _decode_feeds(decoder, _random_tokens(np.random.default_rng([config.seed, p]), p + 1, vocab))
        logger.info("generation: timing one token after a past of %d", p)
        decode[p] = time_runs(lambda f=feeds: decoder.session.run(None, f), config.timing)
    prompt = _random_tokens(np.random.default_rng([config.seed, 1]), config.prompt_len, vocab)
    logger.info("generation: %d greedy generations of %d tokens", config.generation_runs, config.new_tokens)
    decoder.greedy(prompt, config.new_tokens)  # untimed: the first generation allocates the growing pasts
    runs = [decoder.greedy(prompt, config.new_tokens) for _ in range(config.generation_runs)]
    first_s = float(np.median([g.first_token_s for g in runs]))
    total_s = float(np.median([g.total_s for g in runs]))
    rest_s = float(np.median([g.total_s - g.first_token_s for g in runs]))
    decoder = None  # free this session before the interleaved ones
    measured = None
    if baseline is not None and config.speedup_past_len is not None:
        p = config.speedup_past_len
        tokens = _random_tokens(np.random.default_rng([config.seed, p]), p + 1, vocab)
        logger.info("generation: timing the decode step at past %d against the baseline", p)
        measured = measure_speedup(_decode_runners(baseline, session, tokens), _decode_runners(model, session, tokens),
                                   speedup or SpeedupConfig())
    return GenerationResult(
        prefill=prefill,
        decode=decode,
        ttft_ms=first_s * 1e3,
        tokens_per_s=config.new_tokens / total_s,
        decode_tokens_per_s=(config.new_tokens - 1) / rest_s if config.new_tokens > 1 else float("nan"),
        generation=runs[-1],
        speedup=measured,
        speedup_past_len=config.speedup_past_len if measured is not None else None,
    )


def _decode_feeds(decoder: DecoderSession, tokens: np.ndarray) -> dict[str, np.ndarray]:
    """Feeds for the last of `tokens` [1, p + 1] after the past the prompt pass of the others made."""
    _, past = decoder.prefill(tokens[:, :-1])
    return decoder.feeds(tokens[:, -1:], past)


def _decode_runners(model: onnx.ModelProto | str | Path, session: SessionConfig, tokens: np.ndarray):
    """Fresh sessions (threads that stop spinning after a run) bound to one decode step, for `measure_speedup`."""
    if not isinstance(model, onnx.ModelProto):
        model = str(model)  # a path stays a path: each session reads it (and its external data) itself

    def make() -> Runner:
        decoder = DecoderSession.open(model, session, stop_spinning_after_run=True)
        feeds = _decode_feeds(decoder, tokens)
        return lambda: decoder.session.run(None, feeds)

    return make


def _vocab_size(decoder: DecoderSession) -> int:
    (logits,) = [o for o in decoder.session.get_outputs() if o.name == LOGITS]
    vocab = logits.shape[-1]
    if not isinstance(vocab, int):
        raise ValueError(f"the logits' last dimension (the vocabulary) must be static, got {logits.shape}")
    return vocab


def _random_tokens(rng: np.random.Generator, n: int, vocab: int) -> np.ndarray:
    return rng.integers(0, vocab, size=(1, n), dtype=np.int64)


def _check_tokens(tokens: np.ndarray) -> np.ndarray:
    tokens = np.asarray(tokens)
    if tokens.dtype != np.int64 or tokens.ndim != 2 or tokens.shape[1] < 1:
        raise ValueError(f"tokens must be an int64 array [batch, seq >= 1], got {tokens.dtype} of shape {tokens.shape}")
    return tokens
