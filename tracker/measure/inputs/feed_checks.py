"""Checks of feeds before they are made, read or run: names, dtypes, ranks and fixed dims against the model's
inputs, integer feeds inside the tables they index, and the memory feeds would take.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import numpy as np
import onnx

from tracker.base.errors import FeedError
from tracker.measure.inputs.model_inputs import InputSpec, index_tables, input_specs

# What a Python str costs beyond its characters (object header, hash, length) plus its pointer in an object array.
STR_OBJECT_BYTES = 64


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


def _format_bytes(size: int) -> str:
    if size < 1024:
        return f"{size} B"
    scaled = size / 1024
    for unit in ("KiB", "MiB", "GiB"):
        if scaled < 1024:
            return f"{scaled:.1f} {unit}"
        scaled /= 1024
    return f"{scaled:.1f} TiB"


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
