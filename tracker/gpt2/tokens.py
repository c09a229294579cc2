"""GPT-2 inputs: seeded token ids, text tokenized with a local tokenizer, and ONNX feeds built from them."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np

from tracker.base.errors import FeedError

logger = logging.getLogger(__name__)

# The inputs feeds_for knows how to fill from token ids.
KNOWN_INPUTS = ("input_ids", "attention_mask")


def make_tokens(*, batch: int, seq_len: int, vocab_size: int, seed: int) -> np.ndarray:
    """Seeded random token ids.

    Args:
        batch: rows (sequences).
        seq_len: tokens per row.
        vocab_size: ids are drawn from [0, vocab_size).
        seed: seed of the random generator.

    Returns:
        int64 array of shape [batch, seq_len].

    Raises:
        ValueError: a size is < 1.
    """
    if batch < 1 or seq_len < 1 or vocab_size < 1:
        raise ValueError(
            f"batch, seq_len and vocab_size must be >= 1, got batch={batch}, seq_len={seq_len}, vocab_size={vocab_size}"
        )
    rng = np.random.default_rng(seed)
    return rng.integers(0, vocab_size, size=(batch, seq_len), dtype=np.int64)


def tokenize(text: str, *, tokenizer_path: str, seq_len: int) -> np.ndarray | None:
    """Token ids of `text` from a tokenizer available offline, shaped [1, seq_len].

    The ids are repeated (or cut) to exactly `seq_len`: GPT-2 has no pad token, and a latency
    measurement wants a fixed number of positions.

    Args:
        text: the text to tokenize; must produce at least one token.
        tokenizer_path: a local directory written by `save_pretrained`, or a name already in the
            Hugging Face cache. Nothing is downloaded.
        seq_len: tokens in the result.

    Returns:
        int64 array of shape [1, seq_len], or None when no tokenizer is available locally (logged).

    Raises:
        ValueError: `seq_len` < 1, or `text` produces no tokens.
    """
    if seq_len < 1:
        raise ValueError(f"seq_len must be >= 1, got {seq_len}")
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_path, local_files_only=True)
    except (OSError, ValueError) as e:
        # OSError: not found / not cached; ValueError: a directory without tokenizer files.
        logger.warning("no tokenizer available offline at %r, using no text tokens: %s", tokenizer_path, e)
        return None
    ids = list(tokenizer(text)["input_ids"])
    if not ids:
        raise ValueError(f"text {text!r} produced no tokens with the tokenizer at {tokenizer_path!r}")
    repeats = -(-seq_len // len(ids))
    return np.asarray((ids * repeats)[:seq_len], dtype=np.int64).reshape(1, seq_len)


def feeds_for(tokens: np.ndarray, input_names: Sequence[str]) -> dict[str, np.ndarray]:
    """The ONNX feeds for `tokens`: input_ids, and an all-ones attention_mask if the model takes one.

    Args:
        tokens: int64 token ids of shape [batch, seq_len].
        input_names: the exported model's input names.

    Raises:
        FeedError: tokens are not an int64 2-D array, the model has no input_ids input, or it has
            inputs this function cannot fill (e.g. past key/values).
    """
    tokens = np.asarray(tokens)
    if tokens.dtype != np.int64 or tokens.ndim != 2:
        raise FeedError(f"tokens must be an int64 array [batch, seq_len], got {tokens.dtype} of shape {tokens.shape}")
    names = list(input_names)
    unknown = [n for n in names if n not in KNOWN_INPUTS]
    if "input_ids" not in names or unknown:
        raise FeedError(
            f"feeds_for fills only {list(KNOWN_INPUTS)} (input_ids required); the model's inputs are {names}"
        )
    feeds = {"input_ids": tokens}
    if "attention_mask" in names:
        feeds["attention_mask"] = np.ones_like(tokens)
    return feeds
