"""Reads an ONNX Runtime profile (raw or gzip JSON trace) into one row per kernel invocation."""

from __future__ import annotations

import gc
import gzip
import itertools
import logging
import operator
import zlib
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from operator import attrgetter
from pathlib import Path

import msgspec
import numpy as np
import pandas as pd

from tracker import columns as C
from tracker.errors import ProfileFormatError
from tracker.profile_stream import AnyEvent, decode_events, empty_message, iter_blocks, iter_event_batches

logger = logging.getLogger(__name__)

_KERNEL_SUFFIX = "_kernel_time"
_FENCE_SUFFIX = "_fence_before"
_RUN_EVENT = "model_run"
_GZIP_MAGIC = b"\x1f\x8b"
# parse_profile reads plain files from this size on, and every gzip file, a block of text at a time: the result is
# the same, and memory holds the table and one block's events instead of the whole text and all its events. It is
# also faster from a few MB on (fewer fresh pages to fault in).
STREAM_ABOVE_BYTES = 4 * 2**20
# Text decoded at a time: larger blocks cost more page faults than they save in per-block work (measured: 4 MiB
# blocks spend ~0.5 s more than 1 MiB ones on a 540 MB profile).
BLOCK_BYTES = 2**20

# Columns of repeated strings, and of numbers (see _KernelColumns).
_STRING_COLUMNS = (C.OP_TYPE, C.NODE, C.PROVIDER, C.THREAD, C.INPUT_SHAPES, C.OUTPUT_SHAPES)
_INT_COLUMNS = (C.DUR_US, C.TS_US, C.OUTPUT_SIZE, C.ACTIVATION_SIZE, C.PARAMETER_SIZE)
# What the kernel calls of a node repeat from run to run (string columns first), and where an event holds them.
_CALL_COLUMNS = (C.THREAD, C.OP_TYPE, C.PROVIDER, C.INPUT_SHAPES, C.OUTPUT_SHAPES)
_CALL_COLUMNS += (C.OUTPUT_SIZE, C.ACTIVATION_SIZE, C.PARAMETER_SIZE)
_call_attributes = attrgetter(
    "tid",
    "args.op_name",
    "args.provider",
    "args.input_type_shape",
    "args.output_type_shape",
    "args.output_size",
    "args.activation_size",
    "args.parameter_size",
)


@dataclass(frozen=True)
class Profile:
    """A parsed profile.

    Attributes:
        events: one row per kernel invocation, columns `tracker.columns.EVENT_COLUMNS`.
        runs: one row per inference run (`run`, `ts_us`, `dur_us` of ORT's `model_run` event).
        format: "fences" (older ORT with `_fence_before/_fence_after` events), "memory" (ORT with
            per-node memory fields) or "plain".
        truncated: the file was cut short and only its complete events were read.
        source: the file it came from.
    """

    events: pd.DataFrame
    runs: pd.DataFrame
    format: str
    truncated: bool
    source: str

    @property
    def run_count(self) -> int:
        return len(self.runs)


@dataclass(frozen=True)
class ProfileChunk:
    """The kernel invocations and runs read from one stretch of a profile's text.

    Attributes:
        events: one row per kernel invocation, columns `tracker.columns.EVENT_COLUMNS`, with `run` -1 in every
            row: ORT writes a run's `model_run` event after its kernels, so runs are numbered only once all are
            read (`parse_profile` does so).
        runs: `ts_us`, `dur_us` of the `model_run` events in this stretch, in file order.
        trace_events: the trace events of every category in this stretch.
        truncated: the file ends in this chunk, cut short.
    """

    events: pd.DataFrame
    runs: pd.DataFrame
    trace_events: int
    truncated: bool


def read_profile_bytes(path: str | Path) -> bytes:
    """Returns the JSON text of a profile file, decompressing it if it is gzip."""
    path = _checked_file(path)
    data = path.read_bytes()
    if data[:2] == _GZIP_MAGIC:
        # A corrupt deflate stream raises zlib.error, which is neither OSError nor EOFError.
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as e:
            raise ProfileFormatError(f"profile {str(path)!r} is a damaged gzip file: {e}") from e
    return data


