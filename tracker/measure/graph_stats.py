"""Graph statistics of an ONNX model (nodes, op types, initializers, size) and the difference of two."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np
import onnx
import pandas as pd
from onnx import helper

from tracker.profile.columns import OP_TYPE

BASELINE_COUNT = "baseline_count"
ATTEMPT_COUNT = "attempt_count"
DELTA = "delta"


@dataclass(frozen=True)
class GraphStats:
    """What a model's main graph holds.

    Attributes:
        node_count: nodes of the main graph (function bodies and subgraphs not expanded).
        op_types: node count per op type; ops outside the default domain are `domain:OpType`.
        initializer_count, initializer_bytes: weights, counted from their shapes so external data counts.
        size_bytes: size of the model file and its external data (or of the in-memory protobuf).
        opsets: `{domain: version}` imports ("" is the default ONNX domain).
        function_count: model-local functions.
    """

    node_count: int
    op_types: dict[str, int]
    initializer_count: int
    initializer_bytes: int
    size_bytes: int
    opsets: dict[str, int]
    function_count: int
    ir_version: int

    def metrics(self) -> dict[str, float]:
        return {
            "graph.node_count": float(self.node_count),
            "graph.op_type_count": float(len(self.op_types)),
            "graph.initializer_count": float(self.initializer_count),
            "graph.initializer_bytes": float(self.initializer_bytes),
            "graph.function_count": float(self.function_count),
            "model.size_bytes": float(self.size_bytes),
        }

    def params(self) -> dict[str, str]:
        opsets = ",".join(f"{d or 'ai.onnx'}={v}" for d, v in sorted(self.opsets.items()))
        return {"model.opsets": opsets, "model.ir_version": str(self.ir_version)}


def graph_stats(model: onnx.ModelProto, *, size_bytes: int | None = None) -> GraphStats:
    """Counts the nodes, op types and weights of `model`.

    Args:
        model: the model (its external data need not be loaded).
        size_bytes: the model's size on disk, external data included; default: the serialized size
            of `model` as it is in memory.
    """
    graph = model.graph
    op_types = Counter(_op_name(n) for n in graph.node)
    init_bytes = sum(_tensor_bytes(t) for t in graph.initializer)
    return GraphStats(
        node_count=len(graph.node),
        op_types=dict(sorted(op_types.items())),
        initializer_count=len(graph.initializer),
        initializer_bytes=int(init_bytes),
        size_bytes=int(model.ByteSize()) if size_bytes is None else size_bytes,
        opsets={o.domain: o.version for o in model.opset_import},
        function_count=len(model.functions),
        ir_version=int(model.ir_version),
    )


def diff_graphs(baseline: GraphStats, attempt: GraphStats) -> pd.DataFrame:
    """Nodes per op type in both graphs and the change, changed op types first."""
    ops = sorted(set(baseline.op_types) | set(attempt.op_types))
    table = pd.DataFrame(
        {
            OP_TYPE: ops,
            BASELINE_COUNT: [baseline.op_types.get(o, 0) for o in ops],
            ATTEMPT_COUNT: [attempt.op_types.get(o, 0) for o in ops],
        }
    )
    table[DELTA] = table[ATTEMPT_COUNT] - table[BASELINE_COUNT]
    order = table[DELTA].abs().sort_values(ascending=False, kind="stable").index
    return table.loc[order].reset_index(drop=True)


def _op_name(node: onnx.NodeProto) -> str:
    return node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}:{node.op_type}"


def _tensor_bytes(tensor: onnx.TensorProto) -> int:
    if tensor.data_type == onnx.TensorProto.STRING:
        return sum(len(s) for s in tensor.string_data)
    itemsize = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.data_type)).itemsize
    return int(np.prod(tensor.dims, dtype=np.int64)) * itemsize
