"""What the transformer fusers need to know about a model (`ModelInfo`: heads, hidden size, ORT model type), and
finding it in a Hugging Face `config.json` or in the graph itself."""

from __future__ import annotations

import json
import logging
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import onnx

from tracker.base.files import read_small_file
from tracker.optimize.graph_reading import TransformerGraph

logger = logging.getLogger(__name__)

MAX_CONFIG_BYTES = 4 * 2**20  # a Hugging Face config.json is a few kB; anything near this is not one

# Hugging Face `model_type` -> the `onnxruntime.transformers.optimizer` model type whose fusions fit it. Only
# types whose graphs ORT's fusions were written for: an unknown type gets a reason, never a guess.
ORT_MODEL_TYPES = {
    "bert": "bert",
    "roberta": "bert",
    "xlm-roberta": "bert",
    "camembert": "bert",
    "distilbert": "bert",
    "albert": "bert",
    "electra": "bert",
    "gpt2": "gpt2",
    "gpt_neox": "gpt_neox",
    "bart": "bart",
    "mbart": "bart",
    "t5": "t5",
    "mt5": "t5",
    "vit": "vit",
    "swin": "swin",
    "phi": "phi",
    "qwen3": "qwen3",
    # LLaMA-family decoders (RMSNorm, rotary positions, grouped-query attention): ORT's Python optimizer has no
    # type for them, onnxscript's ORT fusions do (`attention_fused`); "llama" is this project's type.
    "llama": "llama",
    "mistral": "llama",
    "qwen2": "llama",
}
# The model types `onnxruntime.transformers.optimizer.optimize_model` has fusions for, among those above.
ORT_OPTIMIZER_TYPES = frozenset(ORT_MODEL_TYPES.values()) - {"llama"}
# config.json keys, in the order they are looked for (GPT-2, DistilBERT and T5 spell them their own way).
HEADS_KEYS = ("num_attention_heads", "n_head", "n_heads", "num_heads")
HIDDEN_KEYS = ("hidden_size", "n_embd", "dim", "d_model")



@dataclass(frozen=True)
class ModelInfo:
    """What the fusers cannot reliably read from the graph.

    Attributes:
        num_heads: attention heads per layer.
        hidden_size: width of the residual stream.
        model_type: `onnxruntime.transformers` model type ("gpt2", "bert", ...); None: detect it from the graph
            when an entry needs it.
    """

    num_heads: int
    hidden_size: int
    model_type: str | None = None

    def __post_init__(self) -> None:
        if self.num_heads < 1 or self.hidden_size < 1:
            raise ValueError(
                f"num_heads and hidden_size must be >= 1, got num_heads={self.num_heads}, "
                f"hidden_size={self.hidden_size}"
            )
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must be a multiple of num_heads ({self.num_heads})"
            )
        if self.model_type is not None and (not isinstance(self.model_type, str) or not self.model_type):
            raise ValueError(f"model_type must be a non-empty string or None, got {self.model_type!r}")


@dataclass(frozen=True)
class Detection:
    """What was found: `info`, or the reason there is none.

    Attributes:
        info: heads, hidden size and model type; None when they could not all be found.
        reason: why `info` is None (None when it is not).
        source: where `info` came from: "config.json" or "graph" (None when nothing was found).
    """

    info: ModelInfo | None
    reason: str | None
    source: str | None


def detect_model_info(model: onnx.ModelProto, config_json: Path | None = None) -> ModelInfo | None:
    """Heads, hidden size and model type of `model`, from `config_json` when given, else from the graph.

    Args:
        model: the model; its weights' values are not needed (shapes, Constant nodes and declared shapes are).
        config_json: a Hugging Face `config.json` (or the folder holding it); it wins over the graph, and a
            disagreement between the two is logged as a warning.

    Returns:
        The info, or None when it cannot be found (`detect` says why).

    Raises:
        ValueError: `config_json` is not a readable JSON object.
    """
    return detect(model, config_json).info


def detect(model: onnx.ModelProto, config_json: Path | None = None) -> Detection:
    """`detect_model_info`, with the reason when nothing is found and where the info came from."""
    from_graph = detect_from_graph(model)
    if config_json is None:
        return from_graph
    from_config = detect_from_config(config_json)
    if from_config.info is not None and from_graph.info is not None and from_config.info != from_graph.info:
        logger.warning("%s says %s but the graph says %s: using the config", config_json, from_config.info,
                       from_graph.info)
    return from_config


