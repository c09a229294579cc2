"""Where an attempt's kernel time goes against the machine's limits: per op type the achieved GFLOP/s, GB/s,
arithmetic intensity and share of the roof that applies at that intensity, from a profile's kernel calls and
their FLOPs and bytes (`tracker.measure.kernel_costs`, where the counting conventions are)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from tracker.keys import metric_keys
from tracker.measure.kernel_costs import kernel_costs
from tracker.profile import aggregate
from tracker.profile import columns as C

if TYPE_CHECKING:
    from tracker.measure.machine import MachinePeaks

# Columns of the roofline table (one row per op type).
OP_TYPE = C.OP_TYPE
US_PER_RUN = "us_per_run"
TIME_PCT = "time_pct"  # share of the kernel time
CALLS_PER_RUN = "calls_per_run"
GFLOP_PER_RUN = "gflop_per_run"
MB_PER_RUN = "mb_per_run"  # 1e6 bytes
GFLOPS = "gflops"  # achieved, over the calls whose FLOPs are known
GBPS = "gbps"
INTENSITY = "flop_per_byte"
ROOF_GFLOPS = "roof_gflops"  # min(peak, bandwidth x intensity)
PCT_PEAK = "pct_peak"  # achieved / roof at its intensity, in percent
PCT_BANDWIDTH = "pct_bandwidth"  # achieved GB/s / measured bandwidth, in percent
BOUND = "bound"  # "memory" (intensity below the ridge) or "compute"
COVERED_CALLS_PCT = "covered_calls_pct"  # calls whose FLOPs are known
ROOFLINE_COLUMNS = (OP_TYPE, US_PER_RUN, TIME_PCT, CALLS_PER_RUN, GFLOP_PER_RUN, MB_PER_RUN, GFLOPS, GBPS,
                    INTENSITY, ROOF_GFLOPS, PCT_PEAK, PCT_BANDWIDTH, BOUND, COVERED_CALLS_PCT)
TOP_OPS = 8  # op types with per-op metrics, the slowest first


@dataclass(frozen=True, eq=False)  # it holds a DataFrame
class Roofline:
    """An attempt's kernels against the machine's roofs.

    Attributes:
        table: one row per op type, slowest first (`ROOFLINE_COLUMNS`).
        gflop_per_run: the model's FLOPs per run (covered kernels), in GFLOP.
        mb_per_run: bytes moved per run by every kernel, in MB (1e6).
        gflops: achieved GFLOP/s over the covered kernels' time.
        covered_time_pct: share of the kernel time in calls whose FLOPs are known.
        tokens_per_run: batch x sequence of the token input (`count_tokens`), or None.
        machine: the roofs, or None when the machine was not measured (no `roof_gflops`, `pct_peak`).
    """

    table: pd.DataFrame
    gflop_per_run: float
    mb_per_run: float
    gflops: float
    covered_time_pct: float
    tokens_per_run: int | None = None
    machine: MachinePeaks | None = None

    @property
    def gflop_per_token(self) -> float | None:
        return self.gflop_per_run / self.tokens_per_run if self.tokens_per_run else None

    def metrics(self, *, top: int = TOP_OPS) -> dict[str, float]:
        """`roofline.model_*`, and `roofline.<OpType>.{gflops,gbps,intensity,pct_peak}` for the `top` slowest
        op types: `gbps` for each, the others where the op type's FLOPs are known (`pct_peak` with the machine's
        roofs, and FLOPs above 0). A value of a kernel that took 0 µs is NaN."""
        metrics = {"roofline.model_gflop_per_run": self.gflop_per_run, "roofline.model_gflops": self.gflops,
                   "roofline.covered_time_pct": self.covered_time_pct}
        if self.gflop_per_token is not None:
            metrics["roofline.model_gflop_per_token"] = self.gflop_per_token
        rows = self.table.head(top)
        names = [str(n) for n in rows[OP_TYPE]]
        keys = {suffix: metric_keys("roofline", names, suffix) for suffix in ("gflops", "gbps", "intensity", "pct_peak")}
        for name, row in zip(names, rows.to_dict("records")):
            metrics[keys["gbps"][name]] = float(row[GBPS])
            if row[COVERED_CALLS_PCT] > 0:
                metrics[keys["gflops"][name]] = float(row[GFLOPS])
                metrics[keys["intensity"][name]] = float(row[INTENSITY])
                if self.machine is not None and row[GFLOP_PER_RUN] > 0:
                    metrics[keys["pct_peak"][name]] = float(row[PCT_PEAK])
        return metrics


def build_roofline(
    events: pd.DataFrame, *, machine: MachinePeaks | None = None, skip_runs: int = 0, tokens_per_run: int | None = None
) -> Roofline:
    """Per op type FLOPs, bytes, achieved GFLOP/s and GB/s, intensity and share of the roof, from a profile.

    Args:
        events: one row per kernel call (`tracker.profile.columns.EVENT_COLUMNS`).
        machine: the roofs (`measure_machine`); without them the roof columns are NaN.
        skip_runs: leading (warm-up) runs left out, as in the per-op summaries.
        tokens_per_run: tokens one run processes, for the FLOPs per token.
    """
    kept = aggregate.keep_runs(events, skip_runs=skip_runs)
    n_runs = max(1, int(kept[C.RUN].nunique())) if not kept.empty else 1
    costs = kernel_costs(kept)
    covered = costs["flops"].notna()
    frame = pd.DataFrame({
        OP_TYPE: kept[C.OP_TYPE].astype(str).to_numpy(),
        "us": kept[C.DUR_US].astype(float).to_numpy(),
        "flops": costs["flops"].fillna(0.0).to_numpy(),
        "bytes": costs["bytes"].to_numpy(),
        "covered": covered.to_numpy(),
    })
    frame["covered_us"] = frame["us"].where(frame["covered"], 0.0)
    frame["covered_bytes"] = frame["bytes"].where(frame["covered"], 0.0)
    sums = frame.groupby(OP_TYPE, sort=False).agg(
        us=("us", "sum"), calls=("us", "size"), flops=("flops", "sum"), bytes=("bytes", "sum"),
        covered_calls=("covered", "sum"), covered_us=("covered_us", "sum"), covered_bytes=("covered_bytes", "sum"))
    known = sums["covered_calls"] > 0
    total_us = sums["us"].sum()
    table = pd.DataFrame(index=sums.index)
    table[US_PER_RUN] = sums["us"] / n_runs
    table[TIME_PCT] = 100.0 * sums["us"] / total_us if total_us else 0.0
    table[CALLS_PER_RUN] = sums["calls"] / n_runs
    table[GFLOP_PER_RUN] = (sums["flops"] / n_runs / 1e9).where(known)
    table[MB_PER_RUN] = sums["bytes"] / n_runs / 1e6
    # FLOP per µs is MFLOP/s: / 1e3 for GFLOP/s (bytes alike); 0 µs (a clock too coarse) gives NaN.
    table[GFLOPS] = (sums["flops"] / sums["covered_us"].where(sums["covered_us"] > 0) / 1e3).where(known)
    table[GBPS] = sums["bytes"] / sums["us"].where(sums["us"] > 0) / 1e3
    table[INTENSITY] = (sums["flops"] / sums["covered_bytes"].where(sums["covered_bytes"] > 0)).where(known)
    if machine is not None:
        intensity = table[INTENSITY].where(table[INTENSITY] > 0)
        table[ROOF_GFLOPS] = machine.roof_gflops(intensity.to_numpy())
        table[PCT_PEAK] = 100.0 * table[GFLOPS] / table[ROOF_GFLOPS]
        table[PCT_BANDWIDTH] = 100.0 * table[GBPS] / machine.bandwidth_gbps
        # Data movement (0 FLOP per byte) is bound by memory too.
        table[BOUND] = np.where(table[INTENSITY].isna(), None,
                                np.where(table[INTENSITY] < machine.ridge_flop_per_byte, "memory", "compute"))
    else:
        table[ROOF_GFLOPS] = table[PCT_PEAK] = table[PCT_BANDWIDTH] = np.nan
        table[BOUND] = None
    table[COVERED_CALLS_PCT] = 100.0 * sums["covered_calls"] / sums["calls"]
    table = table.rename_axis(OP_TYPE).reset_index()
    table = table.sort_values([US_PER_RUN, OP_TYPE], ascending=[False, True], ignore_index=True)
    covered_us = float(frame["covered_us"].sum())
    flops = float(frame["flops"].sum())
    return Roofline(
        table=table[list(ROOFLINE_COLUMNS)],
        gflop_per_run=flops / n_runs / 1e9,
        mb_per_run=float(frame["bytes"].sum()) / n_runs / 1e6,
        gflops=flops / covered_us / 1e3 if covered_us > 0 else float("nan"),
        covered_time_pct=100.0 * covered_us / total_us if total_us else 0.0,
        tokens_per_run=tokens_per_run,
        machine=machine,
    )


def count_tokens(feeds: Mapping[str, np.ndarray]) -> int | None:
    """Tokens one run processes: batch x sequence of the feed `input_ids` if it is a 2-D integer array, else of
    the first 2-D integer feed; None when no feed is one (the model takes no tokens)."""
    candidates = [(name, np.asarray(value)) for name, value in feeds.items()]
    candidates = [(name, a) for name, a in candidates if a.ndim == 2 and a.dtype.kind in "iu"]
    if not candidates:
        return None
    chosen = next((a for name, a in candidates if name == "input_ids"), candidates[0][1])
    return int(chosen.shape[0] * chosen.shape[1])
