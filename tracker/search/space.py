"""What a search tries: every registered entry that applies, each entry's knob space enumerated (a variant that
equals another registered entry is that entry, under its name)."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence

import onnx

from tracker.optimize import FORWARD_ENTRIES, REGISTRY, Chain, Context, Entry


def expand(entry: Entry, *, limit: int | None = None, knobs: Mapping[str, tuple] | None = None) -> list[Entry]:
    """`entry` and its variants over `entry.space()` (the default values first), at most `limit` of them.

    Args:
        knobs: values to try instead of the space's, by knob (a narrower or a wider space).

    Raises:
        ValueError: a knob the entry does not have, or a value it refuses (the message lists what is allowed).
    """
    space = entry.space()
    unknown = sorted(set(knobs or {}) - set(space))
    if unknown:
        raise ValueError(f"{entry.name} has no knob {', '.join(unknown)}; its knobs: {', '.join(space) or 'none'}")
    space.update({k: tuple(v) for k, v in (knobs or {}).items()})
    if not space:
        return [entry]
    names = list(space)
    default = tuple(getattr(entry, n) for n in names)
    combos = sorted(itertools.product(*(space[n] for n in names)), key=lambda c: c != default)
    found, refused = [], []
    for combo in combos:
        try:
            found.append(entry.variant(**dict(zip(names, combo))))
        except ValueError as e:  # a combination the entry refuses (block_bias with symmetric blocks) is no candidate
            refused.append(e)
    if refused and not found:
        raise refused[0]
    return found[:limit] if limit is not None else found


def candidates(
    model: onnx.ModelProto, context: Context, *, entries: Sequence[str] | None = None,
    per_entry: int | None = None, knobs: Mapping[str, Mapping[str, tuple]] | None = None,
) -> tuple[list[Entry], dict[str, str]]:
    """The candidates of a search over the registry (or `entries`), and every entry left out with the reason.

    Entries of one kind with the same knobs (`int8_static_minmax`, `int8_static_percentile`) share one space:
    it is enumerated once, and a variant equal to a registered entry keeps that entry's name. `knobs` narrows (or
    widens) an entry's space by knob, under the entry's registered name.
    """
    chosen = [REGISTRY[n] for n in (entries if entries is not None else FORWARD_ENTRIES)]
    refused = {e.name: why for e in chosen if (why := e.why_not(model, context)) is not None}
    by_values = {(type(e), _values(e)): e for e in REGISTRY.values() if e.knobs()}
    found: dict[str, Entry] = {}
    spaces_done: set[type] = set()
    for entry in chosen:
        if entry.name in refused:
            continue
        if not entry.knobs():
            found[entry.name] = entry
            continue
        if type(entry) in spaces_done:
            continue
        spaces_done.add(type(entry))
        for variant in expand(entry, limit=per_entry, knobs=(knobs or {}).get(entry.name)):
            named = by_values.get((type(variant), _values(variant)), variant)
            found.setdefault(named.name, named)
    return list(found.values()), refused


def interleave(groups: Iterable[Sequence[Entry]]) -> list[Entry]:
    """Round-robin over groups: a budget cut then leaves some of every group tried."""
    out: list[Entry] = []
    for row in itertools.zip_longest(*groups):
        out.extend(e for e in row if e is not None)
    return out


def family(entry: Entry) -> str:
    """The class that makes `entry` (every variant of int8_dynamic is one family); "chain" for a chain."""
    if isinstance(entry, Chain):
        return "chain"
    return type(entry).__name__ if entry.knobs() else entry.name


def by_family(entries: Sequence[Entry]) -> Mapping[str, list[Entry]]:
    """Entries grouped by `family`."""
    groups: dict[str, list[Entry]] = {}
    for entry in entries:
        groups.setdefault(family(entry), []).append(entry)
    return groups


def _values(entry: Entry) -> tuple:
    return tuple(sorted((k, repr(v)) for k, v in entry.knob_values().items()))
