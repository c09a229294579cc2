"""What a model's inputs are, read from its graph: each input's dtype and dims, the sizes of its symbolic dims, the
constant tables integer inputs index and the strings string inputs are looked up among.

Making feeds from them is `tracker.measure.inputs.feeds`'; checking given feeds against them is
`tracker.measure.inputs.feed_checks`'.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

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
# The attributes of ai.onnx.ml ops that hold the strings a string input is looked up among.
_STRING_KEYS = ("keys_strings", "cats_strings")


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
