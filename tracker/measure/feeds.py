"""Model inputs: generating seeded feeds from a model's signature and checking feeds against it."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper

from tracker.errors import FeedError


@dataclass(frozen=True)
class InputSpec:
    """One graph input: name, numpy dtype and dims (an int, or the symbolic name of a dim)."""

    name: str
    dtype: np.dtype
    dims: tuple[int | str, ...]


def input_specs(model: onnx.ModelProto) -> list[InputSpec]:
    """The inputs a caller must feed (graph inputs that are not initializers)."""
    initializers = {t.name for t in model.graph.initializer}
    specs = []
    for value in model.graph.input:
        if value.name in initializers:
            continue
        tensor = value.type.tensor_type
        if not value.type.HasField("tensor_type"):
            raise FeedError(f"input {value.name!r} is not a tensor; only tensor inputs are supported")
        dims = tuple(
            d.dim_value if d.HasField("dim_value") else (d.dim_param or f"?{i}")
            for i, d in enumerate(tensor.shape.dim)
        )
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.elem_type))
        specs.append(InputSpec(value.name, dtype, dims))
    return specs


def make_feeds(
    model: onnx.ModelProto,
    *,
    dims: Mapping[str, int] | None = None,
    seed: int = 0,
    int_high: int = 100,
    max_bytes: int | None = None,
) -> dict[str, np.ndarray]:
    """Seeded random feeds matching the model's input signature.

    Args:
        model: the model to feed.
        dims: sizes of symbolic dims by name (e.g. `{"batch": 1, "seq": 32}`); every symbolic dim
            must be given.
        seed: seed of the random generator.
        int_high: integer inputs are drawn from [0, int_high) (token ids, indices).
        max_bytes: the most the feeds may take together; default `feed_limit_bytes()`.

    Raises:
        FeedError: a symbolic dim has no size or a negative one, or the feeds would take more than
            `max_bytes` (checked before anything is allocated).
    """
    dims = dict(dims or {})
    specs = input_specs(model)
    shapes = [_shape(spec, dims) for spec in specs]
    if max_bytes is None:
        _check_size(specs, shapes, feed_limit_bytes(), why=" (a quarter of the memory available now)")
    else:
        _check_size(specs, shapes, max_bytes, why="")
    rng = np.random.default_rng(seed)
    return {spec.name: _random(rng, spec.dtype, shape, int_high) for spec, shape in zip(specs, shapes)}


def feed_limit_bytes() -> int:
    """The default bound on generated feeds: a quarter of the memory available now.

    A quarter, because generating a float32 feed briefly holds a float64 copy of it too, and the
    model still needs room to run on the feeds.
    """
    import psutil

    return int(psutil.virtual_memory().available) // 4


def _check_size(specs: list[InputSpec], shapes: list[tuple[int, ...]], max_bytes: int, *, why: str) -> None:
    sizes = [math.prod(shape) * spec.dtype.itemsize for spec, shape in zip(specs, shapes)]
    if sum(sizes) <= max_bytes:
        return
    largest = sorted(zip(sizes, specs, shapes), key=lambda t: t[0], reverse=True)[:3]
    inputs = ", ".join(f"{s.name}: {s.dtype}{list(shape)} = {_format_bytes(size)}" for size, s, shape in largest)
    raise FeedError(
        f"feeds of these sizes would take {_format_bytes(sum(sizes))} ({inputs}), more than the limit of "
        f"{_format_bytes(max_bytes)}{why}; give smaller sizes (--dim)"
    )


def _shape(spec: InputSpec, dims: Mapping[str, int]) -> tuple[int, ...]:
    shape = []
    for d in spec.dims:
        if isinstance(d, str):
            if d not in dims:
                raise FeedError(
                    f"input {spec.name!r} has symbolic dim {d!r} with no size; give it, "
                    f"e.g. dims={{{d!r}: 4}} (CLI: --dim {d}=4)"
                )
            if int(dims[d]) < 0:
                raise FeedError(f"symbolic dim {d!r} of input {spec.name!r} has size {dims[d]}; expected a size >= 0")
            d = dims[d]
        shape.append(int(d))
    return tuple(shape)


def _format_bytes(size: int) -> str:
    if size < 1024:
        return f"{size} B"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        size /= 1024
        if size < 1024 or unit == "TiB":
            return f"{size:.1f} {unit}"


def _random(rng: np.random.Generator, dtype: np.dtype, shape: tuple[int, ...], int_high: int) -> np.ndarray:
    if dtype.kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    if dtype.kind in "iu":
        return rng.integers(0, int_high, size=shape).astype(dtype)
    if dtype.kind == "b":
        return rng.integers(0, 2, size=shape).astype(bool)
    raise FeedError(f"cannot generate feeds of dtype {dtype}; pass feeds explicitly")


def check_feeds(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> None:
    """Checks names, dtypes, ranks and fixed dims of `feeds` against the model's inputs.

    Raises:
        FeedError: naming every mismatch found, with what the model expects.
    """
    specs = {s.name: s for s in input_specs(model)}
    # Graph inputs that are also initializers have a default value: feeding them is optional.
    optional = {v.name for v in model.graph.input} - set(specs)
    problems = []
    missing = sorted(set(specs) - set(feeds))
    extra = sorted(set(feeds) - set(specs) - optional)
    if missing:
        problems.append(f"missing inputs {missing}")
    if extra:
        problems.append(f"unknown inputs {extra}")
    for name in sorted(set(specs) & set(feeds)):
        spec, value = specs[name], np.asarray(feeds[name])
        if value.dtype != spec.dtype:
            problems.append(f"{name!r} has dtype {value.dtype}, expected {spec.dtype}")
        if value.ndim != len(spec.dims):
            problems.append(f"{name!r} has rank {value.ndim} (shape {value.shape}), expected rank {len(spec.dims)} {spec.dims}")
            continue
        for axis, (want, got) in enumerate(zip(spec.dims, value.shape)):
            if isinstance(want, int) and want > 0 and want != got:
                problems.append(f"{name!r} has size {got} on axis {axis}, expected {want} {spec.dims}")
    if problems:
        expected = ", ".join(f"{s.name}: {s.dtype}{list(s.dims)}" for s in specs.values())
        raise FeedError(f"feeds do not match the model: {'; '.join(problems)} (model expects {expected})")
