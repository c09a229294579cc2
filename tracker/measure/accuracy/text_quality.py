"""A language model's quality on real text against its baseline, as users of LMs measure it: perplexity on held-out
text (its increase, with an interval over the text's chunks), next-token top-1 agreement and KL divergence along the
text, and greedy continuations of real prompts; and the bounds each precision must keep (`lm_bounds.toml`)."""

from __future__ import annotations

import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from tracker.base.keys import METRIC_DIFF_PASSED
from tracker.measure.accuracy.lm_diff import LogitsDiff

BOUNDS_FILE = Path(__file__).with_name("lm_bounds.toml")
# The confidence of the perplexity increase's interval (a t interval over the chunks' paired log-perplexity changes).
CONFIDENCE = 0.95


@dataclass(frozen=True)
class QualityBound:
    """What an attempt of one precision must keep against its baseline on real text.

    Attributes:
        precision: the precision it is for ("fp32", "fp16", "int8", "int4").
        max_ppl_increase: largest allowed relative perplexity increase on the held-out text (0.02 is +2 %).
        min_top1: smallest allowed share of the text's positions whose next-token argmax agrees with the baseline's.
        min_greedy_prefix: smallest allowed mean share of each prompt's greedy tokens that match the baseline's
            before the first difference (1.0: every prompt's continuation identical).
        basis: the measurements the bound was set from (docs/methodology.md, "Quality bounds for language models").
    """

    precision: str
    max_ppl_increase: float
    min_top1: float
    min_greedy_prefix: float
    basis: str = ""

    def __post_init__(self) -> None:
        if not (self.max_ppl_increase >= 0 and 0 <= self.min_top1 <= 1 and 0 <= self.min_greedy_prefix <= 1):
            raise ValueError(f"bound {self.precision!r}: need max_ppl_increase >= 0, min_top1 and min_greedy_prefix in "
                             f"[0, 1], got {self.max_ppl_increase}, {self.min_top1}, {self.min_greedy_prefix}")

    def params(self) -> dict[str, str]:
        return {"quality.bound": self.precision, "quality.max_ppl_increase": repr(self.max_ppl_increase),
                "quality.min_top1": repr(self.min_top1), "quality.min_greedy_prefix": repr(self.min_greedy_prefix)}


def load_bounds(path: str | Path = BOUNDS_FILE, *, max_ppl_increase: float | None = None) -> dict[str, QualityBound]:
    """The bounds per precision from a TOML table (`[precision]` with `max_ppl_increase`, `min_top1`,
    `min_greedy_prefix`, `basis`); `max_ppl_increase` replaces every precision's perplexity bound (the user's
    `--max-ppl-increase`).

    Raises:
        ValueError: the file is not such a table (the message names the file and what is missing).
    """
    try:
        table = tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ValueError(f"cannot read the LM quality bounds from {path}: {e}") from e
    fields = ("max_ppl_increase", "min_top1", "min_greedy_prefix")
    bounds = {}
    for precision, values in table.items():
        missing = [f for f in fields if not isinstance(values, dict) or f not in values]
        if missing:
            raise ValueError(f"{path}: [{precision}] needs {', '.join(fields)}; missing {', '.join(missing)}")
        bound = QualityBound(precision, float(values["max_ppl_increase"]), float(values["min_top1"]),
                             float(values["min_greedy_prefix"]), basis=str(values.get("basis", "")))
        bounds[precision] = bound if max_ppl_increase is None else replace(bound, max_ppl_increase=max_ppl_increase)
    if not bounds:
        raise ValueError(f"{path} holds no bounds")
    return bounds


