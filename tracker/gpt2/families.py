"""The causal-LM architectures the generation study exports (GPT-2 and the LLaMA family), and reading a model's config
offline: which family it is, and the shape of its layers and KV cache."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tracker.base.errors import ModelError
from tracker.gpt2.gguf import local_folder

if TYPE_CHECKING:
    from transformers import PretrainedConfig

# Hugging Face `model_type` -> the class `AutoModelForCausalLM` builds for it. These are the architectures whose
# forward and decode-ready exports are checked against PyTorch (tests/gpt2): GPT-2 (learned positions, LayerNorm,
# multi-head attention) and the LLaMA family (rotary positions, RMSNorm, grouped-query attention), of which mistral
# and qwen2 (q/k/v biases) export the same way.
FAMILIES: dict[str, str] = {
    "gpt2": "GPT2LMHeadModel",
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
}


@dataclass(frozen=True)
class LMShape:
    """What exporting and decoding need to know of a causal LM, whatever its family spells it.

    Attributes:
        family: the config's `model_type`, one of FAMILIES.
        n_layer: decoder layers (one key and one value in the KV cache each).
        num_heads: attention (query) heads per layer.
        kv_heads: key/value heads per layer: fewer than `num_heads` with grouped-query attention.
        head_dim: width of one head; the KV cache is [batch, kv_heads, past, head_dim].
        hidden_size: width of the residual stream.
        max_positions: the longest sequence the model holds (a prompt plus everything generated).
        vocab_size: token ids lie in [0, vocab_size).
    """

    family: str
    n_layer: int
    num_heads: int
    kv_heads: int
    head_dim: int
    hidden_size: int
    max_positions: int
    vocab_size: int


def supported() -> str:
    """The supported families, as an error message says them."""
    return ", ".join(f"{family} ({cls})" for family, cls in FAMILIES.items())


def check_family(config: PretrainedConfig, *, where: str) -> str:
    """The family of `config`, or a ModelError naming its architecture and the supported ones.

    Args:
        config: a transformers config.
        where: where the config came from, for the message.
    """
    family = getattr(config, "model_type", None) or ""
    if family not in FAMILIES:
        architectures = ", ".join(getattr(config, "architectures", None) or []) or "no architectures listed"
        raise ModelError(f"{where} holds a {family or 'config without model_type'} model ({architectures}), not a "
                         f"causal LM the exporter handles; supported: {supported()}")
    return family


def read_config(model: str) -> PretrainedConfig:
    """The config of a local model folder (or a name already in the Hugging Face cache, or a GGUF file), checked to be
    a supported causal LM. Nothing is downloaded, and no weights are read from a folder; a GGUF file is converted to
    a folder first (`gguf.local_folder`: the first time, its weights are dequantized).

    Raises:
        ModelError: no config is available offline for `model`, or it is not one of FAMILIES.
    """
    from transformers import AutoConfig

    folder, _ = local_folder(model)
    try:
        config = AutoConfig.from_pretrained(folder, local_files_only=True)
    except (OSError, ValueError) as e:  # not found / not cached (OSError), a config.json of unknown type (ValueError)
        raise ModelError(
            f"no causal LM config is available offline for {model!r} (no model hub here: it must be a local folder "
            f"written by save_pretrained, with its config.json, a GGUF file, or a name already in the Hugging Face "
            f"cache); pass such a folder, or omit --model to build GPT-2 with seeded weights ({str(e).splitlines()[0]})"
        ) from e
    check_family(config, where=repr(model))
    return config


def config_from_json(path: str) -> PretrainedConfig:
    """A config from a JSON file: the family its `model_type` names (one of FAMILIES), GPT-2 when it names none.

    Raises:
        ValueError: the file is not a readable JSON object.
        ModelError: its `model_type` is not one of FAMILIES.
    """
    from transformers import AutoConfig

    try:
        values: dict[str, Any] = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot read a model config JSON from {path!r}: {e}") from e
    if not isinstance(values, dict):
        raise ValueError(f"a model config JSON is an object, got {type(values).__name__} in {path!r}")
    family = values.pop("model_type", "gpt2")
    if family not in FAMILIES:
        raise ModelError(f"{path!r} describes a {family} model, not a causal LM the exporter handles; supported: "
                         f"{supported()}")
    return AutoConfig.for_model(family, **values)


def lm_shape(config: PretrainedConfig) -> LMShape:
    """The shape of a supported causal LM's config (GPT-2's `n_head`, `n_embd`, `n_positions` are read through the
    standard names transformers maps them to)."""
    family = check_family(config, where="the config")
    heads, hidden = int(config.num_attention_heads), int(config.hidden_size)
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    return LMShape(family=family, n_layer=int(config.num_hidden_layers), num_heads=heads, kv_heads=int(kv_heads),
                   head_dim=int(head_dim), hidden_size=hidden, max_positions=int(config.max_position_embeddings),
                   vocab_size=int(config.vocab_size))
