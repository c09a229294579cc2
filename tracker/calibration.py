"""Models whose speed-up against their baseline is known: the checks of the speed-up measurement itself.

An A/A pair (the baseline's own file as an attempt) must read "inconclusive" with an interval around 1;
a model made to do extra work must read "worse", its interval covering the ratio that long isolated runs
of each give. `benchmarks/bench_speedup.py` runs both on every study model, the tests on the tiny ones.
"""

from __future__ import annotations

import onnx
from onnx import helper


def with_extra_work(model: onnx.ModelProto, *, copies: int = 1) -> onnx.ModelProto:
    """`model` with its whole graph computed `copies` more times, and the same outputs.

    Each output becomes `output + (copy - copy)` over one of the copies, so every copy is computed,
    the values are bit-identical for finite outputs, and ONNX Runtime cannot fold the extra work away
    (it does not simplify `x - x`). The input model is not changed.

    Raises:
        ValueError: `copies` < 1, or the graph has subgraphs or functions (not supported here).
    """
    if copies < 1:
        raise ValueError(f"copies must be >= 1, got {copies}")
    graph = model.graph
    if model.functions or any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
                              for n in graph.node for a in n.attribute):
        raise ValueError("with_extra_work handles flat graphs only (no subgraphs, no model-local functions)")
    inputs = {i.name for i in graph.input} | {t.name for t in graph.initializer} | {""}
    extra = []
    last_copy: dict[str, str] = {}
    for c in range(1, copies + 1):
        renamed = {}
        for node in graph.node:
            clone = onnx.NodeProto()
            clone.CopyFrom(node)
            clone.name = f"{node.name or node.op_type}__extra{c}"
            del clone.input[:]
            clone.input.extend(n if n in inputs else renamed.get(n, f"{n}__extra{c}") for n in node.input)
            del clone.output[:]
            for out in node.output:
                renamed[out] = f"{out}__extra{c}" if out else ""
                clone.output.append(renamed[out])
            extra.append(clone)
        last_copy = renamed
    tail = []
    new_outputs = []
    for out in graph.output:
        copy_name = last_copy[out.name]
        zero, kept = f"{out.name}__extra_zero", f"{out.name}__before_extra"
        tail.append(helper.make_node("Sub", [copy_name, copy_name], [zero], name=f"{out.name}__extra_sub"))
        tail.append(helper.make_node("Add", [kept, zero], [out.name], name=f"{out.name}__extra_add"))
        new_outputs.append((out.name, kept))
    renames = dict(new_outputs)
    result = onnx.ModelProto()
    result.CopyFrom(model)
    for node in result.graph.node:
        for i, name in enumerate(node.output):
            if name in renames:
                node.output[i] = renames[name]
    for node in result.graph.node:
        for i, name in enumerate(node.input):
            if name in renames:
                node.input[i] = renames[name]
    result.graph.node.extend(extra + tail)
    return result
