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
import onnx_ir as ir

from tracker.optimize.base import made_by, rewrite_in_ir


def fold_flattening_reshapes(model: onnx.ModelProto) -> int:
    """Folds, in place, each flatten and unflatten around a `MatMulNBits` (`FoldFlatteningReshapes`), and drops what
    only the Reshapes used. Returns how many products were folded."""
    fold = FoldFlatteningReshapes()
    rewrite_in_ir(model, fold)
    return fold.folded


class FoldFlatteningReshapes(ir.passes.InPlacePass):
    """Makes each `MatMulNBits` between a flattening Reshape and the Reshape that undoes it read the unflattened
    input, its output (or the Add of its bias) feeding what the second Reshape fed. `folded` counts the products.

    A pair is folded only where the graph's shapes prove it a flatten and its inverse: the input is [d..., K] and
    the second Reshape's output [d..., N], with the same leading dimensions (the same names or sizes), and the
    flattened value feeds nothing else. Anything less certain is left as it is.
    """

    def __init__(self) -> None:
        super().__init__()
        self.folded = 0

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        self.folded = 0
        for node in model.graph:
            flat = node.inputs[0] if node.op_type == "MatMulNBits" else None
            flatten = made_by(flat, "Reshape")
            if flat is None or flatten is None or len(flat.uses()) != 1:
                continue
            readers = node.outputs[0].consumers()
            tail = readers[0] if len(readers) == 1 and readers[0].op_type == "Add" else node
            after = tail.outputs[0].consumers()
            if len(after) != 1 or after[0].op_type != "Reshape" or after[0].outputs[0].is_graph_output():
                continue
            unflatten = after[0]
            before, restored = _dims(flatten.inputs[0]), _dims(unflatten.outputs[0])
            k, n = node.attributes.get_int("K"), node.attributes.get_int("N")
            if (before is None or restored is None or len(before) < 2 or len(before) != len(restored)
                    or before[:-1] != restored[:-1] or before[-1] != k or restored[-1] != n):
                continue
            node.replace_input_with(0, flatten.inputs[0])
            unflatten.outputs[0].replace_all_uses_with(tail.outputs[0])  # the two Reshapes are read by nothing now
            for value in (node.outputs[0], tail.outputs[0]):  # [d..., N] now, no longer 2-D: ORT infers it
                value.shape, value.type = None, None
            self.folded += 1
        return ir.passes.PassResult(model, modified=bool(self.folded))


def _dims(value: ir.Value | None) -> list[str | int] | None:
    """The known dimensions of a value (a dim_param name or a positive size each), or None if any is unknown."""
    if value is None or value.shape is None:
        return None
    dims: list[str | int] = []
    for dim in value.shape:
        if isinstance(dim, int) and dim > 0:
            dims.append(dim)
        elif isinstance(dim, ir.SymbolicDim) and dim.value:
            dims.append(dim.value)
        else:
            return None
    return dims
