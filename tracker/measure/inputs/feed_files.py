"""Feeds read from numpy files (`.npz` by input name, `.npy` for one input), checked against the model."""

from __future__ import annotations

import contextlib
import os
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, cast

import numpy as np
import onnx

from tracker.base.errors import FeedError
from tracker.measure.inputs.feed_checks import check_feed_names, check_feed_size, check_feeds, check_indices
from tracker.measure.inputs.model_inputs import InputSpec, input_specs

_EXPECTED_FILE = "expected a .npz of arrays by input name (numpy.savez) or a .npy of one array (numpy.save)"
_OBJECTS_REFUSED = ("object arrays are refused: reading them would unpickle; save strings as a numpy str array, "
                    "e.g. numpy.array(['a', 'b'])")
# Errors reading a zip member or a .npy stream: numpy's (bad header, short data), zipfile's (bad CRC, encrypted,
# unsupported compression) and the OS's.
_READ_ERRORS = (OSError, ValueError, EOFError, RuntimeError, NotImplementedError, zipfile.BadZipFile)


@dataclass(frozen=True)
class _Stored:
    """One array of a feeds file, not read yet: the input it feeds and where its .npy stream is."""

    path: Path
    name: str
    member: str | None  # the .npz's member; None: the file is the .npy

    @property
    def label(self) -> str:
        where = f"feeds file {str(self.path)!r}"
        return where if self.member is None else f"array {self.name!r} of {where}"

    @contextlib.contextmanager
    def open(self) -> Iterator[IO[bytes]]:
        if self.member is None:
            with self.path.open("rb") as stream:
                yield stream
        else:
            with zipfile.ZipFile(self.path) as archive, archive.open(self.member) as stream:
                yield stream


def load_feeds(path: str | os.PathLike[str], model: onnx.ModelProto, *,
               max_bytes: int | None = None) -> dict[str, np.ndarray]:
    """Reads feeds from a numpy file and checks them against the model.

    A `.npz` (`numpy.savez`) holds one array per input, by name; a `.npy` (`numpy.save`) holds one array, for a
    model with exactly one input. The content decides, not the extension. Everything the model's inputs allow
    is checked from the file's directory and the arrays' headers before any data is read: names (a member that
    is not an input is never read), dtypes, shapes and the memory the arrays would take. Arrays of Python
    objects are refused: reading them would unpickle the file, which can run any code. Unicode arrays
    (`numpy.array(['a', 'b'])`) feed string inputs, as the object arrays of `str` ONNX Runtime takes.

    Args:
        path: the `.npz` or `.npy` file.
        model: the model the feeds are for.
        max_bytes: the most the arrays may take together; default `feed_limit_bytes()` (a quarter of the memory
            available now).

    Returns:
        The feeds by input name.

    Raises:
        FeedError: naming the file, when it is missing, not a numpy file, unreadable or corrupt, holds object
            arrays, holds one array for a model of several inputs, does not match the model (`check_feeds`),
            would take more than `max_bytes`, or holds integers outside a table they index (`check_indices`).
    """
    path = Path(path)
    stored = _arrays(path, model)
    try:
        check_feed_names(model, stored)
    except FeedError as e:
        raise FeedError(f"feeds file {str(path)!r}: {e}") from e
    headers = {name: _header(array) for name, array in stored.items()}
    try:
        check_feed_size(list(headers.values()), max_bytes=max_bytes,
                        fix="expected arrays that fit in memory (nothing was read)")
        # Zero-strided stand-ins of the right dtype and shape: the full check, before any data is read.
        # cast: a .npy header's dims are ints (`_header`), never a symbolic name
        check_feeds(model, {name: np.broadcast_to(np.zeros((), _feed_dtype(spec.dtype)),
                                                  cast(tuple[int, ...], spec.dims))
                            for name, spec in headers.items()})
    except FeedError as e:
        raise FeedError(f"feeds file {str(path)!r}: {e}") from e
    feeds = {name: _read(array) for name, array in stored.items()}
    try:
        check_indices(model, feeds)
    except FeedError as e:
        raise FeedError(f"feeds file {str(path)!r}: {e}") from e
    return feeds


