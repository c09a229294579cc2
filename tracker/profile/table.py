"""The events table of a profile: the kernel columns gathered from its events, as one row per kernel call."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from tracker.base.errors import ProfileFormatError
from tracker.profile import columns as C
from tracker.profile.kernels import INT_COLUMNS, KERNEL_SUFFIX, STRING_COLUMNS, KernelColumns


def runs_table(windows: list[tuple[int, int]]) -> pd.DataFrame:
    """One row per inference run (`run`, `ts_us`, `dur_us`), numbered in the order they started."""
    ordered = np.array(sorted(windows), dtype=np.int64).reshape(-1, 2)
    return pd.DataFrame(
        {C.RUN: np.arange(len(ordered), dtype=np.int64), C.TS_US: ordered[:, 0], C.DUR_US: ordered[:, 1]}
    )


def events_table(columns: KernelColumns, runs: pd.DataFrame, source: str) -> pd.DataFrame:
    """The kernel rows, numbered by the runs whose windows hold them."""
    gathered = columns.gathered()
    convert: dict[str, Callable[[Any], str]] = {
        C.NODE: lambda name: name.removesuffix(KERNEL_SUFFIX),
        C.THREAD: str,
        C.INPUT_SHAPES: bytes.decode,
        C.OUTPUT_SHAPES: bytes.decode,
    }
    data: dict[str, pd.Categorical | list | np.ndarray | pd.arrays.IntegerArray] = {}
    for column in STRING_COLUMNS:
        data[column] = _strings(gathered.distinct[column], gathered.codes.pop(column), convert.get(column))
    numbers = {column: gathered.numbers.pop(column) for column in INT_COLUMNS}
    data |= numbers
    # Each duration fits in int64 (`events` bounds it), but their sum, which every summary takes, may not.
    if numbers[C.DUR_US].sum(dtype=np.float64) >= 2**63:
        raise ProfileFormatError(
            f"the kernel durations of profile {source!r} add up to more than 2**63 microseconds; expected durations "
            "of real kernel calls, which add up to the profiled time"
        )
    data[C.RUN] = _run_index(numbers[C.TS_US], runs)
    data[C.MEM_IN_USE_DELTA] = pd.arrays.IntegerArray(gathered.numbers.pop(C.MEM_IN_USE_DELTA), gathered.mem_missing)
    return pd.DataFrame(data, columns=list(C.EVENT_COLUMNS))


def _strings(distinct: list, codes: np.ndarray, convert: Callable | None) -> pd.Categorical | list:
    """A column of a few hundred distinct strings as a Categorical: its values in lexical order, and a code per row.

    Only the values some row holds are categories (not the names of fences, say), so `value_counts` and the
    like list no strangers; their lexical order makes sorting by the column sort by its text.
    """
    if not len(codes):
        return []  # what pandas makes of an empty list (float64 in pandas 3.1), as the table always had
    present = np.flatnonzero(np.bincount(codes, minlength=len(distinct)))
    values = [distinct[i] if convert is None else convert(distinct[i]) for i in present]
    categories = sorted(set(values))  # a tid may be read as 7 in one event and "7" in another
    position = {value: i for i, value in enumerate(categories)}
    recode = np.full(len(distinct), -1, dtype=np.int64)
    recode[present] = [position[value] for value in values]
    return pd.Categorical.from_codes(recode[codes], categories=pd.Index(categories, dtype="str"))


def _run_index(ts: np.ndarray, runs: pd.DataFrame) -> np.ndarray:
    """Index of the run whose [start, start + dur] window holds each timestamp, else -1."""
    if runs.empty:
        return np.full(len(ts), -1, dtype=np.int64)
    starts = runs[C.TS_US].to_numpy()
    ends = starts + runs[C.DUR_US].to_numpy()
    idx = np.searchsorted(starts, ts, side="right") - 1
    inside = (idx >= 0) & (ts <= ends[np.clip(idx, 0, None)])
    return np.where(inside, idx, -1).astype(np.int64)
