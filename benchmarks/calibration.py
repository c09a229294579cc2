"""Models whose speed-up against their baseline is known: the checks of the speed-up measurement itself.

An A/A pair (the baseline's own file as an attempt) must read "same" or "inconclusive", its interval around 1;
a model made to do extra work must read "worse", its interval covering the ratio that long isolated runs
of each give. `benchmarks/bench_speedup.py` runs both on every study model, the tests on the tiny ones.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper


def with_extra_work(model: onnx.ModelProto, *, copies: int = 1) -> onnx.ModelProto:
    """`model` with its whole graph computed `copies` more times, and the same outputs.

    Each output becomes `output + (copy - copy)` over one of the copies, so every copy is computed and
    the values are bit-identical for finite outputs. ONNX Runtime would merge a copy that reads the same
    inputs into the original (its common-subexpression elimination), so each copy reads the graph inputs
    through `Mul(input, 1)` with a one of its own, which it does not simplify; nor does it simplify
    `x - x`. The input model is not changed.

    Raises:
        ValueError: `copies` < 1, or the graph has subgraphs or functions (not supported here).
    """
    if copies < 1:
        raise ValueError(f"copies must be >= 1, got {copies}")
    graph = model.graph
    if model.functions or any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
                              for n in graph.node for a in n.attribute):
        raise ValueError("with_extra_work handles flat graphs only (no subgraphs, no model-local functions)")
    initializers = {t.name for t in graph.initializer}
    shared = initializers | {""}
    extra = []
    ones = []
    last_copy: dict[str, str] = {}
    for c in range(1, copies + 1):
        renamed = {}
        for graph_input in graph.input:
            if graph_input.name in initializers:
                continue
            one = f"{graph_input.name}__one{c}"
            dtype = helper.tensor_dtype_to_np_dtype(graph_input.type.tensor_type.elem_type)
            ones.append(numpy_helper.from_array(np.ones((), dtype=dtype), one))
            renamed[graph_input.name] = f"{graph_input.name}__extra{c}"
            extra.append(helper.make_node("Mul", [graph_input.name, one], [renamed[graph_input.name]],
                                          name=f"{graph_input.name}__extra{c}_mul"))
        for node in graph.node:
            clone = onnx.NodeProto()
            clone.CopyFrom(node)
            clone.name = f"{node.name or node.op_type}__extra{c}"
            del clone.input[:]
            clone.input.extend(n if n in shared else renamed.get(n, f"{n}__extra{c}") for n in node.input)
            del clone.output[:]
            for out in node.output:
                renamed[out] = f"{out}__extra{c}" if out else ""
                clone.output.append(renamed[out])
            extra.append(clone)
        last_copy = renamed
    # the original graph now computes each output under another name; the tail adds the zero to it
    kept = {out.name: f"{out.name}__before_extra" for out in graph.output}
    tail = []
    for name, before in kept.items():
        copy_name, zero = last_copy[name], f"{name}__extra_zero"
        tail.append(helper.make_node("Sub", [copy_name, copy_name], [zero], name=f"{name}__extra_sub"))
        tail.append(helper.make_node("Add", [before, zero], [name], name=f"{name}__extra_add"))
    result = onnx.ModelProto()
    result.CopyFrom(model)
    for node in result.graph.node:
        for names in (node.input, node.output):
            for i, name in enumerate(names):
                names[i] = kept.get(name, name)
    result.graph.node.extend(extra + tail)
    result.graph.initializer.extend(ones)
    return result
