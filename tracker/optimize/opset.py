"""A model's ai.onnx opset against what the installed ONNX Runtime implements for the ops entries insert.

The quantizers and fp16 insert standard ops (QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear,
MatMulInteger, Cast) at the model's opset. onnx writes its newest opset by default (28 with onnx 1.23), and ONNX
Runtime may have no kernel there yet (1.32: "Could not find an implementation for DequantizeLinear(28)"): the
candidate would be made, then fail to load. An entry that inserts ops (`Entry.inserts_ops`) therefore runs on a copy
converted down to ORT's limit (`for_ort`), or says before making anything why it cannot (`opset_problem`).
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper, version_converter

from tracker.base.terminal import one_line
from tracker.optimize.model_files import save_proto

INSERTED_OPS = ("QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "MatMulInteger", "Cast")
_OLDEST = 13  # every entry's ops exist at this opset: the probe goes no lower


def model_opset(model: onnx.ModelProto) -> int | None:
    """The model's ai.onnx opset; None when it imports none (a model of other domains only)."""
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)


@functools.cache
def ort_opset_limit() -> int:
    """The highest ai.onnx opset (up to the installed onnx's newest) at which the installed ONNX Runtime builds a
    session for a model of `INSERTED_OPS`: found by trying, newest first, once per process (a few milliseconds)."""
    import onnxruntime as ort

    for opset in range(onnx.defs.onnx_opset_version(), _OLDEST, -1):
        try:
            ort.InferenceSession(_probe(opset).SerializeToString(), providers=["CPUExecutionProvider"])
        except Exception:  # no kernel at this opset (NOT_IMPLEMENTED), or onnx's newest is unknown to ORT
            continue
        return opset
    return onnx.defs.onnx_opset_version()  # no opset loads: the probe is at fault, not the models; convert none


def _probe(opset: int) -> onnx.ModelProto:
    """x -> Quantize/DequantizeLinear, DynamicQuantizeLinear -> MatMulInteger, Cast to fp16 and back: one model of
    every op of `INSERTED_OPS` at `opset`."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2])
    outputs = [helper.make_tensor_value_info(n, t, shape) for n, t, shape in
               (("dq", TensorProto.FLOAT, [1, 2]), ("mm", TensorProto.INT32, [1, 1]), ("back", TensorProto.FLOAT, [1, 2]))]
    constants = [numpy_helper.from_array(np.array(0.1, np.float32), "scale"),
                 numpy_helper.from_array(np.array(0, np.uint8), "zero"),
                 numpy_helper.from_array(np.ones((2, 1), np.uint8), "b")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "scale", "zero"], ["q"]),
             helper.make_node("DequantizeLinear", ["q", "scale", "zero"], ["dq"]),
             helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"]),
             helper.make_node("MatMulInteger", ["xq", "b"], ["mm"]),
             helper.make_node("Cast", ["x"], ["half"], to=TensorProto.FLOAT16),
             helper.make_node("Cast", ["half"], ["back"], to=TensorProto.FLOAT)]
    graph = helper.make_graph(nodes, "opset_probe", [x], outputs, constants)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def opset_problem(model: onnx.ModelProto) -> str | None:
    """None when ONNX Runtime implements the inserted ops at `model`'s opset, or onnx.version_converter brings the
    model (its graph: weights are not needed) down to ORT's limit; else why not, and what to do."""
    opset, limit = model_opset(model), ort_opset_limit()
    if opset is None or opset <= limit:
        return None
    try:
        version_converter.convert_version(model, limit)
    except Exception as e:
        return (f"it is at ai.onnx opset {opset}, past the {limit} the installed onnxruntime {_ort_version()} "
                f"implements for the ops this entry inserts ({', '.join(INSERTED_OPS)}), and onnx.version_converter "
                f"cannot bring it down ({one_line(str(e), 160)}): export the model at opset {limit} or lower")
    return None


def plan_note(model: onnx.ModelProto) -> str | None:
    """For `--dry-run`: what happens to `model`'s opset in the entries that insert ops; None when nothing does."""
    opset, limit = model_opset(model), ort_opset_limit()
    if opset is None or opset <= limit or opset_problem(model):  # a problem: each such entry says it does not run
        return None
    return (f"ai.onnx opset {opset}, past the {limit} the installed onnxruntime {_ort_version()} implements for the "
            f"ops quantization and fp16 insert: those entries run on a copy converted to opset {limit} "
            "(onnx.version_converter)")


def for_ort(source: Path, graph: onnx.ModelProto, target_dir: Path) -> tuple[Path, str | None]:
    """`source`, or, when its opset (read from `graph`) is past ORT's limit, a copy converted down to it under
    `target_dir`; with the note that says so (None when nothing was converted)."""
    opset, limit = model_opset(graph), ort_opset_limit()
    if opset is None or opset <= limit:
        return source, None
    converted = version_converter.convert_version(onnx.load_model(str(source)), limit)
    path = Path(target_dir) / f"source_opset{limit}.onnx"
    path.parent.mkdir(parents=True, exist_ok=True)
    save_proto(converted, path)
    return path, (f"converted from ai.onnx opset {opset} to {limit} (onnx.version_converter): the installed "
                  f"onnxruntime {_ort_version()} implements the ops this entry inserts only up to opset {limit}")


def _ort_version() -> str:
    import onnxruntime as ort

    return ort.__version__
