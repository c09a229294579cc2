"""Reading a model's graph through onnx-ir: `ir_model` and `made_by` (queries the rewrites share, through
`tracker.optimize.base`), and `TransformerGraph`, what the detectors of `tracker.optimize.model_info` read of a
transformer: its norms' widths, its heads, whether it is causal, and so its model type."""

from __future__ import annotations

import onnx
import onnx_ir as ir
from onnx import numpy_helper

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


class TransformerGraph:
    """The main graph as onnx-ir sees it (each value's producer and readers), and its initializers as stored (their
    dims survive when the values were dropped: `load_graph`), for the detectors of `tracker.optimize.model_info`."""

    def __init__(self, model: onnx.ModelProto) -> None:
        read = ir_model(model)
        self.nodes = list(read.graph) if read is not None else []  # a graph onnx-ir cannot read has no transformer
        self.initializers = {t.name: t for t in model.graph.initializer}
        self.input_names = [i.name for i in model.graph.input if i.name not in self.initializers]
        self.output_names = [o.name for o in model.graph.output]

    def model_type(self) -> tuple[str | None, str | None]:
        """(model type, None), or (None, why not): `model_info.detect_model_type`'s rule."""
        if any(name in _ENCODER_DECODER_INPUTS for name in self.input_names):
            return None, "an encoder-decoder graph: its ORT model type (bart, t5, ...) needs a config.json"
        names = (*self.input_names, *self.output_names)
        if any(name.startswith(("past", "present")) for name in names) or self.is_causal():
            # RMSNorm instead of LayerNorm: a LLaMA-family decoder (LLaMA, Mistral, Qwen2), not GPT-2.
            return ("llama" if self.rms_norm_widths() and not self.fused_norm_widths(rms=False) else "gpt2"), None
        return "bert", None

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
