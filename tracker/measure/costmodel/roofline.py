"""Where an attempt's kernel time goes against the machine's limits: per op type the achieved GFLOP/s, GB/s,
arithmetic intensity and share of the roof that applies at that intensity, from a profile's kernel calls and
their FLOPs and bytes (`tracker.measure.costmodel.kernel_costs`, where the counting conventions are)."""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from tracker.base.keys import metric_keys
from tracker.measure.costmodel.kernel_costs import MATMUL_OPS, kernel_costs
from tracker.profile import aggregate
from tracker.profile import columns as C

if TYPE_CHECKING:
    from tracker.measure.costmodel.machine import MachinePeaks

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
MATMULS = "matmuls"  # the name of the matrix products' row (`Roofline.matmuls`) and metrics


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
        matmuls: the matrix products (`MATMUL_OPS`) together, as one row of `table`'s columns (op type
            `MATMULS`); None when the model has none. Their op type changes with the attempt (MatMul, FusedMatMul,
            MatMulInteger, MatMulNBits, ...): this row compares them across attempts.
    """

    table: pd.DataFrame
    gflop_per_run: float
    mb_per_run: float
    gflops: float
    covered_time_pct: float
    tokens_per_run: int | None = None
    machine: MachinePeaks | None = None
    matmuls: pd.Series | None = None

    @property
    def gflop_per_token(self) -> float | None:
        return self.gflop_per_run / self.tokens_per_run if self.tokens_per_run else None

    @property
    def flop_per_byte(self) -> float:
        """The model's arithmetic intensity: its FLOPs over the bytes its kernels move."""
        return 1e3 * self.gflop_per_run / self.mb_per_run if self.mb_per_run > 0 else float("nan")

    @property
    def bound(self) -> str | None:
        """The roof the model's time sits under: "compute" when most of it is in op types above the ridge,
        else "memory"; None without the machine's roofs or FLOPs."""
        if self.machine is None or not (self.table[GFLOP_PER_RUN] > 0).any():
            return None
        by_bound = self.table.groupby(BOUND)[US_PER_RUN].sum()
        return "compute" if by_bound.get("compute", 0.0) > by_bound.get("memory", 0.0) else "memory"

    def metrics(self, *, top: int = TOP_OPS) -> dict[str, float]:
        """`roofline.model_*`, `roofline.memory_bound` (1 or 0, with the machine's roofs), the matrix products
        together as `roofline.matmuls.*`, and `roofline.<OpType>.{gflops,gbps,intensity,pct_peak}` for the `top`
        slowest op types: `gbps` for each, the others where the op type's FLOPs are known (`pct_peak` with the
        machine's roofs, and FLOPs above 0). A value of a kernel that took 0 µs is NaN."""
        metrics = {"roofline.model_gflop_per_run": self.gflop_per_run, "roofline.model_gflops": self.gflops,
                   "roofline.model_flop_per_byte": self.flop_per_byte,
                   "roofline.covered_time_pct": self.covered_time_pct}
        if self.gflop_per_token is not None:
            metrics["roofline.model_gflop_per_token"] = self.gflop_per_token
        if self.bound is not None:
            metrics["roofline.memory_bound"] = float(self.bound == "memory")
        if self.matmuls is not None:
            metrics.update(self._row_metrics(self.matmuls.to_dict(), key=f"roofline.{MATMULS}"))
            metrics[f"roofline.{MATMULS}.time_pct"] = float(self.matmuls[TIME_PCT])
        rows = self.table.head(top)
        names = [str(n) for n in rows[OP_TYPE]]
        keys = metric_keys("roofline", names, "pct_peak")  # the longest suffix sets the room for the name
        for name, row in zip(names, rows.to_dict("records")):
            metrics.update(self._row_metrics(row, key=keys[name].removesuffix(".pct_peak")))
        return metrics

    def _row_metrics(self, row: Mapping[Hashable, Any], *, key: str) -> dict[str, float]:
        metrics = {f"{key}.gbps": float(row[GBPS])}
        if row[COVERED_CALLS_PCT] > 0:
            metrics[f"{key}.gflops"] = float(row[GFLOPS])
            metrics[f"{key}.intensity"] = float(row[INTENSITY])
            if self.machine is not None and row[GFLOP_PER_RUN] > 0:
                metrics[f"{key}.pct_peak"] = float(row[PCT_PEAK])
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
    total_us = float(frame["us"].sum())
    table = _per_group(frame, frame[OP_TYPE], n_runs=n_runs, total_us=total_us, machine=machine)
    table = table.sort_values([US_PER_RUN, OP_TYPE], ascending=[False, True], ignore_index=True)
    is_matmul = frame[OP_TYPE].isin(MATMUL_OPS)
    matmuls = None
    if is_matmul.any():
        matmuls = _per_group(frame[is_matmul], pd.Series(MATMULS, index=frame.index[is_matmul]), n_runs=n_runs,
                             total_us=total_us, machine=machine).iloc[0]
    covered_us = float(frame["covered_us"].sum())
    flops = float(frame["flops"].sum())
    return Roofline(
        table=table,
        gflop_per_run=flops / n_runs / 1e9,
        mb_per_run=float(frame["bytes"].sum()) / n_runs / 1e6,
        gflops=flops / covered_us / 1e3 if covered_us > 0 else float("nan"),
        covered_time_pct=100.0 * covered_us / total_us if total_us else 0.0,
        tokens_per_run=tokens_per_run,
        machine=machine,
        matmuls=matmuls,
    )


def _per_group(frame: pd.DataFrame, groups: pd.Series, *, n_runs: int, total_us: float,
               machine: MachinePeaks | None) -> pd.DataFrame:
    """The roofline table's columns (`ROOFLINE_COLUMNS`) for each group of `frame`'s kernel calls, its name in
    the OP_TYPE column."""
    sums = frame.groupby(groups.to_numpy(), sort=False).agg(
        us=("us", "sum"), calls=("us", "size"), flops=("flops", "sum"), bytes=("bytes", "sum"),
        covered_calls=("covered", "sum"), covered_us=("covered_us", "sum"), covered_bytes=("covered_bytes", "sum"))
    known = sums["covered_calls"] > 0
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
        # numpy's stubs take no None as a choice; np.where makes an object array holding it
        table[BOUND] = np.where(table[INTENSITY].isna(), None,  # type: ignore[call-overload]
                                np.where(table[INTENSITY] < machine.ridge_flop_per_byte, "memory", "compute"))
    else:
        table[ROOF_GFLOPS] = table[PCT_PEAK] = table[PCT_BANDWIDTH] = np.nan
        table[BOUND] = None
    table[COVERED_CALLS_PCT] = 100.0 * sums["covered_calls"] / sums["calls"]
    return table.rename_axis(OP_TYPE).reset_index()[list(ROOFLINE_COLUMNS)]


def count_tokens(feeds: Mapping[str, np.ndarray]) -> int | None:
    """Tokens one run processes: batch x sequence of the feed `input_ids` if it is a 2-D integer array, else of
    the first 2-D integer feed; None when no feed is one (the model takes no tokens)."""
    candidates = [(name, np.asarray(value)) for name, value in feeds.items()]
    candidates = [(name, a) for name, a in candidates if a.ndim == 2 and a.dtype.kind in "iu"]
    if not candidates:
        return None
    chosen = next((a for name, a in candidates if name == "input_ids"), candidates[0][1])
    return int(chosen.shape[0] * chosen.shape[1])