@dataclass(frozen=True)
class TextScores:
    """What one model did on the evaluation text and prompts.

    Attributes:
        chunk_nll: mean next-token negative log-likelihood (nats) of each held-out chunk, [chunks].
        logprobs: next-token log-probabilities at every scored position, [chunks, positions, vocab] (float32; a
            memory map for a large vocabulary).
        greedy: the greedy continuation of each prompt, int64 [prompts, new_tokens].
    """

    chunk_nll: np.ndarray
    logprobs: np.ndarray
    greedy: np.ndarray

    @property
    def perplexity(self) -> float:
        """exp of the mean NLL over every scored token (the chunks are of one length)."""
        return math.exp(float(np.mean(self.chunk_nll)))


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Log-probabilities over the last axis, in float64."""
    shifted = np.asarray(logits, dtype=np.float64)
    shifted = shifted - shifted.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def token_nll(logprobs: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """The negative log-likelihood of each target token: logprobs [..., vocab], targets [...] -> [...].

    Raises:
        ValueError: the shapes do not line up, or a target lies outside the vocabulary.
    """
    targets = np.asarray(targets)
    if logprobs.shape[:-1] != targets.shape:
        raise ValueError(f"log-probabilities {logprobs.shape} do not line up with targets {targets.shape}")
    if targets.size and (targets.min() < 0 or targets.max() >= logprobs.shape[-1]):
        raise ValueError(f"target ids must lie in [0, {logprobs.shape[-1]}), got [{targets.min()}, {targets.max()}]")
    return -np.take_along_axis(logprobs, targets[..., None].astype(np.int64), axis=-1)[..., 0]


def matching_prefixes(baseline: np.ndarray, attempt: np.ndarray) -> np.ndarray:
    """How many leading tokens of each row agree: [rows, n] twice -> [rows] (n where the whole row agrees)."""
    if baseline.shape != attempt.shape:
        raise ValueError(f"greedy continuations of different shapes: {baseline.shape} and {attempt.shape}")
    differs = baseline != attempt
    return np.where(differs.any(axis=1), differs.argmax(axis=1), baseline.shape[1])


@dataclass(frozen=True)
class TextQuality:
    """An attempt's quality on real text against its baseline's, and the bound it was judged by.

    Attributes:
        perplexity: the attempt's on the held-out text.
        baseline_perplexity: the baseline's on the same text.
        ppl_increase: perplexity / baseline's - 1.
        ppl_increase_low, ppl_increase_high: its interval (`CONFIDENCE`) from the chunks' paired changes.
        top1_agreement: share of the text's positions whose argmax agrees with the baseline's.
        kl_divergence: mean KL(baseline || attempt) of the next-token distributions along the text (nats).
        greedy_prefix: mean over prompts of the share of greedy tokens matching the baseline's before the first
            difference.
        greedy_exact: share of prompts whose whole greedy continuation matches the baseline's.
        new_tokens: greedy tokens per prompt.
        bound: what it was judged by; None: measured, not judged.
    """

    perplexity: float
    baseline_perplexity: float
    ppl_increase: float
    ppl_increase_low: float
    ppl_increase_high: float
    top1_agreement: float
    kl_divergence: float
    greedy_prefix: float
    greedy_exact: float
    new_tokens: int
    bound: QualityBound | None = None

    @property
    def failures(self) -> list[str]:
        """Each bound the attempt broke, said with its figure; empty when it passed or was not judged."""
        b = self.bound
        if b is None:
            return []
        finite = all(math.isfinite(v) for v in (self.perplexity, self.kl_divergence))
        failed = [] if finite else ["non-finite logits"]
        if not self.ppl_increase <= b.max_ppl_increase:
            failed.append(f"perplexity +{self.ppl_increase:.1%} > +{b.max_ppl_increase:.1%}")
        if self.top1_agreement < b.min_top1:
            failed.append(f"top-1 along the text {self.top1_agreement:.3f} < {b.min_top1}")
        if self.greedy_prefix < b.min_greedy_prefix:
            failed.append(f"greedy prefix {self.greedy_prefix:.3f} < {b.min_greedy_prefix}")
        return failed

    @property
    def passed(self) -> bool | None:
        return None if self.bound is None else not self.failures

    @property
    def margin(self) -> float:
        """How far inside its bound the attempt landed, as `task_diff.accuracy_margin` says it for a task's check: the
        smallest share left of each figure's room (perplexity: the allowed increase; top-1 and greedy prefix: from
        the bound to 1); 1 is the baseline itself, < 0 is outside. Ranks attempts; `passed` says whether it passed.

        Raises:
            ValueError: the attempt was not judged (no bound).
        """
        b = self.bound
        if b is None:
            raise ValueError("an attempt measured without a bound has no margin")
        if not all(math.isfinite(v) for v in (self.perplexity, self.kl_divergence)):
            return float("-inf")
        shares = ((b.max_ppl_increase - self.ppl_increase) / max(b.max_ppl_increase, 1e-9),
                  (self.top1_agreement - b.min_top1) / max(1.0 - b.min_top1, 1e-9),
                  (self.greedy_prefix - b.min_greedy_prefix) / max(1.0 - b.min_greedy_prefix, 1e-9))
        return float(min(shares))

    def metrics(self, prefix: str = "quality.") -> dict[str, float]:
        figures = {"perplexity": self.perplexity, "perplexity_baseline": self.baseline_perplexity,
                   "ppl_increase": self.ppl_increase, "ppl_increase_ci_low": self.ppl_increase_low,
                   "ppl_increase_ci_high": self.ppl_increase_high, "top1_agreement": self.top1_agreement,
                   "kl_divergence": self.kl_divergence, "greedy_prefix": self.greedy_prefix,
                   "greedy_exact": self.greedy_exact}
        if self.passed is not None:
            figures["passed"] = float(self.passed)
        return {prefix + key: float(value) for key, value in figures.items()}

    def params(self, prefix: str = "quality.") -> dict[str, str]:
        params = {"quality.new_tokens": str(self.new_tokens), **(self.bound.params() if self.bound else {})}
        if self.bound is not None:
            params["quality.failed"] = "; ".join(self.failures) or "none"
        return {prefix + key.removeprefix("quality."): value for key, value in params.items()}


@dataclass(frozen=True)
class CheckedOnText:
    """A language model's forward check: its logits on the study's feeds against the baseline's (`LogitsDiff`), and its
    quality on real text (`TextQuality`); it passes when both do."""

    logits: LogitsDiff
    quality: TextQuality

    @property
    def passed(self) -> bool:
        return bool(self.logits.passed) and self.quality.passed is not False

    @property
    def max_abs(self) -> float:
        return self.logits.max_abs

    @property
    def nonfinite_mismatches(self) -> int:
        return self.logits.nonfinite_mismatches

    def metrics(self) -> dict[str, float]:
        return {**self.logits.metrics(), **self.quality.metrics(), METRIC_DIFF_PASSED: float(self.passed)}

    def params(self) -> dict[str, str]:
        return {**self.logits.params(), **self.quality.params()}


def compare_scores(baseline: TextScores, attempt: TextScores, bound: QualityBound | None) -> TextQuality:
    """The attempt's quality on the same text and prompts as the baseline's, judged by `bound` (None: not judged).

    Raises:
        ValueError: the two were scored on different text (shapes differ).
    """
    if baseline.chunk_nll.shape != attempt.chunk_nll.shape or baseline.logprobs.shape != attempt.logprobs.shape:
        raise ValueError(f"scores of different text: {baseline.logprobs.shape} and {attempt.logprobs.shape}")
    changes = attempt.chunk_nll - baseline.chunk_nll  # per chunk: log(ppl ratio)
    low, high = _mean_interval(changes)
    top1, kl = _agreement(baseline.logprobs, attempt.logprobs)
    prefixes = matching_prefixes(baseline.greedy, attempt.greedy)
    new_tokens = int(baseline.greedy.shape[1])
    return TextQuality(
        perplexity=attempt.perplexity, baseline_perplexity=baseline.perplexity,
        ppl_increase=attempt.perplexity / baseline.perplexity - 1,
        ppl_increase_low=math.expm1(low), ppl_increase_high=math.expm1(high),
        top1_agreement=top1, kl_divergence=kl,
        greedy_prefix=float(np.mean(prefixes / new_tokens)), greedy_exact=float(np.mean(prefixes == new_tokens)),
        new_tokens=new_tokens, bound=bound)


def _mean_interval(values: np.ndarray) -> tuple[float, float]:
    """A t interval of the mean (`CONFIDENCE`); the mean itself twice for fewer than 2 values."""
    from scipy import stats

    mean = float(np.mean(values))
    if values.size < 2 or not np.all(np.isfinite(values)):
        return mean, mean
    half = float(stats.t.ppf(0.5 + CONFIDENCE / 2, values.size - 1) * np.std(values, ddof=1) / math.sqrt(values.size))
    return mean - half, mean + half


def _agreement(baseline: np.ndarray, attempt: np.ndarray) -> tuple[float, float]:
    """Top-1 agreement and mean KL(baseline || attempt) over every position, a chunk at a time (the arrays may be
    memory maps of a few hundred MB)."""
    agree, kl, count = 0, 0.0, 0
    for base, other in zip(baseline, attempt, strict=True):
        base, other = np.asarray(base, dtype=np.float64), np.asarray(other, dtype=np.float64)
        agree += int(np.sum(base.argmax(axis=-1) == other.argmax(axis=-1)))
        kl += float(np.sum(np.exp(base) * (base - other)))
        count += base.shape[0]
    return agree / count, kl / count


def bound_for(bounds: Mapping[str, QualityBound], precision: str) -> QualityBound:
    """The bound of `precision`.

    Raises:
        ValueError: no bound is set for it (the message lists those that are).
    """
    if precision not in bounds:
        raise ValueError(f"no LM quality bound for precision {precision!r}; bounds are set for {', '.join(bounds)}")
    return bounds[precision]
