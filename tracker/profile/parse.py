"""Reads an ONNX Runtime profile (raw or gzip JSON trace) into one row per kernel invocation."""

from __future__ import annotations

import gc
import gzip
import itertools
import logging
import os
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from tracker.base.errors import ProfileFormatError
from tracker.profile import columns as C
from tracker.profile.events import decode_events, empty_message
from tracker.profile.kernels import KernelColumns, gather
from tracker.profile.stream import event_commas, iter_blocks, iter_event_batches, iter_mapped_batches
from tracker.profile.table import events_table, runs_table
from tracker.profile.worker import Worker

logger = logging.getLogger(__name__)

_GZIP_MAGIC = b"\x1f\x8b"
# parse_profile reads plain files from this size on, and every gzip file, a block of text at a time: the result is
# the same, and memory holds the table and one block's events instead of the whole text and all its events. It is
# also faster from a few MB on (fewer fresh pages to fault in).
STREAM_ABOVE_BYTES = 4 * 2**20
# Text decoded at a time: larger blocks cost more page faults than they save in per-block work (measured: 4 MiB
# blocks spend ~0.5 s more than 1 MiB ones on a 540 MB profile).
BLOCK_BYTES = 2**20
# By default a plain file gets one process per this much text (the first stretch is read in this one), up to
# the CPUs this process may use and MAX_WORKERS.
WORKER_BYTES = 128 * 2**20
MAX_WORKERS = 4
# A worker is up (python, numpy, msgspec) and has handed back its columns ~0.2 s later than if it had started
# at once: about this much text. The first stretch, read here while the workers start, is longer by as much
# (by less in small files).
_WORKER_START_BYTES = 48 * 2**20