def parse_profile(
    path: str | Path, *, stream_above_bytes: int = STREAM_ABOVE_BYTES, block_bytes: int = BLOCK_BYTES
) -> Profile:
    """Parses an ONNX Runtime profile file (JSON, or JSON compressed with gzip).

    Args:
        path: the file `InferenceSession.end_profiling()` wrote.
        stream_above_bytes: plain files of at least this size, and gzip files of any size, are read
            `block_bytes` of text at a time; smaller ones in one go. The result is the same.
        block_bytes: how much text to decode at a time when streaming.

    Returns:
        The kernel invocations and runs it holds.

    Raises:
        ProfileFormatError: the file is empty, not JSON, or JSON that is not an ORT trace.
    """
    source, path = str(path), _checked_file(path)
    if path.stat().st_size < stream_above_bytes and not _is_gzip(path):
        return parse_profile_bytes(read_profile_bytes(path), source=source)
    columns, truncated = _KernelColumns(), False
    with _gc_paused():
        for events, truncated in iter_event_batches(iter_blocks(path, block_bytes), source):
            columns.add(events)
        return columns.to_profile(truncated=truncated, source=source)


def parse_profile_bytes(data: bytes, *, source: str = "<bytes>") -> Profile:
    """Parses the JSON text of an ONNX Runtime profile. See `parse_profile`."""
    if not data or data.isspace():  # isspace() looks in place, where strip() would copy the whole text
        raise ProfileFormatError(empty_message(source))
    columns = _KernelColumns()
    with _gc_paused():
        events, truncated = decode_events(data, source)
        columns.add(events)
        del events  # before the table is built: the events and the text they point into are no longer needed
        return columns.to_profile(truncated=truncated, source=source)


def iter_profile_chunks(path: str | Path, *, chunk_bytes: int = 64 * 2**20) -> Iterator[ProfileChunk]:
    """Reads a profile file (JSON or gzip) a chunk at a time, for files too large to hold.

    Memory holds one chunk at a time, however large the file. Each chunk holds whole events; a truncated file
    ends with the complete events before the cut (and a warning), as in `parse_profile`.

    Args:
        path: the file `InferenceSession.end_profiling()` wrote.
        chunk_bytes: about how much of the file's JSON text each chunk covers (at least one event); 64 MiB
            is about 64,000 events.

    Raises:
        ProfileFormatError: as `parse_profile` (the check for ORT event categories aside), possibly after
            some chunks were yielded.
    """
    if chunk_bytes < 1:
        raise ValueError(f"chunk_bytes must be at least 1, got {chunk_bytes}")
    source, path = str(path), _checked_file(path)
    block_bytes = min(chunk_bytes, BLOCK_BYTES)
    batches = iter_event_batches(iter_blocks(path, block_bytes), source)
    blocks_per_chunk, seen = max(1, round(chunk_bytes / block_bytes)), 0
    while True:
        with _gc_paused():
            columns, truncated = _KernelColumns(), False
            for events, truncated in itertools.islice(batches, blocks_per_chunk):
                columns.add(events)
            if not columns.trace_events and not truncated:
                return
            seen += columns.trace_events
            if truncated:
                _warn_truncated(source, seen)
            windows = np.array(columns.run_windows, dtype=np.int64).reshape(-1, 2)
            runs = pd.DataFrame({C.TS_US: windows[:, 0], C.DUR_US: windows[:, 1]})
            chunk = ProfileChunk(columns.table(_runs_table([])), runs, columns.trace_events, truncated)
        yield chunk


def _checked_file(path: str | Path) -> Path:
    path = Path(path)
    if not path.is_file():
        raise ProfileFormatError(f"profile file {str(path)!r} does not exist or is not a file")
    return path


def _is_gzip(path: Path) -> bool:
    with path.open("rb") as file:
        return file.read(2) == _GZIP_MAGIC


@contextmanager
def _gc_paused() -> Iterator[None]:
    # Decoding makes millions of objects and no cycles: the cyclic GC would only walk them over and over.
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _warn_truncated(source: str, complete_events: int) -> None:
    logger.warning(
        "profile %r is truncated: read its %d complete events and dropped the rest", source, complete_events
    )


