"""What the transformer fusers need to know about a model (`ModelInfo`: heads, hidden size, ORT model type), and
finding it in a Hugging Face `config.json` or in the graph itself."""

from __future__ import annotations

import json
import logging
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import onnx
import onnx_ir as ir
from onnx import numpy_helper

from tracker.base.files import read_small_file

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

# The Transpose that turns [batch, seq, heads, head_dim] into [batch, heads, seq, head_dim] (query, value) or
# [batch, heads, head_dim, seq] (key).
_SPLIT_HEADS_PERMS: tuple[tuple[int, ...], ...] = ((0, 2, 1, 3), (0, 2, 3, 1))
_FUSED_ATTENTION_OPS = ("Attention", "MultiHeadAttention", "GroupQueryAttention")
# The layer norms whose scale (input 1, else 2 for SkipLayerNormalization's gamma) gives the hidden size.
_LAYER_NORM_SCALE = {"LayerNormalization": 1, "SkipLayerNormalization": 2, "SkipSimplifiedLayerNormalization": 2,
                     "SimplifiedLayerNormalization": 1, "RMSNormalization": 1}
# The RMSNorm ops (no mean subtracted, no bias): a LLaMA-family model's norms, not GPT-2's or BERT's.
_RMS_NORMS = ("SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization", "RMSNormalization")
_COMPARISONS = ("Less", "LessOrEqual", "Greater", "GreaterOrEqual")
# How far back from a comparison to look for the Range that makes a position index (Unsqueeze, Cast, Add...).
_RANGE_HOPS = 6
_ENCODER_DECODER_INPUTS = ("decoder_input_ids", "encoder_hidden_states", "encoder_outputs")


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
    graph = _Graph(model)
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
    model_type, reason = _model_type(graph)
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
    return _model_type(_Graph(model))[0]


def _model_type(graph: _Graph) -> tuple[str | None, str | None]:
    """(model type, None), or (None, why not)."""
    if any(name in _ENCODER_DECODER_INPUTS for name in graph.input_names):
        return None, "an encoder-decoder graph: its ORT model type (bart, t5, ...) needs a config.json"
    names = (*graph.input_names, *graph.output_names)
    if any(name.startswith(("past", "present")) for name in names) or graph.is_causal():
        # RMSNorm instead of LayerNorm: a LLaMA-family decoder (LLaMA, Mistral, Qwen2), not GPT-2.
        return ("llama" if graph.rms_norm_widths() and not graph.fused_norm_widths(rms=False) else "gpt2"), None
    return "bert", None


def _heads_from_head_dim(hidden: int, head_dims: list[int]) -> int | None:
    head_dim = _most_common(head_dims)
    if head_dim is None or hidden % head_dim:
        return None
    return hidden // head_dim


def _most_common(values: list[int]) -> int | None:
    return Counter(values).most_common(1)[0][0] if values else None


