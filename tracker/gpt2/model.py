"""Loading a causal LM offline (GPT-2, the LLaMA family, or any other family `AutoModelForCausalLM` builds): a local
folder, or an architecture with seeded weights."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, NotRequired, TypedDict

from tracker.base.errors import ModelError
from tracker.gpt2.families import LMShape, check_family, config_from_json, family_support, lm_shape, read_config
from tracker.gpt2.gguf import local_folder

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedModel

    from tracker.gpt2.gguf import GGUFSource

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
class LoadedLM(LMShape):
    """A causal LM in eval mode, where it came from, and its shape (the `LMShape` fields: family, layers, heads, KV
    heads, head width, hidden size, positions, vocabulary, tied embeddings).

    Attributes:
        model: the transformers model (`GPT2LMHeadModel`, `LlamaForCausalLM`, ...), in eval mode, float32.
        config: its config.
        pretrained: True when the weights were loaded with `from_pretrained`, False when seeded.
        source: "local:<path or cached name>", "gguf:<path>", "config:<size>" or "config-file:<path>".
        folder: the local folder (or cached name) the weights and tokenizer were loaded from; None when built.
        params: what to log as MLflow params (`gpt2.*` keys for GPT-2, `lm.*` for the others; string values), and for
            every family `lm.family`, `lm.family_known` and `lm.family_note` (`families.family_support`), and the
            `lm.gguf.*` of a GGUF file (`GGUFSource.params`).
    """

    model: PreTrainedModel
    config: PretrainedConfig
    pretrained: bool
    source: str
    folder: str | None
    params: dict[str, str]


# The name from before LLaMA-family models were loaded too.
LoadedGPT2 = LoadedLM


def load_lm(
    *, model: str | None = None, size: str = "small", config_path: str | None = None, seed: int = 0
) -> LoadedLM:
    """Loads a local causal LM, or builds one with seeded weights that look trained.

    Any family `AutoModelForCausalLM` builds loads; `families.family_support` says whether it is a known one (its
    decode-ready export checked) or takes the generic path (the forward export only).

    Args:
        model: a local folder written by `save_pretrained`, or a name already in the Hugging Face cache; its
            `config.json` must describe a causal LM (`families.check_family`). Or a GGUF file (or a folder holding
            one and no config.json), converted to such a folder the first time (`gguf.resolve_gguf`). Nothing is
            downloaded.
            When None, a model is built from `config_path` or `size`.
        size: one of SIZES (GPT-2), used when neither `model` nor `config_path` is given.
        config_path: a config JSON file to build the model from (its `model_type`, GPT-2 when it names none).
        seed: seeds the weights of a built model (ignored for pretrained weights).

    Raises:
        ValueError: unknown size, or both `model` and `config_path` given.
        ModelError: `model` is not available offline, or is not a causal LM (the message names its architecture),
            or is a GGUF file that cannot be converted.
    """
    _check_source(model=model, size=size, config_path=config_path)
    gguf: GGUFSource | None = None
    folder: str | None = None
    if model is not None:
        folder, gguf = local_folder(model)
        lm = _from_pretrained(folder)
        source = f"gguf:{model}" if gguf is not None else f"local:{model}"
        pretrained = True
    else:
        lm = _from_config(size=size, config_path=config_path, seed=seed)
        source = f"config-file:{config_path}" if config_path else f"config:{size}"
        pretrained = False
    lm.eval()
    config = lm.config
    shape = lm_shape(config)
    num_parameters = str(sum(p.numel() for p in lm.parameters()))
    seed_param = "none" if pretrained else str(seed)
    if shape.family == "gpt2":
        params = {
            "gpt2.size": _size_name(config),
            "gpt2.pretrained": str(pretrained).lower(),
            "gpt2.source": source,
            "gpt2.seed": seed_param,
            "gpt2.n_layer": str(config.n_layer),
            "gpt2.n_head": str(config.n_head),
            "gpt2.n_embd": str(config.n_embd),
            "gpt2.vocab_size": str(config.vocab_size),
            "gpt2.n_positions": str(config.n_positions),
            "gpt2.num_parameters": num_parameters,
            "gpt2.attn_implementation": str(config._attn_implementation),
        }
    else:
        params = {"lm.pretrained": str(pretrained).lower(), "lm.source": source, "lm.seed": seed_param,
                  **{f"lm.{k}": _param(v) for k, v in asdict(shape).items() if k != "family"},
                  "lm.num_parameters": num_parameters,
                  "lm.attn_implementation": str(config._attn_implementation)}
    support = family_support(config)
    params.update({"lm.family": shape.family, "lm.family_known": _param(support.known),
                   "lm.family_note": support.reason})
    if gguf is not None:
        params.update(gguf.params())
    logger.info("%s loaded from %s: %s layers, %s parameters", shape.family, source, shape.n_layer, num_parameters)
    return LoadedLM(model=lm, config=config, pretrained=pretrained, source=source, folder=folder, params=params,
                    **asdict(shape))


# The name from before LLaMA-family models were loaded too; it loads them as well.
load_gpt2 = load_lm


def lm_config(*, model: str | None = None, size: str = "small", config_path: str | None = None) -> PretrainedConfig:
    """The config `load_lm` would load or build from the same arguments, read without any weights (a GGUF file's are
    converted once, as `load_lm` would): what a caller checks (architecture, positions) before any work.

    Raises:
        ValueError, ModelError: as `load_lm`.
    """
    from transformers import GPT2Config

    _check_source(model=model, size=size, config_path=config_path)
    if model is not None:
        return read_config(model)
    return config_from_json(config_path) if config_path is not None else GPT2Config(**SIZES[size])


def seeded_lm(config: PretrainedConfig, *, seed: int = 0) -> PreTrainedModel:
    """A causal LM of `config`'s architecture (any family `AutoModelForCausalLM` builds) with seeded weights that look
    trained: norms and biases get seeded noise, as trained ones have. The caller's global torch RNG is left as it was.

    Raises:
        ModelError: `config` is not a causal LM (`families.check_family`).
    """
    import torch
    from transformers import AutoModelForCausalLM

    check_family(config, where="the config")
    # fork_rng: seeding the init must not reseed the caller's global torch RNG.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        lm = _with_attention(lambda attn: AutoModelForCausalLM.from_config(config, attn_implementation=attn))
    _perturb_bias_and_norm(lm, seed=seed)
    return lm.eval()


def _check_source(*, model: str | None, size: str, config_path: str | None) -> None:
    if size not in SIZES:
        raise ValueError(f"size must be one of {sorted(SIZES)}, got {size!r}")
    if model is not None and config_path is not None:
        raise ValueError(f"give either model ({model!r}) or config_path ({config_path!r}), not both")


def _from_pretrained(name: str) -> PreTrainedModel:
    import torch
    from transformers import AutoModelForCausalLM

    read_config(name)  # the architecture is checked before any weight is read
    try:
        return _with_attention(lambda attn: AutoModelForCausalLM.from_pretrained(
            name, local_files_only=True, attn_implementation=attn, dtype=torch.float32))
    except OSError as e:  # transformers' "not found / not cached / no weights file" is an OSError
        raise ModelError(
            f"no weights are available offline for {name!r} (no model hub here: it must be a local "
            f"directory written by save_pretrained, or a name already in the Hugging Face cache); pass a "
            f"local directory, or omit --model to build GPT-2 with seeded weights ({e})"
        ) from e


def _with_attention(build: Callable[[str | None], PreTrainedModel]) -> PreTrainedModel:
    """`build(ATTN_IMPLEMENTATION)`, or `build(None)` (the model's default attention) when its class refuses it.

    transformers 5 accepts "eager" for every class it ships (`get_correct_attn_implementation`); a class of remote
    code may not, and its own attention is then better than no model.
    """
    try:
        return build(ATTN_IMPLEMENTATION)
    except ValueError as e:
        if "attn_implementation" not in str(e):
            raise
        logger.warning("%r attention refused (%s): loading with the model's default", ATTN_IMPLEMENTATION,
                       str(e).splitlines()[0])
        return build(None)


def _param(value: object) -> str:
    """A param's string: booleans as "true"/"false", as the other params say them."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def _from_config(*, size: str, config_path: str | None, seed: int) -> PreTrainedModel:
    return seeded_lm(lm_config(size=size, config_path=config_path), seed=seed)


def _perturb_bias_and_norm(lm: Any, *, seed: int) -> None:
    """Gives every bias and norm (LayerNorm, RMSNorm) parameter seeded noise, as trained weights have."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in lm.modules():
            # transformers' RMSNorms are classes of each model (LlamaRMSNorm, ...), not one torch class
            is_norm = isinstance(module, torch.nn.LayerNorm) or type(module).__name__.endswith("RMSNorm")
            for name, param in module.named_parameters(recurse=False):
                noise = torch.randn(param.shape, generator=generator) * PARAM_NOISE_STD
                if is_norm and name == "weight":
                    param.copy_(1.0 + noise)
                elif name == "bias":
                    param.copy_(noise)


def _size_name(config: PretrainedConfig) -> str:
    """The SIZES entry whose architecture `config` has, or "custom"."""
    for name, kwargs in SIZES.items():
        if all(getattr(config, key) == value for key, value in kwargs.items() if not key.endswith("token_id")):
            return name
    return "custom"