def _runs_table(windows: list[tuple[int, int]]) -> pd.DataFrame:
    ordered = np.array(sorted(windows), dtype=np.int64).reshape(-1, 2)
    return pd.DataFrame(
        {C.RUN: np.arange(len(ordered), dtype=np.int64), C.TS_US: ordered[:, 0], C.DUR_US: ordered[:, 1]}
    )


class _KernelColumns:
    """The kernel calls and `model_run` windows of a profile, gathered batch by batch of events.

    A string column holds a code per row: the position of its value among the column's distinct values, which
    (a few hundred node names, op types and shapes) are converted and stored once, by `table`.

    The calls of a node repeat its thread, op type, provider, shapes and sizes run after run: when every call in
    a batch matches its node's last call, the batch takes those columns from the node's last call, and no value
    is hashed or converted; other batches are encoded value by value.
    """

    def __init__(self) -> None:
        self.trace_events = 0
        self.ort_events = 0  # of category Session or Node
        self.has_fences = False
        self.has_memory = False
        self.run_windows: list[tuple[int, int]] = []
        self._rows = 0
        # The node names are those of every Node event (fences too): they tell which events are kernel calls.
        self._distinct: dict[str, dict] = {column: {} for column in _STRING_COLUMNS}
        self._is_kernel = np.zeros(0, dtype=bool)  # per distinct node name
        self._last_call: list[tuple | None] = []  # per distinct node name: `_call_attributes` of its last call
        self._last_row = np.zeros((0, len(_CALL_COLUMNS)), dtype=np.int64)  # and its `_CALL_COLUMNS`
        self._parts: dict[str, list[np.ndarray]] = {column: [] for column in C.EVENT_COLUMNS}
        self._mem_missing: list[np.ndarray] = []

    def add(self, events: list[AnyEvent]) -> None:
        self.trace_events += len(events)
        nodes = [e for e in events if e.cat == "Node"]
        sessions = [e for e in events if e.cat == "Session"]
        self.ort_events += len(nodes) + len(sessions)
        self.run_windows += [(e.ts, e.dur) for e in sessions if e.name == _RUN_EVENT]
        names = self._codes(C.NODE, map(attrgetter("name"), nodes))
        self._learn_names()
        is_kernel = self._is_kernel[names]
        kernels = list(itertools.compress(nodes, is_kernel))
        self._parts[C.NODE].append(names[is_kernel])
        for column, values in zip(_CALL_COLUMNS, self._call_columns(kernels, names[is_kernel]).T):
            self._parts[column].append(values)
        self._parts[C.TS_US].append(np.fromiter(map(attrgetter("ts"), kernels), dtype=np.int64))
        self._parts[C.DUR_US].append(np.fromiter(map(attrgetter("dur"), kernels), dtype=np.int64))
        mem = [e.args.mem_in_use_delta for e in kernels]  # None in profiles of ORT releases without memory fields
        missing = np.fromiter(map(operator.is_, mem, itertools.repeat(None)), dtype=bool, count=len(mem))
        self.has_memory = self.has_memory or not missing.all()
        self._mem_missing.append(missing)
        mem_values = (m or 0 for m in mem) if missing.any() else mem
        self._parts[C.MEM_IN_USE_DELTA].append(np.fromiter(mem_values, dtype=np.int64, count=len(mem)))
        self._rows += len(kernels)

    def _codes(self, column: str, values: Iterable) -> np.ndarray:
        distinct = self._distinct[column]  # value -> code, in order of first appearance
        return np.array([distinct.setdefault(value, len(distinct)) for value in values], dtype=np.int64)

    def _learn_names(self) -> None:
        new = list(itertools.islice(self._distinct[C.NODE], len(self._is_kernel), None))
        if new:
            self._is_kernel = np.append(self._is_kernel, [name.endswith(_KERNEL_SUFFIX) for name in new])
            self.has_fences = self.has_fences or any(name.endswith(_FENCE_SUFFIX) for name in new)
            self._last_call += [None] * len(new)
            self._last_row = np.vstack([self._last_row, np.zeros((len(new), len(_CALL_COLUMNS)), np.int64)])

    def _call_columns(self, kernels: list[AnyEvent], nodes: np.ndarray) -> np.ndarray:
        """The `_CALL_COLUMNS` of the kernel calls, one row per call."""
        calls = list(map(_call_attributes, kernels))
        nodes_list = nodes.tolist()
        if all(map(operator.eq, calls, map(self._last_call.__getitem__, nodes_list))):
            return self._last_row[nodes]
        tids, ops, providers, inputs, outputs, *sizes = zip(*calls)
        rows = np.column_stack(
            [
                self._codes(C.THREAD, tids),
                self._codes(C.OP_TYPE, ops),
                self._codes(C.PROVIDER, providers),
                self._codes(C.INPUT_SHAPES, map(bytes, inputs)),
                self._codes(C.OUTPUT_SHAPES, map(bytes, outputs)),
                *(np.array(values, dtype=np.int64) for values in sizes),
            ]
        )
        last = dict(zip(nodes_list, range(len(calls))))  # node -> its last call in the batch
        for node, i in last.items():
            # Copies of the shapes: msgspec.Raw points into the batch's text, which is not to outlive the batch.
            tid, op, provider, input_shapes, output_shapes, *call_sizes = calls[i]
            shapes = msgspec.Raw(bytes(input_shapes)), msgspec.Raw(bytes(output_shapes))
            self._last_call[node] = (tid, op, provider, *shapes, *call_sizes)
        self._last_row[list(last)] = rows[list(last.values())]
        return rows

    def to_profile(self, *, truncated: bool, source: str) -> Profile:
        if truncated:
            _warn_truncated(source, self.trace_events)
        if not self.ort_events:
            raise ProfileFormatError(
                f"{source!r} holds {self.trace_events} trace events but none of category 'Session' or 'Node'; "
                "it is not an ONNX Runtime profile"
            )
        runs = _runs_table(self.run_windows)
        fmt = "fences" if self.has_fences else ("memory" if self.has_memory else "plain")
        return Profile(events=self.table(runs), runs=runs, format=fmt, truncated=truncated, source=source)

    def table(self, runs: pd.DataFrame) -> pd.DataFrame:
        """The kernel rows, numbered by the runs whose windows hold them."""
        convert = {
            C.NODE: lambda name: name.removesuffix(_KERNEL_SUFFIX),
            C.THREAD: str,
            C.INPUT_SHAPES: bytes.decode,
            C.OUTPUT_SHAPES: bytes.decode,
        }
        data = {column: self._strings(column, convert.get(column)) for column in _STRING_COLUMNS}
        data |= {column: self._ints(column) for column in _INT_COLUMNS}
        data[C.RUN] = _run_index(data[C.TS_US], runs)
        data[C.MEM_IN_USE_DELTA] = pd.arrays.IntegerArray(self._ints(C.MEM_IN_USE_DELTA), self._missing())
        return pd.DataFrame(data, columns=list(C.EVENT_COLUMNS))

    def _ints(self, column: str) -> np.ndarray:
        # Popped: `table` is the last use, and the table is built column by column without a second copy.
        return np.concatenate(self._parts.pop(column) or [np.empty(0, dtype=np.int64)])

    def _missing(self) -> np.ndarray:
        return np.concatenate(self._mem_missing or [np.empty(0, dtype=bool)])

    def _strings(self, column: str, convert: Callable | None) -> pd.api.extensions.ExtensionArray | list:
        if not self._rows:
            return []  # what pandas makes of an empty list (float64 in pandas 3.1), as the table always had
        distinct = self._distinct[column]
        values = list(distinct) if convert is None else [convert(value) for value in distinct]
        # Index.take repeats each value's one string object (object dtype) or copies it into Arrow's buffer.
        return pd.Index(values).take(self._ints(column)).array


def _run_index(ts: np.ndarray, runs: pd.DataFrame) -> np.ndarray:
    """Index of the run whose [start, start + dur] window holds each timestamp, else -1."""
    if runs.empty:
        return np.full(len(ts), -1, dtype=np.int64)
    starts = runs[C.TS_US].to_numpy()
    ends = starts + runs[C.DUR_US].to_numpy()
    idx = np.searchsorted(starts, ts, side="right") - 1
    inside = (idx >= 0) & (ts <= ends[np.clip(idx, 0, None)])
    return np.where(inside, idx, -1).astype(np.int64)
