"""The graph a quantizer starts from: the source pre-processed once (ORT's transformer optimizer, or
`quant_pre_process`), kept in `Context.work` so every variant of a search starts from the same file and the
same node names (the names a `nodes_to_exclude` knob holds)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import onnx

from tracker.optimize.base import Context, float_weights
from tracker.optimize.model_files import files_state

# From this size on, a model's weights must lie in an external data file (protobuf's 2 GiB limit).
LARGE_MODEL_BYTES = 2**31 - 1
HOWS = ("ort_optimizer", "quant_pre_process", "quant_pre_process_shapes")


@dataclass(frozen=True)
class Prepared:
    """A pre-processed source.

    Attributes:
        path: the pre-processed model (its external data beside it).
        how: one of HOWS: ORT's transformer optimizer at opt_level 1 (a transformer whose heads and hidden size
            are known), else `quant_pre_process` (with ONNX shape inference for `..._shapes`).
        fusions: what ORT's optimizer fused (empty for `quant_pre_process`).
        fully_optimized: ORT's optimizer's own verdict, None for `quant_pre_process`.
        params: what was done, as params.
    """

    path: Path
    how: str
    fusions: dict[str, int] = field(default_factory=dict)
    fully_optimized: bool | None = None
    params: dict[str, str] = field(default_factory=dict)


@contextlib.contextmanager
def prepared(source: Path, target_dir: Path, context: Context, *, how: str, entry: str) -> Iterator[Prepared]:
    """The source pre-processed `how`: reused from `context.work` when a variant already made it there, else made
    there (or, without `context.work`, in a folder under `target_dir` that goes when the block ends)."""
    if how not in HOWS:
        raise ValueError(f"how must be one of {HOWS}, got {how!r}")
    source = Path(source)
    if context.work is None:
        with tempfile.TemporaryDirectory(dir=target_dir, prefix=f"{entry}.") as work:
            yield _prepare(source, Path(work), context, how)
        return
    key = hashlib.sha1(repr((str(source.resolve()), files_state(source), how)).encode()).hexdigest()[:16]
    folder = Path(context.work) / f"{how}-{key}"
    meta = folder / "prepared.json"
    if meta.is_file():
        found = json.loads(meta.read_text())
        yield Prepared(**{**found, "path": Path(found["path"])})
        return
    folder.mkdir(parents=True, exist_ok=True)
    made = _prepare(source, folder, context, how)
    meta.write_text(json.dumps({**asdict(made), "path": str(made.path)}))
    yield made


def _prepare(source: Path, folder: Path, context: Context, how: str) -> Prepared:
    target = folder / "prepared.onnx"
    if how == "ort_optimizer":
        from tracker.optimize.ort_optimizer import BASIC_OPT_LEVEL, optimizer_params, save_optimized

        info = context.require_info("the quantizer's pre-processing", source)
        fusions, fully = save_optimized(source, target, info, opt_level=BASIC_OPT_LEVEL)
        return Prepared(target, how, fusions, fully, optimizer_params(info, BASIC_OPT_LEVEL, context))
    pre_process(source, target, shape_inference=how.endswith("_shapes"),
                large=model_bytes(source) >= LARGE_MODEL_BYTES)
    return Prepared(target, how, params={"quantization.pre_process": "quant_pre_process"})


def pre_process_for(source: Path, context: Context) -> str:
    """ORT's transformer optimizer where the model is a transformer whose heads, hidden size and type are known
    (its fusions keep the graph int8 kernels were tuned for), else `quant_pre_process`."""
    from tracker.optimize.model_info import ORT_OPTIMIZER_TYPES

    try:
        info = context.require_info("quantization", source)
    except ValueError:
        return "quant_pre_process"
    return "ort_optimizer" if info.model_type in ORT_OPTIMIZER_TYPES else "quant_pre_process"


def quantizable_nodes(entry, source: Path, folder: Path, context: Context) -> list[str]:
    """What the `exclude` knob of a quantization `entry` may name: the nodes of its `weight_ops` with a float weight,
    in the graph it quantizes (the source pre-processed its way, `entry.pre_processing`)."""
    how = entry.pre_processing(source, context)
    with prepared(source, folder, context, how=how, entry=entry.name) as ready:
        graph = onnx.load_model(str(ready.path), load_external_data=False)
    return [node.name for node in float_weights(graph, entry.weight_ops)]


def model_bytes(path: Path) -> int:
    """The size of a model: its file plus the external data it points to."""
    model = onnx.load_model(str(path), load_external_data=False)
    external = 0
    for tensor in model.graph.initializer:
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            entries = {e.key: e.value for e in tensor.external_data}
            external += int(entries.get("length", 0))
    return Path(path).stat().st_size + external


def pre_process(source: Path, target: Path, *, shape_inference: bool, large: bool) -> None:
    """`quant_pre_process` of `source` into `target`: ORT's basic graph optimizations (constant folding),
    then ONNX shape inference when `shape_inference`.

    Why: the folding makes weights the quantizer can see out of constant subgraphs (the dynamo GPT-2
    export ties lm_head to the embedding through a Transpose; folded, it is an int8 constant quantized once
    instead of an activation quantized every run) and fuses Conv+BatchNormalization, so the merged weight
    is quantized once. Symbolic shape inference is skipped: when it cannot infer every shape it writes
    `sym_shape_infer_temp.onnx` into the working directory and raises, and ONNX shape inference types every
    standard op these graphs have. A `large` model (2 GiB or more) keeps its weights in `<target>.data`.
    """
    from onnxruntime.quantization.shape_inference import quant_pre_process

    # A source whose weights lie in a side file must be written the same way: ORT's optimized copy would
    # otherwise point at the source's data file name from the temporary folder, where it is not, and
    # quant_pre_process would log the failure and go on without optimizing.
    external = large or any(t.data_location == onnx.TensorProto.EXTERNAL
                            for t in onnx.load_model(str(source), load_external_data=False).graph.initializer)
    quant_pre_process(
        source,
        target,
        skip_symbolic_shape=True,
        skip_onnx_shape=not shape_inference,
        save_as_external_data=external,
        all_tensors_to_one_file=True,
        external_data_location=f"{target.name}.data" if external else None,
    )


