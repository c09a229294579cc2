"""Gathers the kernel calls of decoded trace events into columns of numbers; imports no pandas.

`tracker.profile.parse` turns the columns into a table; `tracker.profile.worker` gathers a stretch of a file in a
process of its own and hands its columns back to be merged.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Iterable
from dataclasses import dataclass
from operator import attrgetter

import msgspec
import numpy as np

from tracker.profile import columns as C
from tracker.profile.events import AnyEvent, Args

KERNEL_SUFFIX = "_kernel_time"
_FENCE_SUFFIX = "_fence_before"
_RUN_EVENT = "model_run"

# Columns of repeated strings, and of numbers.
STRING_COLUMNS = C.LABEL_COLUMNS
INT_COLUMNS = (C.DUR_US, C.TS_US, C.OUTPUT_SIZE, C.ACTIVATION_SIZE, C.PARAMETER_SIZE)
# What the kernel calls of a node repeat from run to run (string columns first), and where an event holds them.
_CALL_COLUMNS: tuple[str, ...] = (C.THREAD, C.OP_TYPE, C.PROVIDER, C.INPUT_SHAPES, C.OUTPUT_SHAPES)
_CALL_COLUMNS += (C.OUTPUT_SIZE, C.ACTIVATION_SIZE, C.PARAMETER_SIZE)
_arg_attributes = attrgetter(
    "op_name", "provider", "input_type_shape", "output_type_shape", "output_size", "activation_size", "parameter_size"
)
_SHAPE_FIELDS = ("input_type_shape", "output_type_shape")
_GATHERED = (C.NODE, *_CALL_COLUMNS, C.TS_US, C.DUR_US, C.MEM_IN_USE_DELTA)
_args, _tid, _name = attrgetter("args"), attrgetter("tid"), attrgetter("name")


def _call(tid: int | str | None, args: Args | None) -> tuple | None:
    """What a kernel call repeats from run to run but its memory field: its tid and `_arg_attributes`."""
    return None if args is None else (tid, *_arg_attributes(args))


@dataclass
class GatheredColumns:
    """What `KernelColumns` gathered, in a form that pickles: what a worker process hands back.

    Attributes:
        codes: per column of `STRING_COLUMNS`, one code per kernel call: a position in `distinct[column]`.
        distinct: per column of `STRING_COLUMNS`, its distinct values (str, or bytes for shapes).
        numbers: per column of `INT_COLUMNS` and `C.MEM_IN_USE_DELTA`, one int64 per kernel call.
        mem_missing: per kernel call, whether its event had no memory field.
        run_windows: (ts, dur) of each `model_run` event, in file order.
    """

    codes: dict[str, np.ndarray]
    distinct: dict[str, list]
    numbers: dict[str, np.ndarray]
    mem_missing: np.ndarray
    run_windows: list[tuple[int, int]]
    trace_events: int
    ort_events: int
    has_fences: bool
    has_memory: bool


class KernelColumns:
    """The kernel calls and `model_run` windows of a profile, gathered batch by batch of events.

    A string column holds a code per row: the position of its value among the column's distinct values, which
    (a few hundred node names, op types and shapes) are converted and stored once, when the table is built.

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
        self.rows = 0
        # The node names are those of every Node event (fences too): they tell which events are kernel calls.
        self.distinct: dict[str, dict] = {column: {} for column in STRING_COLUMNS}
        self._is_kernel = np.zeros(0, dtype=bool)  # per distinct node name
        # Per distinct node name, its last call: its Args (memory field and all) and tid.
        self._last_args: list[Args | None] = []
        self._last_tid: list[int | str | None] = []
        self._last_row = np.zeros((0, len(_CALL_COLUMNS)), dtype=np.int64)  # and its `_CALL_COLUMNS`
        self._parts: dict[str, list[np.ndarray]] = {column: [] for column in _GATHERED}
        self._mem_missing: list[np.ndarray] = []

    def add(self, events: list[AnyEvent]) -> None:
        self.trace_events += len(events)
        nodes = [e for e in events if e.cat == "Node"]
        sessions = [e for e in events if e.cat == "Session"]
        self.ort_events += len(nodes) + len(sessions)
        self.run_windows += [(e.ts, e.dur) for e in sessions if e.name == _RUN_EVENT]
        names = self._codes(C.NODE, list(map(_name, nodes)))
        self._learn_names()
        is_kernel = self._is_kernel[names]
        kernels = list(itertools.compress(nodes, is_kernel))
        args = list(map(_args, kernels))
        self._parts[C.NODE].append(names[is_kernel])
        for column, values in zip(_CALL_COLUMNS, self._call_columns(kernels, args, names[is_kernel]).T):
            self._parts[column].append(values)
        self._parts[C.TS_US].append(np.fromiter(map(attrgetter("ts"), kernels), dtype=np.int64))
        self._parts[C.DUR_US].append(np.fromiter(map(attrgetter("dur"), kernels), dtype=np.int64))
        mem = [a.mem_in_use_delta for a in args]  # None in profiles of ORT releases without memory fields
        missing = np.fromiter(map(operator.is_, mem, itertools.repeat(None)), dtype=bool, count=len(mem))
        self.has_memory = self.has_memory or not missing.all()
        self._mem_missing.append(missing)
        mem_values = (m or 0 for m in mem) if missing.any() else mem
        self._parts[C.MEM_IN_USE_DELTA].append(np.fromiter(mem_values, dtype=np.int64, count=len(mem)))
        self.rows += len(kernels)

    def _codes(self, column: str, values: list) -> np.ndarray:
        distinct = self.distinct[column]  # value -> code, in order of first appearance
        try:
            return np.fromiter(map(distinct.__getitem__, values), dtype=np.int64, count=len(values))
        except KeyError:  # a value not seen before
            return np.array([distinct.setdefault(value, len(distinct)) for value in values], dtype=np.int64)

    def _learn_names(self) -> None:
        new = list(itertools.islice(self.distinct[C.NODE], len(self._is_kernel), None))
        if new:
            self._is_kernel = np.append(self._is_kernel, [name.endswith(KERNEL_SUFFIX) for name in new])
            self.has_fences = self.has_fences or any(name.endswith(_FENCE_SUFFIX) for name in new)
            self._last_args += [None] * len(new)
            self._last_tid += [None] * len(new)
            self._last_row = np.vstack([self._last_row, np.zeros((len(new), len(_CALL_COLUMNS)), np.int64)])

    def _call_columns(self, kernels: list[AnyEvent], args: list[Args], nodes: np.ndarray) -> np.ndarray:
        """The `_CALL_COLUMNS` of the kernel calls, one row per call."""
        nodes_list = nodes.tolist()
        tids = list(map(_tid, kernels))
        # Is every call its node's last one again, memory field and all? (Lists of Args compare in C.)
        last_args = list(map(self._last_args.__getitem__, nodes_list))
        last_tids = list(map(self._last_tid.__getitem__, nodes_list))
        if args == last_args and tids == last_tids:
            return self._last_row[nodes]
        calls = list(map(_call, tids, args))
        # Or its node's last one but for the memory field (which may change from run to run)?
        same_but_memory = calls == list(map(_call, last_tids, last_args))
        last = dict(zip(nodes_list, range(len(calls))))  # node -> its last call in the batch
        for node, i in last.items():
            if args[i] != self._last_args[node] or tids[i] != self._last_tid[node]:
                # Copies of the shapes: msgspec.Raw points into the batch's text, which is not to outlive the batch.
                shapes = {field: msgspec.Raw(bytes(getattr(args[i], field))) for field in _SHAPE_FIELDS}
                self._last_args[node] = msgspec.structs.replace(args[i], **shapes)
                self._last_tid[node] = tids[i]
        if same_but_memory:
            return self._last_row[nodes]
        _, ops, providers, inputs, outputs, *sizes = zip(*calls)
        rows = np.column_stack(
            [
                self._codes(C.THREAD, tids),
                self._codes(C.OP_TYPE, list(ops)),
                self._codes(C.PROVIDER, list(providers)),
                self._codes(C.INPUT_SHAPES, list(map(bytes, inputs))),
                self._codes(C.OUTPUT_SHAPES, list(map(bytes, outputs))),
                *(np.array(values, dtype=np.int64) for values in sizes),
            ]
        )
        self._last_row[list(last)] = rows[list(last.values())]
        return rows

    def gathered(self) -> GatheredColumns:
        """The columns gathered so far, each in one array; the parts are let go (this is their last use)."""
        parts, self._parts = self._parts, {column: [] for column in _GATHERED}
        return GatheredColumns(
            codes={column: _concatenated(parts.pop(column)) for column in STRING_COLUMNS},
            distinct={column: list(values) for column, values in self.distinct.items()},
            numbers={column: _concatenated(parts.pop(column)) for column in (*INT_COLUMNS, C.MEM_IN_USE_DELTA)},
            mem_missing=_concatenated(self._mem_missing, dtype=bool),
            run_windows=self.run_windows,
            trace_events=self.trace_events,
            ort_events=self.ort_events,
            has_fences=self.has_fences,
            has_memory=self.has_memory,
        )

    def merge(self, other: GatheredColumns) -> None:
        """Appends the calls another `KernelColumns` gathered from the text that follows this one's."""
        for column in STRING_COLUMNS:
            distinct = self.distinct[column]
            recode = np.array([distinct.setdefault(value, len(distinct)) for value in other.distinct[column]])
            self._parts[column].append(recode.astype(np.int64)[other.codes[column]])
        self._learn_names()
        for column, values in other.numbers.items():
            self._parts[column].append(values)
        self._mem_missing.append(other.mem_missing)
        self.run_windows += other.run_windows
        self.rows += len(other.mem_missing)
        self.trace_events += other.trace_events
        self.ort_events += other.ort_events
        self.has_fences = self.has_fences or other.has_fences
        self.has_memory = self.has_memory or other.has_memory


def _concatenated(parts: list[np.ndarray], dtype: type = np.int64) -> np.ndarray:
    return np.concatenate(parts) if parts else np.empty(0, dtype=dtype)


def gather(batches: Iterable[tuple[list[AnyEvent], bool]]) -> tuple[KernelColumns, bool]:
    """Gathers the kernel calls of batches of events (`tracker.profile.stream`); True if the text was cut short.

    Raises:
        ProfileFormatError: as the batches do.
    """
    columns, truncated = KernelColumns(), False
    for events, truncated in batches:  # noqa: B007 (the last batch's flag is the answer)
        columns.add(events)
    return columns, truncated
