"""The Reshapes around a linear layer that only flatten and unflatten it, folded away once it is a MatMulNBits.

torch exports a linear layer on a [batch, seq, K] input as Reshape to [batch * seq, K], a Gemm (which takes
2-D inputs only), and a Reshape back to [batch, seq, N]. Once the Gemm is a MatMul + Add and the MatMul a
`MatMulNBits`, which takes any leading dimensions, the two Reshapes and the Shape/Concat that computed the
second one's target do nothing but cost a kernel each on every call: on gpt2-small, 96 of the int4 decode step's
226 kernels. The values are unchanged: a row of the product depends on its own row of the input only (with a
batch of several rows the kernel may tile them otherwise, which moves the last float bits: ~1e-7).
"""

from __future__ import annotations

import onnx

from tracker.optimize.base import GraphLookups, drop_dead_nodes


def _dims(graph_shapes: dict[str, onnx.TensorShapeProto], name: str) -> list[str | int] | None:
    """The known dimensions of a value (a dim_param name or a positive size each), or None if any is unknown."""
    shape = graph_shapes.get(name)
    if shape is None:
        return None
    dims: list[str | int] = []
    for dim in shape.dim:
        if dim.dim_param:
            dims.append(dim.dim_param)
        elif dim.dim_value > 0:
            dims.append(dim.dim_value)
        else:
            return None
    return dims


def fold_flattening_reshapes(model: onnx.ModelProto) -> int:
    """Makes each `MatMulNBits` between a flattening Reshape and the Reshape that undoes it read the unflattened
    input, its output (or the Add of its bias) feeding what the second Reshape fed; drops the Reshapes and what
    only they used. Returns how many products were folded.

    A pair is folded only where the graph's shapes prove it a flatten and its inverse: the input is [d..., K] and
    the second Reshape's output [d..., N], with the same leading dimensions (the same names or sizes), and the
    flattened value feeds nothing else. Anything less certain is left as it is.
    """
    graph = model.graph
    shapes = {v.name: v.type.tensor_type.shape for v in [*graph.value_info, *graph.input, *graph.output]
              if v.type.HasField("tensor_type") and v.type.tensor_type.HasField("shape")}
    lookups = GraphLookups(graph)
    reshaped: set[str] = set()  # the outputs that were 2-D and are now [d..., N]
    folded = 0
    for node in graph.node:
        if node.op_type != "MatMulNBits":
            continue
        flatten = lookups.node(node.input[0], "Reshape")
        if flatten is None or len(lookups.readers[node.input[0]]) != 1:
            continue
        last = lookups.readers.get(node.output[0], [])
        tail = last[0] if len(last) == 1 and last[0].op_type == "Add" else node
        after = lookups.readers.get(tail.output[0], [])
        if len(after) != 1 or after[0].op_type != "Reshape" or after[0].output[0] in lookups.outputs:
            continue
        unflatten = after[0]
        attrs = {a.name: a.i for a in node.attribute}
        before, restored = _dims(shapes, flatten.input[0]), _dims(shapes, unflatten.output[0])
        if (before is None or restored is None or len(before) < 2 or len(before) != len(restored)
                or before[:-1] != restored[:-1] or before[-1] != attrs.get("K") or restored[-1] != attrs.get("N")):
            continue
        node.input[0] = flatten.input[0]
        for reader in lookups.readers.get(unflatten.output[0], []):  # the two Reshapes are read by nothing now
            reader.input[:] = [tail.output[0] if name == unflatten.output[0] else name for name in reader.input]
        reshaped.update({node.output[0], tail.output[0]})
        folded += 1
    if folded:
        drop_dead_nodes(graph)
        kept = [v for v in graph.value_info if v.name not in reshaped]  # ORT infers their new shapes
        del graph.value_info[:]
        graph.value_info.extend(kept)
    return folded
