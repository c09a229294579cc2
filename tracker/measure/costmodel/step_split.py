"""Where one step's time goes: each kernel of ONNX Runtime's runtime graph in one part (the transformer layers' matrix
products, the lm_head's, attention, the KV cache's copies, everything else), and a profiled step's wall time split
over those parts (`StepSplit`), its metric keys and back.

The parts, decided on the runtime graph (`classify_nodes`), by the first rule that holds:

- **KV cache I/O** (`kv_io`): a `Concat` of a graph input into a graph output, the in-graph copy of the past and the
  new key/value into the present. It reads and writes the whole cache every step (the present's allocation
  included), and it is what a cache shared between past and present (fused attention with a past,
  onnxruntime-genai's buffers) removes; so it is counted here and not in attention. Added to it: the host's part of
  the step, its wall time outside ONNX Runtime's `model_run` (feeding the past, returning the presents), measured
  outside the graph (`split_step`). ONNX Runtime 1.32 takes numpy feeds and returns outputs as numpy views of its
  own buffers, without a copy either way, so with the numpy loop the host's part is small and the Concat is most
  of the cache's cost.
- **matrix products with a weight**, by weight: a product kernel (`MATMUL_OPS`: MatMul, Gemm, FusedMatMul,
  MatMulNBits, DynamicQuantizeMatMul, MatMulInteger, QGemm, QLinearMatMul, ...) one of whose operands is a constant
  (an initializer, or computed from initializers only). The **lm_head** (`lm_head`) is the first such product met
  walking back from the `logits` output; the others are the **layers'** (`layer_matmuls`). With each product go the
  kernels that only serve it: the weight's own preparation (nodes computed from initializers only, such as a
  DequantizeLinear or Transpose of a tied embedding, each step), the quantization of its activation
  (DynamicQuantizeLinear, QuantizeLinear, and the Mul of their scale), and the rescaling of an integer product's
  output back to float (Cast, DequantizeLinear, Mul).
- **attention** (`attention`): the kernels between the projections. Its core is the products of two activations
  (scores, context), Softmax and the fused attention ops (`ATTENTION_OPS`); with it go every kernel it depends on and
  every kernel depending on it, up to a matrix product with a weight: the heads' reshapes and transposes, the scaling,
  the mask (its Where, its Add to the scores), rotary embeddings when they are not fused.
- **other** (`other`): the rest (layer norms, GELU, the embeddings' Gather, residual Adds, reshapes of the residual
  stream), and ONNX Runtime's own time between kernels within `model_run`, where the profiler's cost lands.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, fields
from enum import StrEnum

import numpy as np
import onnx
import onnx_ir as ir
import pandas as pd

from tracker.measure.costmodel.kernel_costs import MATMUL_OPS
from tracker.profile import aggregate
from tracker.profile import columns as C

logger = logging.getLogger(__name__)


class Part(StrEnum):
    """The part of a step a kernel's time counts in (see the module docstring)."""

    LAYER_MATMULS = "layer_matmuls"
    LM_HEAD = "lm_head"
    ATTENTION = "attention"
    KV_IO = "kv_io"
    OTHER = "other"


PARTS = tuple(Part)
SPLIT = "split."  # the split's metric keys, after the phase's prefix: `gen.decode.past512.split.lm_head_ms`
# Fused attention kernels, and Softmax: the core of attention with the products of two activations.
ATTENTION_OPS = frozenset(("Attention", "MultiHeadAttention", "GroupQueryAttention", "RotaryEmbedding",
                           "DecoderMaskedMultiHeadAttention", "DecoderMaskedSelfAttention", "PackedAttention",
                           "PackedMultiHeadAttention", "SparseAttention", "QAttention", "Softmax"))
# A product's operands among its inputs, where they are not the first two.
_OPERANDS = {"QGemm": (0, 3), "QLinearMatMul": (0, 3)}
_QUANTIZE_OPS = frozenset(("DynamicQuantizeLinear", "QuantizeLinear"))
_INTEGER_PRODUCTS = frozenset(("MatMulInteger", "QLinearMatMul", "QGemm"))
_RESCALE_OPS = frozenset(("Cast", "DequantizeLinear"))


