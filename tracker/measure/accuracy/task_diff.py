"""Accuracy by task: which check of an attempt's outputs against the baseline's fits what the model is for
(`--task`), its bounds per precision, and how far inside them a check landed.

The regression, classification and embedding checks themselves are `tracker.measure.accuracy.task_compare`'s; the
raw one is `output_diff`'s and the logits one `lm_diff`'s.
"""

from __future__ import annotations

from collections.abc import Mapping

from tracker.measure.accuracy.lm_diff import LOGITS_TOLERANCES, LogitsDiff, LogitsTolerance
from tracker.measure.accuracy.output_diff import TOLERANCES, OutputDiff, Tolerance
from tracker.measure.accuracy.task_compare import (
    ClassificationDiff,
    ClassificationTolerance,
    EmbeddingDiff,
    EmbeddingTolerance,
    RegressionDiff,
    RegressionTolerance,
)

TASKS = ("raw", "regression", "classification", "embedding", "lm")

TaskTolerance = Tolerance | LogitsTolerance | RegressionTolerance | ClassificationTolerance | EmbeddingTolerance

# Scaled error: fp32 variants of one graph differ by ~1e-6 of the output scale (reordered sums), so 1e-4
# (the raw check's rtol) only catches breakage. fp16 rounds at 5e-4 relative and measured 3.6e-4 on a
# 256x256 MLP regressor (skl2onnx); 1e-2 is the raw fp16 rtol. Dynamic int8 measured 1.2e-2 and int4
# weight-only (block 32) 1.0e-2 on that MLP; int4 errors are 2-5x int8's on GPT-2 (FACTS), hence 5e-2 and 0.1.
# A broken graph is off by the order of the outputs themselves (~1).
REGRESSION_TOLERANCES = {t.name: t for t in (
    RegressionTolerance("fp32", max_scaled_error=1e-4),
    RegressionTolerance("fp16", max_scaled_error=1e-2),
    RegressionTolerance("int8", max_scaled_error=5e-2),
    RegressionTolerance("int4", max_scaled_error=1e-1),
)}
# A trained classifier has wide class margins: on a 5-class skl2onnx MLP (256x256) fp16, int8 and int4 (block
# 32) all kept top-1 at 1.0, with max probability differences of 2e-5, 1.3e-3 and 1.6e-2. fp32 noise moves a
# probability by ~1e-7, so only an exact tie can flip a class. The int8/int4 top-1 bounds leave room for the
# rows near a tie that a real dataset has; a broken graph agrees on ~1/C of the rows.
CLASSIFICATION_TOLERANCES = {t.name: t for t in (
    ClassificationTolerance("fp32", min_top1=0.999, max_prob_diff=1e-4),
    ClassificationTolerance("fp16", min_top1=0.99, max_prob_diff=1e-2),
    ClassificationTolerance("int8", min_top1=0.97, max_prob_diff=5e-2),
    ClassificationTolerance("int4", min_top1=0.9, max_prob_diff=1e-1),
)}
# For a small relative error r orthogonal to the vector, cosine = 1 - r^2 / 2: 0.999999 allows r = 1.4e-3
# (fp32 noise is ~1e-6), 0.9999 r = 1.4e-2 (the raw fp16 rtol), 0.99 r = 0.14, 0.95 r = 0.32. Measured on a
# random 6-block, 384-wide residual MLP stack (mean-pooled [2, 32, 384]): fp16 0.9999999, dynamic int8
# 0.9996, int4 block 32 0.983 and block 128 0.978; random weights are a harsh case for int4.
EMBEDDING_TOLERANCES = {t.name: t for t in (
    EmbeddingTolerance("fp32", min_cosine=0.999999),
    EmbeddingTolerance("fp16", min_cosine=0.9999),
    EmbeddingTolerance("int8", min_cosine=0.99),
    EmbeddingTolerance("int4", min_cosine=0.95),
)}

_BY_TASK: Mapping[str, Mapping[str, TaskTolerance]] = {
    "raw": TOLERANCES,
    "regression": REGRESSION_TOLERANCES,
    "classification": CLASSIFICATION_TOLERANCES,
    "embedding": EMBEDDING_TOLERANCES,
    "lm": LOGITS_TOLERANCES,
}


def tolerance_for(tolerance: TaskTolerance | Mapping[str, TaskTolerance], precision: str) -> TaskTolerance:
    """The tolerance that judges a model of `precision`: one given for every precision, or its entry in a table
    by precision (`task_tolerances`)."""
    return tolerance[precision] if isinstance(tolerance, Mapping) else tolerance


def task_tolerances(task: str) -> dict[str, TaskTolerance]:
    """The check of a task for each precision ("fp32", "fp16", "int8", "int4"), as `Study.optimize` takes it.

    Raises:
        ValueError: `task` is not one of `TASKS`.
    """
    if task not in _BY_TASK:
        raise ValueError(f"unknown task {task!r}; known tasks: {', '.join(TASKS)}")
    return dict(_BY_TASK[task])  # a copy: the shared tables stay as they are


def accuracy_margin(diff: OutputDiff | LogitsDiff | RegressionDiff | ClassificationDiff | EmbeddingDiff) -> float:
    """How far inside its bounds a check landed, in units of each bound's room: 1 is the baseline itself, 0 is on
    the tightest bound, < 0 is outside it. It ranks attempts (the sensitivity of a quantized node, the nearest
    failure); whether an attempt passes stays `diff.passed`.

    Each bound's room is what separates the ideal value from the bound (1 - min_cosine, 1 - min_top1, the largest
    allowed error); the margin is the smallest of the bounds' shares of their room left.
    """
    raw = diff.outputs if hasattr(diff, "outputs") else diff
    if raw.nonfinite_mismatches:
        return float("-inf")

    def left(value: float, bound: float, ideal: float) -> float:
        room = abs(ideal - bound)
        return (bound - value) / room if ideal < bound else (value - bound) / room if room else 0.0

    if isinstance(diff, EmbeddingDiff):
        return left(diff.cosine_min, diff.tolerance.min_cosine, 1.0)
    if isinstance(diff, ClassificationDiff):
        t = diff.tolerance
        return min(left(diff.top1_agreement, t.min_top1, 1.0), left(diff.max_prob_diff, t.max_prob_diff, 0.0))
    if isinstance(diff, RegressionDiff):
        return left(diff.scaled_error, diff.tolerance.max_scaled_error, 0.0)
    if isinstance(diff, LogitsDiff):
        lt = diff.tolerance
        return min(left(diff.top1_agreement, lt.min_top1, 1.0), left(diff.kl_divergence, lt.max_kl, 0.0),
                   left(diff.max_abs, lt.max_abs, 0.0))
    return left(diff.max_abs, diff.tolerance.atol, 0.0)
