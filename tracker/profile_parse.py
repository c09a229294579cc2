"""Reads an ONNX Runtime profile (raw or gzip JSON trace) into one row per kernel invocation."""

from __future__ import annotations

import gc
import gzip
import logging
import zlib
from dataclasses import dataclass
from pathlib import Path

import msgspec
import numpy as np
import pandas as pd

from tracker import columns as C
from tracker.errors import ProfileFormatError

logger = logging.getLogger(__name__)

_KERNEL_SUFFIX = "_kernel_time"
_RUN_EVENT = "model_run"
_GZIP_MAGIC = b"\x1f\x8b"
# How many candidate cut points to try when recovering the complete events of a truncated file.
_MAX_RECOVERY_TRIES = 64


class _Args(msgspec.Struct):
    # Fields we do not keep (thread_scheduling_stats, node_index, mem_* but one) are skipped by the
    # decoder without being materialized; numeric values are strings in every ORT release.
    op_name: str = ""
    provider: str = ""
    input_type_shape: msgspec.Raw = msgspec.Raw(b"[]")
    output_type_shape: msgspec.Raw = msgspec.Raw(b"[]")
    output_size: str = "0"
    activation_size: str = "0"
    parameter_size: str = "0"
    mem_in_use_delta: str | None = None


class _Event(msgspec.Struct):
    cat: str
    name: str
    ts: int
    dur: int = 0
    ph: str = "X"
    tid: int | str = 0
    args: _Args = msgspec.field(default_factory=_Args)


_decoder = msgspec.json.Decoder(list[_Event])


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


def read_profile_bytes(path: str | Path) -> bytes:
    """Returns the JSON text of a profile file, decompressing it if it is gzip."""
    path = Path(path)
    if not path.is_file():
        raise ProfileFormatError(f"profile file {str(path)!r} does not exist or is not a file")
    data = path.read_bytes()
    if data[:2] == _GZIP_MAGIC:
        # A corrupt deflate stream raises zlib.error, which is neither OSError nor EOFError.
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as e:
            raise ProfileFormatError(f"profile {str(path)!r} is a damaged gzip file: {e}") from e
    return data


def parse_profile(path: str | Path) -> Profile:
    """Parses an ONNX Runtime profile file (JSON, or JSON compressed with gzip).

    Args:
        path: the file `InferenceSession.end_profiling()` wrote.

    Returns:
        The kernel invocations and runs it holds.

    Raises:
        ProfileFormatError: the file is empty, not JSON, or JSON that is not an ORT trace.
    """
    data = read_profile_bytes(path)
    return parse_profile_bytes(data, source=str(path))


def parse_profile_bytes(data: bytes, *, source: str = "<bytes>") -> Profile:
    """Parses the JSON text of an ONNX Runtime profile. See `parse_profile`."""
    if not data.strip():
        raise ProfileFormatError(f"profile {source!r} is empty; expected a JSON list of trace events")
    events, truncated = _decode(data, source)
    return _to_profile(events, truncated=truncated, source=source)


def _decode(data: bytes, source: str) -> tuple[list[_Event], bool]:
    # The cyclic GC would walk every decoded object many times over; nothing here makes cycles.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        try:
            return _decoder.decode(data), False
        except msgspec.ValidationError as e:
            raise ProfileFormatError(_foreign_message(source, e)) from e
        except msgspec.DecodeError as e:
            events = _recover_truncated(data)
            if events is None:
                raise ProfileFormatError(
                    f"profile {source!r} is not valid JSON ({e}); expected the JSON list of trace "
                    "events that onnxruntime writes with enable_profiling=True"
                ) from e
            logger.warning(
                "profile %r is truncated: read its %d complete events and dropped the rest",
                source,
                len(events),
            )
            return events, True
    finally:
        if gc_was_enabled:
            gc.enable()


def _foreign_message(source: str, error: Exception) -> str:
    return (
        f"{source!r} is JSON but not an ONNX Runtime profile ({error}); expected a list of trace "
        'events like {"cat": "Node", "name": "..._kernel_time", "ts": 0, "dur": 0, "args": {...}}'
    )