def classify_nodes(graph: onnx.GraphProto, *, logits: str = "logits") -> dict[str, Part]:
    """The part of each node of a runtime graph (ORT's optimized model), by node name (see the module docstring).

    Args:
        graph: the graph whose nodes the profile's kernels are (`SessionOptions.optimized_model_filepath`).
        logits: the output the lm_head's product makes (through nodes that are not products with a weight).
    """
    model = ir.from_proto(graph)
    nodes = list(model)
    index = {id(n): i for i, n in enumerate(nodes)}

    def made_by(value: ir.Value | None) -> int | None:  # the node of this graph that makes `value`, if any
        node = value.producer() if value is not None else None
        return index.get(id(node)) if node is not None else None

    def users(value: ir.Value) -> list[int]:  # the nodes of this graph that read `value`
        return [index[id(use.node)] for use in value.uses() if id(use.node) in index]

    def readers(i: int) -> list[int]:  # the nodes of this graph that read node i's outputs
        return [j for out in nodes[i].outputs for j in users(out)]

    const = _constant_nodes(nodes, set(model.initializers) | {t.values.name for t in graph.sparse_initializer})
    const_values = {id(out) for i in const for out in nodes[i].outputs} | {id(v) for v in model.initializers.values()}
    products = {i for i, n in enumerate(nodes) if n.op_type in MATMUL_OPS}
    weighted = {i for i in products
                if any(k < len(nodes[i].inputs) and id(nodes[i].inputs[k]) in const_values
                       for k in _OPERANDS.get(nodes[i].op_type, (0, 1)))}
    logits_value = next((o for o in model.outputs if o.name == logits), None)
    lm_head = _first_products_before(made_by(logits_value), nodes, made_by, weighted, const_values)
    if weighted and not lm_head:
        logger.warning("no matrix product with a weight makes %r: every product counts as the layers'", logits)
    parts: dict[int, Part] = {i: Part.LM_HEAD if i in lm_head else Part.LAYER_MATMULS for i in weighted}
    _add_satellites(parts, nodes, users, const)
    graph_inputs, graph_outputs = {id(v) for v in model.inputs}, {id(v) for v in model.outputs}
    for i, n in enumerate(nodes):
        if n.op_type == "Concat" and {id(v) for v in n.inputs} & graph_inputs and {id(v) for v in n.outputs} & graph_outputs:
            parts[i] = Part.KV_IO
    core = {i for i, n in enumerate(nodes) if n.op_type in ATTENTION_OPS or (i in products and i not in weighted)}
    region = (_closure(core, lambda i: [j for v in nodes[i].inputs if (j := made_by(v)) is not None],
                       stop=weighted | const)
              | _closure(core, readers, stop=weighted))
    for i in region:
        parts.setdefault(i, Part.ATTENTION)
    return {n.name or "": parts.get(i, Part.OTHER) for i, n in enumerate(nodes)}


def _constant_nodes(nodes: Sequence[ir.Node], initializers: Collection[str]) -> set[int]:
    """Nodes computed from initializers only (in topological order, as ONNX keeps a graph's nodes)."""
    known = set(initializers)
    const = set()
    for i, n in enumerate(nodes):
        inputs = [v.name for v in n.inputs if v is not None and v.name]
        if (inputs and all(t in known for t in inputs)) or n.op_type == "Constant":
            const.add(i)
            known.update(v.name for v in n.outputs if v.name)
    return const


def _first_products_before(start: int | None, nodes: Sequence[ir.Node], made_by, weighted: set[int],
                           const_values: set[int]) -> set[int]:
    """The products with a weight first met on each path back from node `start` (the maker of the logits)."""
    found, seen = set(), set()
    stack = [start] if start is not None else []
    while stack:
        i = stack.pop()
        if i in seen:
            continue
        seen.add(i)
        if i in weighted:
            found.add(i)
            continue
        stack.extend(j for v in nodes[i].inputs if id(v) not in const_values and (j := made_by(v)) is not None)
    return found


