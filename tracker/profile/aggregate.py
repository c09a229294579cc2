"""Per-op views of a kernel-invocation table: time, calls and share per key, and attempt-vs-baseline."""

from __future__ import annotations

import re
from typing import Literal

import numpy as np
import pandas as pd

from tracker.profile import columns as C

By = Literal["op", "node", "provider", "layer"]
_BY_COLUMN = {"op": C.OP_TYPE, "node": C.NODE, "provider": C.PROVIDER, "layer": C.NODE}
NO_LAYER = "(outside layers)"
# Transformer block names in exported node names: "/transformer/h.3/attn/MatMul" (torch exports),
# "model.layers.3.mlp", "blocks_3_..."; the first match wins.
_LAYER = re.compile(r"(?:^|[^A-Za-z0-9])(?:h|layers?|blocks?)[._/](\d+)(?=$|[^0-9])")


def layer_of(node_name: str) -> str:
    """The transformer block a node belongs to, from its name ("layer.03"), or NO_LAYER."""
    match = _LAYER.search(node_name)
    return f"layer.{int(match.group(1)):02d}" if match else NO_LAYER


def keep_runs(events: pd.DataFrame, *, skip_runs: int = 0) -> pd.DataFrame:
    """Drops the first `skip_runs` runs (warm-up) and invocations outside any run.

    Raises:
        ValueError: `skip_runs` is negative or leaves no run.
    """
    if skip_runs < 0:
        raise ValueError(f"skip_runs must be >= 0, got {skip_runs}")
    kept = events[events[C.RUN] >= skip_runs]
    if kept.empty and not events.empty:
        n_runs = int(events[C.RUN].max()) + 1
        raise ValueError(f"skip_runs={skip_runs} leaves no run: the profile holds {n_runs} run(s)")
    return kept


def summarize(events: pd.DataFrame, *, by: By = "op", skip_runs: int = 0) -> pd.DataFrame:
    """Total time, calls, share of kernel time and spread across runs per op type, node or provider.

    Args:
        events: one row per kernel invocation (`tracker.profile.columns.EVENT_COLUMNS`).
        by: "op" (ONNX op type), "node" (node name), "provider" (execution provider) or "layer"
            (transformer block, from node names; see `layer_of`).
        skip_runs: leading runs to leave out, e.g. 1 to drop the slow first run.

    Returns:
        One row per key, columns `tracker.profile.columns.SUMMARY_COLUMNS`, sorted by total time descending.
    """
    if by not in _BY_COLUMN:
        raise ValueError(f"by must be one of {sorted(_BY_COLUMN)}, got {by!r}")
    kept = keep_runs(events, skip_runs=skip_runs)
    column = "_key"
    keys = kept[_BY_COLUMN[by]]
    kept = kept.assign(_key=keys.map(layer_of) if by == "layer" else keys)
    if kept.empty:
        return pd.DataFrame({c: pd.Series(dtype=_summary_dtype(c)) for c in C.SUMMARY_COLUMNS})
    n_runs = kept[C.RUN].nunique()
    grouped = kept.groupby(column, sort=False)[C.DUR_US]
    summary = pd.DataFrame({C.TOTAL_US: grouped.sum(), C.CALLS: grouped.size()})
    total_us = summary[C.TOTAL_US].sum()
    # Kernels that all took 0 µs (a clock too coarse for them) have no share to split: each gets 0 %, not NaN.
    summary[C.PCT] = 100.0 * summary[C.TOTAL_US] / total_us if total_us else 0.0
    summary[C.US_PER_RUN] = summary[C.TOTAL_US] / n_runs
    summary[C.CALLS_PER_RUN] = summary[C.CALLS] / n_runs
    summary[C.MEAN_US] = summary[C.TOTAL_US] / summary[C.CALLS]
    # A key absent from a run spent 0 µs in it: fill before taking the spread.
    per_run = kept.pivot_table(index=column, columns=C.RUN, values=C.DUR_US, aggfunc="sum", fill_value=0)
    per_run = per_run.reindex(summary.index)
    summary[C.RUN_MEAN_US] = per_run.mean(axis=1)
    summary[C.RUN_STD_US] = per_run.std(axis=1, ddof=0)
    summary[C.RUN_MIN_US] = per_run.min(axis=1)
    summary[C.RUN_MAX_US] = per_run.max(axis=1)
    summary = summary.rename_axis(C.KEY).reset_index()
    summary[C.KEY] = summary[C.KEY].astype(str)  # a key of the events' categorical columns: a string of its own
    summary = summary.sort_values([C.TOTAL_US, C.KEY], ascending=[False, True], ignore_index=True)
    return summary[list(C.SUMMARY_COLUMNS)]


