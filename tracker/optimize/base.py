"""What an entry is told (`Context`) and what it returns (`Candidate`), and the reading of a graph that decides
whether an entry applies to it (attention, float weights) and counts what an entry made.

The entry itself (requires, make, ensures; its knobs) is `tracker.optimize.entry`'s; writing and copying model
files is `tracker.optimize.model_files`'.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx
import onnx_ir as ir
from onnx_ir.passes.common import RemoveUnusedNodesPass

from tracker.optimize.graph_reading import ir_model as ir_model  # the rewrites' graph queries are all here
from tracker.optimize.graph_reading import made_by as made_by
from tracker.optimize.model_info import ModelInfo, detect_from_graph, detect_model_type

if TYPE_CHECKING:
    from tracker.measure.runtimes.ort_runtime import SessionConfig

PRECISIONS = ("fp32", "fp16", "int8", "int4")


@dataclass(frozen=True)
class Context:
    """What an entry is told besides its source model.

    Attributes:
        info: heads, hidden size and model type, for the entries that fuse transformer blocks; None: the
            entries that need them read them from the graph (`model_info.detect_from_graph`).
        runtime: the runtime the candidate will run in ("onnxruntime" or "reference").
        feeds: the study's inputs, for entries that calibrate on real data (static quantization).
        work: a folder where entries keep the intermediates their variants share (the pre-processed graph a
            quantizer starts from), so a search over knobs prepares each source once; None: each run prepares
            its own, under its target folder.
    """

    info: ModelInfo | None = None
    runtime: str = "onnxruntime"
    feeds: Mapping[str, np.ndarray] | None = None
    work: Path | None = None

    def require_info(self, entry: str, source: Path | None = None) -> ModelInfo:
        """`info` with its model type, what is missing read from the graph of `source`.

        Raises:
            ValueError: `entry` needs what neither `info` nor the graph of `source` gives (the message says why).
        """
        info = self.info
        if info is not None and info.model_type is not None:
            return info
        if source is None:
            raise ValueError(f"{entry} needs the model's num_heads and hidden_size (a ModelInfo); none was given")
        graph = onnx.load_model(str(source), load_external_data=False)
        if info is None:
            detection = detect_from_graph(graph)
            if detection.info is None:
                raise ValueError(f"{entry} needs the model's num_heads and hidden_size (a ModelInfo), and the graph "
                                 f"does not give them: {detection.reason}")
            return detection.info
        model_type = detect_model_type(graph)
        if model_type is None:
            raise ValueError(f"{entry} needs the model's type (ModelInfo.model_type), and the graph does not give it")
        return replace(info, model_type=model_type)


@dataclass(frozen=True)
class Candidate:
    """What one entry made: the model to measure and how to run it.

    Attributes:
        path: the model file (its external data, if any, lies beside it); a session entry returns its source.
        applied: False when the entry could not do what it is for (no attention to fuse, nothing
            quantized); `notes` say why, and `path` is still a model that runs.
        fusions: count of each fused op type in the new graph, e.g. {"SkipLayerNormalization": 24}.
        fully_optimized: the optimizer's own verdict (ORT's `is_fully_optimized`), None where it has none.
        precision: one of PRECISIONS ("fp32", "fp16", "int8", "int4"): the precision of the weights and
            compute; the study's tolerance for that precision judges the outputs.
        notes: what a reader of the run should know (what was skipped, repaired, or left unfused).
        params: what was done, as strings to log (`optimizer.opt_level`, ...).
        session: `SessionConfig` fields this candidate sets on top of the study's (session entries).
        new_ops: the reference runtime's kernels for custom ops the candidate has.
    """

    path: Path
    applied: bool
    fusions: dict[str, int]
    fully_optimized: bool | None
    precision: str
    notes: tuple[str, ...] = ()
    params: dict[str, str] = field(default_factory=dict)
    session: Mapping[str, str | int] = field(default_factory=dict)
    new_ops: tuple[type, ...] = ()

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {self.precision!r}")
        bad = {k: v for k, v in self.fusions.items() if not isinstance(v, int) or isinstance(v, bool) or v < 0}
        if bad:
            raise ValueError(f"fusion counts must be non-negative ints, got {bad}")

    def session_on(self, base: SessionConfig) -> SessionConfig:
        """`base` with the `SessionConfig` fields this candidate sets on top (a session entry's)."""
        settings: dict[str, Any] = dict(self.session)  # field names and values `SessionConfig` checks itself
        return replace(base, **settings)


Make = Callable[[Path, Path, Context], Candidate]
# None when the entry applies to the model (loaded without its external weights), else why it does not.
Applies = Callable[[onnx.ModelProto, Context], "str | None"]


def any_graph(model: onnx.ModelProto, context: Context) -> str | None:
    """Every model: session settings and generic rewrites."""
    return None


def info_source(context: Context) -> str:
    """Where the `ModelInfo` an entry used came from, as a param value: "given", "graph" (detected), or
    "given, model_type from graph"."""
    if context.info is None:
        return "graph"
    return "given" if context.info.model_type is not None else "given, model_type from graph"


def transformer(model: onnx.ModelProto, context: Context) -> str | None:
    """Models with attention (Softmax and MatMul) whose heads, hidden size and model type are given in
    `context.info` or can be read from the graph."""
    ops = {node.op_type for node in model.graph.node}
    if not {"Softmax", "MatMul"} <= ops:
        return "no attention in the graph (a transformer has Softmax and MatMul)"
    if context.info is None:
        detection = detect_from_graph(model)
        if detection.info is None:
            return f"needs the model's num_heads and hidden_size (a ModelInfo or a config.json): {detection.reason}"
    elif context.info.model_type is None and detect_model_type(model) is None:
        return "needs the model's type (ModelInfo.model_type): the graph does not tell it"
    return None


def ort_transformer(model: onnx.ModelProto, context: Context) -> str | None:
    """`transformer`, and a model type ORT's transformer optimizer has fusions for (not a LLaMA-family decoder:
    onnxscript's fusions, `attention_fused`, cover those)."""
    reason = transformer(model, context)
    if reason is not None:
        return reason
    from tracker.optimize.model_info import ORT_OPTIMIZER_TYPES

    model_type = (context.info.model_type if context.info is not None and context.info.model_type else None) \
        or detect_model_type(model)
    if model_type not in ORT_OPTIMIZER_TYPES:
        return (f"ORT's transformer optimizer has no fusions for {model_type} models (its types: "
                f"{', '.join(sorted(ORT_OPTIMIZER_TYPES))}); attention_fused (onnxscript's fusions) has")
    return None


def float_weights(model: onnx.ModelProto, op_types: tuple[str, ...]) -> list[onnx.NodeProto]:
    """The nodes of `op_types` whose weight (input 1: B of MatMul and Gemm, W of Conv) is a float32
    initializer of the main graph, 2-D for MatMul and Gemm: the nodes a weight quantizer can quantize."""
    initializers = {t.name: t for t in model.graph.initializer}
    found = []
    for node in model.graph.node:
        weight = initializers.get(node.input[1]) if node.op_type in op_types and len(node.input) > 1 else None
        if weight is None or weight.data_type != onnx.TensorProto.FLOAT:
            continue
        if node.op_type == "Conv" or len(weight.dims) == 2:
            found.append(node)
    return found


def has_matmul_weights(model: onnx.ModelProto, context: Context) -> str | None:
    """Models with a MatMul or Gemm whose weight is a 2-D float32 initializer (what weight-only quantizers take)."""
    if not float_weights(model, ("MatMul", "Gemm")):
        return "no MatMul or Gemm with a 2-D float32 weight initializer"
    return None


def count_ops(model: onnx.ModelProto, op_types: tuple[str, ...]) -> dict[str, int]:
    """How many nodes of the main graph have each of `op_types` (any domain)."""
    counts = dict.fromkeys(op_types, 0)
    for node in model.graph.node:
        if node.op_type in counts:
            counts[node.op_type] += 1
    return counts


def ort_fused_counts(statistics: Mapping[str, int]) -> dict[str, int]:
    """ORT's `get_fused_operator_statistics()` as plain non-negative ints."""
    return {str(op): int(count) for op, count in statistics.items()}


def rewrite_in_ir(model: onnx.ModelProto, *passes: ir.passes.PassBase) -> bool:
    """Runs `passes` on `model` as onnx-ir sees it, then onnx-ir's removal of what no output needs any more (the
    nodes a rewrite left, the decoder's own causal mask once no attention reads it, the weights only they read); writes
    the result back into `model` when a pass changed it. Returns whether one did."""
    read = ir_model(model)
    if read is None or not ir.passes.Sequential(*passes)(read).modified:  # onnx-ir cannot read it: no rewrite
        return False
    RemoveUnusedNodesPass()(read)
    model.CopyFrom(ir.to_proto(read))
    return True


def through_layout(value: ir.Value | None, ops: tuple[str, ...] | None = None) -> ir.Value | None:
    """Walks up from `value` through ops that only move data (`LAYOUT_OPS` by default); the first value another op
    made."""
    while value is not None and (node := value.producer()) is not None and node.op_type in (ops or LAYOUT_OPS):
        value = node.inputs[0]
    return value


def constant_of(value: ir.Value | None) -> np.ndarray | None:
    """`value`'s array when it is a weight or a Constant's output; None otherwise."""
    tensor = ir.convenience.get_const_tensor(value) if value is not None else None
    return tensor.numpy() if tensor is not None else None


def recorded_positions(model: onnx.ModelProto | ir.Model) -> int | None:
    """The positions a decode export recorded in its metadata (`max_positions`, written by `tracker.gpt2.decode`), or
    None when it recorded none."""
    props = model.metadata_props if isinstance(model, ir.Model) else {p.key: p.value for p in model.metadata_props}
    value = props.get("max_positions")
    return None if value is None else int(value)


# Ops that only move data (between a projection and the attention: [B, S, H*D] -> [B, H, S, D] and back): what a
# rewrite looks through to find the value another op made.
LAYOUT_OPS = ("Reshape", "Transpose")
