"""Model inputs: seeded feeds a model accepts, and checks of feeds against a model (files: `feed_files`)."""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Literal

import numpy as np
import onnx
from onnx import helper

from tracker.base.errors import FeedError

DEFAULT_BATCH = 1
DEFAULT_SEQUENCE = 128

# Whole names (lower case) of batch dims. "?0" is how `input_specs` names an unnamed first axis.
_BATCH_NAMES = frozenset({"batch", "batch_size", "batchsize", "bs", "n", "b", "?0"})
# Words (the name split on anything not a letter or digit) that make a dim a sequence: seq_len, past_sequence_length.
_SEQUENCE_WORDS = frozenset({"seq", "sequence", "seqlen", "seqlength", "sequencelength", "len", "length", "past"})
# A dim named by an expression ("past_sequence_length + 1", "s0*2") depends on other dims: no default fits.
_EXPRESSION = re.compile(r"[+*/()\s]")

# Ops whose output holds the values of their first input, moved or retyped: indices keep their range through them.
_VALUE_PRESERVING = frozenset({"Cast", "CastLike", "Identity", "Reshape", "Unsqueeze", "Squeeze", "Flatten",
                               "Expand", "Transpose"})
_ONNX_DOMAINS = ("", "ai.onnx")

# Name rules, checked in this order (lower-cased input name).
_MASK = re.compile(r"mask")
_TOKEN_TYPE = re.compile(r"token_type|segment_id")
_POSITION = re.compile(r"position_id")

# String inputs: words drawn from the keys of the ai.onnx.ml op they feed (so they map to something), else these.
_WORDS = ("the", "cat", "sat", "on", "a", "mat", "red", "green", "blue", "one", "two", "three", "yes", "no", "up",
          "down")
_STRING_KEYS = ("keys_strings", "cats_strings")
# What a Python str costs beyond its characters (object header, hash, length) plus its pointer in an object array.
STR_OBJECT_BYTES = 64


@dataclass(frozen=True)
class InputSpec:
    """One graph input: name, numpy dtype and dims (an int, or the symbolic name of a dim)."""

    name: str
    dtype: np.dtype
    dims: tuple[int | str, ...]


@dataclass(frozen=True)
class IndexedTable:
    """A constant table an integer input indexes: `rows` entries on the axis a Gather takes them from."""

    table: str
    rows: int
    gather: str


def input_specs(model: onnx.ModelProto) -> list[InputSpec]:
    """The inputs a caller must feed (graph inputs that are not initializers).

    Raises:
        FeedError: an input is not a tensor (a sequence, map or optional), or has no element type.
    """
    initializers = {t.name for t in model.graph.initializer}
    specs = []
    for value in model.graph.input:
        if value.name in initializers:
            continue
        kind = value.type.WhichOneof("value")
        if kind != "tensor_type":
            raise FeedError(f"input {value.name!r} is of type {kind or 'undefined'}, not a tensor; only tensor "
                            "inputs can be fed")
        tensor = value.type.tensor_type
        if tensor.elem_type == onnx.TensorProto.UNDEFINED:
            raise FeedError(f"input {value.name!r} is a tensor with no element type; expected one (float, int64 ...)")
        dims = tuple(
            d.dim_value if d.HasField("dim_value") else (d.dim_param or f"?{i}")
            for i, d in enumerate(tensor.shape.dim)
        )
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.elem_type))
        specs.append(InputSpec(value.name, dtype, dims))
    return specs


def default_dim_size(name: str) -> int | None:
    """The size a symbolic dim gets when the caller does not give one, from its name.

    - `DEFAULT_BATCH` (1) for a batch: the whole name is `batch`, `batch_size`, `bs`, `N`, `B` or `?0` (an unnamed
      first axis), or one of its words is `batch` (`dynamic_batch`).
    - `DEFAULT_SEQUENCE` (128) for a sequence: one of its words is `seq`, `sequence`, `seq_len`'s `len`, `length`
      or `past` (`sequence_length`, `past_sequence_length`, `max_seq_len`).
    - None for any other name, and for expressions (`past_sequence_length + 1`), whose size follows from other
      dims: the caller must give them.
    """
    lowered = name.lower()
    if _EXPRESSION.search(lowered):
        return None
    words = set(re.split(r"[^a-z0-9]+", lowered))
    if lowered in _BATCH_NAMES or "batch" in words:
        return DEFAULT_BATCH
    if words & _SEQUENCE_WORDS:
        return DEFAULT_SEQUENCE
    return None


