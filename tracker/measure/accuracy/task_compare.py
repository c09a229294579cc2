"""The checks of the tasks beyond the raw and logits ones: regression, classification and embedding. Each has its
bounds (a `*Tolerance`), its result (a `*Diff`, carrying the raw output diff) and its `compare_*` function.

Which check a task gets and its bounds per precision are `tracker.measure.accuracy.task_diff`'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tracker.base.keys import METRIC_DIFF_PASSED
from tracker.measure.accuracy.output_diff import OutputDiff, Tolerance, compare_outputs, same_nonfinite
from tracker.measure.accuracy.output_values import paired_parts


@dataclass(frozen=True)
class RegressionTolerance:
    """Bound of a regression attempt: its prediction error scaled by the baseline's largest prediction.

    Attributes:
        name: the precision it is meant for ("fp32", "fp16", "int8", "int4").
        max_scaled_error: largest allowed max |attempt - baseline| / max |baseline|, per target.
    """

    name: str
    max_scaled_error: float

    def __post_init__(self) -> None:
        if not self.max_scaled_error >= 0:
            raise ValueError(f"max_scaled_error must be >= 0, got {self.max_scaled_error}")

    def compare(self, baseline: Sequence[Any], attempt: Sequence[Any]) -> RegressionDiff:
        """`compare_regression` with this bound."""
        return compare_regression(baseline, attempt, self)


@dataclass(frozen=True)
class ClassificationTolerance:
    """Bounds of a classifier attempt: predicted-class agreement and class-probability difference.

    Attributes:
        name: the precision they are meant for.
        min_top1: smallest allowed share of rows whose predicted class agrees with the baseline's.
        max_prob_diff: largest allowed absolute difference of a class probability.
    """

    name: str
    min_top1: float
    max_prob_diff: float

    def __post_init__(self) -> None:
        if not (0 <= self.min_top1 <= 1 and 0 <= self.max_prob_diff <= 1):
            raise ValueError(f"need 0 <= min_top1 <= 1 and 0 <= max_prob_diff <= 1, got {self.min_top1}, "
                             f"{self.max_prob_diff}")

    def compare(self, baseline: Sequence[Any], attempt: Sequence[Any]) -> ClassificationDiff:
        """`compare_classification` with these bounds."""
        return compare_classification(baseline, attempt, self)


@dataclass(frozen=True)
class EmbeddingTolerance:
    """Bound of an embedding attempt: the smallest cosine similarity of one of its vectors to the baseline's.

    Attributes:
        name: the precision it is meant for.
        min_cosine: smallest allowed cosine similarity of any row.
    """

    name: str
    min_cosine: float

    def __post_init__(self) -> None:
        if not -1 <= self.min_cosine <= 1:
            raise ValueError(f"min_cosine must lie in [-1, 1], got {self.min_cosine}")

    def compare(self, baseline: Sequence[Any], attempt: Sequence[Any]) -> EmbeddingDiff:
        """`compare_embeddings` with this bound."""
        return compare_embeddings(baseline, attempt, self)


@dataclass(frozen=True)
class _TaskDiff:
    """What every task diff shares: the raw output diff, whose `diff.*` keys every attempt run carries."""

    outputs: OutputDiff

    @property
    def max_abs(self) -> float:
        return self.outputs.max_abs

    @property
    def max_rel(self) -> float:
        return self.outputs.max_rel

    @property
    def nonfinite_mismatches(self) -> int:
        return self.outputs.nonfinite_mismatches


@dataclass(frozen=True)
class RegressionDiff(_TaskDiff):
    """The regression check: the raw diff plus the scaled error of the predictions."""

    scaled_error: float
    passed: bool
    tolerance: RegressionTolerance

    def metrics(self) -> dict[str, float]:
        return {**self.outputs.metrics(), "diff.scaled_error": self.scaled_error, METRIC_DIFF_PASSED: float(self.passed)}

    def params(self) -> dict[str, str]:
        t = self.tolerance
        return {"diff.tolerance": t.name, "diff.task": "regression", "diff.max_scaled_error": repr(t.max_scaled_error)}


@dataclass(frozen=True)
class ClassificationDiff(_TaskDiff):
    """The classification check: the raw diff plus top-1 agreement and the largest probability difference."""

    top1_agreement: float
    max_prob_diff: float
    passed: bool
    tolerance: ClassificationTolerance

    def metrics(self) -> dict[str, float]:
        return {
            **self.outputs.metrics(),
            "diff.top1_agreement": self.top1_agreement,
            "diff.max_prob_diff": self.max_prob_diff,
            METRIC_DIFF_PASSED: float(self.passed),
        }

    def params(self) -> dict[str, str]:
        t = self.tolerance
        return {"diff.tolerance": t.name, "diff.task": "classification", "diff.min_top1": repr(t.min_top1),
                "diff.max_prob_diff_bound": repr(t.max_prob_diff)}


@dataclass(frozen=True)
class EmbeddingDiff(_TaskDiff):
    """The embedding check: the raw diff plus the cosine similarity of each (pooled) vector, min and mean."""

    cosine_min: float
    cosine_mean: float
    passed: bool
    tolerance: EmbeddingTolerance

    def metrics(self) -> dict[str, float]:
        return {
            **self.outputs.metrics(),
            "diff.cosine_min": self.cosine_min,
            "diff.cosine_mean": self.cosine_mean,
            METRIC_DIFF_PASSED: float(self.passed),
        }

    def params(self) -> dict[str, str]:
        t = self.tolerance
        return {"diff.tolerance": t.name, "diff.task": "embedding", "diff.min_cosine": repr(t.min_cosine)}


def compare_regression(
    baseline: Sequence[Any], attempt: Sequence[Any], tolerance: RegressionTolerance
) -> RegressionDiff:
    """Compares the predictions: the first floating-point output, each target (last axis) on its own scale.

    The error is max |attempt - baseline| / max |baseline| per target rather than per element, because a
    prediction near zero makes |a - b| / |b| blow up while its error is as small as anywhere else. A target
    whose baseline is all zero passes only when the attempt's is too. NaN or inf on one side only fail the check;
    at the same place on both sides they are equal.

    Raises:
        ValueError: the outputs cannot be compared (count or shape differs) or none is floating point.
    """
    raw = _raw_diff(baseline, attempt, tolerance.name)
    _, *values = _first_float(baseline, attempt, "regression")
    base, other = (_columns(v.astype(np.float64)) for v in values)
    finite = np.isfinite(base) & np.isfinite(other)
    err = _finite_abs_diff(base, other, finite).max(axis=0, initial=0.0)
    scale = np.where(finite, np.abs(base), 0.0).max(axis=0, initial=0.0)
    with np.errstate(over="ignore"):  # an all-zero target: any error at all is a huge ratio, kept finite
        ratio = np.minimum(err / np.maximum(scale, np.finfo(np.float64).tiny), np.finfo(np.float64).max)
    scaled = float(ratio.max(initial=0.0))
    passed = raw.nonfinite_mismatches == 0 and scaled <= tolerance.max_scaled_error
    return RegressionDiff(raw, scaled, bool(passed), tolerance)


def compare_classification(
    baseline: Sequence[Any], attempt: Sequence[Any], tolerance: ClassificationTolerance
) -> ClassificationDiff:
    """Compares the predicted classes and the class probabilities of a classifier.

    The scores are the first floating-point output of shape [..., C] with C >= 2 classes: a tensor, or the
    probabilities of a skl2onnx classifier converted with its defaults (ZipMap: a sequence of maps from class key
    to probability), as a table with one column per class key in sorted order. Scores that are not probabilities
    (outside [0, 1] or rows not summing to 1: logits, decision values) go through a softmax first, so
    `max_prob_diff` is a probability difference either way. The predicted class is the label output when there is
    one (an integer or string output of shape [...], skl2onnx's `label`), compared by agreement, else the argmax
    of the scores. NaN or inf on one side only fail the check; a row identical on both sides, NaN included, agrees.

    Raises:
        ValueError: the outputs cannot be compared (count, shape, sequence length or class keys differ), or none
            holds class scores.
    """
    raw = _raw_diff(baseline, attempt, tolerance.name)
    pairs = [(b.values, a.values) for b, a in paired_parts(baseline, attempt)]
    scores_at = next((i for i, (t, _) in enumerate(pairs) if t.dtype.kind == "f" and t.ndim >= 2 and t.shape[-1] >= 2),
                     None)
    if scores_at is None:
        shapes = ", ".join(f"{t.dtype}{list(t.shape)}" for t, _ in pairs)
        raise ValueError(f"task classification needs a floating-point output of class scores [..., C] with C >= 2; "
                         f"the outputs are {shapes or 'none'}")
    base, other = (np.asarray(t, dtype=np.float64) for t in pairs[scores_at])
    base, other = base.reshape(-1, base.shape[-1]), other.reshape(-1, other.shape[-1])
    if not _are_probabilities(base):
        base, other = _softmax(base), _softmax(other)
    finite = np.isfinite(base) & np.isfinite(other)
    max_prob_diff = float(_finite_abs_diff(base, other, finite).max(initial=0.0))
    label_at = next((i for i, (t, _) in enumerate(pairs)
                     if t.dtype.kind not in "fc" and t.shape == pairs[scores_at][0].shape[:-1]), None)
    if label_at is not None:
        agree = pairs[label_at][0].reshape(-1) == pairs[label_at][1].reshape(-1)
    else:  # a NaN row has no class: it agrees only with the same row, NaN for NaN
        nan_rows = np.isnan(base).any(axis=-1) | np.isnan(other).any(axis=-1)
        same_rows = np.all((base == other) | same_nonfinite(base, other), axis=-1)
        agree = (base.argmax(axis=-1) == other.argmax(axis=-1)) & ~nan_rows | same_rows
    top1 = float(np.mean(agree)) if agree.size else 1.0
    passed = raw.nonfinite_mismatches == 0 and top1 >= tolerance.min_top1 and max_prob_diff <= tolerance.max_prob_diff
    return ClassificationDiff(raw, top1, max_prob_diff, bool(passed), tolerance)


def compare_embeddings(
    baseline: Sequence[Any], attempt: Sequence[Any], tolerance: EmbeddingTolerance
) -> EmbeddingDiff:
    """Compares the embedding vectors: the first floating-point output, row by row, by cosine similarity.

    A [batch, hidden] output is one vector per row. A per-token [batch, seq, hidden] output is mean-pooled
    over axis 1 first, over every position: only outputs reach this check, not the attention mask, so padded
    positions count as much as the rest (feed unpadded batches, or export the pooled embedding first).
    A zero vector has cosine 1 with a zero vector and 0 with any other. A row holding NaN or inf has cosine 1
    when it is identical in both (same infinities, NaN at the same places) and -1 otherwise, so a broken row is
    never hidden.

    Raises:
        ValueError: the outputs cannot be compared, or the first floating-point one is not 1-, 2- or 3-D.
    """
    raw = _raw_diff(baseline, attempt, tolerance.name)
    label, *values = _first_float(baseline, attempt, "embedding")
    base, other = (_pooled(v.astype(np.float64), label) for v in values)
    finite = np.isfinite(base).all(axis=-1) & np.isfinite(other).all(axis=-1)
    # the non-finite rows': 1 where both sides hold the same values, NaN at the same places included
    cosine = np.where(np.all((base == other) | same_nonfinite(base, other), axis=-1), 1.0, -1.0)
    b, o = base[finite], other[finite]
    # Scaled by each row's largest |value| first, so that squaring cannot overflow to inf.
    scale = np.maximum(np.abs(b).max(axis=-1, initial=0.0), np.abs(o).max(axis=-1, initial=0.0))[:, None]
    b, o = b / np.where(scale > 0, scale, 1.0), o / np.where(scale > 0, scale, 1.0)
    norms = np.linalg.norm(b, axis=-1) * np.linalg.norm(o, axis=-1)
    both_zero = ~b.any(axis=-1) & ~o.any(axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        cos = np.where(norms > 0, np.sum(b * o, axis=-1) / norms, np.where(both_zero, 1.0, 0.0))
    cosine[finite] = np.clip(cos, -1.0, 1.0)
    cosine_min = float(cosine.min()) if cosine.size else 1.0
    cosine_mean = float(cosine.mean()) if cosine.size else 1.0
    passed = raw.nonfinite_mismatches == 0 and cosine_min >= tolerance.min_cosine
    return EmbeddingDiff(raw, cosine_min, cosine_mean, bool(passed), tolerance)


def _raw_diff(baseline: Sequence[Any], attempt: Sequence[Any], name: str) -> OutputDiff:
    """The raw diff for its sizes (max_abs, max_rel, mean_abs, non-finite mismatches) and its checks of
    count and shapes; its own `passed` (zero tolerance) is replaced by the task's."""
    return compare_outputs(baseline, attempt, Tolerance(name, rtol=0.0, atol=0.0))


def _first_float(baseline: Sequence[Any], attempt: Sequence[Any], task: str) -> tuple[str, np.ndarray, np.ndarray]:
    """The first floating-point output (or element of a sequence) of each side, and where it is ("output 0")."""
    for b, a in paired_parts(baseline, attempt):
        if b.values.dtype.kind == "f":
            return b.label, b.values, a.values
    raise ValueError(f"task {task} needs a floating-point output; got {len(baseline)} outputs, none floating point")


def _finite_abs_diff(base: np.ndarray, other: np.ndarray, finite: np.ndarray) -> np.ndarray:
    """|other - base| where both are finite, 0 elsewhere (the raw diff counts the rest)."""
    diff = np.zeros(base.shape)
    diff[finite] = np.abs(other[finite] - base[finite])
    return diff


def _columns(x: np.ndarray) -> np.ndarray:
    """[..., k] -> [rows, k]: one column per target; a 0- or 1-D output is one target."""
    return x.reshape(-1, x.shape[-1]) if x.ndim >= 2 else x.reshape(-1, 1)


def _pooled(x: np.ndarray, label: str) -> np.ndarray:
    if x.ndim == 3:
        with np.errstate(invalid="ignore"):  # inf - inf: a NaN row, which the check counts as a mismatch
            return x.mean(axis=1)
    if x.ndim in (1, 2):
        return x.reshape(-1, x.shape[-1])
    raise ValueError(f"task embedding compares vectors [hidden], [batch, hidden] or tokens [batch, seq, hidden]; "
                     f"{label} has shape {list(x.shape)}")


def _are_probabilities(scores: np.ndarray) -> bool:
    rows = scores[np.isfinite(scores).all(axis=-1)]
    if rows.size == 0:
        return True
    return bool(rows.min() >= 0 and rows.max() <= 1 and np.allclose(rows.sum(axis=-1), 1, atol=1e-3))


def _softmax(x: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", over="ignore"):  # non-finite rows stay non-finite: the raw diff counts them
        shifted = np.exp(x - x.max(axis=-1, keepdims=True))
        return shifted / shifted.sum(axis=-1, keepdims=True)