def _add_satellites(parts: dict[int, Part], nodes: Sequence[ir.Node], readers_of, const: set[int]) -> None:
    """Gives each product's serving kernels its part: its weight's preparation, its activation's quantization, its
    integer output's rescaling."""

    def part_of(users: Sequence[int]) -> Part | None:
        found = {parts[u] for u in users if u in parts}
        return Part.LM_HEAD if Part.LM_HEAD in found else (Part.LAYER_MATMULS if found else None)

    for i in sorted(const, reverse=True):  # readers first: a weight's chain ends at its product
        part = part_of([j for out in nodes[i].outputs for j in readers_of(out)])
        if part is not None:
            parts[i] = part
    for i, n in enumerate(nodes):
        if n.op_type in _QUANTIZE_OPS and i not in parts:
            part = part_of(readers_of(n.outputs[0]))
            if part is None:
                continue
            parts[i] = part
            for scale in n.outputs[1:2]:  # the dynamic scale, multiplied by the weight's for the rescaling
                for c in readers_of(scale):
                    if nodes[c].op_type == "Mul":
                        parts.setdefault(c, part)
    for i, n in enumerate(nodes):
        if n.op_type not in _INTEGER_PRODUCTS or i not in parts:
            continue
        frontier = readers_of(n.outputs[0])
        while frontier:
            c = frontier.pop()
            if nodes[c].op_type in _RESCALE_OPS | {"Mul"} and c not in parts:
                parts[c] = parts[i]
                if nodes[c].op_type in _RESCALE_OPS:
                    frontier.extend(readers_of(nodes[c].outputs[0]))


def _closure(start: set[int], neighbours, *, stop: set[int]) -> set[int]:
    """`start` and every node reached from it through `neighbours`, not entering `stop`."""
    reached, stack = set(start), list(start)
    while stack:
        for j in neighbours(stack.pop()):
            if j not in reached and j not in stop:
                reached.add(j)
                stack.append(j)
    return reached


@dataclass(frozen=True)
class StepSplit:
    """A step's wall time over its parts, in ms per step (means over the profiled steps kept, `split_step`).

    The five parts add up to `step_ms`: the kernels of each part, plus the host's time outside `model_run` in
    `kv_io_ms` and ONNX Runtime's time between kernels in `other_ms`.

    Attributes:
        step_ms: the mean wall time of a step, timed around each call as the decode loop makes it, profiled.
        layer_matmuls_ms, lm_head_ms, attention_ms, kv_io_ms, other_ms: the parts (`Part`).
        kv_host_ms: of `kv_io_ms`, the wall time outside ONNX Runtime's `model_run` (feeds in, outputs out).
        kv_concat_ms: of `kv_io_ms`, the in-graph Concat of the past and the new key/value.
        between_kernels_ms: of `other_ms`, `model_run` less the kernels' time (the executor, the profiler's cost).
        runs: the profiled steps the means are over (the middle half by wall time, `split_step`).
    """

    step_ms: float
    layer_matmuls_ms: float
    lm_head_ms: float
    attention_ms: float
    kv_io_ms: float
    other_ms: float
    kv_host_ms: float
    kv_concat_ms: float
    between_kernels_ms: float
    runs: int

    def part_ms(self, part: Part | str) -> float:
        return float(getattr(self, f"{Part(part)}_ms"))

    def share(self, part: Part | str) -> float:
        """The part's share of the step (0 to 1)."""
        return self.part_ms(part) / self.step_ms if self.step_ms > 0 else float("nan")

    def metrics(self) -> dict[str, float]:
        """`split.<part>_ms` and `split.<part>_share` for each part, and `split.{step_ms, kv_host_ms, kv_concat_ms,
        between_kernels_ms, runs}`."""
        metrics = {f"{SPLIT}{f.name}": float(getattr(self, f.name)) for f in fields(self)}
        metrics.update({f"{SPLIT}{part}_share": self.share(part) for part in PARTS})
        return metrics