def _recover_truncated(data: bytes) -> list[_Event] | None:
    """Returns the complete events before the cut of a truncated list, or None if it is not one."""
    start = data.lstrip()[:1]
    if start != b"[":
        return None
    end = len(data)
    for _ in range(_MAX_RECOVERY_TRIES):
        end = data.rfind(b"}", 0, end)
        if end < 0:
            return None
        try:
            events = _decoder.decode(data[: end + 1] + b"]")
        except msgspec.ValidationError:
            return None
        except msgspec.DecodeError:
            continue
        return events
    return None


def _to_profile(events: list[_Event], *, truncated: bool, source: str) -> Profile:
    if not any(e.cat in ("Session", "Node") for e in events):
        raise ProfileFormatError(
            f"{source!r} holds {len(events)} trace events but none of category 'Session' or 'Node'; "
            "it is not an ONNX Runtime profile"
        )
    run_events = sorted((e.ts, e.dur) for e in events if e.cat == "Session" and e.name == _RUN_EVENT)
    runs = pd.DataFrame(
        {
            C.RUN: np.arange(len(run_events), dtype=np.int64),
            C.TS_US: np.array([ts for ts, _ in run_events], dtype=np.int64),
            C.DUR_US: np.array([dur for _, dur in run_events], dtype=np.int64),
        }
    )
    kernels = [e for e in events if e.cat == "Node" and e.name.endswith(_KERNEL_SUFFIX)]
    has_fences = any(e.cat == "Node" and e.name.endswith("_fence_before") for e in events)
    has_memory = any(e.args.mem_in_use_delta is not None for e in kernels)
    fmt = "fences" if has_fences else ("memory" if has_memory else "plain")
    table = _kernel_table(kernels, runs)
    return Profile(events=table, runs=runs, format=fmt, truncated=truncated, source=source)


def _kernel_table(kernels: list[_Event], runs: pd.DataFrame) -> pd.DataFrame:
    n = len(kernels)
    ts = np.fromiter((e.ts for e in kernels), dtype=np.int64, count=n)
    cut = len(_KERNEL_SUFFIX)
    mem = [e.args.mem_in_use_delta for e in kernels]
    table = pd.DataFrame(
        {
            C.OP_TYPE: [e.args.op_name for e in kernels],
            C.NODE: [e.name[:-cut] for e in kernels],
            C.PROVIDER: [e.args.provider for e in kernels],
            C.RUN: _run_index(ts, runs),
            C.DUR_US: np.fromiter((e.dur for e in kernels), dtype=np.int64, count=n),
            C.TS_US: ts,
            C.THREAD: [str(e.tid) for e in kernels],
            C.INPUT_SHAPES: [bytes(e.args.input_type_shape).decode() for e in kernels],
            C.OUTPUT_SHAPES: [bytes(e.args.output_type_shape).decode() for e in kernels],
            C.OUTPUT_SIZE: np.array([int(e.args.output_size) for e in kernels], dtype=np.int64),
            C.ACTIVATION_SIZE: np.array([int(e.args.activation_size) for e in kernels], dtype=np.int64),
            C.PARAMETER_SIZE: np.array([int(e.args.parameter_size) for e in kernels], dtype=np.int64),
            C.MEM_IN_USE_DELTA: pd.array([None if m is None else int(m) for m in mem], dtype="Int64"),
        },
        columns=list(C.EVENT_COLUMNS),
    )
    return table


def _run_index(ts: np.ndarray, runs: pd.DataFrame) -> np.ndarray:
    """Index of the run whose [start, start + dur] window holds each timestamp, else -1."""
    if runs.empty:
        return np.full(len(ts), -1, dtype=np.int64)
    starts = runs[C.TS_US].to_numpy()
    ends = starts + runs[C.DUR_US].to_numpy()
    idx = np.searchsorted(starts, ts, side="right") - 1
    inside = (idx >= 0) & (ts <= ends[np.clip(idx, 0, None)])
    return np.where(inside, idx, -1).astype(np.int64)
