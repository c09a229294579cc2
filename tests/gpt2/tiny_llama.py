"""A tiny LLaMA-architecture model built offline (grouped-query attention, rotary positions, RMSNorm), saved with
`save_pretrained` as a user's local folder would be."""

from __future__ import annotations

from pathlib import Path

# 2 layers, 4 query heads sharing 2 key/value heads (GQA), head_dim 16: a decode export in about 15 s.
TINY_LLAMA = {
    "num_hidden_layers": 2,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 1000,
    "max_position_embeddings": 256,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "tie_word_embeddings": False,
}


def save_tiny_llama(folder: Path, *, seed: int = 0, weights: bool = True) -> Path:
    """Writes the tiny LLaMA to `folder` with `save_pretrained`: its config.json, and its seeded weights unless
    `weights` is False (a config is enough for what is checked before any weight is read)."""
    from transformers import LlamaConfig

    from tracker.gpt2.model import seeded_lm

    config = LlamaConfig(**TINY_LLAMA)
    if weights:
        seeded_lm(config, seed=seed).save_pretrained(folder)
    else:
        config.save_pretrained(folder)
    return folder
