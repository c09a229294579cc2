"""Seeded feeds a model accepts, made from its inputs' dtypes, dims and names and the tables they index (what the
model's inputs are: `model_inputs`; checks: `feed_checks`; feeds read from files: `feed_files`)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import numpy as np
import onnx

from tracker.base.errors import FeedError
from tracker.measure.inputs.feed_checks import check_feed_size
from tracker.measure.inputs.model_inputs import (
    DEFAULT_BATCH,
    DEFAULT_SEQUENCE,
    IndexedTable,
    InputSpec,
    StringKeys,
    index_tables,
    input_specs,
    string_keys,
    symbolic_dims,
)

# Name rules, checked in this order (lower-cased input name).
_MASK = re.compile(r"mask")
_TOKEN_TYPE = re.compile(r"token_type|segment_id")
_POSITION = re.compile(r"position_id")

# String inputs: words drawn from the keys of the ai.onnx.ml op they feed (so they map to something), else these.
_WORDS = ("the", "cat", "sat", "on", "a", "mat", "red", "green", "blue", "one", "two", "three", "yes", "no", "up",
          "down")


@dataclass(frozen=True)
class _Rule:
    """How one input's values are made; `high` bounds the integers of the random kinds, `words` the strings."""

    kind: Literal["ones", "zeros", "positions", "random", "words"]
    description: str
    high: int = 0
    words: tuple[str, ...] = ()


def _rule(spec: InputSpec, table: IndexedTable | None, int_high: int, keys: StringKeys | None = None) -> _Rule:
    # Name rules first: they give what a tokenizer gives for one unpadded sentence (every token attended, one
    # segment, positions in order), and stay valid for any table they index unless it is too small (checked).
    # Random draws inside the table are left to what no name describes: token ids.
    lowered, kind = spec.name.lower(), spec.dtype.kind
    if kind in "iufb":
        if _MASK.search(lowered):
            return _Rule("ones", "ones (a mask: the name contains 'mask')")
        if _TOKEN_TYPE.search(lowered):
            return _Rule("zeros", "zeros (token types: one segment)")
        if _POSITION.search(lowered):
            return _Rule("positions", "arange over the last axis (position ids)")
    if table is not None and kind in "iuf":
        return _Rule("random", f"integers in [0, {table.rows}) (indices into {table.table!r}, {table.rows} rows, "
                               f"Gather {table.gather!r})", table.rows)
    if kind in "iu":
        return _Rule("random", f"integers in [0, {int_high})", int_high)
    if kind == "O":  # ONNX strings
        if keys is not None:
            return _Rule("words", f"strings drawn from the {len(keys.values)} {keys.attribute} of {keys.op_type} "
                                  f"{keys.node!r}", words=keys.values)
        return _Rule("words", f"strings drawn from {len(_WORDS)} short words ({', '.join(_WORDS[:3])} ...)",
                     words=_WORDS)
    return _Rule("random", {"f": "standard normal", "b": "random booleans"}.get(kind, f"random {spec.dtype}"))


def feed_rules(model: onnx.ModelProto, *, int_high: int = 100) -> dict[str, str]:
    """How `make_feeds` makes each input's values, one line per input name (for a dry run, a dataset's description)."""
    tables, keys = index_tables(model), string_keys(model)
    return {spec.name: _rule(spec, tables.get(spec.name), int_high, keys.get(spec.name)).description
            for spec in input_specs(model)}


def make_feeds(
    model: onnx.ModelProto,
    *,
    dims: Mapping[str, int] | None = None,
    seed: int = 0,
    int_high: int = 100,
    max_bytes: int | None = None,
) -> dict[str, np.ndarray]:
    """Seeded feeds matching the model's input signature, with values the model accepts.

    Values, by input (lower-cased name), first rule that applies:

    1. a name containing `mask` (`attention_mask`): ones;
    2. a name containing `token_type` or `segment_id` (`token_type_ids`, `segment_ids`): zeros;
    3. a name containing `position_id`: arange over the last axis, broadcast over the others;
    4. an input that indexes a constant table (`index_tables`, the smallest if several): integers drawn from
       [0, rows) — token ids;
    5. other integers from [0, int_high), floats standard normal, booleans random;
    6. strings (an object array of `str`, what ONNX Runtime takes for a string tensor): drawn from the keys of the
       ai.onnx.ml op they feed (`string_keys`: a LabelEncoder's `keys_strings` ...), else from a fixed list of
       short words.

    The name rules come first because they give what a tokenizer gives for one unpadded sentence; random
    values inside a table would also run, but a random mask or segment is not the input being measured. The
    table still bounds them: a name-ruled value the table cannot hold is an error.

    Symbolic dims get the size given in `dims`, else a default (`default_dim_size`: 1 for a batch, 128 for a
    sequence); any other dim must be given.

    Args:
        model: the model to feed.
        dims: sizes of symbolic dims by name (e.g. `{"batch": 1, "seq": 32}`); they win over the defaults.
        seed: seed of the random generator.
        int_high: integer inputs that no rule above bounds are drawn from [0, int_high).
        max_bytes: the most the feeds may take together; default `feed_limit_bytes()`.

    Raises:
        FeedError: naming the input and what was expected, when an input is not a tensor or of a dtype that
            cannot be generated, a symbolic dim has no size and no default, `dims` names an unknown dim or a
            negative size, the model declares a negative static size or (but for a past) a 0, `seed` is negative,
            an input indexes a table of 0 rows or one too small for its name rule, or the feeds would take more
            than `max_bytes` (checked before anything is allocated).
    """
    if int_high < 1:
        raise ValueError(f"int_high must be >= 1, got {int_high}")
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
        raise FeedError(f"the feeds' seed must be an integer >= 0 (numpy's generator takes no other), got {seed!r} "
                        "(CLI: --seed)")
    specs = input_specs(model)
    sizes = symbolic_dims(model, dims=dims)
    shapes = [_shape(spec, sizes) for spec in specs]
    # Generated strings are shared: an element costs its pointer only.
    check_feed_size([InputSpec(s.name, s.dtype, shape) for s, shape in zip(specs, shapes)], max_bytes=max_bytes)
    tables, keys = index_tables(model), string_keys(model)
    rng = np.random.default_rng(seed)
    feeds = {}
    for spec, shape in zip(specs, shapes):
        table = tables.get(spec.name)
        feeds[spec.name] = _generate(spec, shape, table, _rule(spec, table, int_high, keys.get(spec.name)), rng)
    return feeds