def _summary_dtype(column: str) -> str:
    return {C.KEY: "object", C.TOTAL_US: "int64", C.CALLS: "int64"}.get(column, "float64")


def top_n(summary: pd.DataFrame, n: int, *, other: str = "(other)") -> pd.DataFrame:
    """Keeps the `n` largest rows of a summary and folds the rest into one row named `other`."""
    if n < 1:
        raise ValueError(f"top must be >= 1, got {n}")
    if len(summary) <= n:
        return summary
    head, rest = summary.iloc[:n], summary.iloc[n:]
    summed = (C.TOTAL_US, C.CALLS, C.PCT, C.US_PER_RUN, C.CALLS_PER_RUN, C.RUN_MEAN_US)
    sums = {c: rest[c].sum() for c in summed}
    folded: dict[str, float | str] = {**sums, C.KEY: f"{other} x{len(rest)}"}
    folded[C.MEAN_US] = sums[C.TOTAL_US] / sums[C.CALLS]
    for c in (C.RUN_STD_US, C.RUN_MIN_US, C.RUN_MAX_US):
        folded[c] = np.nan
    return pd.concat([head, pd.DataFrame([folded])], ignore_index=True)[list(C.SUMMARY_COLUMNS)]


def diff_summaries(baseline: pd.DataFrame, attempt: pd.DataFrame) -> pd.DataFrame:
    """Per-key time and call deltas of an attempt against a baseline, normalized per run.

    Keys only in the attempt have status "added", keys only in the baseline "removed".

    Returns:
        Columns `tracker.profile.columns.DIFF_COLUMNS`, sorted by the time delta (largest gain first).
    """
    per_run = [C.US_PER_RUN, C.CALLS_PER_RUN]
    b = baseline.set_index(C.KEY)[per_run].add_suffix("_b")
    a = attempt.set_index(C.KEY)[per_run].add_suffix("_a")
    merged = b.join(a, how="outer")
    diff = pd.DataFrame(index=merged.index)
    diff[C.BASE_US_PER_RUN] = merged[f"{C.US_PER_RUN}_b"].fillna(0.0)
    diff[C.ATTEMPT_US_PER_RUN] = merged[f"{C.US_PER_RUN}_a"].fillna(0.0)
    diff[C.DELTA_US_PER_RUN] = diff[C.ATTEMPT_US_PER_RUN] - diff[C.BASE_US_PER_RUN]
    diff[C.BASE_CALLS_PER_RUN] = merged[f"{C.CALLS_PER_RUN}_b"].fillna(0.0)
    diff[C.ATTEMPT_CALLS_PER_RUN] = merged[f"{C.CALLS_PER_RUN}_a"].fillna(0.0)
    diff[C.DELTA_CALLS_PER_RUN] = diff[C.ATTEMPT_CALLS_PER_RUN] - diff[C.BASE_CALLS_PER_RUN]
    in_b = merged[f"{C.US_PER_RUN}_b"].notna()
    in_a = merged[f"{C.US_PER_RUN}_a"].notna()
    diff[C.STATUS] = np.select([in_b & in_a, in_a], ["both", "added"], default="removed")
    diff = diff.rename_axis(C.KEY).reset_index()
    diff = diff.sort_values([C.DELTA_US_PER_RUN, C.KEY], ignore_index=True)
    return diff[list(C.DIFF_COLUMNS)]

