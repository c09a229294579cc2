"""Runs, times and traces models under onnx's pure-Python `ReferenceEvaluator`, and evaluates a node alone; its
profile is `tracker.measure.runtimes.reference_profile`'s."""

from __future__ import annotations

import contextlib
import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import helper
from onnx.reference import ReferenceEvaluator
from onnx.reference.op_run import OpRun

from tracker.base.errors import UnsupportedOpError
from tracker.measure.inputs.feed_checks import check_feeds
from tracker.measure.timing.latency import Latency, TimingConfig, time_runs

PROVIDER = "ReferenceEvaluator"
# The domains of onnx.reference's own kernels (ReferenceEvaluator._load_impl, onnx 1.23).
REFERENCE_DOMAINS = ("", "ai.onnx.ml", "ai.onnx.preview", "ai.onnx.preview.training", "experimental")
VERBOSE_LEVELS = (1, 2, 3, 4)

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
            unnamed node, as in `reference_profile.profile_reference`.
        verbose: verbosity of the one-node run whose trace is returned (0: empty trace).

    Raises:
        ValueError: no top-level node has that name.
        tracker.base.errors.FeedError: the feeds do not match the model's inputs.
    """
    names = node_names(model.graph)
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


def node_names(graph: onnx.GraphProto) -> list[str]:
    """The top-level nodes' names, "<op_type>_<index>" for an unnamed one."""
    return [node.name or f"{node.op_type}_{index}" for index, node in enumerate(graph.node)]


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
