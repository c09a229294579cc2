"""Runs, times, profiles and traces models under onnx's pure-Python `ReferenceEvaluator`."""

from __future__ import annotations

import contextlib
import io
import json
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
import pandas as pd
from onnx import helper
from onnx.reference import ReferenceEvaluator
from onnx.reference.op_run import OpRun

from tracker.base.errors import UnsupportedOpError
from tracker.measure.inputs.feed_checks import check_feeds
from tracker.measure.timing.latency import Latency, TimingConfig, time_runs
from tracker.profile import columns as C
from tracker.profile.parse import Profile

PROVIDER = "ReferenceEvaluator"
# The domains of onnx.reference's own kernels (ReferenceEvaluator._load_impl, onnx 1.23).
REFERENCE_DOMAINS = ("", "ai.onnx.ml", "ai.onnx.preview", "ai.onnx.preview.training", "experimental")
VERBOSE_LEVELS = (1, 2, 3, 4)

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


@dataclass(frozen=True)
class NodeEvaluation:
    """One node evaluated on its own, on the inputs it receives in a full run of its model."""

    node_name: str
    op_type: str
    inputs: dict[str, np.ndarray]
    outputs: dict[str, np.ndarray]
    trace: str


def make_evaluator(
    model: onnx.ModelProto, *, new_ops: Sequence[type[OpRun]] = (), verbose: int = 0
) -> ReferenceEvaluator:
    """Builds a ReferenceEvaluator for `model`.

    Args:
        model: the model; its local functions are known to the evaluator.
        new_ops: OpRun kernels of custom ops, matched by (`op_domain`, class name). Where a model
            also has a local function of the same domain and name, the kernel wins.
        verbose: the evaluator's verbosity (it prints to stdout while running).

    Raises:
        tracker.base.errors.UnsupportedOpError: the evaluator has no kernel for an op of the model.
    """
    check_reference_ops(model, new_ops=new_ops)
    try:
        return ReferenceEvaluator(model, new_ops=list(new_ops) or None, verbose=verbose)
    except NotImplementedError as e:  # a standard op (or version) the evaluator has no kernel for
        raise UnsupportedOpError(f"the reference runtime (onnx ReferenceEvaluator) cannot run this model: {e}") from e


def check_reference_ops(model: onnx.ModelProto, *, new_ops: Sequence[type[OpRun]] = ()) -> None:
    """Raises `UnsupportedOpError` naming each op of a domain the evaluator has no kernels for.

    The evaluator runs the domains in `REFERENCE_DOMAINS`, the model's local functions and the
    kernels in `new_ops`; any other op (e.g. a custom domain's, or com.microsoft's) fails.
    """
    functions = sorted((f.domain, f.name) for f in model.functions)
    kernels = sorted((op.op_domain, op.__name__) for op in new_ops)
    unknown: dict[tuple[str, str], str] = {}
    for node in _all_nodes(model):
        key = (node.domain, node.op_type)
        if node.domain not in REFERENCE_DOMAINS and key not in functions and key not in kernels:
            unknown.setdefault(key, f" (node {node.name!r})" if node.name else "")
    if unknown:
        ops = ", ".join(f"op {op!r} of domain {domain!r}{node}" for (domain, op), node in unknown.items())
        raise UnsupportedOpError(
            f"the reference runtime (onnx ReferenceEvaluator) has no kernel for {ops}; it runs the ops of "
            f"domains {', '.join(repr(d) for d in REFERENCE_DOMAINS)} ('' is ai.onnx), the model's local functions "
            f"({_names(functions)}) and OpRun kernels passed as new_ops ({_names(kernels)}); add a local "
            "function of that domain and name to the model, or pass a kernel in new_ops (Python API)"
        )


def _names(keys: list[tuple[str, str]]) -> str:
    return ", ".join(f"{domain}.{name}" for domain, name in keys) or "none"


def _all_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """The nodes of the main graph, of its subgraphs and of the model's local functions."""
    nodes: list[onnx.NodeProto] = []
    pending = [list(model.graph.node), *(list(f.node) for f in model.functions)]
    while pending:
        for node in pending.pop():
            nodes.append(node)
            for attr in node.attribute:
                pending.extend(list(g.node) for g in ([attr.g] if attr.HasField("g") else attr.graphs))
    return nodes


def run_reference(
    model: onnx.ModelProto, feeds: Mapping[str, np.ndarray], *, new_ops: Sequence[type[OpRun]] = ()
) -> list[np.ndarray]:
    """Runs `model` once and returns its outputs in graph output order.

    Raises:
        tracker.base.errors.FeedError: the feeds do not match the model's inputs.
    """
    check_feeds(model, feeds)
    outputs = make_evaluator(model, new_ops=new_ops).run(None, dict(feeds))
    assert isinstance(outputs, list)  # a dict only with intermediate=True
    return outputs