def symbolic_dims(model: onnx.ModelProto, *, dims: Mapping[str, int] | None = None) -> dict[str, int | None]:
    """Every symbolic dim of the model's inputs, in order, with the size feeds will give it.

    A size the caller gives in `dims` wins; else `default_dim_size`; None when neither gives one.

    Raises:
        FeedError: `dims` names a dim the model does not have (a typo would be silently ignored), or gives a
            negative size.
    """
    names = dict.fromkeys(d for spec in input_specs(model) for d in spec.dims if isinstance(d, str))
    given = dict(dims or {})
    unknown = sorted(set(given) - set(names))
    if unknown:
        raise FeedError(f"sizes were given for dims {unknown} that no input has; the model's symbolic dims are "
                        f"{list(names) or 'none'}")
    for name, size in given.items():
        if int(size) < 0:
            raise FeedError(f"symbolic dim {name!r} has size {size}; expected a size >= 0")
    return {name: int(given[name]) if name in given else default_dim_size(name) for name in names}


def index_tables(model: onnx.ModelProto) -> dict[str, IndexedTable]:
    """The smallest constant table each input indexes, by input name; inputs indexing none are absent.

    An input indexes a table when it reaches the indices of a `Gather` whose data is an initializer or a
    `Constant` (also through a Cast or Identity of one), directly or through ops that keep its values
    (Cast, Reshape, Unsqueeze, Squeeze, Flatten, Identity, Expand, Transpose). Only the main graph is searched:
    tables indexed inside subgraphs (If, Loop, Scan bodies) and by fused ops (EmbedLayerNormalization) are not
    found.
    """
    graph = model.graph
    consumers: dict[str, list[tuple[onnx.NodeProto, int]]] = defaultdict(list)
    for node in graph.node:
        for position, name in enumerate(node.input):
            if name:
                consumers[name].append((node, position))
    constants = _constant_dims(graph)
    tables = {}
    for spec in input_specs(model):
        found = list(_tables_reached(spec.name, consumers, constants))
        if found:
            tables[spec.name] = min(found, key=lambda t: t.rows)
    return tables


def _constant_dims(graph: onnx.GraphProto) -> dict[str, tuple[int, ...]]:
    dims = {t.name: tuple(t.dims) for t in graph.initializer}
    for node in graph.node:  # ONNX graphs are topologically sorted
        if node.domain not in _ONNX_DOMAINS:
            continue
        if node.op_type == "Constant" and node.attribute:
            value = helper.get_attribute_value(node.attribute[0])
            if isinstance(value, (onnx.TensorProto, onnx.SparseTensorProto)):
                dims[node.output[0]] = tuple(value.dims)
            elif isinstance(value, list):
                dims[node.output[0]] = (len(value),)
        elif node.op_type in ("Cast", "Identity") and node.input and node.input[0] in dims:
            dims[node.output[0]] = dims[node.input[0]]
    return dims


def _tables_reached(
    name: str, consumers: Mapping[str, list[tuple[onnx.NodeProto, int]]], constants: Mapping[str, tuple[int, ...]]
) -> Iterator[IndexedTable]:
    pending, seen = [name], {name}
    while pending:
        for node, position in consumers.get(pending.pop(), []):
            if node.domain not in _ONNX_DOMAINS:
                continue
            if node.op_type == "Gather" and position == 1 and node.input[0] in constants:
                shape = constants[node.input[0]]
                axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
                if -len(shape) <= axis < len(shape):
                    yield IndexedTable(node.input[0], shape[axis], node.name)
            elif node.op_type in _VALUE_PRESERVING and position == 0:
                fresh = [out for out in node.output if out and out not in seen]
                seen.update(fresh)
                pending.extend(fresh)


@dataclass(frozen=True)
class StringKeys:
    """The strings an ai.onnx.ml op maps (a LabelEncoder's `keys_strings`, a OneHotEncoder's `cats_strings`)."""

    node: str
    op_type: str
    attribute: str
    values: tuple[str, ...]


