"""The one registry of optimization attempts, of every kind: session settings, tool transforms, hand-written fusions.

Each entry is an `Entry` in a module of its own (two levels of one tool share one): what it applies to
(`requires`), how it makes a `Candidate` from a source model file (`make`), and its knobs (fields of a frozen
dataclass, so a search space is data). `get_entry` also spells variants (`int8_dynamic:per_channel=true`) and
chains (`attention_fused+int8_dynamic`). Adding one is a new module plus one line below; the
common test (`tests/optimize/test_registry.py`) then runs it on a small model it applies to. A study runs an
entry with `Study.optimize(name, source, ...)`. The baseline (the source model) is not an entry.
"""

from __future__ import annotations

from pathlib import Path

import onnx

from tracker.optimize import add_eyelike, fp16, ort_optimizer, session_levels, session_options
from tracker.optimize.attention import fusion as attention_fusion
from tracker.optimize.attention import shared_kv
from tracker.optimize.base import Candidate, Context, ModelInfo
from tracker.optimize.chain import SEPARATOR, Chain
from tracker.optimize.entry import KINDS, Entry, EntryError
from tracker.optimize.quantize import int4, int8, int8_static, kv_cache

REGISTRY: dict[str, Entry] = {
    entry.name: entry
    for entry in (
        session_levels.DISABLED,
        session_levels.ENABLED,
        session_options.THREADS_1,
        session_options.PARALLEL,
        session_options.IO_BINDING,
        ort_optimizer.BASIC,
        fp16.ENTRY,
        ort_optimizer.EXTENDED,
        attention_fusion.ENTRY,
        shared_kv.ENTRY,
        int8.ENTRY,
        int8_static.MINMAX,
        int8_static.PERCENTILE,
        int4.BLOCK32,
        int4.BLOCK128,
        int4.INT8_BLOCK32,
        kv_cache.ENTRY,
        add_eyelike.ENTRY,
    )
}

# Entries that change only how a model decodes against a KV cache (on a forward-only model they leave it as it is):
# the generation scenario runs them; a forward-only study or search leaves them out unless asked for by name.
DECODE_ONLY = (session_options.IO_BINDING.name, shared_kv.ENTRY.name, kv_cache.ENTRY.name)
FORWARD_ENTRIES = tuple(name for name in REGISTRY if name not in DECODE_ONLY)


def get_entry(name: str) -> Entry:
    """The entry `name` spells: a registered name, a variant `ENTRY:knob=value:knob=value`, or a chain of
    those joined by `+` (`attention_fused+int8_dynamic:per_channel=true`).

    Raises:
        ValueError: an unknown entry (the message lists the registered ones), an unknown knob or a value it
            may not take (the message lists what is allowed).
    """
    steps = [_one_entry(part.strip()) for part in name.split(SEPARATOR)]
    return steps[0] if len(steps) == 1 else Chain(tuple(steps))


def _one_entry(spec: str) -> Entry:
    base, *pairs = spec.split(":")
    if base not in REGISTRY:
        raise ValueError(f"unknown optimization {base!r}; registered: {', '.join(REGISTRY)}")
    entry = REGISTRY[base]
    values = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep:
            raise ValueError(f"{spec!r}: expected ENTRY:KNOB=VALUE:KNOB=VALUE, got {pair!r}")
        values[key.strip()] = parse_knob_value(entry, key.strip(), text.strip())
    return entry.variant(**values) if values else entry


def parse_knob_value(entry: Entry, key: str, text: str) -> object:
    """A knob's value from its text: true/false, an integer, one of its choices, or node names joined by `;`.

    Raises:
        ValueError: `entry` has no knob `key`, or `text` is none of its values (the message lists them).
    """
    knobs = entry.knobs()
    if key not in knobs:
        raise ValueError(f"{entry.name} has no knob {key!r}; its knobs: {', '.join(knobs) or 'none'}")
    choices = knobs[key].choices
    if choices is None:
        return tuple(n for n in text.split(";") if n)
    for choice in choices:
        if text.lower() == str(choice).lower():
            return choice
    raise ValueError(f"{entry.name}: {key}={text} is not allowed; expected one of "
                     f"{', '.join(str(c).lower() if isinstance(c, bool) else str(c) for c in choices)}")


def apply(name: str, source: Path, target_dir: Path, context: Context | None = None) -> Candidate:
    """Runs the entry `name` (`get_entry`) on the model file `source`, writing under `target_dir`: requires,
    make, ensures (`Entry.__call__`).

    Raises:
        ValueError: `name` is not registered, the entry does not apply (`EntryError`, with the reason), or it
            needs what `context` lacks.
    """
    return get_entry(name)(Path(source), Path(target_dir), context or Context())


def applicable(model: onnx.ModelProto, context: Context) -> dict[str, str | None]:
    """Every entry, with None where it applies to `model` under `context` and the reason where it does not."""
    return {name: entry.why_not(model, context) for name, entry in REGISTRY.items()}


__all__ = ["DECODE_ONLY", "FORWARD_ENTRIES", "KINDS", "REGISTRY", "Candidate", "Chain", "Context", "Entry", "EntryError", "ModelInfo", "applicable",
           "apply", "get_entry", "parse_knob_value"]