def read_step_split(metrics: Mapping[str, float], prefix: str) -> StepSplit | None:
    """The split `StepSplit.metrics` wrote under `prefix` (`gen.decode.past512.`), or None when it is not all there."""
    values = {f.name: metrics.get(f"{prefix}{SPLIT}{f.name}") for f in fields(StepSplit)}
    found = {k: float(v) for k, v in values.items() if v is not None}
    if len(found) < len(values):
        return None
    return StepSplit(**{k: v for k, v in found.items() if k != "runs"}, runs=int(found["runs"]))


def split_step(events: pd.DataFrame, runs: pd.DataFrame, wall_ms: Sequence[float], parts: Mapping[str, Part], *,
               skip_runs: int = 1) -> StepSplit:
    """Splits profiled steps' wall time over the parts, as means over the middle half of the steps by wall time
    (after the first `skip_runs`).

    Each step's time splits exactly (its kernels by part, `model_run` less its kernels, its wall time less
    `model_run`), so the means over any set of steps add up to their mean wall time. The middle half (the steps
    ranked from a quarter to three quarters by wall time, rounded outwards: at least one) keeps a step another
    process slowed from skewing the parts.

    Args:
        events: the profile's kernel calls (`tracker.profile.columns.EVENT_COLUMNS`).
        runs: the profile's `model_run` events, one per step (`Profile.runs`).
        wall_ms: the wall time of each step, in the order run, as many as `runs`.
        parts: each node's part (`classify_nodes`); a kernel of a node it does not name counts as other.
        skip_runs: leading (warm-up) steps left out.

    Raises:
        ValueError: the wall times are not one per `model_run`, or no step is left.
    """
    if len(wall_ms) != len(runs):
        raise ValueError(f"one wall time per profiled step is needed: got {len(wall_ms)} for {len(runs)} runs")
    kept_runs = runs[runs[C.RUN] >= skip_runs]
    if kept_runs.empty:
        raise ValueError(f"skip_runs={skip_runs} leaves no step of {len(runs)}")
    all_wall = np.asarray(wall_ms, dtype=float)
    order = np.argsort(all_wall[kept_runs[C.RUN].to_numpy()], kind="stable")
    n = len(order)
    kept_runs = kept_runs.iloc[np.sort(order[n // 4: -(-3 * n // 4)])]  # ranks n/4 to 3n/4, rounded outwards
    n = len(kept_runs)
    kept = aggregate.keep_runs(events, skip_runs=skip_runs)
    kept = kept[kept[C.RUN].isin(kept_runs[C.RUN])]
    nodes = kept[C.NODE].astype(str)
    unknown = sorted(set(nodes) - set(parts))
    if unknown:
        logger.warning("%d profiled nodes are not in the runtime graph, counted as other: %s", len(unknown),
                       unknown[:5])
    by_part = kept[C.DUR_US].astype(float).groupby(nodes.map(lambda x: parts.get(x, Part.OTHER)).to_numpy()).sum()
    kernel_ms = {part: float(by_part.get(part, 0.0)) / n / 1e3 for part in PARTS}
    wall = all_wall[kept_runs[C.RUN].to_numpy()]
    model_run_ms = kept_runs[C.DUR_US].to_numpy(dtype=float) / 1e3
    host_ms = float(np.mean(wall - model_run_ms))
    between_ms = float(np.mean(model_run_ms)) - sum(kernel_ms.values())
    return StepSplit(
        step_ms=float(np.mean(wall)),
        layer_matmuls_ms=kernel_ms[Part.LAYER_MATMULS],
        lm_head_ms=kernel_ms[Part.LM_HEAD],
        attention_ms=kernel_ms[Part.ATTENTION],
        kv_io_ms=kernel_ms[Part.KV_IO] + host_ms,
        other_ms=kernel_ms[Part.OTHER] + between_ms,
        kv_host_ms=host_ms,
        kv_concat_ms=kernel_ms[Part.KV_IO],
        between_kernels_ms=between_ms,
        runs=n,
    )