def string_keys(model: onnx.ModelProto) -> dict[str, StringKeys]:
    """The strings each string input is looked up among, by input name; inputs that reach no such op are absent.

    An input reaches a `LabelEncoder`, `CategoryMapper` or `OneHotEncoder` (any ai.onnx.ml op with non-empty
    `keys_strings` or `cats_strings`) directly or through ops that keep its values (`index_tables`' list).
    Only the main graph is searched; the first op found wins.
    """
    consumers: dict[str, list[tuple[onnx.NodeProto, int]]] = defaultdict(list)
    for node in model.graph.node:
        for position, name in enumerate(node.input):
            if name:
                consumers[name].append((node, position))
    found = {}
    for spec in input_specs(model):
        if spec.dtype.kind != "O":
            continue
        keys = next(_string_keys_reached(spec.name, consumers), None)
        if keys is not None:
            found[spec.name] = keys
    return found


def _string_keys_reached(name: str, consumers: Mapping[str, list[tuple[onnx.NodeProto, int]]]) -> Iterator[StringKeys]:
    pending, seen = [name], {name}
    while pending:
        for node, position in consumers.get(pending.pop(), []):
            if node.domain == "ai.onnx.ml" and position == 0:
                for attribute in node.attribute:
                    if attribute.name in _STRING_KEYS and attribute.strings:
                        values = tuple(v.decode("utf-8", errors="replace") for v in attribute.strings)
                        yield StringKeys(node.name, node.op_type, attribute.name, values)
            elif node.domain in _ONNX_DOMAINS and node.op_type in _VALUE_PRESERVING - {"Cast", "CastLike"} \
                    and position == 0:
                fresh = [out for out in node.output if out and out not in seen]
                seen.update(fresh)
                pending.extend(fresh)


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
            negative size, an input indexes a table of 0 rows or one too small for its name rule, or the feeds
            would take more than `max_bytes` (checked before anything is allocated).
    """
    if int_high < 1:
        raise ValueError(f"int_high must be >= 1, got {int_high}")
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


def feed_limit_bytes() -> int:
    """The default bound on generated feeds: a quarter of the memory available now.

    A quarter, because generating a float32 feed briefly holds a float64 copy of it too, and the
    model still needs room to run on the feeds.
    """
    import psutil

    return int(psutil.virtual_memory().available) // 4


def feed_bytes(spec: InputSpec) -> int:
    """What an array of `spec`'s dtype and (sized) dims takes; a numpy unicode array also counts the Python str
    each element becomes (`STR_OBJECT_BYTES` more), as ONNX Runtime takes strings as an object array."""
    count = math.prod(int(d) for d in spec.dims)
    extra = STR_OBJECT_BYTES if spec.dtype.kind == "U" else 0
    return count * (spec.dtype.itemsize + extra)


def check_feed_size(arrays: list[InputSpec], *, max_bytes: int | None = None,
                    fix: str = "give smaller sizes (--dim)") -> None:
    """Raises `FeedError` when arrays of these dtypes and sized dims would take more than `max_bytes` together.

    Checked before anything is allocated or read. `max_bytes` defaults to `feed_limit_bytes()`; `fix` ends the
    message (what the caller can do about it).
    """
    why = ""
    if max_bytes is None:
        max_bytes, why = feed_limit_bytes(), " (a quarter of the memory available now)"
    sizes = [feed_bytes(spec) for spec in arrays]
    if sum(sizes) <= max_bytes:
        return
    largest = sorted(zip(sizes, arrays), key=lambda t: t[0], reverse=True)[:3]
    inputs = ", ".join(f"{s.name}: {s.dtype}{list(s.dims)} = {_format_bytes(size)}" for size, s in largest)
    raise FeedError(
        f"feeds of these sizes would take {_format_bytes(sum(sizes))} ({inputs}), more than the limit of "
        f"{_format_bytes(max_bytes)}{why}; {fix}"
    )


def _shape(spec: InputSpec, sizes: Mapping[str, int | None]) -> tuple[int, ...]:
    shape = []
    for d in spec.dims:
        if isinstance(d, str):
            if sizes[d] is None:
                raise FeedError(
                    f"input {spec.name!r} has symbolic dim {d!r} with no size and no default (only batch-like "
                    f"names get {DEFAULT_BATCH}, sequence-like names {DEFAULT_SEQUENCE}); give it, "
                    f"e.g. dims={{{d!r}: 4}} (CLI: --dim {d}=4)"
                )
            d = sizes[d]
        shape.append(int(d))
    return tuple(shape)


def _format_bytes(size: int) -> str:
    if size < 1024:
        return f"{size} B"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        size /= 1024
        if size < 1024 or unit == "TiB":
            return f"{size:.1f} {unit}"


def _random(rng: np.random.Generator, spec: InputSpec, shape: tuple[int, ...]) -> np.ndarray:
    if spec.dtype.kind == "f":
        return rng.standard_normal(shape).astype(spec.dtype)
    if spec.dtype.kind == "b":
        return rng.integers(0, 2, size=shape).astype(bool)
    raise FeedError(f"cannot generate input {spec.name!r} of dtype {spec.dtype}; expected float, integer, bool or "
                    "string inputs, or pass feeds explicitly")


def check_feeds(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> None:
    """Checks names, dtypes, ranks and fixed dims of `feeds` against the model's inputs.

    Raises:
        FeedError: naming every mismatch found, with what the model expects.
    """
    specs = {s.name: s for s in input_specs(model)}
    problems = _name_problems(model, feeds)
    for name in sorted(set(specs) & set(feeds)):
        spec, value = specs[name], np.asarray(feeds[name])
        if value.dtype != spec.dtype:
            strings = " (strings: an object array of str)" if spec.dtype.kind == "O" else ""
            problems.append(f"{name!r} has dtype {value.dtype}, expected {spec.dtype}{strings}")
        if value.ndim != len(spec.dims):
            problems.append(f"{name!r} has rank {value.ndim} (shape {value.shape}), expected rank {len(spec.dims)} "
                            f"{spec.dims}")
            continue
        for axis, (want, got) in enumerate(zip(spec.dims, value.shape)):
            if isinstance(want, int) and want > 0 and want != got:
                problems.append(f"{name!r} has size {got} on axis {axis}, expected {want} {spec.dims}")
    _raise_mismatch(problems, specs.values())


def check_feed_names(model: onnx.ModelProto, names: Iterable[str]) -> None:
    """`check_feeds`' check of names alone, for feeds not read yet: every input given, and nothing else.

    Raises:
        FeedError: naming the missing and unknown inputs, with what the model expects.
    """
    _raise_mismatch(_name_problems(model, list(names)), input_specs(model))


def _name_problems(model: onnx.ModelProto, names: Iterable[str]) -> list[str]:
    specs = {s.name for s in input_specs(model)}
    # Graph inputs that are also initializers have a default value: feeding them is optional.
    optional = {v.name for v in model.graph.input} - specs
    problems = []
    missing = sorted(specs - set(names))
    extra = sorted(set(names) - specs - optional)
    if missing:
        problems.append(f"missing inputs {missing}")
    if extra:
        problems.append(f"unknown inputs {extra}")
    return problems


def _raise_mismatch(problems: list[str], specs: Iterable[InputSpec]) -> None:
    if problems:
        expected = ", ".join(f"{s.name}: {_dtype_name(s.dtype)}{list(s.dims)}" for s in specs)
        raise FeedError(f"feeds do not match the model: {'; '.join(problems)} (model expects {expected})")


def _dtype_name(dtype: np.dtype) -> str:
    return "string" if dtype.kind == "O" else str(dtype)


def check_indices(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> None:
    """Checks that integer feeds stay inside the tables they index (`index_tables`).

    ONNX Runtime's Gather accepts [-rows, rows - 1] and fails at run time on anything else
    ("indices element out of data bounds"); this says so before any session is made.

    Raises:
        FeedError: naming each feed outside its table, its range and the table's size.
    """
    problems = []
    for name, table in index_tables(model).items():
        value = np.asarray(feeds.get(name, ()))
        if value.dtype.kind not in "iu" or value.size == 0:
            continue
        low, high = value.min(), value.max()
        if low < -table.rows or high >= table.rows:
            problems.append(f"{name!r} holds values in [{low}, {high}] but indexes {table.table!r}, a table of "
                            f"{table.rows} rows (Gather {table.gather!r}): expected values in [0, {table.rows})")
    if problems:
        raise FeedError(f"feeds outside the tables they index: {'; '.join(problems)}")
