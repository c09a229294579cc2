"""Loading GPT-2 offline: local pretrained weights, or a known architecture with seeded weights."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NotRequired, TypedDict

from tracker.base.errors import ModelError

if TYPE_CHECKING:
    from transformers import GPT2Config, GPT2LMHeadModel

logger = logging.getLogger(__name__)


class GPT2Size(TypedDict):
    """The GPT2Config keyword arguments of one size."""

    n_layer: int
    n_head: int
    n_embd: int
    vocab_size: int
    n_positions: int
    bos_token_id: NotRequired[int]
    eos_token_id: NotRequired[int]


# GPT2Config keyword arguments per size, kept as plain dicts so importing this module does not import
# transformers (slow) and callers cannot mutate a shared config object.
SIZES: dict[str, GPT2Size] = {
    # The real gpt2-small architecture (these are GPT2Config()'s defaults, spelled out): 124 M parameters.
    "small": {"n_layer": 12, "n_head": 12, "n_embd": 768, "vocab_size": 50257, "n_positions": 1024},
    # For tests: exports in about a second. bos/eos must lie inside the small vocabulary.
    "tiny": {
        "n_layer": 2,
        "n_head": 4,
        "n_embd": 64,
        "vocab_size": 1000,
        "n_positions": 256,
        "bos_token_id": 999,
        "eos_token_id": 999,
    },
}

# "eager" rather than the default "sdpa": both export with either exporter and both get onnxscript's
# MultiHeadAttention fusion on the dynamo export, but sdpa's decomposition adds IsNaN/Where guards
# (tiny dynamo graph: 161 nodes vs 137) and eager is the plain MatMul-Softmax-MatMul that fusers expect.
ATTN_IMPLEMENTATION = "eager"

# Std of the noise put on biases and LayerNorm parameters: random init leaves them exactly 0 / 1, the
# dynamo exporter then drops the zero Gemm biases and ORT's gpt2 optimizer crashes on the result.
PARAM_NOISE_STD = 0.02


@dataclass(frozen=True)
class LoadedGPT2:
    """A GPT-2 LM in eval mode and where it came from.

    Attributes:
        model: the `transformers.GPT2LMHeadModel`, in eval mode, float32.
        config: its `GPT2Config`.
        pretrained: True when the weights were loaded with `from_pretrained`, False when seeded.
        source: "local:<path or cached name>", "config:<size>" or "config-file:<path>".
        num_heads: attention heads per layer (what ORT's optimizer calls num_heads).
        hidden_size: embedding width (n_embd).
        vocab_size: vocabulary size; token ids must lie in [0, vocab_size).
        params: what to log as MLflow params (dotted `gpt2.*` keys, string values).
    """

    model: GPT2LMHeadModel
    config: GPT2Config
    pretrained: bool
    source: str
    num_heads: int
    hidden_size: int
    vocab_size: int
    params: dict[str, str]


def load_gpt2(
    *, model: str | None = None, size: str = "small", config_path: str | None = None, seed: int = 0
) -> LoadedGPT2:
    """Loads local GPT-2 weights, or builds a GPT-2 with seeded weights that look trained.

    Args:
        model: a local directory written by `save_pretrained`, or a name already in the Hugging Face
            cache. Nothing is downloaded. When None, a model is built from `config_path` or `size`.
        size: one of SIZES, used when neither `model` nor `config_path` is given.
        config_path: a GPT2Config JSON file to build the model from.
        seed: seeds the weights of a built model (ignored for pretrained weights).

    Raises:
        ValueError: unknown size, or both `model` and `config_path` given.
        ModelError: `model` is not available offline.
    """
    if size not in SIZES:
        raise ValueError(f"size must be one of {sorted(SIZES)}, got {size!r}")
    if model is not None and config_path is not None:
        raise ValueError(f"give either model ({model!r}) or config_path ({config_path!r}), not both")
    if model is not None:
        lm = _from_pretrained(model)
        source, pretrained = f"local:{model}", True
    else:
        lm = _from_config(size=size, config_path=config_path, seed=seed)
        source = f"config-file:{config_path}" if config_path else f"config:{size}"
        pretrained = False
    lm.eval()
    config = lm.config
    params = {
        "gpt2.size": _size_name(config),
        "gpt2.pretrained": str(pretrained).lower(),
        "gpt2.source": source,
        "gpt2.seed": "none" if pretrained else str(seed),
        "gpt2.n_layer": str(config.n_layer),
        "gpt2.n_head": str(config.n_head),
        "gpt2.n_embd": str(config.n_embd),
        "gpt2.vocab_size": str(config.vocab_size),
        "gpt2.n_positions": str(config.n_positions),
        "gpt2.num_parameters": str(sum(p.numel() for p in lm.parameters())),
        "gpt2.attn_implementation": str(config._attn_implementation),
    }
    logger.info("gpt2 loaded from %s: %s layers, %s parameters", source, config.n_layer, params["gpt2.num_parameters"])
    return LoadedGPT2(
        model=lm,
        config=config,
        pretrained=pretrained,
        source=source,
        num_heads=config.n_head,
        hidden_size=config.n_embd,
        vocab_size=config.vocab_size,
        params=params,
    )


def _from_pretrained(name: str) -> GPT2LMHeadModel:
    import torch
    from transformers import GPT2LMHeadModel

    try:
        return GPT2LMHeadModel.from_pretrained(
            name, local_files_only=True, attn_implementation=ATTN_IMPLEMENTATION, dtype=torch.float32
        )
    except OSError as e:  # transformers' "not found / not cached / no weights file" is an OSError
        raise ModelError(
            f"no GPT-2 weights are available offline for {name!r} (no model hub here: it must be a local "
            f"directory written by save_pretrained, or a name already in the Hugging Face cache); pass a "
            f"local directory, or omit --model to build the architecture with seeded weights ({e})"
        ) from e


def _from_config(*, size: str, config_path: str | None, seed: int) -> GPT2LMHeadModel:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    if config_path is not None:
        try:
            config = GPT2Config.from_json_file(config_path)
        except (OSError, ValueError) as e:
            raise ValueError(f"cannot read a GPT2Config JSON from {config_path!r}: {e}") from e
    else:
        config = GPT2Config(**SIZES[size])
    config._attn_implementation = ATTN_IMPLEMENTATION
    # fork_rng: seeding the init must not reseed the caller's global torch RNG.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        lm = GPT2LMHeadModel(config)
    _perturb_bias_and_norm(lm, seed=seed)
    return lm


def _perturb_bias_and_norm(lm: Any, *, seed: int) -> None:
    """Gives every bias and LayerNorm parameter seeded noise, as trained weights have."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in lm.modules():
            is_norm = isinstance(module, torch.nn.LayerNorm)
            for name, param in module.named_parameters(recurse=False):
                noise = torch.randn(param.shape, generator=generator) * PARAM_NOISE_STD
                if is_norm and name == "weight":
                    param.copy_(1.0 + noise)
                elif name == "bias":
                    param.copy_(noise)


def _size_name(config: GPT2Config) -> str:
    """The SIZES entry whose architecture `config` has, or "custom"."""
    for name, kwargs in SIZES.items():
        if all(getattr(config, key) == value for key, value in kwargs.items() if not key.endswith("token_id")):
            return name
    return "custom"
