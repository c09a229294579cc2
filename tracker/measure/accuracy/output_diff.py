"""Prediction-diff check: an attempt's outputs against the baseline's on the same feeds."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tracker.base.keys import METRIC_DIFF_PASSED
from tracker.measure.accuracy.output_values import paired_parts


@dataclass(frozen=True)
class Tolerance:
    """`allclose` tolerances, chosen per precision and recorded with every check."""

    name: str
    rtol: float
    atol: float

    def __post_init__(self) -> None:
        if self.rtol < 0 or self.atol < 0:
            raise ValueError(f"tolerances must be >= 0, got rtol={self.rtol}, atol={self.atol}")

    def compare(self, baseline: Sequence[Any], attempt: Sequence[Any]) -> OutputDiff:
        """`compare_outputs` with these tolerances."""
        return compare_outputs(baseline, attempt, self)


EXACT = Tolerance("exact", rtol=0.0, atol=0.0)
# fp32 variants of one graph agree within a few 1e-6; 1e-4 separates real breakage from float noise.
FP32 = Tolerance("fp32", rtol=1e-4, atol=1e-4)
FP16 = Tolerance("fp16", rtol=1e-2, atol=1e-2)
INT8 = Tolerance("int8", rtol=1e-1, atol=5e-1)
# int4 weights (blocks of 16 levels): a 3-layer MLP with outputs of order 1 differs by up to ~0.26, GPT-2's
# logits by 0.24-0.55 and a random 6-block LayerNorm'd stack by 0.75-0.9 (block 32-128). A raw check is coarse
# for int4: prefer a task's (`task_diff`), which judges what the outputs are for.
INT4 = Tolerance("int4", rtol=2e-1, atol=1.0)
# The raw-output tolerance of each precision an optimization can produce (`Candidate.precision`).
TOLERANCES = {t.name: t for t in (FP32, FP16, INT8, INT4)}


@dataclass(frozen=True)
class OutputDiff:
    """The result of comparing two sets of outputs. A failed check is data, not an exception."""

    max_abs: float
    max_rel: float
    mean_abs: float
    nonfinite_mismatches: int  # positions NaN or infinite on one side only (or different infinities)
    passed: bool
    tolerance: Tolerance

    def metrics(self) -> dict[str, float]:
        return {
            "diff.max_abs": self.max_abs,
            "diff.max_rel": self.max_rel,
            "diff.mean_abs": self.mean_abs,
            "diff.nonfinite_mismatches": float(self.nonfinite_mismatches),
            METRIC_DIFF_PASSED: float(self.passed),
        }

    def params(self) -> dict[str, str]:
        return {
            "diff.tolerance": self.tolerance.name,
            "diff.rtol": repr(self.tolerance.rtol),
            "diff.atol": repr(self.tolerance.atol),
        }


def compare_outputs(
    baseline: Sequence[Any], attempt: Sequence[Any], tolerance: Tolerance
) -> OutputDiff:
    """Compares outputs pairwise: tensors, and sequences and maps part by part (`output_values.paired_parts`).

    NaN on both sides at one position, or the same infinity, is equal: feeds that hold NaN (missing values) give
    NaN in every variant of a graph. A NaN or infinity on one side only is a mismatch, and fails the check.

    Args:
        baseline: the baseline's outputs, in graph output order.
        attempt: the attempt's outputs on the same feeds.
        tolerance: `allclose` tolerances for `passed` (|a - b| <= atol + rtol * |b|).

    Raises:
        ValueError: the number of outputs, a shape, a sequence's length or a map's class keys differ; such
            outputs cannot be compared.
    """
    max_abs = max_rel = abs_sum = 0.0
    count = nonfinite = 0
    passed = True
    for bp, ap in paired_parts(baseline, attempt):
        b, a = bp.values, ap.values
        if b.shape != a.shape:
            raise ValueError(f"{bp.label}: baseline shape {b.shape} differs from attempt shape {a.shape}")
        if b.dtype.kind not in "fiub" or a.dtype.kind not in "fiub":  # strings (labels): equal or not
            passed &= bool(np.array_equal(a, b))
            continue
        b64, a64 = b.astype(np.float64), a.astype(np.float64)
        finite = np.isfinite(b64) & np.isfinite(a64)
        nonfinite += int(np.sum(~finite & ~same_nonfinite(b64, a64)))
        err = np.abs(a64[finite] - b64[finite])
        if err.size:
            # A zero baseline makes the ratio huge; cap it at the largest float so the metric
            # stays finite (err / tiny overflows to inf, with a RuntimeWarning, from err ~ 4 up).
            with np.errstate(over="ignore"):
                rel = err / np.maximum(np.abs(b64[finite]), np.finfo(np.float64).tiny)
            rel = np.minimum(rel, np.finfo(np.float64).max)
            max_abs = max(max_abs, float(err.max()))
            max_rel = max(max_rel, float(rel.max()))
            abs_sum += float(err.sum())
            count += err.size
        passed &= bool(np.allclose(a64, b64, rtol=tolerance.rtol, atol=tolerance.atol, equal_nan=True))
    return OutputDiff(
        max_abs=max_abs,
        max_rel=max_rel,
        mean_abs=abs_sum / count if count else 0.0,
        nonfinite_mismatches=nonfinite,
        passed=passed and nonfinite == 0,
        tolerance=tolerance,
    )


def same_nonfinite(baseline: np.ndarray, attempt: np.ndarray) -> np.ndarray:
    """Where both sides hold NaN, or the same infinity: equal, though `==` says otherwise for NaN."""
    return (np.isnan(baseline) & np.isnan(attempt)) | (np.isinf(baseline) & (baseline == attempt))
