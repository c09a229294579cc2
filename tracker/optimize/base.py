"""One registry entry (`Entry`): what it applies to, what it is told (`Context`), what it returns
(`Candidate`); and the file helpers every entry shares."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, is_dataclass, replace
from pathlib import Path

import numpy as np
import onnx

from tracker.optimize.model_info import ModelInfo, detect_from_graph, detect_model_type

PRECISIONS = ("fp32", "fp16", "int8", "int4")
# What an entry does: run the same model with other session settings, rewrite the graph with a tool
# (optimizer, converter, quantizer), apply a hand-written fusion, or quantize any model's weights with a
# tool ("quantization": int8 static, int4 weight-only; the GPT-2 study's defaults, every "transform",
# leave them out).
KINDS = ("session", "transform", "fusion", "quantization")

# Protobuf cannot serialize a message of 2 GiB or more: only then must weights go to an external file.
_PROTOBUF_LIMIT_BYTES = 2**31 - 1


@dataclass(frozen=True)
class Context:
    """What an entry is told besides its source model.

    Attributes:
        info: heads, hidden size and model type, for the entries that fuse transformer blocks; None: the
            entries that need them read them from the graph (`model_info.detect_from_graph`).
        runtime: the runtime the candidate will run in ("onnxruntime" or "reference").
        feeds: the study's inputs, for entries that calibrate on real data (static quantization).
        work: a folder where entries keep the intermediates their variants share (the pre-processed graph a
            quantizer starts from), so a search over knobs prepares each source once; None: each run prepares
            its own, under its target folder.
    """

    info: ModelInfo | None = None
    runtime: str = "onnxruntime"
    feeds: Mapping[str, np.ndarray] | None = None
    work: Path | None = None

    def require_info(self, entry: str, source: Path | None = None) -> ModelInfo:
        """`info` with its model type, what is missing read from the graph of `source`.

        Raises:
            ValueError: `entry` needs what neither `info` nor the graph of `source` gives (the message says why).
        """
        info = self.info
        if info is not None and info.model_type is not None:
            return info
        if source is None:
            raise ValueError(f"{entry} needs the model's num_heads and hidden_size (a ModelInfo); none was given")
        graph = onnx.load_model(str(source), load_external_data=False)
        if info is None:
            detection = detect_from_graph(graph)
            if detection.info is None:
                raise ValueError(f"{entry} needs the model's num_heads and hidden_size (a ModelInfo), and the graph "
                                 f"does not give them: {detection.reason}")
            return detection.info
        model_type = detect_model_type(graph)
        if model_type is None:
            raise ValueError(f"{entry} needs the model's type (ModelInfo.model_type), and the graph does not give it")
        return replace(info, model_type=model_type)


@dataclass(frozen=True)
class Candidate:
    """What one entry made: the model to measure and how to run it.

    Attributes:
        path: the model file (its external data, if any, lies beside it); a session entry returns its source.
        applied: False when the entry could not do what it is for (no attention to fuse, nothing
            quantized); `notes` say why, and `path` is still a model that runs.
        fusions: count of each fused op type in the new graph, e.g. {"SkipLayerNormalization": 24}.
        fully_optimized: the optimizer's own verdict (ORT's `is_fully_optimized`), None where it has none.
        precision: one of PRECISIONS ("fp32", "fp16", "int8", "int4"): the precision of the weights and
            compute; the study's tolerance for that precision judges the outputs.
        notes: what a reader of the run should know (what was skipped, repaired, or left unfused).
        params: what was done, as strings to log (`optimizer.opt_level`, ...).
        session: `SessionConfig` fields this candidate sets on top of the study's (session entries).
        new_ops: the reference runtime's kernels for custom ops the candidate has.
    """

    path: Path
    applied: bool
    fusions: dict[str, int]
    fully_optimized: bool | None
    precision: str
    notes: tuple[str, ...] = ()
    params: dict[str, str] = field(default_factory=dict)
    session: Mapping[str, str | int] = field(default_factory=dict)
    new_ops: tuple[type, ...] = ()

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {self.precision!r}")
        bad = {k: v for k, v in self.fusions.items() if not isinstance(v, int) or isinstance(v, bool) or v < 0}
        if bad:
            raise ValueError(f"fusion counts must be non-negative ints, got {bad}")


Make = Callable[[Path, Path, Context], Candidate]
# None when the entry applies to the model (loaded without its external weights), else why it does not.
Applies = Callable[[onnx.ModelProto, Context], "str | None"]


def any_graph(model: onnx.ModelProto, context: Context) -> str | None:
    """Every model: session settings and generic rewrites."""
    return None


def info_source(context: Context) -> str:
    """Where the `ModelInfo` an entry used came from, as a param value: "given", "graph" (detected), or
    "given, model_type from graph"."""
    if context.info is None:
        return "graph"
    return "given" if context.info.model_type is not None else "given, model_type from graph"


def transformer(model: onnx.ModelProto, context: Context) -> str | None:
    """Models with attention (Softmax and MatMul) whose heads, hidden size and model type are given in
    `context.info` or can be read from the graph."""
    ops = {node.op_type for node in model.graph.node}
    if not {"Softmax", "MatMul"} <= ops:
        return "no attention in the graph (a transformer has Softmax and MatMul)"
    if context.info is None:
        detection = detect_from_graph(model)
        if detection.info is None:
            return f"needs the model's num_heads and hidden_size (a ModelInfo or a config.json): {detection.reason}"
    elif context.info.model_type is None and detect_model_type(model) is None:
        return "needs the model's type (ModelInfo.model_type): the graph does not tell it"
    return None


def ort_transformer(model: onnx.ModelProto, context: Context) -> str | None:
    """`transformer`, and a model type ORT's transformer optimizer has fusions for (not a LLaMA-family decoder:
    onnxscript's fusions, `attention_fused`, cover those)."""
    reason = transformer(model, context)
    if reason is not None:
        return reason
    from tracker.optimize.model_info import ORT_OPTIMIZER_TYPES

    model_type = (context.info.model_type if context.info is not None and context.info.model_type else None) \
        or detect_model_type(model)
    if model_type not in ORT_OPTIMIZER_TYPES:
        return (f"ORT's transformer optimizer has no fusions for {model_type} models (its types: "
                f"{', '.join(sorted(ORT_OPTIMIZER_TYPES))}); attention_fused (onnxscript's fusions) has")
    return None


