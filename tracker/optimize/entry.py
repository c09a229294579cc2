"""One registry entry (`Entry`): what it applies to (`requires`), what it makes (`make`), what the framework
checks after it ran (`__call__`), and its knobs (fields of a frozen dataclass, so a search space is data).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, is_dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import onnx

from tracker.base.vocabulary import Kind
from tracker.optimize.base import Applies, Candidate, Context, Make, any_graph
from tracker.optimize.model_files import files_state
from tracker.optimize.opset import for_ort, opset_problem

# What an entry does: run the same model with other session settings, rewrite the graph with a tool
# (optimizer, converter, quantizer), apply a hand-written fusion, or quantize any model's weights with a
# tool ("quantization": int8 static, int4 weight-only; the GPT-2 study's defaults, every "transform",
# leave them out).
KINDS = tuple(Kind)  # what an entry changes (`tracker.base.vocabulary.Kind`)


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
        kind: a `Kind`.
        summary: one line for humans: what it does.
        runtimes: the runtimes its candidates run in.
    """

    params_prefix = "quantization"
    inserts_ops = False  # it inserts standard ops (QuantizeLinear, Cast, ...) at the model's opset: `optimize.opset`

    # Read-only to the framework: an entry gives them as dataclass fields, class attributes or properties (a
    # chain's come from its steps). Declared for the type checker only: a property here would be the default
    # of a subclass's dataclass field.
    if TYPE_CHECKING:
        @property
        def name(self) -> str: ...

        @property
        def kind(self) -> Kind: ...

        @property
        def summary(self) -> str: ...

    @property
    def runtimes(self) -> tuple[str, ...]:
        return ("onnxruntime",)

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
        if self.inserts_ops and (problem := opset_problem(model)):
            return problem
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
        # A model past the opset ORT implements for the ops it inserts: a converted copy (`opset_problem` allowed it)
        made_from, converted = for_ort(source, graph, target_dir) if self.inserts_ops else (source, None)
        candidate = self.make(made_from, target_dir, context)
        if files_state(source) != before:
            raise EntryError(self.name, f"changed its source {source}")
        if converted:
            candidate = replace(candidate, notes=(converted, *candidate.notes))
        if self.kind == Kind.SESSION:
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
        assert is_dataclass(self), "an entry with knobs is a dataclass"
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


@dataclass(frozen=True)
class FunctionEntry(Entry):
    """A plain entry: a function that makes the candidate and one that says whether it applies.

    Attributes:
        make: `(source, target_dir, context) -> Candidate`; writes only under `target_dir`.
        applies: whether it applies to a model (`any_graph`, `transformer`, or the entry's own check).
    """

    name: str
    kind: Kind
    summary: str
    make: Make  # type: ignore[assignment]  # the function, held as a field, stands in for the method (same call)
    applies: Applies = any_graph
    runtimes: tuple[str, ...] = ("onnxruntime",)
    inserts_ops: bool = False

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        object.__setattr__(self, "kind", Kind(self.kind))

    def requires(self, model: onnx.ModelProto, context: Context) -> str | None:
        return self.applies(model, context)


def session_entry(name: str, summary: str, note: str, **settings: str | int) -> Entry:
    """An entry that runs its source model as it is, with other ONNX Runtime settings (`SessionConfig` fields)."""

    def make(source: Path, target_dir: Path, context: Context) -> Candidate:
        return Candidate(path=Path(source), applied=True, fusions={}, fully_optimized=None, precision="fp32",
                         notes=(note,), session=settings)

    return FunctionEntry(name, Kind.SESSION, summary, make)