class _Graph:
    """The main graph as onnx-ir sees it (each value's producer and readers), and its initializers as stored (their
    dims survive when the values were dropped: `load_graph`), for the detectors above."""

    def __init__(self, model: onnx.ModelProto) -> None:
        read = ir_model(model)
        self.nodes = list(read.graph) if read is not None else []  # a graph onnx-ir cannot read has no transformer
        self.initializers = {t.name: t for t in model.graph.initializer}
        self.input_names = [i.name for i in model.graph.input if i.name not in self.initializers]
        self.output_names = [o.name for o in model.graph.output]

    def layer_norm_widths(self) -> list[int]:
        """Widths of every norm's scale: LayerNormalization and its fused forms, and RMSNorms (`rms_norm_widths`)."""
        return self.fused_norm_widths(rms=False) + self.rms_norm_widths()

    def rms_norm_widths(self) -> list[int]:
        """Widths of RMSNorms: the fused ops', and the written-out ones (a dynamo export of LLaMA),
        x * 1/sqrt(mean(x^2) + eps) * weight, found from a ReduceMean of a Pow to the Mul by a 1-D weight."""
        written_out = [self._scale_after(node.outputs[0], hops=6) for node in self.nodes
                       if node.op_type == "ReduceMean" and made_by(node.inputs[0], "Pow")]
        return self.fused_norm_widths(rms=True) + [w for w in written_out if w]

    def fused_norm_widths(self, *, rms: bool) -> list[int]:
        """Widths of the 1-D scales of the norm ops (`_LAYER_NORM_SCALE`): the RMSNorm ones, or the others."""
        widths = []
        for node in self.nodes:
            index = _LAYER_NORM_SCALE.get(node.op_type)
            if index is None or len(node.inputs) <= index or (node.op_type in _RMS_NORMS) != rms:
                continue
            dims = self._dims(node.inputs[index])
            if dims is not None and len(dims) == 1 and dims[0] > 0:
                widths.append(dims[0])
        return widths

    def _scale_after(self, value: ir.Value, hops: int) -> int | None:
        """The width of the first 1-D initializer a Mul reading (eventually) `value` multiplies by."""
        frontier = [value]
        for _ in range(hops):
            nxt: list[ir.Value] = []
            for reader in (r for v in frontier for r in v.consumers()):
                for other in reader.inputs if reader.op_type == "Mul" else ():
                    init = self.initializers.get(other.name or "") if other is not None else None
                    if init is not None and len(init.dims) == 1 and init.dims[0] > 1:
                        return init.dims[0]
                nxt.extend(reader.outputs)
            frontier = nxt
        return None

    def fused_attention_heads(self) -> list[int]:
        return [heads for node in self.nodes if node.op_type in _FUSED_ATTENTION_OPS
                and (heads := node.attributes.get_int("num_heads", 0)) > 0]

    def split_heads_dims(self) -> list[tuple[int | None, int | None]]:
        """(heads, head_dim) of every Reshape read by a split-heads Transpose; None where a dim is unknown."""
        found: list[tuple[int | None, int | None]] = []
        for node in self.nodes:
            if node.op_type == "Reshape" and any(
                reader.op_type == "Transpose" and tuple(reader.attributes.get_ints("perm") or ()) in _SPLIT_HEADS_PERMS
                for reader in node.outputs[0].consumers()
            ):
                # The Transpose's perm says the Reshape's output is 4-D: only its last two dims matter.
                shape = node.outputs[0].shape
                declared = [None, None, *(d if isinstance(d, int) else None for d in shape or ())][-2:]
                constant = [None, None, *self._trailing_shape_values(node.inputs[1])][-2:]
                heads, head_dim = (_positive(d) or _positive(c) for d, c in zip(declared, constant))
                found.append((heads, head_dim))
        return found

    def is_causal(self) -> bool:
        if any(node.op_type == "Trilu" for node in self.nodes):
            return True
        for tensor in self.initializers.values():
            dims = list(tensor.dims)
            if tensor.data_type in (onnx.TensorProto.BOOL, onnx.TensorProto.UINT8) and len(dims) == 4 \
                    and dims[:2] == [1, 1] and dims[2] == dims[3] > 1:
                return True
        return any(node.op_type in _COMPARISONS and len(node.inputs) == 2
                   and all(_from_range(value, _RANGE_HOPS) for value in node.inputs) for node in self.nodes)

    def _dims(self, value: ir.Value | None) -> list[int] | None:
        """The static shape of an initializer or Constant (its dims survive when the values were dropped)."""
        init = self.initializers.get(value.name or "") if value is not None else None
        if init is not None:
            return list(init.dims)
        constant = made_by(value, "Constant")
        tensor = constant.attributes.get_tensor("value") if constant is not None else None
        return list(tensor.shape.numpy()) if tensor is not None else None

    def _trailing_shape_values(self, value: ir.Value | None) -> list[int]:
        """The known last values of a shape input: a constant, or the constant parts ending a Concat
        (`[batch, seq, -1, head_dim]` is Concat(Shape..., Shape..., [-1], [head_dim]))."""
        values = self._constant_ints(value)
        if values is not None:
            return values
        concat = made_by(value, "Concat")
        trailing: list[int] = []
        for part in reversed(concat.inputs if concat is not None else ()):
            known = self._constant_ints(part)
            if known is None:  # a computed part (batch, seq), of unknown length: nothing before it is placed
                break
            trailing[:0] = known
        return trailing

    def _constant_ints(self, value: ir.Value | None) -> list[int] | None:
        """The values of an int64 initializer or Constant; None when they are not in the graph (computed,
        external, or dropped when the graph was read without its weights)."""
        tensor = self.initializers.get(value.name or "") if value is not None else None
        constant = made_by(value, "Constant")
        if tensor is None and constant is not None:
            attrs = constant.attributes
            if "value_ints" in attrs or "value_int" in attrs:
                return list(attrs.get_ints("value_ints") or [attrs.get_int("value_int", 0)])
            found = attrs.get_tensor("value")
            if found is None or found.dtype != ir.DataType.INT64:
                return None
            return [int(v) for v in found.numpy().reshape(-1)]
        if tensor is None or tensor.data_type != onnx.TensorProto.INT64:
            return None
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            return None
        size = 1
        for dim in tensor.dims:
            size *= dim
        if size and not (tensor.raw_data or tensor.int64_data):
            return None
        return [int(v) for v in numpy_helper.to_array(tensor).reshape(-1)]


def ir_model(model: onnx.ModelProto) -> ir.Model | None:
    """`model` as onnx-ir reads it; None for one it cannot read (a map or a sequence type, as skl2onnx's ZipMap of a
    classifier's probabilities)."""
    try:
        return ir.from_proto(model)
    except (ir.serde.SerdeError, NotImplementedError):
        return None


def made_by(value: ir.Value | None, op_type: str) -> ir.Node | None:
    """The node of `op_type` that makes `value`; None when another op (or none: an input, a weight) does."""
    node = value.producer() if value is not None else None
    return node if node is not None and node.op_type == op_type else None


def _from_range(value: ir.Value | None, hops: int) -> bool:
    node = value.producer() if value is not None else None
    if node is None or hops == 0:
        return False
    return node.op_type == "Range" or any(_from_range(v, hops - 1) for v in node.inputs if v is not None)


def _positive(dim: int | None) -> int | None:
    return dim if dim is not None and dim > 0 else None