def float_weights(model: onnx.ModelProto, op_types: tuple[str, ...]) -> list[onnx.NodeProto]:
    """The nodes of `op_types` whose weight (input 1: B of MatMul and Gemm, W of Conv) is a float32
    initializer of the main graph, 2-D for MatMul and Gemm: the nodes a weight quantizer can quantize."""
    initializers = {t.name: t for t in model.graph.initializer}
    found = []
    for node in model.graph.node:
        weight = initializers.get(node.input[1]) if node.op_type in op_types and len(node.input) > 1 else None
        if weight is None or weight.data_type != onnx.TensorProto.FLOAT:
            continue
        if node.op_type == "Conv" or len(weight.dims) == 2:
            found.append(node)
    return found


def has_matmul_weights(model: onnx.ModelProto, context: Context) -> str | None:
    """Models with a MatMul or Gemm whose weight is a 2-D float32 initializer (what weight-only quantizers take)."""
    if not float_weights(model, ("MatMul", "Gemm")):
        return "no MatMul or Gemm with a 2-D float32 weight initializer"
    return None


@dataclass(frozen=True)
class Knob:
    """What one knob of an entry may be and what a search tries.

    Attributes:
        choices: the values it may take; None for a tuple of node names (exclusions), checked against the
            graph when the entry runs.
        search: the values a search tries (default: every choice).
        short: how a variant's name spells it (`int8_dynamic.pc.w-quint8`).
        key: the param it is logged as (`quantization.<key>`; default: the field's name).
    """

    choices: tuple | None
    search: tuple | None = None
    short: str = ""
    key: str = ""


def knob(default, choices: tuple | None, *, search: tuple | None = None, short: str = "", key: str = ""):
    """A field of an entry's frozen dataclass that a user or a search may set (see `Knob`)."""
    return field(default=default, metadata={"knob": Knob(choices, search, short, key)})