def detect_from_config(config_json: Path) -> Detection:
    """Heads, hidden size and model type from a Hugging Face `config.json` (or the folder holding it).

    Raises:
        ValueError: the file does not exist or is not a JSON object.
    """
    path = Path(config_json)
    if path.is_dir():
        path = path / "config.json"
    try:
        config = json.loads(read_small_file(path, max_bytes=MAX_CONFIG_BYTES, what="a Hugging Face config.json"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"config_json must be a readable Hugging Face config.json, got {path} ({e})") from e
    except ValueError as e:  # not a regular file, or too large
        raise ValueError(f"config_json: {e}") from e
    except RecursionError as e:  # json recurses once per level of nesting
        raise ValueError(f"config_json must be a readable Hugging Face config.json, got {path} (nested too deeply "
                         "for Python's JSON reader; a config.json is a flat object of settings)") from e
    if not isinstance(config, dict):
        raise ValueError(f"config_json must hold a JSON object, got {type(config).__name__} in {path}")
    heads = next((config[k] for k in HEADS_KEYS if k in config), None)
    hidden = next((config[k] for k in HIDDEN_KEYS if k in config), None)
    hf_type = config.get("model_type")
    missing = [name for name, value in (("/".join(HEADS_KEYS), heads), ("/".join(HIDDEN_KEYS), hidden),
                                        ("model_type", hf_type)) if value is None]
    if missing:
        return Detection(None, f"{path} has no {', '.join(missing)}", None)
    if not isinstance(hf_type, str):
        shown = repr(hf_type) if len(repr(hf_type)) <= 60 else f"{repr(hf_type)[:60]}..."
        return Detection(None, f'{path}: model_type must be a string (e.g. "bert"), got {shown}', None)
    if hf_type not in ORT_MODEL_TYPES:
        return Detection(None, f"{path}: model_type {hf_type!r} has no onnxruntime.transformers optimizer type "
                         f"(known: {', '.join(sorted(ORT_MODEL_TYPES))})", None)
    if not (isinstance(heads, int) and isinstance(hidden, int)) or isinstance(heads, bool) or isinstance(hidden, bool):
        return Detection(None, f"{path}: heads ({heads!r}) and hidden size ({hidden!r}) must be integers", None)
    try:
        info = ModelInfo(num_heads=heads, hidden_size=hidden, model_type=ORT_MODEL_TYPES[hf_type])
    except ValueError as e:
        return Detection(None, f"{path}: {e}", None)
    return Detection(info, None, "config.json")


def detect_from_graph(model: onnx.ModelProto) -> Detection:
    """Heads, hidden size and model type read from the graph.

    Hidden size: the most common width of the layer norms' scales. Heads: the `num_heads` of fused attention
    nodes, else the Reshape to [batch, seq, heads, head_dim] before each split-heads Transpose (its declared
    output shape, or its constant shape: transformers 5 writes heads as -1 and head_dim as a constant, so
    heads = hidden / head_dim). Model type: `detect_model_type`.
    """
    graph = TransformerGraph(model)
    hidden = _most_common(graph.layer_norm_widths())
    if hidden is None:
        return Detection(None, "no layer normalization with a known width: hidden size unknown", None)
    heads = _most_common(graph.fused_attention_heads())
    if heads is None:
        # hidden / head_dim first: with grouped-query attention (LLaMA) the key and value Reshapes have fewer heads
        # than the query's, and outnumber it.
        split = graph.split_heads_dims()
        heads = _heads_from_head_dim(hidden, [d for _, d in split if d]) or _most_common([h for h, _ in split if h])
    if heads is None:
        return Detection(None, "no attention heads found (no Reshape to [batch, seq, heads, head_dim] with a "
                         "constant head_dim before a Transpose, and no fused attention)", None)
    model_type, reason = graph.model_type()
    if model_type is None:
        return Detection(None, reason, None)
    try:
        info = ModelInfo(num_heads=heads, hidden_size=hidden, model_type=model_type)
    except ValueError as e:
        return Detection(None, f"the graph's heads and hidden size do not fit: {e}", None)
    return Detection(info, None, "graph")


def detect_model_type(model: onnx.ModelProto) -> str | None:
    """"gpt2" for a decoder, "bert" for an encoder, None for an encoder-decoder (its type needs a config.json).

    A decoder has past key/values inputs or present outputs, a Trilu, a causal-mask buffer ([1, 1, n, n]
    bool), or a causal mask computed from two position ranges (transformers 5: `kv_idx <= q_idx`). An
    encoder has none of these (`token_type_ids` is not required: RoBERTa and DistilBERT have none).
    """
    return TransformerGraph(model).model_type()[0]


def _heads_from_head_dim(hidden: int, head_dims: list[int]) -> int | None:
    head_dim = _most_common(head_dims)
    if head_dim is None or hidden % head_dim:
        return None
    return hidden // head_dim


def _most_common(values: list[int]) -> int | None:
    return Counter(values).most_common(1)[0][0] if values else None
