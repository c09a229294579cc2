"""Chains of entries (`attention_fused+int8_dynamic`, `ort_opt_extended+int4_block32+ort_threads_1`): each step
runs on what the previous one made, session settings add up on top, and the chain is one attempt."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import onnx

from tracker.base.vocabulary import Kind
from tracker.optimize.base import PRECISIONS, Candidate, Context
from tracker.optimize.entry import Entry

SEPARATOR = "+"


@dataclass(frozen=True)
class Chain(Entry):
    """Entries run one after the other; the attempt's name is theirs joined by `+`.

    The first step's `requires` is checked on the source; each later step's on what the one before made, when
    the chain runs (a step that does not apply there fails the chain with its reason, as data).
    """

    steps: tuple[Entry, ...]

    def __post_init__(self) -> None:
        if len(self.steps) < 2:
            raise ValueError(f"a chain has at least two steps, got {[s.name for s in self.steps]}")
        after_session = [s.name for s, nxt in zip(self.steps, self.steps[1:])
                         if s.kind == Kind.SESSION and nxt.kind != Kind.SESSION]
        if after_session:
            raise ValueError(f"session settings go last in a chain (they are not a model to rewrite): {after_session} "
                             f"come before a step that rewrites the graph")

    @property
    def name(self) -> str:
        return SEPARATOR.join(step.name for step in self.steps)

    @property
    def inserts_ops(self) -> bool:  # type: ignore[override]  # a class attribute on Entry, read-only here
        return any(step.inserts_ops for step in self.steps)

    @property
    def kind(self) -> Kind:
        graph_steps = [s.kind for s in self.steps if s.kind != Kind.SESSION]
        return graph_steps[-1] if graph_steps else Kind.SESSION

    @property
    def summary(self) -> str:
        return " then ".join(step.summary for step in self.steps)

    @property
    def runtimes(self) -> tuple[str, ...]:
        return tuple(r for r in self.steps[0].runtimes if all(r in s.runtimes for s in self.steps[1:]))

    @property
    def parent(self) -> str:
        """The attempt this chain extends: every step but the last."""
        return SEPARATOR.join(step.name for step in self.steps[:-1])

    def requires(self, model: onnx.ModelProto, context: Context) -> str | None:
        return self.steps[0].requires(model, context)

    def make(self, source: Path, target_dir: Path, context: Context) -> Candidate:
        current, made = Path(source), []
        for index, step in enumerate(self.steps):
            made.append(step(current, Path(target_dir) / f"{index}-{step.name}", context))
            current = made[-1].path
        # A step's counts are of the ops in the graph it made (ORT's optimizer counts the fused ops it finds, new or
        # not): the last step that counts an op type says how many the chain's model has.
        fusions: dict[str, int] = {}
        for candidate in made:
            fusions.update(candidate.fusions)
        params: dict[str, str] = {}
        for candidate in made:
            params.update(candidate.params)
        params["pipeline"] = self.name
        session: dict = {}
        for candidate in made:
            session.update(candidate.session)
        fully = [c.fully_optimized for c in made if c.fully_optimized is not None]
        return Candidate(
            path=made[-1].path,
            applied=all(c.applied for c in made),
            fusions=fusions,
            fully_optimized=fully[-1] if fully else None,
            precision=max((c.precision for c in made), key=PRECISIONS.index),
            notes=tuple(f"{step.name}: {note}" for step, c in zip(self.steps, made) for note in c.notes),
            params=params,
            session=session,
            new_ops=tuple(op for c in made for op in c.new_ops),
        )

    def variant(self, **values) -> Entry:
        """The chain with its last step's knobs set (`attention_fused+int8_dynamic.pc`)."""
        return replace(self, steps=(*self.steps[:-1], self.steps[-1].variant(**values)))

    def knobs(self) -> dict:
        return self.steps[-1].knobs()

    def knob_values(self) -> dict[str, object]:
        return self.steps[-1].knob_values()

    def knob_params(self) -> dict[str, str]:
        params: dict[str, str] = {}
        for step in self.steps:
            params.update(step.knob_params())
        return params
