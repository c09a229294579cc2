"""A prompt cut from real text: started at a line or a sentence when one is near, and, for a chat model, a user
message through its tokenizer's chat template, exactly as many tokens long as asked."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

logger = logging.getLogger(__name__)

# How far (in tokens) a prompt may move forward to start at a line or a sentence.
PROMPT_ALIGN_TOKENS = 64
_SENTENCE_ENDS = ".!?"


def text_start(text: str, starts: np.ndarray, *, limit: int) -> int:
    """The first of the first `limit` + 1 tokens that starts a line or a sentence; 0 when none does."""
    for i, start in enumerate(starts[: min(limit, PROMPT_ALIGN_TOKENS) + 1]):
        p = int(start)
        while p < len(text) and text[p] in " \t":
            p += 1
        if i + 1 < len(starts) and p >= starts[i + 1]:
            continue  # a token of only spaces (indentation): the line's text starts in the next one
        q = p - 1
        while q >= 0 and text[q] in " \t":
            q -= 1
        if q < 0 or text[q] == "\n" or (text[q] in _SENTENCE_ENDS and q < p - 1):
            return i
    return 0


def _chat(tokenizer: PreTrainedTokenizerBase, snippet: str) -> np.ndarray:
    """`snippet` as a user message through the chat template, ready for the assistant's answer."""
    out = tokenizer.apply_chat_template([{"role": "user", "content": snippet}], add_generation_prompt=True,
                                        tokenize=True, return_dict=False)
    return np.asarray(out, dtype=np.int64)


def chat_overhead(tokenizer: PreTrainedTokenizerBase, *, prompt_len: int) -> int:
    """Tokens the chat template adds to a message; an error when they leave no text in `prompt_len`."""
    overhead = len(_chat(tokenizer, ""))
    if overhead >= prompt_len:
        raise ValueError(f"the chat template alone takes {overhead} tokens, leaving no text in a prompt of "
                         f"prompt_len={prompt_len}; ask for prompt_len > {overhead} or chat=False")
    if overhead > prompt_len // 2:
        logger.warning("the chat template takes %d of each prompt's %d tokens, leaving %d for text",
                       overhead, prompt_len, prompt_len - overhead)
    return overhead


def chat_prompt(tokenizer: PreTrainedTokenizerBase, window: np.ndarray, begin: int, *, prompt_len: int,
                 overhead: int) -> np.ndarray:
    """A user message of text from `window` through the chat template, exactly `prompt_len` tokens long."""
    # Text re-tokenized next to the template's tokens may merge, and stripping may drop a token, so a count of
    # text tokens can skip the length wanted: try counts around the estimate, then a start a token later.
    estimate = prompt_len - overhead
    lengths = {}
    for first in range(begin, min(begin + 8, len(window))):
        for k in (estimate, estimate + 1, estimate - 1, estimate + 2, estimate - 2):
            if 1 <= k <= len(window) - first:
                snippet = tokenizer.decode(window[first: first + k].tolist())
                assert isinstance(snippet, str)  # decode of one sequence is one string
                ids = _chat(tokenizer, snippet.strip())
                if len(ids) == prompt_len:
                    return ids
                lengths[first - begin, k] = len(ids)
    tried = ", ".join(f"+{shift}:{k} -> {n}" for (shift, k), n in sorted(lengths.items()))
    raise ValueError(f"no cut of the text makes a chat prompt of exactly {prompt_len} tokens "
                     f"(start shift:text tokens -> prompt tokens: {tried})")
