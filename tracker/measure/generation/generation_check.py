"""The generation scenario's accuracy check: an attempt's greedy generation against the baseline's from the same
prompt (token agreement, the first step's divergence), and its next-token logits along the baseline's tokens within
the bounds of its precision (`lm_diff.LOGITS_TOLERANCES`), which decides whether it passed."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tracker.base.keys import METRIC_DIFF_PASSED
from tracker.measure.accuracy.lm_diff import LOGITS_FP32, LogitsDiff, LogitsTolerance, compare_logits
from tracker.measure.accuracy.text_quality import TextQuality
from tracker.measure.generation.decoder import Generation


@dataclass(frozen=True)
class GenerationDiff:
    """An attempt's generation against the baseline's, from the same prompt.

    Attributes:
        token_agreement: share of the new greedy tokens equal position by position. Once one token differs, the
            two generations continue from different text: a single flip early on costs every later position.
        first_divergence: index of the first token that differs (the number of tokens when none does).
        first_step_kl: mean over the batch of KL(baseline || attempt) of the first next-token distribution (nats).
        first_step_max_abs: largest absolute difference of the first step's logits.
        along: the check of the attempt's next-token logits when fed the baseline's tokens (every step compares
            the same text) against the baseline's, with the tolerance of the attempt's precision; None when the
            attempt's logits along the baseline's tokens are not known.
        quality: a language model's quality on real text through its decode loop (`text_scoring.TextCheck`), judged
            by the bound of its precision; None when the study has no real text.
    """

    token_agreement: float
    first_divergence: int
    first_step_kl: float
    first_step_max_abs: float
    along: LogitsDiff | None = None
    quality: TextQuality | None = None

    @property
    def passed(self) -> bool | None:
        """The generation's accuracy check: `along` passed (max abs, top-1 over every step, mean KL within the
        precision's bounds), and so did `quality` when there is one; None when neither was made."""
        checks = [c.passed for c in (self.along, self.quality) if c is not None and c.passed is not None]
        return all(checks) if checks else None

    def metrics(self) -> dict[str, float]:
        metrics = {
            "gen.token_agreement": self.token_agreement,
            "gen.first_divergence": float(self.first_divergence),
            "gen.first_step_kl": self.first_step_kl,
            "gen.first_step_max_abs": self.first_step_max_abs,
        }
        if self.along is not None:
            metrics.update({f"gen.{key}": value for key, value in self.along.metrics().items()})
        if self.quality is not None:
            metrics.update(self.quality.metrics("gen.quality."))
        if self.passed is not None:
            metrics[f"gen.{METRIC_DIFF_PASSED}"] = float(self.passed)
        return metrics

    def params(self) -> dict[str, str]:
        params = {f"gen.{key}": value for key, value in self.along.params().items()} if self.along is not None else {}
        return {**params, **(self.quality.params("gen.quality.") if self.quality is not None else {})}


def compare_generations(
    baseline: Generation,
    attempt: Generation,
    *,
    along: Sequence[np.ndarray] | None = None,
    tolerance: LogitsTolerance = LOGITS_FP32,
    quality: TextQuality | None = None,
) -> GenerationDiff:
    """Greedy-token agreement and the first step's divergence of `attempt` against `baseline`, and the check of
    `along` (the attempt's logits fed the baseline's tokens, `GenerationResult.along_reference`) with `tolerance`.

    Raises:
        ValueError: the two generations, or `along` and the baseline's steps, have different shapes.
    """
    if baseline.tokens.shape != attempt.tokens.shape:
        raise ValueError(f"generations of different shapes: {baseline.tokens.shape} and {attempt.tokens.shape}")
    equal = np.all(baseline.tokens == attempt.tokens, axis=0)  # a position agrees when every row does
    first = int(np.argmin(equal)) if not equal.all() else int(equal.size)
    # The first step's check is the forward check with one position (float64, finite-aware).
    diff = compare_logits([baseline.step_logits[0]], [attempt.step_logits[0]], LOGITS_FP32)
    checked = None
    if along is not None:
        if len(along) != len(baseline.step_logits):
            raise ValueError(f"{len(along)} steps of logits along the baseline's tokens, expected "
                             f"{len(baseline.step_logits)}")
        checked = compare_logits([np.stack(baseline.step_logits)], [np.stack(along)], tolerance)
    return GenerationDiff(float(equal.mean()), first, diff.kl_divergence, diff.max_abs, checked, quality)
