"""Profiles a model under onnx's `ReferenceEvaluator`: each top-level node's kernel call timed, as the rows of a
parsed ONNX Runtime profile."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
import pandas as pd
from onnx import helper
from onnx.reference.op_run import OpRun

from tracker.measure.inputs.feed_checks import check_feeds
from tracker.measure.runtimes.reference_runtime import PROVIDER, make_evaluator, node_names
from tracker.profile import columns as C
from tracker.profile.parse import Profile

# The columns of repeated strings are categorical, as in a parsed ORT profile.
_EVENT_DTYPES = {
    **dict.fromkeys(C.LABEL_COLUMNS, "category"),
    C.RUN: "int64",
    C.DUR_US: "float64",
    C.TS_US: "float64",
    C.OUTPUT_SIZE: "int64",
    C.ACTIVATION_SIZE: "int64",
    C.PARAMETER_SIZE: "int64",
    C.MEM_IN_USE_DELTA: "Int64",  # the evaluator has no allocator to report on: all <NA>
}

# ORT's names of element types in profiles ('[{"float":[4,100]}]'); others fall back to the
# lower-cased TensorProto name.
_ORT_TYPE_NAMES = {
    onnx.TensorProto.FLOAT: "float",
    onnx.TensorProto.DOUBLE: "double",
    onnx.TensorProto.FLOAT16: "float16",
    onnx.TensorProto.BFLOAT16: "bfloat16",
    onnx.TensorProto.BOOL: "bool",
    onnx.TensorProto.STRING: "string",
}


def profile_reference(
    model: onnx.ModelProto,
    feeds: Mapping[str, np.ndarray],
    *,
    new_ops: Sequence[type[OpRun]] = (),
    runs: int,
) -> Profile:
    """Runs `model` `runs` times and times every top-level node.

    Only the kernel call of each node is timed (its `run` is wrapped); nodes inside functions and
    subgraphs are part of their calling node's time and get no rows of their own.

    Returns:
        A `Profile` as parsed from ORT: `runs` holds the wall time of each `evaluator.run` (the
        timing wrappers included), `events` one row per node and run, columns
        `tracker.profile.columns.EVENT_COLUMNS` as in a parsed ORT profile:
        `dur_us`/`ts_us` are float µs (`ts_us` since the first run started), `provider` is
        "ReferenceEvaluator", unnamed nodes are named "<op_type>_<index>", and
        `mem_in_use_delta_bytes` is all <NA>.
    """
    if runs < 1:
        raise ValueError(f"runs must be >= 1, got {runs}")
    check_feeds(model, feeds)
    feeds = dict(feeds)
    evaluator = make_evaluator(model, new_ops=new_ops)
    calls: list[tuple[int, int, int, tuple[Any, ...], Any]] = []
    for index, rt_node in enumerate(evaluator.rt_nodes_):
        # An instance attribute shadows OpRun.run, and the evaluator calls `node.run(...)`.
        rt_node.run = _timed(rt_node.run, index, calls)
    names = node_names(model.graph)
    parameters = _initializer_names(model.graph) - set(feeds)
    tid = str(threading.get_ident())
    rows: list[dict[str, Any]] = []
    origin = time.perf_counter_ns()
    run_rows = []
    for run in range(runs):
        start = time.perf_counter_ns()
        evaluator.run(None, feeds)
        run_rows.append((run, (start - origin) / 1e3, (time.perf_counter_ns() - start) / 1e3))
        for index, t0, t1, args, outputs in calls:
            node = model.graph.node[index]
            timing = {C.RUN: run, C.DUR_US: (t1 - t0) / 1e3, C.TS_US: (t0 - origin) / 1e3, C.THREAD: tid}
            rows.append(_row(node, names[index], timing, args, outputs, parameters))
        calls.clear()
    table = pd.DataFrame(rows, columns=list(C.EVENT_COLUMNS)).astype(_EVENT_DTYPES)
    run_table = pd.DataFrame(run_rows, columns=[C.RUN, C.TS_US, C.DUR_US])
    return Profile(events=table, runs=run_table, format="reference", truncated=False, source=PROVIDER)


def _initializer_names(graph: onnx.GraphProto) -> set[str]:
    return {t.name for t in graph.initializer} | {t.values.name for t in graph.sparse_initializer}


def _timed(run: Any, index: int, calls: list[tuple[int, int, int, tuple[Any, ...], Any]]) -> Any:
    clock = time.perf_counter_ns

    def timed_run(*args: Any, **kwargs: Any) -> Any:
        t0 = clock()
        outputs = run(*args, **kwargs)
        t1 = clock()
        calls.append((index, t0, t1, args, outputs))
        return outputs

    return timed_run


def _row(
    node: onnx.NodeProto,
    name: str,
    timing: dict[str, Any],
    args: tuple[Any, ...],
    outputs: Any,
    parameters: set[str],
) -> dict[str, Any]:
    named_inputs = [(n, v) for n, v in zip(node.input, args, strict=False) if n and v is not None]
    outs = [v for v in outputs if isinstance(v, np.ndarray)]
    return {
        C.OP_TYPE: node.op_type,
        C.NODE: name,
        C.PROVIDER: PROVIDER,
        **timing,
        C.INPUT_SHAPES: _shapes_json([v for _, v in named_inputs]),
        C.OUTPUT_SHAPES: _shapes_json(outs),
        C.OUTPUT_SIZE: sum(v.nbytes for v in outs),
        C.ACTIVATION_SIZE: sum(_nbytes(v) for n, v in named_inputs if n not in parameters),
        C.PARAMETER_SIZE: sum(_nbytes(v) for n, v in named_inputs if n in parameters),
        C.MEM_IN_USE_DELTA: None,
    }


def _nbytes(value: Any) -> int:
    return value.nbytes if isinstance(value, np.ndarray) else 0


def _shapes_json(values: Sequence[Any]) -> str:
    # Sequences and maps have no ORT-style tensor entry; they are left out.
    entries = [{_ort_type_name(v.dtype): list(v.shape)} for v in values if isinstance(v, np.ndarray)]
    return json.dumps(entries, separators=(",", ":"))


def _ort_type_name(dtype: np.dtype) -> str:
    elem_type = helper.np_dtype_to_tensor_dtype(dtype)
    return _ORT_TYPE_NAMES.get(elem_type, onnx.TensorProto.DataType.Name(elem_type).lower())