def _arrays(path: Path, model: onnx.ModelProto) -> dict[str, _Stored]:
    """Each array of the file by name, from the .npz's directory; nothing of the arrays is read."""
    if not path.is_file():
        state = "is not a file" if path.exists() else "does not exist"
        raise FeedError(f"feeds file {str(path)!r} {state}; {_EXPECTED_FILE}")
    with path.open("rb") as file:
        head = file.read(len(np.lib.format.MAGIC_PREFIX))
    if head == np.lib.format.MAGIC_PREFIX:
        name = _only_input(model, path)
        return {name: _Stored(path, name, None)}
    # numpy reads anything else as a pickle; say what the file is not instead of numpy's pickle message.
    if not head.startswith(b"PK"):
        raise FeedError(f"feeds file {str(path)!r} is neither a .npz archive nor a .npy array; {_EXPECTED_FILE}")
    try:
        with zipfile.ZipFile(path) as archive:
            members = archive.namelist()
    except _READ_ERRORS as e:
        raise FeedError(f"cannot read feeds file {str(path)!r}: {e}; {_EXPECTED_FILE} of numbers or strings") from e
    # numpy.savez names a member `<input>.npy`; numpy.load strips the suffix the same way.
    return {m.removesuffix(".npy"): _Stored(path, m.removesuffix(".npy"), m) for m in members}


def _header(array: _Stored) -> InputSpec:
    """The array's dtype and shape, from its .npy header alone."""
    try:
        with array.open() as stream:
            if stream.read(len(np.lib.format.MAGIC_PREFIX)) != np.lib.format.MAGIC_PREFIX:
                raise FeedError(f"member {array.name!r} of feeds file {str(array.path)!r} is not a .npy array; "
                                f"{_EXPECTED_FILE}")
            major = stream.read(2)[:1]
            if major not in (b"\x01", b"\x02", b"\x03"):
                raise ValueError(f"unknown .npy format version {major!r}")
            # Versions 2 and 3 lay the header out alike (3 allows UTF-8 in it); numpy has no public reader of 3.
            read = np.lib.format.read_array_header_1_0 if major == b"\x01" else np.lib.format.read_array_header_2_0
            shape, _, dtype = read(stream)
    except _READ_ERRORS as e:
        raise FeedError(f"cannot read {array.label}: {e}; {_EXPECTED_FILE} of numbers or strings") from e
    if dtype.hasobject:
        raise FeedError(f"{array.label} holds Python objects (dtype {dtype}); {_OBJECTS_REFUSED}")
    if any(d < 0 for d in shape):
        raise FeedError(f"cannot read {array.label}: its header declares shape {shape}; {_EXPECTED_FILE}")
    return InputSpec(array.name, dtype, tuple(shape))


def _read(array: _Stored) -> np.ndarray:
    try:
        with array.open() as stream:
            value = np.lib.format.read_array(stream, allow_pickle=False)
    except _READ_ERRORS as e:
        raise FeedError(f"cannot read {array.label}: {e}; {_EXPECTED_FILE} of numbers or strings") from e
    # ONNX Runtime takes a string tensor as an object array of str; numpy keeps strings as fixed-width unicode.
    return value.astype(object) if value.dtype.kind == "U" else value


def _feed_dtype(dtype: np.dtype) -> np.dtype:
    return np.dtype(object) if dtype.kind == "U" else dtype


def _only_input(model: onnx.ModelProto, path: Path) -> str:
    names = [spec.name for spec in input_specs(model)]
    if len(names) != 1:
        raise FeedError(f"feeds file {str(path)!r} holds one array (.npy), but the model has {len(names)} inputs "
                        f"{names}; save them by name in a .npz: numpy.savez(path, **feeds)")
    return names[0]