def time_reference(
    model: onnx.ModelProto,
    feeds: Mapping[str, np.ndarray],
    *,
    new_ops: Sequence[type[OpRun]] = (),
    timing: TimingConfig,
) -> Latency:
    """Times whole runs of `model`; the evaluator is built once, outside the timed runs."""
    check_feeds(model, feeds)
    evaluator = make_evaluator(model, new_ops=new_ops)
    feeds = dict(feeds)
    return time_runs(lambda: evaluator.run(None, feeds), timing)


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
    names = _node_names(model.graph)
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


def trace_reference(
    model: onnx.ModelProto,
    feeds: Mapping[str, np.ndarray],
    *,
    new_ops: Sequence[type[OpRun]] = (),
    verbose: int,
) -> str:
    """Returns what the evaluator prints during one run at verbosity `verbose` (1 to 4).

    In onnx 1.23 level 1 prints nothing for top-level nodes, 2 adds one line per node, 3 adds the
    range of every value, 4 the first values.
    """
    if verbose not in VERBOSE_LEVELS:
        raise ValueError(f"verbose must be one of {VERBOSE_LEVELS}, got {verbose!r}")
    check_feeds(model, feeds)
    evaluator = make_evaluator(model, new_ops=new_ops, verbose=verbose)
    _, trace = _captured_run(evaluator, dict(feeds))
    return trace


def evaluate_node(
    model: onnx.ModelProto,
    node_name: str,
    feeds: Mapping[str, np.ndarray],
    *,
    new_ops: Sequence[type[OpRun]] = (),
    verbose: int = 0,
) -> NodeEvaluation:
    """Evaluates one top-level node alone, on the inputs a full run of `model` gives it.

    The node runs in a one-node model with `model`'s opset imports and local functions.

    Args:
        node_name: the node's name (the first node of that name), or "<op_type>_<index>" for an
            unnamed node, as in `profile_reference`.
        verbose: verbosity of the one-node run whose trace is returned (0: empty trace).

    Raises:
        ValueError: no top-level node has that name.
        tracker.base.errors.FeedError: the feeds do not match the model's inputs.
    """
    names = _node_names(model.graph)
    if node_name not in names:
        raise ValueError(
            f"model has no node named {node_name!r}; {len(names)} nodes, e.g. {names[:8]}"
        )
    check_feeds(model, feeds)
    node = model.graph.node[names.index(node_name)]
    values = make_evaluator(model, new_ops=new_ops).run(None, dict(feeds), intermediate=True)
    assert isinstance(values, dict)  # every value by name, with intermediate=True
    inputs = {name: values[name] for name in node.input if name}
    # Subgraphs (If, Loop, Scan) may read outer-scope values that are not node inputs.
    implicit = {n: values[n] for n in _names_read_by_subgraphs(node) if n and n in values}
    node_feeds = {**implicit, **inputs}
    one_node = _one_node_model(model, node, node_feeds)
    evaluator = make_evaluator(one_node, new_ops=new_ops, verbose=verbose)
    out_names = [name for name in node.output if name]
    results, trace = _captured_run(evaluator, node_feeds, out_names)
    return NodeEvaluation(
        node_name=node_name,
        op_type=node.op_type,
        inputs=inputs,
        outputs=dict(zip(out_names, results, strict=True)),
        trace=trace,
    )


def _initializer_names(graph: onnx.GraphProto) -> set[str]:
    return {t.name for t in graph.initializer} | {t.values.name for t in graph.sparse_initializer}


def _node_names(graph: onnx.GraphProto) -> list[str]:
    return [node.name or f"{node.op_type}_{index}" for index, node in enumerate(graph.node)]


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


def _captured_run(
    evaluator: ReferenceEvaluator, feeds: dict[str, Any], output_names: list[str] | None = None
) -> tuple[list[Any], str]:
    """Runs once and returns the outputs and what the evaluator printed (its verbose trace)."""
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        results = evaluator.run(output_names, feeds)
    assert isinstance(results, list)  # a dict only with intermediate=True
    return results, buffer.getvalue()


def _names_read_by_subgraphs(node: onnx.NodeProto) -> set[str]:
    names: set[str] = set()
    for attr in node.attribute:
        for graph in [attr.g] if attr.HasField("g") else list(attr.graphs):
            for inner in graph.node:
                names.update(inner.input)
                names |= _names_read_by_subgraphs(inner)
    return names


def _one_node_model(
    model: onnx.ModelProto, node: onnx.NodeProto, feeds: Mapping[str, Any]
) -> onnx.ModelProto:
    inputs = [_value_info(name, value) for name, value in feeds.items()]
    outputs = [helper.make_value_info(name, onnx.TypeProto()) for name in node.output if name]
    graph = helper.make_graph([node], f"node_{node.name or node.op_type}", inputs, outputs)
    return helper.make_model(
        graph,
        opset_imports=list(model.opset_import),
        functions=list(model.functions),
        ir_version=model.ir_version,
    )


def _value_info(name: str, value: Any) -> onnx.ValueInfoProto:
    if isinstance(value, np.ndarray):
        elem_type = helper.np_dtype_to_tensor_dtype(value.dtype)
        return helper.make_tensor_value_info(name, elem_type, value.shape)
    return helper.make_value_info(name, onnx.TypeProto())
