"""The textbook fusion EyeLike + Add -> AddEyeLike (a custom op) and its registry entry. The fusion study's model
(`tracker.studies.fusion.make_linear_model`) has the pattern."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
from onnx import helper
from onnx.reference.op_run import OpRun

from tracker.base.vocabulary import Kind
from tracker.optimize.base import Candidate, Context, ir_model, made_by
from tracker.optimize.entry import FunctionEntry
from tracker.optimize.model_files import prepare_output, save_proto

DOMAIN = "tracker.fusions"
OPSET_VERSION = 1
OP_TYPE = "AddEyeLike"


@dataclass(frozen=True)
class FusionResult:
    """What a fusion returns: the new model and how many patterns it replaced."""

    model: onnx.ModelProto
    count: int


def fuse_add_eyelike(model: onnx.ModelProto, *, as_function: bool = False) -> FusionResult:
    """Replaces every EyeLike(A) -> Add(A, I) pair (either operand order) by one AddEyeLike(A) node.

    Only top-level nodes are fused, and only where the EyeLike output feeds nothing but that Add.
    The input model is never modified.

    Args:
        model: the model to fuse.
        as_function: also add a model-local FunctionProto AddEyeLike (body EyeLike + Add) so that
            runtimes without an AddEyeLike kernel (onnxruntime) inline it and can run the model.
            The ReferenceEvaluator runs the model without it, given `new_ops=[AddEyeLike]`.

    Returns:
        The fused copy and the number of fused pairs. With count 0 the copy is unchanged (no
        opset import or function is added).
    """
    copy = ir.from_proto(model)  # the input model is never modified
    graph = copy.graph
    count = 0
    for add in list(graph):
        if add.op_type != "Add" or add.domain not in ("", "ai.onnx") or len(add.inputs) != 2:
            continue
        eye = _eyelike_of_other_operand(add)
        if eye is None or len(eye.outputs[0].uses()) != 1 or eye.outputs[0].is_graph_output():
            continue
        one = ir.node(OP_TYPE, [eye.inputs[0]], domain=DOMAIN, name=add.name or eye.name)
        ir.convenience.replace_nodes_and_values(graph, add, [add, eye], [one], list(add.outputs), list(one.outputs))
        count += 1
    if not count:
        unchanged = onnx.ModelProto()
        unchanged.CopyFrom(model)
        return FusionResult(model=unchanged, count=0)
    fused = ir.to_proto(copy)
    if all(op.domain != DOMAIN for op in fused.opset_import):
        fused.opset_import.append(helper.make_opsetid(DOMAIN, OPSET_VERSION))
    if as_function and all((f.domain, f.name) != (DOMAIN, OP_TYPE) for f in fused.functions):
        fused.functions.append(_add_eyelike_function(_default_opset(fused)))
    return FusionResult(model=fused, count=count)


def _eyelike_of_other_operand(add: ir.Node) -> ir.Node | None:
    for mine, other in ((add.inputs[0], add.inputs[1]), (add.inputs[1], add.inputs[0])):
        eye = made_by(mine, "EyeLike")
        # `k` shifts the diagonal and `dtype` may change the type: neither is what AddEyeLike computes.
        if eye is not None and eye.domain in ("", "ai.onnx") and not eye.attributes and eye.inputs[0] is other:
            return eye
    return None


def _default_opset(model: onnx.ModelProto) -> int:
    return next(op.version for op in model.opset_import if op.domain in ("", "ai.onnx"))


def _add_eyelike_function(opset: int) -> onnx.FunctionProto:
    return helper.make_function(
        DOMAIN,
        OP_TYPE,
        inputs=["X"],
        outputs=["Y"],
        nodes=[
            helper.make_node("EyeLike", ["X"], ["I"]),
            helper.make_node("Add", ["X", "I"], ["Y"]),
        ],
        opset_imports=[helper.make_opsetid("", opset)],
    )


# Which implementation ReferenceEvaluator (onnx 1.23) picks for an AddEyeLike node: its `_load_impl`
# looks at `new_ops` first and at the model's local functions only after that, so with
# `new_ops=[AddEyeLike]` this kernel wins even when the model carries the function; without
# `new_ops` it runs the function body through a nested evaluator (slower than the unfused graph).
# The reference runtime therefore runs the `as_function=False` model with `new_ops=[AddEyeLike]`.
class AddEyeLike(OpRun):
    """ReferenceEvaluator kernel of AddEyeLike: x + I, I the identity of x's shape and dtype."""

    op_domain = DOMAIN

    def _run(self, x: np.ndarray) -> tuple[np.ndarray]:
        return (x + np.eye(*x.shape, dtype=x.dtype),)


def _run_wrong(self: OpRun, x: np.ndarray) -> tuple[np.ndarray]:
    return (x + 2 * np.eye(*x.shape, dtype=x.dtype),)


# A deliberately wrong kernel (x + 2I) that proves the output diff catches a bad fusion.
# ReferenceEvaluator looks new_ops up by (op_domain, class __name__), so it must be *named*
# "AddEyeLike" to replace the node's kernel; a second `class AddEyeLike` would shadow the right one
# in this module, hence `type(...)` under another Python name.
WRONG_ADD_EYELIKE: type[OpRun] = type(
    OP_TYPE,
    (OpRun,),
    {"op_domain": DOMAIN, "_run": _run_wrong, "__module__": __name__, "__doc__": "x + 2I (wrong)."},
)


def add_eyelike(source: Path, target_dir: Path, context: Context) -> Candidate:
    """The registry's AddEyeLike fusion: for ONNX Runtime the fused op carries its model-local function
    (ORT inlines it); for the reference runtime the custom kernel `AddEyeLike` runs it."""
    from tracker.base.model_io import load_model

    target = prepare_output(source, target_dir, "add_eyelike")
    for_ort = context.runtime == "onnxruntime"
    fused = fuse_add_eyelike(load_model(Path(source)), as_function=for_ort)
    save_proto(fused.model, target)
    kernel = "model-local function EyeLike+Add" if for_ort else "AddEyeLike: X + I"
    how = "a model-local function ORT inlines" if for_ort else "the custom OpRun AddEyeLike"
    return Candidate(
        path=target,
        applied=fused.count > 0,
        fusions={OP_TYPE: fused.count},
        fully_optimized=None,
        precision="fp32",
        notes=(f"{fused.count} EyeLike+Add pairs fused into the custom op AddEyeLike, run as {how}",),
        params={"fusion.kernel": kernel},
        new_ops=() if for_ort else (AddEyeLike,),
    )


def has_eyelike_add(model: onnx.ModelProto, context: Context) -> str | None:
    """Models with an EyeLike whose output is added to its own input."""
    read = ir_model(model)
    if read is None:
        return "onnx-ir cannot read the graph (a map or sequence type), so its EyeLike+Add pairs cannot be found"
    if any(n.op_type == "Add" and len(n.inputs) == 2 and _eyelike_of_other_operand(n) is not None for n in read.graph):
        return None
    return "no EyeLike(A) added to A in the graph"


ENTRY = FunctionEntry("add_eyelike", Kind.FUSION, "hand-written fusion EyeLike(A) + A -> AddEyeLike(A), a custom op",
              add_eyelike, has_eyelike_add, runtimes=("onnxruntime", "reference"))
