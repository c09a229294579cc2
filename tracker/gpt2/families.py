"""The causal-LM families the generation study knows (GPT-2 and the LLaMA family) and the generic path for any other
causal LM, and reading a model's config offline: which family it is, what applies to it, and its shape."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tracker.base.errors import ModelError
from tracker.gpt2.gguf import local_folder

if TYPE_CHECKING:
    from transformers import PretrainedConfig

# Hugging Face `model_type` -> the class `AutoModelForCausalLM` builds for it. These are the known families: their
# forward and decode-ready exports are checked against PyTorch (tests/gpt2), and the rewrites that read attention
# were written for their graphs: GPT-2 (learned positions, LayerNorm, multi-head attention) and the LLaMA family
# (rotary positions, RMSNorm, grouped-query attention), of which mistral and qwen2 (q/k/v biases) export the same way.
FAMILIES: dict[str, str] = {
    "gpt2": "GPT2LMHeadModel",
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
}
# The rewrites that read a known family's attention (their patterns are GPT-2's and LLaMA's), as the registry names
# them; the others (weight quantization, session settings) work on any graph.
ATTENTION_REWRITES = ("attention_fused", "shared_kv", "kv_int8")
# The config attributes every causal LM's shape is read from (`head_dim`, `num_key_value_heads` when a family has them).
_REQUIRED = ("num_hidden_layers", "num_attention_heads", "hidden_size", "max_position_embeddings", "vocab_size")


@dataclass(frozen=True)
class FamilySupport:
    """What the study does with a causal LM of one family.

    Attributes:
        family: the config's `model_type`.
        known: one of FAMILIES: the forward and the decode-ready export are checked, and every attempt applies.
            Otherwise only the forward export (the generic path).
        reason: why the generation scenario and the attention rewrites apply or not, as a run's notes say it.
    """

    family: str
    known: bool
    reason: str


@dataclass(frozen=True)
class LMShape:
    """What exporting and decoding need to know of a causal LM, whatever its family spells it.

    Attributes:
        family: the config's `model_type` (a key of FAMILIES, or any other causal LM's).
        n_layer: decoder layers (one key and one value in the KV cache each).
        num_heads: attention (query) heads per layer.
        kv_heads: key/value heads per layer: fewer than `num_heads` with grouped-query attention.
        head_dim: width of one head (not always hidden_size / num_heads: Gemma 3 270M has 4 heads of 256 over a
            residual stream of 640); the KV cache is [batch, kv_heads, past, head_dim].
        hidden_size: width of the residual stream.
        max_positions: the longest sequence the model holds (a prompt plus everything generated).
        vocab_size: token ids lie in [0, vocab_size).
        tied_embeddings: the output projection (lm_head) is the input embedding table.
    """

    family: str
    n_layer: int
    num_heads: int
    kv_heads: int
    head_dim: int
    hidden_size: int
    max_positions: int
    vocab_size: int
    tied_embeddings: bool

    @property
    def attention_size(self) -> int:
        """Width of the attention's output before its projection (`num_heads * head_dim`): what the fusers call the
        hidden size. It is `hidden_size` for GPT-2 and LLaMA, not for every family."""
        return self.num_heads * self.head_dim


def supported() -> str:
    """The known families, as an error message says them."""
    return ", ".join(f"{family} ({cls})" for family, cls in FAMILIES.items())


def family_support(config: PretrainedConfig) -> FamilySupport:
    """Whether `config` is of a known family (one of FAMILIES), and why the generation scenario and the attention
    rewrites apply to it or not. `config` is taken to be a causal LM (`check_family`)."""
    family = getattr(config, "model_type", None) or ""
    known_list = ", ".join(FAMILIES)
    if family in FAMILIES:
        return FamilySupport(family, True, f"{family} is one of the families whose forward and decode-ready exports "
                                           f"are checked ({known_list}): every scenario and attempt applies")
    return FamilySupport(family, False, (
        f"{family} is not one of the families whose decode-ready export is checked ({known_list}): the generation "
        f"scenario does not apply, and the rewrites that read attention ({', '.join(ATTENTION_REWRITES)}) were "
        f"written for those families' graphs and may find nothing in this one; the generic attempts (int8, int4, "
        f"session settings) apply"))


def check_family(config: PretrainedConfig, *, where: str) -> str:
    """The family of `config` when it is a causal LM that `AutoModelForCausalLM` builds, else a one-line ModelError
    naming its architecture and why it is not one.

    Args:
        config: a transformers config.
        where: where the config came from, for the message.
    """
    family = getattr(config, "model_type", None) or ""
    why = _not_causal(config, family)
    if why is not None:
        architectures = ", ".join(getattr(config, "architectures", None) or []) or "no architectures listed"
        raise ModelError(f"{where} holds a {family or 'config without model_type'} model ({architectures}), not a "
                         f"causal LM the exporter handles ({why}); supported: {supported()} for every scenario, and "
                         f"any other causal LM that AutoModelForCausalLM builds for the forward one")
    return family


def _not_causal(config: PretrainedConfig, family: str) -> str | None:
    """Why `config` is not a causal LM, or None when it is one."""
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_MASKED_LM_MAPPING_NAMES,
    )

    if family not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        return f"AutoModelForCausalLM has no class for {family or 'it'}"
    if getattr(config, "is_encoder_decoder", False):
        return "it is an encoder-decoder"
    # BERT and its kin have a causal class too (BertLMHeadModel), which is only causal as a decoder.
    if family in MODEL_FOR_MASKED_LM_MAPPING_NAMES and not getattr(config, "is_decoder", False):
        return "an encoder whose config does not set is_decoder"
    # A folder saved from another head (GPT2ForSequenceClassification) would load with an untrained LM head.
    architectures = getattr(config, "architectures", None) or []
    causal_classes = set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values())
    if architectures and not causal_classes.intersection(architectures):
        return f"saved as {', '.join(architectures)}, not as {MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[family]}"
    return None


def read_config(model: str) -> PretrainedConfig:
    """The config of a local model folder (or a name already in the Hugging Face cache, or a GGUF file), checked to be
    a causal LM. Nothing is downloaded, and no weights are read from a folder; a GGUF file is converted to a folder
    first (`gguf.local_folder`: the first time, its weights are dequantized).

    Raises:
        ModelError: no config is available offline for `model`, or it is not a causal LM (`check_family`).
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
    """A config from a JSON file: the family its `model_type` names (any causal LM), GPT-2 when it names none.

    Raises:
        ValueError: the file is not a readable JSON object.
        ModelError: its `model_type` is not a causal LM (`check_family`).
    """
    from transformers import AutoConfig

    try:
        values: dict[str, Any] = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot read a model config JSON from {path!r}: {e}") from e
    if not isinstance(values, dict):
        raise ValueError(f"a model config JSON is an object, got {type(values).__name__} in {path!r}")
    family = values.pop("model_type", "gpt2")
    try:
        config = AutoConfig.for_model(family, **values)
    except ValueError as e:  # a model_type transformers does not know
        raise ModelError(f"{path!r} describes a {family} model, not a causal LM the exporter handles; supported: "
                         f"{supported()} ({str(e).splitlines()[0]})") from e
    check_family(config, where=repr(path))
    return config


def lm_shape(config: PretrainedConfig) -> LMShape:
    """The shape of a causal LM's config, read from the standard attributes every family has (GPT-2's `n_head`,
    `n_embd`, `n_positions` are read through the standard names transformers maps them to).

    Raises:
        ModelError: `config` is not a causal LM, or lacks one of the attributes.
    """
    family = check_family(config, where="the config")
    text = config.get_text_config()
    missing = [name for name in _REQUIRED if getattr(text, name, None) is None]
    if missing:
        raise ModelError(f"the {family} config has no {', '.join(missing)}: the exporter reads a causal LM's shape "
                         f"from {', '.join(_REQUIRED)}")
    heads, hidden = int(text.num_attention_heads), int(text.hidden_size)
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    head_dim = getattr(text, "head_dim", None) or hidden // heads
    return LMShape(family=family, n_layer=int(text.num_hidden_layers), num_heads=heads, kv_heads=int(kv_heads),
                   head_dim=int(head_dim), hidden_size=hidden, max_positions=int(text.max_position_embeddings),
                   vocab_size=int(text.vocab_size), tied_embeddings=bool(getattr(text, "tie_word_embeddings", False)))

