"""Decoding through ONNX Runtime's IO binding: the KV cache in buffers allocated once.

A plain decode loop (`DecoderSession.step`) feeds the past as numpy arrays and gets every present back as a new array
that ORT allocated (ORT 1.32 hands its own buffers to numpy, without a copy). `BoundDecoder` binds the KV cache to
buffers allocated once, at the generation's full length, in one of two ways:
- a decode-ready model whose graph concatenates past and new positions: two buffers per tensor; a step reads the past
  from one and writes the present into the other, and the next step swaps them. The graph's own copy of the past
  into the present remains, and each step binds every tensor again (its length changed): on a small cache this costs
  more than it saves (docs/results.md).
- a model whose attention takes the past in a buffer of any capacity (`optimize.shared_kv`: GroupQueryAttention):
  one buffer per tensor, bound as both past and present, so the kernel writes only the new positions; the binding is
  made once per prompt length, and a decode step only writes the token and the lengths into bound arrays.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from tracker.measure.generation.decoder import (
    INPUT_IDS,
    LOGITS,
    SEQLENS_K,
    TOTAL_SEQUENCE_LENGTH,
    DecoderSession,
    Generation,
    NextLogits,
    check_tokens,
    forced,
    greedy,
    present_name,
)


@dataclass
class _Buffers:
    """Two flat buffers per past tensor (read one, write the other), the logits and the token ids."""

    past: dict[str, tuple[np.ndarray, np.ndarray]]
    logits: np.ndarray
    ids: np.ndarray
    seqlens_k: np.ndarray
    total: np.ndarray


class BoundDecoder:
    """A `DecoderSession` run through IO binding, with its KV cache in buffers allocated once for `capacity` positions.

    Args:
        decoder: the decode-ready session.
        batch: rows of every step.
        capacity: the longest past plus new tokens of any step (a prompt plus the tokens generated).
    """

    def __init__(self, decoder: DecoderSession, *, batch: int, capacity: int) -> None:
        if batch < 1 or capacity < 1:
            raise ValueError(f"batch and capacity must be >= 1, got {batch} and {capacity}")
        self.decoder = decoder
        self.batch, self.capacity = batch, capacity
        self.vocab = decoder.vocab_size
        size = batch * decoder.num_heads * capacity * decoder.head_dim
        # A model that takes the past's length apart (`optimize.shared_kv`) reads and writes one buffer per tensor.
        self.shared = decoder.takes_lengths

        def pair() -> tuple[np.ndarray, np.ndarray]:
            one = np.zeros(size, decoder.dtype)
            return (one, one) if self.shared else (one, np.zeros(size, decoder.dtype))

        self._buffers = _Buffers(
            past={n: pair() for n in decoder.past_names},
            logits=np.zeros(batch * capacity * self.vocab, np.float32),
            ids=np.zeros(batch * capacity, np.int64),
            seqlens_k=np.zeros(batch, np.int32),
            total=np.zeros((), np.int32),
        )
        self._binding = decoder.session.io_binding()
        self._past_len = 0  # positions held in the current side of the buffers
        self._shared_seq: int | None = None  # with one buffer per tensor: the new tokens' count the binding holds
        self._side = 0  # which of the two buffers holds the past

    @property
    def past_len(self) -> int:
        return self._past_len

    def reset(self) -> None:
        """Forgets the past: the next step is a prompt pass."""
        self._past_len, self._side = 0, 0

    def bind(self, tokens: np.ndarray) -> None:
        """Binds `tokens` [batch, seq] after the current past, and the outputs of that step, without running it."""
        tokens = check_tokens(tokens)
        batch, seq = tokens.shape
        if batch != self.batch:
            raise ValueError(f"this decoder's buffers hold batch {self.batch}, got tokens of batch {batch}")
        total = self._past_len + seq
        if total > self.capacity:
            raise ValueError(f"a past of {self._past_len} and {seq} new tokens exceed the buffers' capacity "
                             f"{self.capacity}")
        d, b = self.decoder, self._buffers
        ids = b.ids[: batch * seq].reshape(batch, seq)
        ids[...] = tokens
        self._bound = (batch, seq, total)
        if self.shared:
            b.seqlens_k[...] = total - 1
            b.total[...] = total
            if self._shared_seq == seq:  # every buffer is where it was bound: only the values above changed
                return
            self._shared_seq = seq
        io = self._binding
        io.bind_input(INPUT_IDS, "cpu", 0, np.int64, [batch, seq], ids.ctypes.data)
        past_shape = [batch, d.num_heads, self.capacity if self.shared else self._past_len, d.head_dim]
        present_shape = [batch, d.num_heads, self.capacity if self.shared else total, d.head_dim]
        if self.shared:
            io.bind_input(SEQLENS_K, "cpu", 0, np.int32, [batch], b.seqlens_k.ctypes.data)
            io.bind_input(TOTAL_SEQUENCE_LENGTH, "cpu", 0, np.int32, [], b.total.ctypes.data)
        for name in d.past_names:
            read, write = b.past[name][self._side], b.past[name][1 - self._side]
            io.bind_input(name, "cpu", 0, d.dtype, past_shape, read.ctypes.data)
            io.bind_output(present_name(name), "cpu", 0, d.dtype, present_shape, write.ctypes.data)
        io.bind_output(LOGITS, "cpu", 0, np.float32, [batch, seq, self.vocab], b.logits.ctypes.data)

    def run_bound(self) -> np.ndarray:
        """Runs the step last bound (again, when called twice): logits [batch, seq, vocab], a view of the buffer that
        the next step overwrites. The past does not advance (`advance` does)."""
        self.decoder.session.run_with_iobinding(self._binding)
        batch, seq, _ = self._bound
        return self._buffers.logits[: batch * seq * self.vocab].reshape(batch, seq, self.vocab)

    def advance(self) -> None:
        """Makes the present of the step last run the past of the next."""
        self._past_len = self._bound[2]
        if not self.shared:
            self._side = 1 - self._side

    def step(self, tokens: np.ndarray) -> np.ndarray:
        """Runs `tokens` [batch, seq] after the current past and keeps their keys and values: the logits (a view)."""
        self.bind(tokens)
        logits = self.run_bound()
        self.advance()
        return logits

    def prefill(self, prompt: np.ndarray) -> np.ndarray:
        """The prompt pass, from an empty past."""
        self.reset()
        return self.step(prompt)

    def step_runner(self, tokens: np.ndarray, past_len: int):
        """One step of a phase as the decode loop runs it, to time again and again: `tokens[:, past_len:]` after the
        past the prompt pass of `tokens[:, :past_len]` made (none when `past_len` is 0). Each call binds the step,
        as every step of a generation does, and runs it; the past stays where it is."""
        tokens = check_tokens(tokens)
        self.reset()
        if past_len:
            self.step(tokens[:, :past_len])
        new = tokens[:, past_len:]

        def run() -> np.ndarray:
            self.bind(new)
            return self.run_bound()

        return run

    def feeds_runner(self, feeds: Mapping[str, np.ndarray]):
        """The step `feeds` describe (`DecoderSession.phase_feeds`: tokens after a past given as arrays) as the decode
        loop runs it through IO binding: the past is copied once into the buffers, then each call binds the step and
        runs it, as `step_runner` does, without running a prompt pass of its own."""
        self.reset()
        d = self.decoder
        past = {name: np.asarray(feeds[name]) for name in d.past_names}
        past_len = next(iter(past.values())).shape[2]
        if past_len > self.capacity:
            raise ValueError(f"a past of {past_len} exceeds the buffers' capacity {self.capacity}")
        for name, value in past.items():
            buffer = self._buffers.past[name][self._side]
            if self.shared:  # the past's positions first, in a buffer of `capacity` positions
                shape = (self.batch, d.num_heads, self.capacity, d.head_dim)
                buffer.reshape(shape)[:, :, :past_len, :] = value
            else:
                buffer[: value.size] = value.astype(d.dtype, copy=False).ravel()
        self._past_len = past_len
        new = check_tokens(np.asarray(feeds[INPUT_IDS]))

        def run() -> np.ndarray:
            self.bind(new)
            return self.run_bound()

        return run

    def next_logits(self) -> tuple[NextLogits, NextLogits]:
        """The prompt pass and the step after it, each giving the next-token logits [batch, vocab] (copied out of the
        buffer the next step overwrites): what `greedy` and `forced_logits` drive."""
        return (lambda prompt: self.prefill(prompt)[:, -1, :].copy(),
                lambda tokens: self.step(tokens)[:, -1, :].copy())

    def greedy(self, prompt: np.ndarray, new_tokens: int) -> Generation:
        """Generates `new_tokens` tokens after `prompt` [batch, seq], each the argmax of its step's logits (as
        `DecoderSession.greedy`)."""
        return greedy(*self.next_logits(), prompt, new_tokens)

    def forced_logits(self, prompt: np.ndarray, continuation: np.ndarray) -> list[np.ndarray]:
        """As `DecoderSession.forced_logits`: next-token logits when `continuation` is fed one token at a time."""
        return forced(*self.next_logits(), prompt, continuation)


def loop_step(decoder: DecoderSession, feeds: Mapping[str, np.ndarray], *, io_binding: bool) -> Callable[[], object]:
    """One step (`feeds`: tokens after a past) as the decode loop runs it: `session.run` on numpy arrays, or through IO
    binding with the KV cache in buffers allocated once (`BoundDecoder.feeds_runner`)."""
    if not io_binding:
        feeds = dict(feeds)
        return lambda: decoder.session.run(None, feeds)
    tokens = np.asarray(feeds[INPUT_IDS])
    past_len = np.asarray(feeds[decoder.past_names[0]]).shape[2]
    bound = BoundDecoder(decoder, batch=tokens.shape[0], capacity=past_len + tokens.shape[1])
    return bound.feeds_runner(feeds)