class Entry:
    """One attempt of the registry: what it applies to (`requires`), what it makes (`make`), and its knobs.

    Concrete entries are frozen dataclasses: a plain entry wraps two functions (`FunctionEntry`), an entry
    with knobs declares them as fields made with `knob(...)`, so a search space is data (`space`) and a
    variant is `entry.variant(per_channel=True)`. `entry(source, target_dir, context)` runs it the way
    onnx-ir runs a pass: requires, then make, then ensures (`EntryError` names the entry).

    Attributes:
        name: the attempt's name (its run name).
        kind: one of KINDS.
        summary: one line for humans: what it does.
        runtimes: the runtimes its candidates run in.
    """

    name: str
    kind: str
    summary: str
    runtimes: tuple[str, ...] = ("onnxruntime",)
    params_prefix = "quantization"

    def requires(self, model: onnx.ModelProto, context: Context) -> str | None:
        """None when the entry applies to `model` (loaded without its external weights), else why it does not."""
        return None

    def make(self, source: Path, target_dir: Path, context: Context) -> Candidate:
        """Writes the entry's model under `target_dir` from `source` (which it never changes)."""
        raise NotImplementedError

    def why_not(self, model: onnx.ModelProto, context: Context) -> str | None:
        """None when this entry applies to `model` under `context`, else the reason it does not."""
        if context.runtime not in self.runtimes:
            return f"runs under {', '.join(self.runtimes)}, not {context.runtime}"
        return self.requires(model, context)

    def __call__(self, source: Path, target_dir: Path, context: Context, *,
                 graph: onnx.ModelProto | None = None) -> Candidate:
        """Runs the entry: requires (on `graph`, else `source`'s graph without weights), make, then ensures: the
        source's files are unchanged and the model lies under `target_dir` (a session entry runs its source).

        Raises:
            EntryError: the entry does not apply (the reason), or it broke what it ensures.
        """
        source, target_dir = Path(source), Path(target_dir)
        if graph is None:
            graph = onnx.load_model(str(source), load_external_data=False)
        reason = self.why_not(graph, context)
        if reason is not None:
            raise EntryError(self.name, f"does not apply to this model: {reason}")
        before = files_state(source)
        candidate = self.make(source, target_dir, context)
        if files_state(source) != before:
            raise EntryError(self.name, f"changed its source {source}")
        if self.kind == "session":
            if candidate.path != source:
                raise EntryError(self.name, "a session entry runs its source as it is")
        elif not candidate.path.is_file() or target_dir.resolve() not in candidate.path.resolve().parents:
            raise EntryError(self.name, f"wrote its model to {candidate.path}, not under {target_dir}")
        knobs = self.knob_params()
        if knobs:
            candidate = replace(candidate, params={**knobs, **candidate.params})
        return candidate

    # Knobs: the fields made with `knob(...)`.
    def knobs(self) -> dict[str, Knob]:
        """The entry's knobs by field name (none for a plain entry)."""
        if not is_dataclass(self):
            return {}
        return {f.name: f.metadata["knob"] for f in fields(self) if "knob" in f.metadata}

    def space(self) -> dict[str, tuple]:
        """The values a search tries, by knob."""
        return {name: k.search if k.search is not None else (k.choices or ((),))
                for name, k in self.knobs().items()}

    def knob_values(self) -> dict[str, object]:
        return {name: getattr(self, name) for name in self.knobs()}

    def knob_params(self) -> dict[str, str]:
        """The knobs' values as params (`quantization.per_channel` = "true")."""
        return {f"{self.params_prefix}.{k.key or name}": _param_text(getattr(self, name))
                for name, k in self.knobs().items()}

    def check_knobs(self) -> None:
        """Raises ValueError naming a knob whose value is not one it may take, and the values it may."""
        for name, k in self.knobs().items():
            value = getattr(self, name)
            if k.choices is None:
                if not isinstance(value, tuple) or not all(isinstance(v, str) and v for v in value):
                    raise ValueError(f"{self.name}: {name} must be a tuple of node names, got {value!r}")
            elif value not in k.choices:
                allowed = ", ".join(_param_text(c) for c in k.choices)
                raise ValueError(f"{self.name}: {name}={_param_text(value)} is not allowed; expected one of {allowed}")

    def variant(self, **values) -> Entry:
        """This entry with other knob values, named after what differs (`int8_dynamic.pc.w-quint8`).

        Raises:
            ValueError: an unknown knob, or a value it may not take (the message lists what is allowed).
        """
        knobs = self.knobs()
        unknown = sorted(set(values) - set(knobs))
        if unknown:
            raise ValueError(f"{self.name} has no knob {', '.join(unknown)}; its knobs: {', '.join(knobs) or 'none'}")
        changed = {k: v for k, v in values.items() if v != getattr(self, k)}
        if not changed:
            return self
        suffix = ".".join(_knob_suffix(knobs[k], k, v) for k, v in changed.items())
        name = f"{self.name}.{suffix}"
        if len(name) > 100:
            import hashlib

            name = f"{name[:90]}.{hashlib.sha1(name.encode()).hexdigest()[:8]}"
        made = replace(self, name=name, **changed)
        made.check_knobs()
        return made


