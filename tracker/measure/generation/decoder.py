"""A decode-ready ONNX model in a session: the prompt pass, then one token at a time against a KV cache, and greedy
generation.

A decode-ready model takes `input_ids` [batch, seq] and, per layer, `past_key_values.{i}.key/value`
[batch, heads, past, head_dim], and gives `logits` [batch, seq, vocab] and `present.{i}.key/value` (the past with the
new positions appended). A past of length 0 is the prompt pass (prefill). Positions and the all-ones attention mask
are made inside the graph from the past's length, so the rows of a batch must be unpadded and of one length.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from tracker.measure.runtimes.ort_runtime import SessionConfig, make_session

INPUT_IDS = "input_ids"
LOGITS = "logits"
PAST_PREFIX = "past_key_values."
PRESENT_PREFIX = "present."
# The lengths a model whose attention takes its past in a buffer of any capacity needs (`optimize.shared_kv`):
# per row, the positions after this step minus one; and the positions after this step.
SEQLENS_K = "seqlens_k"
TOTAL_SEQUENCE_LENGTH = "total_sequence_length"
LENGTH_INPUTS = (SEQLENS_K, TOTAL_SEQUENCE_LENGTH)
# int8: a cache the attention keeps quantized (`optimize.quantize.kv_cache`)
_DTYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(int8)": np.int8}


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
        prompt: int64 [batch, prompt_len], what the generation started from.
        tokens: int64 [batch, new_tokens], the argmax of each step.
        step_logits: [batch, vocab] per step; the first is the prompt pass's last position.
        first_token_s: seconds from the start to the first token (the prompt pass and its argmax).
        total_s: seconds for the whole generation.
    """

    prompt: np.ndarray
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
        lengths = tuple(n for n in LENGTH_INPUTS if n in inputs)
        other = sorted(set(inputs) - {INPUT_IDS} - set(pasts) - set(lengths))
        missing = [present_name(p) for p in pasts if present_name(p) not in outputs]
        if INPUT_IDS not in inputs or LOGITS not in outputs or not pasts or other or missing or len(lengths) == 1:
            raise ValueError(
                f"a decode-ready model takes {INPUT_IDS!r} and {PAST_PREFIX}<i>.key/value (and {SEQLENS_K!r} with "
                f"{TOTAL_SEQUENCE_LENGTH!r}, or neither), and gives {LOGITS!r} and "
                f"{PRESENT_PREFIX}<i>.key/value; got inputs {list(inputs)} and outputs {outputs}"
            )
        shape = inputs[pasts[0]].shape
        if len(shape) != 4 or not all(isinstance(d, int) for d in (shape[1], shape[3])):
            raise ValueError(f"past inputs are [batch, heads, past, head_dim] with static heads and head_dim, "
                             f"got {pasts[0]} of shape {shape}")
        if inputs[pasts[0]].type not in _DTYPES:
            raise ValueError(f"past inputs are float, float16 or int8, got {inputs[pasts[0]].type}")
        self.session = session
        self.past_names = pasts
        self.num_heads, self.head_dim = int(shape[1]), int(shape[3])
        self.dtype = _DTYPES[inputs[pasts[0]].type]
        self.output_names = (LOGITS, *(present_name(p) for p in pasts))
        self.takes_lengths = bool(lengths)

    @classmethod
    def open(
        cls, model: onnx.ModelProto | str | Path, config: SessionConfig, *, stop_spinning_after_run: bool = False
    ) -> DecoderSession:
        """A session of `model` with `config`'s settings (`make_session`)."""
        return cls(make_session(model, config, stop_spinning_after_run=stop_spinning_after_run))

    @property
    def vocab_size(self) -> int:
        """The logits' last dimension.

        Raises:
            ValueError: it is not static.
        """
        (logits,) = [o for o in self.session.get_outputs() if o.name == LOGITS]
        vocab = logits.shape[-1]
        if not isinstance(vocab, int):
            raise ValueError(f"the logits' last dimension (the vocabulary) must be static, got {logits.shape}")
        return vocab

    def empty_past(self, batch: int) -> dict[str, np.ndarray]:
        """A past of length 0: what the prompt pass takes."""
        return {n: np.zeros((batch, self.num_heads, 0, self.head_dim), dtype=self.dtype) for n in self.past_names}

    def feeds(self, tokens: np.ndarray, past: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The session's feeds for `tokens` [batch, seq] after `past`."""
        tokens = np.asarray(tokens, dtype=np.int64)
        feeds = {INPUT_IDS: tokens, **past}
        if self.takes_lengths:
            past_len = next(iter(past.values())).shape[2]
            feeds.update(length_feeds(tokens.shape[0], past_len + tokens.shape[1]))
        return feeds

    def phase_feeds(self, tokens: np.ndarray, past_len: int) -> dict[str, np.ndarray]:
        """Feeds for `tokens[:, past_len:]` after the past the prompt pass of `tokens[:, :past_len]` made; a
        `past_len` of 0 is a prompt pass (an empty past)."""
        if past_len == 0:
            return self.feeds(tokens, self.empty_past(tokens.shape[0]))
        _, past = self.prefill(tokens[:, :past_len])
        return self.feeds(tokens[:, past_len:], past)

    def step(self, tokens: np.ndarray, past: Mapping[str, np.ndarray]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Runs `tokens` [batch, seq] after `past`: (logits [batch, seq, vocab], the past including them)."""
        logits, *presents = self.session.run(list(self.output_names), self.feeds(tokens, past))
        return logits, dict(zip(self.past_names, presents, strict=True))

    def prefill(self, prompt: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """The prompt pass: `step` with an empty past."""
        prompt = check_tokens(prompt)
        return self.step(prompt, self.empty_past(prompt.shape[0]))

    def next_logits(self) -> tuple[NextLogits, NextLogits]:
        """The prompt pass and the step after it, each giving the next-token logits [batch, vocab], with the past
        carried between calls: what `greedy` and `forced` drive."""
        past: dict[str, np.ndarray] = {}

        def prefill(prompt: np.ndarray) -> np.ndarray:
            logits, new = self.prefill(prompt)
            past.clear()
            past.update(new)
            return logits[:, -1, :]

        def step(tokens: np.ndarray) -> np.ndarray:
            logits, new = self.step(tokens, past)
            past.update(new)
            return logits[:, -1, :]

        return prefill, step

    def greedy(self, prompt: np.ndarray, new_tokens: int) -> Generation:
        """Generates `new_tokens` tokens after `prompt` [batch, seq], each the argmax of its step's logits."""
        return greedy(*self.next_logits(), prompt, new_tokens)

    def forced_logits(self, prompt: np.ndarray, continuation: np.ndarray) -> list[np.ndarray]:
        """The next-token logits [batch, vocab] at each step when `continuation` [batch, n] is fed one token at a
        time after `prompt`: the first is the prompt pass's last position, the last predicts continuation[:, -1]."""
        return forced(*self.next_logits(), prompt, continuation)


# The next-token logits [batch, vocab] of a prompt pass or of one step after the calls before; arrays the caller keeps.
NextLogits = Callable[[np.ndarray], np.ndarray]


def greedy(prefill: NextLogits, step: NextLogits, prompt: np.ndarray, new_tokens: int) -> Generation:
    """Generates `new_tokens` tokens after `prompt` [batch, seq], each the argmax of its step's logits, timed."""
    if new_tokens < 1:
        raise ValueError(f"new_tokens must be >= 1, got {new_tokens}")
    prompt = check_tokens(prompt)
    start = time.perf_counter()
    next_logits = prefill(prompt)
    token = next_logits.argmax(axis=-1)
    first_token_s = time.perf_counter() - start
    tokens, step_logits = [token], [next_logits]
    for _ in range(new_tokens - 1):
        next_logits = step(token[:, None])
        token = next_logits.argmax(axis=-1)
        tokens.append(token)
        step_logits.append(next_logits)
    total_s = time.perf_counter() - start
    return Generation(prompt, np.stack(tokens, axis=1).astype(np.int64), tuple(step_logits), first_token_s, total_s)


def forced(prefill: NextLogits, step: NextLogits, prompt: np.ndarray, continuation: np.ndarray) -> list[np.ndarray]:
    """The next-token logits at each step when `continuation` [batch, n] is fed one token at a time after `prompt`."""
    continuation = check_tokens(continuation)
    result = [prefill(prompt)]
    for i in range(continuation.shape[1] - 1):
        result.append(step(continuation[:, i : i + 1]))
    return result


def length_feeds(batch: int, total: int) -> dict[str, np.ndarray]:
    """`seqlens_k` and `total_sequence_length` for a step that ends at `total` positions (past and new tokens)."""
    return {SEQLENS_K: np.full((batch,), total - 1, dtype=np.int32), TOTAL_SEQUENCE_LENGTH: np.array(total, np.int32)}


def check_tokens(tokens: np.ndarray) -> np.ndarray:
    tokens = np.asarray(tokens)
    if tokens.dtype != np.int64 or tokens.ndim != 2 or tokens.shape[1] < 1:
        raise ValueError(f"tokens must be an int64 array [batch, seq >= 1], got {tokens.dtype} of shape {tokens.shape}")
    return tokens