@dataclass(frozen=True)
class Profile:
    """A parsed profile.

    Attributes:
        events: one row per kernel invocation, columns `tracker.profile.columns.EVENT_COLUMNS`. Those of repeated
            strings (op type, node, provider, thread, shapes) are categorical, their categories in lexical order.
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
        events: one row per kernel invocation, columns `tracker.profile.columns.EVENT_COLUMNS`, with `run` -1 in every
            row: ORT writes a run's `model_run` event after its kernels, so runs are numbered only once all are
            read (`parse_profile` does so). Each chunk has its own categories: `pd.concat` of chunks gives
            plain strings (or use `pandas.api.types.union_categoricals`).
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
    path: str | Path,
    *,
    stream_above_bytes: int = STREAM_ABOVE_BYTES,
    block_bytes: int = BLOCK_BYTES,
    workers: int | None = None,
) -> Profile:
    """Parses an ONNX Runtime profile file (JSON, or JSON compressed with gzip).

    Args:
        path: the file `InferenceSession.end_profiling()` wrote.
        stream_above_bytes: plain files of at least this size, and gzip files of any size, are read
            `block_bytes` of text at a time; smaller ones in one go. The result is the same.
        block_bytes: how much text to decode at a time when streaming.
        workers: how many processes read a plain file that is streamed: this one reads the first stretch of
            its text and `workers - 1` worker processes the others, at the same time. None: one per
            `WORKER_BYTES` of text, up to the CPUs this process may use and `MAX_WORKERS`. The result is the
            same; a file whose stretches do not decode as lists of events (not one event per line) is read
            again in this process alone.

    Returns:
        The kernel invocations and runs it holds.

    Raises:
        ProfileFormatError: the file is empty, not JSON, or JSON that is not an ORT trace.
    """
    if workers is not None and workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    source, path = str(path), _checked_file(path)
    size, gzipped = path.stat().st_size, _is_gzip(path)
    if gzipped:
        workers = 1  # a gzip stream can only be read from its start
    elif size < stream_above_bytes:
        return parse_profile_bytes(read_profile_bytes(path), source=source)
    if workers is None:
        workers = min(len(os.sched_getaffinity(0)), MAX_WORKERS, max(1, size // WORKER_BYTES))
    with _gc_paused():
        if workers > 1:
            columns, truncated = _gather_in_stretches(path, size, workers, block_bytes)
            if columns is not None:
                return _profile(columns, truncated=truncated, source=source)
        columns, truncated = gather(_event_batches(path, source, block_bytes, gzipped=gzipped))
        return _profile(columns, truncated=truncated, source=source)


def parse_profile_bytes(data: bytes, *, source: str = "<bytes>") -> Profile:
    """Parses the JSON text of an ONNX Runtime profile. See `parse_profile`."""
    if not data or data.isspace():  # isspace() looks in place, where strip() would copy the whole text
        raise ProfileFormatError(empty_message(source))
    columns = KernelColumns()
    with _gc_paused():
        events, truncated = decode_events(data, source)
        columns.add(events)
        del events  # before the table is built: the events and the text they point into are no longer needed
        return _profile(columns, truncated=truncated, source=source)


def _gather_in_stretches(path: Path, size: int, workers: int, block_bytes: int) -> tuple[KernelColumns | None, bool]:
    """Reads the file's first stretch here while worker processes read the others; merges what they gathered.

    Returns:
        The columns of the whole file and whether it was cut short, or None if some stretch did not decode as
        a list of events or a worker could not run (then the caller reads the file in one stream, which also
        says what is wrong with a file that is not a profile).
    """
    head_start = min(_WORKER_START_BYTES, size // (2 * workers))
    stretch = (size - head_start) // workers  # a worker's; the first is longer by the head start
    first = size - stretch * (workers - 1)
    bounds = [0, *event_commas(path, [first + stretch * i for i in range(workers - 1)]), size]
    starts = [0] + [comma + 1 for comma in bounds[1:-1]]  # a stretch starts after the comma, ends before it
    running = _start_workers(path, list(zip(starts[1:], bounds[2:])), block_bytes)
    if running is None:
        return None, False
    try:
        try:
            columns, truncated = gather(iter_mapped_batches(path, str(path), block_bytes, stop=bounds[1]))
        except ProfileFormatError as e:
            logger.debug("reading %s in one stream: its first stretch is not a list of events (%s)", path, e)
            return None, False
        for worker in running:
            result = worker.result()
            if result.columns is None or truncated:  # only the last stretch may be cut short
                logger.debug("reading %s in one stream: a stretch is not a list of events (%s)", path, result.error)
                return None, False
            columns.merge(result.columns)
            truncated = result.truncated
        return columns, truncated
    finally:
        for worker in running:
            worker.stop()


def _start_workers(path: Path, stretches: list[tuple[int, int]], block_bytes: int) -> list[Worker] | None:
    """A worker per stretch, or None (and none left running) if one could not be started."""
    started: list[Worker] = []
    try:
        for start, stop in stretches:
            started.append(Worker(path, start, stop, block_bytes))
    except OSError as e:  # no interpreter to start (an embedded Python), no processes left...
        logger.debug("reading %s in one stream: could not start a worker (%s)", path, e)
        for worker in started:
            worker.stop()
        return None
    return started


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
    batches = _event_batches(path, source, block_bytes, gzipped=_is_gzip(path))
    blocks_per_chunk, seen = max(1, round(chunk_bytes / block_bytes)), 0
    while True:
        with _gc_paused():
            columns, truncated = KernelColumns(), False
            for events, truncated in itertools.islice(batches, blocks_per_chunk):  # noqa: B007 (the last batch's)
                columns.add(events)
            if not columns.trace_events and not truncated:
                return
            seen += columns.trace_events
            if truncated:
                _warn_truncated(source, seen)
            windows = np.array(columns.run_windows, dtype=np.int64).reshape(-1, 2)
            runs = pd.DataFrame({C.TS_US: windows[:, 0], C.DUR_US: windows[:, 1]})
            chunk = ProfileChunk(events_table(columns, runs_table([]), source), runs, columns.trace_events, truncated)
        yield chunk


def _event_batches(path: Path, source: str, block_bytes: int, *, gzipped: bool) -> Iterator[tuple[list, bool]]:
    """The file's events, batch by batch: a plain file decoded where it is mapped, a gzip one as a stream."""
    if gzipped:
        return iter_event_batches(iter_blocks(path, block_bytes), source)
    return iter_mapped_batches(path, source, block_bytes)


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
    logger.warning("profile %r is truncated: read its %d complete events and dropped the rest", source, complete_events)


def _profile(columns: KernelColumns, *, truncated: bool, source: str) -> Profile:
    if truncated:
        _warn_truncated(source, columns.trace_events)
    if not columns.ort_events:
        raise ProfileFormatError(
            f"{source!r} holds {columns.trace_events} trace events but none of category 'Session' or 'Node'; "
            "it is not an ONNX Runtime profile"
        )
    runs = runs_table(columns.run_windows)
    fmt = "fences" if columns.has_fences else ("memory" if columns.has_memory else "plain")
    return Profile(events=events_table(columns, runs, source), runs=runs, format=fmt, truncated=truncated, source=source)