class EntryError(ValueError):
    """An entry that does not apply, or that broke what the framework checks after it ran; names the entry."""

    def __init__(self, entry: str, problem: str) -> None:
        super().__init__(f"{entry} {problem}")
        self.entry = entry


def _param_text(value: object) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, tuple):
        return ",".join(map(str, value)) or "none"
    return str(value)


def _knob_suffix(k: Knob, name: str, value: object) -> str:
    short = k.short or name
    if isinstance(value, bool):
        return short if value else f"no_{short}"
    if isinstance(value, tuple):  # node names by their count, other tuples by their values
        return f"{short}-{len(value)}" if k.choices is None else f"{short}-{'_'.join(map(str, value)).lower()}"
    return f"{short}-{str(value).lower().replace(',', '_')}"


def files_state(source: Path) -> tuple:
    """Size and modification time of a model file and of the files beside it that it may point at: what an
    entry must leave as it found them."""
    source = Path(source)
    beside = sorted(p for p in source.parent.glob(f"{source.name}*") if p.is_file())
    return tuple((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in beside)


@dataclass(frozen=True)
class FunctionEntry(Entry):
    """A plain entry: a function that makes the candidate and one that says whether it applies.

    Attributes:
        make: `(source, target_dir, context) -> Candidate`; writes only under `target_dir`.
        applies: whether it applies to a model (`any_graph`, `transformer`, or the entry's own check).
    """

    name: str
    kind: str
    summary: str
    make: Make
    applies: Applies = any_graph
    runtimes: tuple[str, ...] = ("onnxruntime",)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")

    def requires(self, model: onnx.ModelProto, context: Context) -> str | None:
        return self.applies(model, context)


def session_entry(name: str, summary: str, note: str, **settings: str | int) -> Entry:
    """An entry that runs its source model as it is, with other ONNX Runtime settings (`SessionConfig` fields)."""

    def make(source: Path, target_dir: Path, context: Context) -> Candidate:
        return Candidate(path=Path(source), applied=True, fusions={}, fully_optimized=None, precision="fp32",
                         notes=(note,), session=settings)

    return FunctionEntry(name, "session", summary, make)


def prepare_output(source: Path, target_dir: Path, name: str) -> Path:
    """Checks `source` exists and returns `target_dir/<name>.onnx` (creating the folder).

    Raises:
        ValueError: `source` is not a file, or the output would overwrite it.
    """
    source = Path(source)
    if not source.is_file():
        raise ValueError(f"source model must be an existing .onnx file, got {source}")
    target_dir = Path(target_dir)
    target_dir.mkdir(parents=True, exist_ok=True)
    target = target_dir / f"{name}.onnx"
    if target.resolve() == source.resolve():
        raise ValueError(f"the output of {name!r} would overwrite its source {source}: pick another target_dir")
    return target


def needs_external_data(model: onnx.ModelProto) -> bool:
    """True when `model` is too large for one protobuf file."""
    return model.ByteSize() >= _PROTOBUF_LIMIT_BYTES


def save_proto(model: onnx.ModelProto, path: Path) -> None:
    """Saves `model` as one file, or with its weights in `<path>.data` when it is too large for one."""
    if needs_external_data(model):
        onnx.save_model(model, str(path), save_as_external_data=True, location=f"{path.name}.data")
    else:
        onnx.save_model(model, str(path))


def copy_model(source: Path, target: Path) -> None:
    """Writes an unchanged copy of `source` (external data included) to `target`."""
    save_proto(onnx.load_model(str(source), load_external_data=True), target)


def count_ops(model: onnx.ModelProto, op_types: tuple[str, ...]) -> dict[str, int]:
    """How many nodes of the main graph have each of `op_types` (any domain)."""
    counts = dict.fromkeys(op_types, 0)
    for node in model.graph.node:
        if node.op_type in counts:
            counts[node.op_type] += 1
    return counts


def ort_fused_counts(statistics: Mapping[str, int]) -> dict[str, int]:
    """ORT's `get_fused_operator_statistics()` as plain non-negative ints."""
    return {str(op): int(count) for op, count in statistics.items()}
