"""Scoring a language model on real text: a forward model (every position of each held-out chunk in one pass, greedy
continuations by re-running the growing prompts) or a decode-ready one (the second half of each chunk fed one token at
a time after the first, through its KV cache, and greedy continuations through its decode loop); and `TextCheck`,
which scores each attempt of a study and judges it against the first (its baseline) with the bound of its precision.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from tracker.measure.accuracy.text_quality import (
    QualityBound,
    TextQuality,
    TextScores,
    bound_for,
    compare_scores,
    log_softmax,
    token_nll,
)
from tracker.measure.generation.decoder import DecoderSession
from tracker.measure.runtimes.ort_runtime import SessionConfig, make_session

logger = logging.getLogger(__name__)

# Log-probabilities larger than this are kept in a file (memory-mapped), not in memory.
_IN_MEMORY_BYTES = 64 * 2**20


@dataclass(frozen=True)
class TextSet:
    """The text a language model is judged on.

    Attributes:
        eval_ids: held-out chunks, int64 [chunks, length]: every next token is scored (a forward model), or those of
            the second half after the first half as the past (a decode-ready model).
        prompt_ids: int64 [prompts, prompt_len], each continued greedily.
        new_tokens: greedy tokens per prompt.
    """

    eval_ids: np.ndarray
    prompt_ids: np.ndarray
    new_tokens: int = 16

    def __post_init__(self) -> None:
        for name, ids, least in (("eval_ids", self.eval_ids, 2), ("prompt_ids", self.prompt_ids, 1)):
            if ids.dtype != np.int64 or ids.ndim != 2 or ids.shape[0] < 1 or ids.shape[1] < least:
                raise ValueError(f"{name} must be int64 [rows >= 1, length >= {least}], got {ids.dtype} {ids.shape}")
        if self.new_tokens < 1:
            raise ValueError(f"new_tokens must be >= 1, got {self.new_tokens}")

    @property
    def longest(self) -> int:
        """The longest sequence scoring runs: a chunk, or a prompt and its continuation."""
        return max(self.eval_ids.shape[1], self.prompt_ids.shape[1] + self.new_tokens)


def score_forward(model: onnx.ModelProto | str | Path, session: SessionConfig, text: TextSet,
                  workdir: Path) -> TextScores:
    """A forward model's scores: each chunk in one pass (batch 1), and greedy continuations of every prompt at once,
    the whole sequence run again for each new token (a forward model keeps no cache)."""
    sess = make_session(model, session)
    inputs = {i.name for i in sess.get_inputs()}
    chunks, length = text.eval_ids.shape
    logprobs: np.ndarray | None = None
    nll = np.empty(chunks)
    for i, chunk in enumerate(text.eval_ids):
        logits = sess.run(None, _feeds(chunk[None], inputs))[0][0]
        scored = log_softmax(logits[:-1])
        if logprobs is None:
            logprobs = _array(workdir, (chunks, length - 1, scored.shape[-1]))
        logprobs[i] = scored
        nll[i] = float(np.mean(token_nll(scored, chunk[1:])))
    tokens = text.prompt_ids
    for _ in range(text.new_tokens):
        logits = sess.run(None, _feeds(tokens, inputs))[0]
        tokens = np.concatenate([tokens, logits[:, -1].argmax(axis=-1)[:, None].astype(np.int64)], axis=1)
    assert logprobs is not None  # at least one chunk (TextSet)
    return TextScores(nll, logprobs, tokens[:, text.prompt_ids.shape[1]:])


def score_decoder(model: onnx.ModelProto | str | Path, session: SessionConfig, text: TextSet,
                  workdir: Path) -> TextScores:
    """A decode-ready model's scores: the second half of every chunk fed one token at a time after its first half
    (all chunks as one batch, through the KV cache the model keeps: an int8 cache as int8), and the prompts'
    greedy continuations through the same loop."""
    decoder = DecoderSession.open(model, session)
    half = text.eval_ids.shape[1] // 2
    steps = decoder.forced_logits(text.eval_ids[:, :half], text.eval_ids[:, half:])
    chunks, scored_len = text.eval_ids.shape[0], len(steps)
    logprobs = _array(workdir, (chunks, scored_len, steps[0].shape[-1]))
    for j, logits in enumerate(steps):
        logprobs[:, j] = log_softmax(logits)
    nll = token_nll(logprobs, text.eval_ids[:, half:]).mean(axis=1)
    return TextScores(np.asarray(nll, dtype=np.float64), logprobs, decoder.greedy(text.prompt_ids, text.new_tokens).tokens)


class TextCheck:
    """Scores every attempt of a study on the same text, the first (the baseline) as the reference, and judges each
    later one with the bound of its precision.

    Attributes:
        text: the evaluation text and prompts.
        bounds: the bound per precision (`text_quality.load_bounds`).
        decoder: the models are decode-ready (`score_decoder`), not forward ones (`score_forward`).
        baseline: the baseline's scores, once it was scored.
    """

    def __init__(self, text: TextSet, bounds: Mapping[str, QualityBound], *, decoder: bool = False) -> None:
        self.text = text
        self.bounds = dict(bounds)
        self.decoder = decoder
        self.baseline: TextScores | None = None

    def measure(self, model: onnx.ModelProto | str | Path, session: SessionConfig, *, precision: str,
                workdir: Path, reference: bool = False) -> TextQuality:
        """Scores `model` and judges it against the baseline; the `reference` (the baseline) is judged against
        itself.

        Raises:
            ValueError: no bound for `precision`, or a model other than the reference scored before it.
        """
        if not reference and self.baseline is None:
            raise ValueError("score the baseline (reference=True) before an attempt")
        bound = bound_for(self.bounds, precision)
        workdir.mkdir(parents=True, exist_ok=True)
        score = score_decoder if self.decoder else score_forward
        logger.info("quality: scoring %s on %d chunks of real text and %d prompts", "the decode loop" if self.decoder
                    else "the forward pass", self.text.eval_ids.shape[0], self.text.prompt_ids.shape[0])
        scores = score(model, session, self.text, workdir)
        if reference:
            self.baseline = scores
        assert self.baseline is not None  # checked above
        return compare_scores(self.baseline, scores, bound)


def _feeds(tokens: np.ndarray, inputs: set[str]) -> dict[str, np.ndarray]:
    feeds = {"input_ids": tokens}
    if "attention_mask" in inputs:
        feeds["attention_mask"] = np.ones_like(tokens)
    return feeds


def _array(workdir: Path, shape: tuple[int, ...]) -> np.ndarray:
    """A float32 array of `shape`: in memory when small, else a memory map in `workdir`."""
    if 4 * int(np.prod(shape)) <= _IN_MEMORY_BYTES:
        return np.empty(shape, dtype=np.float32)
    return np.lib.format.open_memmap(workdir / "logprobs.npy", mode="w+", dtype=np.float32, shape=shape)