def _generate(spec: InputSpec, shape: tuple[int, ...], table: IndexedTable | None, rule: _Rule,
              rng: np.random.Generator) -> np.ndarray:
    if table is not None and table.rows == 0:
        raise FeedError(f"input {spec.name!r} indexes {table.table!r}, a table of 0 rows (Gather {table.gather!r}): "
                        "no index is valid; expected a table of at least one row")
    if rule.kind == "ones":
        value = np.ones(shape, spec.dtype)
    elif rule.kind == "zeros":
        value = np.zeros(shape, spec.dtype)
    elif rule.kind == "positions":
        value = np.broadcast_to(np.arange(shape[-1]), shape).astype(spec.dtype) if shape else np.zeros((), spec.dtype)
    elif rule.kind == "words":
        words = np.array(rule.words, dtype=object)
        value = np.asarray(words[rng.integers(0, len(words), size=shape)], dtype=object)
    elif rule.high or spec.dtype.kind in "iu":
        value = rng.integers(0, _highest(spec.dtype, rule.high), size=shape).astype(spec.dtype)
    else:
        value = _random(rng, spec, shape)
    if table is not None and value.size and value.max() >= table.rows:
        dim = spec.dims[-1] if spec.dims else None
        hint = f" (--dim {dim}={table.rows})" if rule.kind == "positions" and isinstance(dim, str) else ""
        raise FeedError(f"input {spec.name!r} gets {rule.description}, up to {value.max()}, but indexes "
                        f"{table.table!r}, a table of {table.rows} rows (Gather {table.gather!r}); expected values "
                        f"below {table.rows}: give smaller sizes{hint} or pass feeds")
    return value


def _highest(dtype: np.dtype, high: int) -> int:
    return min(high, int(np.iinfo(dtype).max) + 1) if dtype.kind in "iu" else high


def _shape(spec: InputSpec, sizes: Mapping[str, int | None]) -> tuple[int, ...]:
    shape = []
    for axis, d in enumerate(spec.dims):
        if isinstance(d, int) and (d < 0 or (d == 0 and "past" not in spec.name.lower())):
            # An empty feed gives empty outputs, which every check passes (as --dim N=0, refused for that reason);
            # an empty past is a decoder's first step.
            raise FeedError(f"input {spec.name!r} declares axis {axis} of size {d} (shape {list(spec.dims)}): "
                            "expected a size of at least 1 (0 only for a past length), as the model would be timed and "
                            "judged on empty feeds; fix the model's input shape, or pass feeds")
        size = sizes[d] if isinstance(d, str) else d
        if size is None:
            raise FeedError(
                f"input {spec.name!r} has symbolic dim {d!r} with no size and no default (only batch-like "
                f"names get {DEFAULT_BATCH}, sequence-like names {DEFAULT_SEQUENCE}); give it, "
                f"e.g. dims={{{d!r}: 4}} (CLI: --dim {d}=4)"
            )
        shape.append(int(size))
    return tuple(shape)


def _random(rng: np.random.Generator, spec: InputSpec, shape: tuple[int, ...]) -> np.ndarray:
    if spec.dtype.kind == "f":
        return rng.standard_normal(shape).astype(spec.dtype)
    if spec.dtype.kind == "b":
        return rng.integers(0, 2, size=shape).astype(bool)
    raise FeedError(f"cannot generate input {spec.name!r} of dtype {spec.dtype}; expected float, integer, bool or "
                    "string inputs, or pass feeds explicitly")
