"""A new model measured against the model it would replace (a registry's champion) in one session: the speed-up with
its interval from interleaved fresh sessions, the verdict, and the accuracy check of the new model's outputs against
the champion's on the same feeds. `tracker check` gates CI on it.

Both models must take the same inputs (names, dtypes, shapes) and give outputs of the same names: what differs is
bad input (`check_same_interface`), not a failed check.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import onnx

from tracker.base.errors import ModelError
from tracker.base.keys import METRIC_DIFF_PASSED
from tracker.base.vocabulary import Verdict
from tracker.measure.accuracy.lm_diff import LogitsDiff
from tracker.measure.accuracy.output_diff import OutputDiff
from tracker.measure.accuracy.task_compare import ClassificationDiff, EmbeddingDiff, RegressionDiff
from tracker.measure.attempt import Attempt
from tracker.measure.inputs.feed_checks import check_feeds, check_indices
from tracker.measure.inputs.model_inputs import input_specs
from tracker.measure.measurement import time_against
from tracker.measure.runtimes.runtime import get_runtime
from tracker.measure.timing.interval import Speedup
from tracker.measure.timing.speedup import SpeedupConfig, describe, judge

Diff = OutputDiff | LogitsDiff | RegressionDiff | ClassificationDiff | EmbeddingDiff


class _Bounded(Protocol):  # an accuracy check: its bounds as params
    def params(self) -> dict[str, str]: ...


def bounds_text(diff: _Bounded) -> str:
    """An accuracy check's bounds, in one line: `tolerance fp32, rtol 0.0001, atol 0.0001`."""
    return ", ".join(f"{k.removeprefix('diff.')} {v}" for k, v in diff.params().items())


@dataclass(frozen=True)
class AgainstChampion:
    """A new model against the champion, measured in one session.

    Attributes:
        speedup: the champion's time / the new model's (> 1: the new one is faster), with its interval.
        diff: the new model's outputs against the champion's, by the new model's tolerance.
        verdict: `judge`'s: `rejected` when the accuracy check failed, else what the interval says.
    """

    speedup: Speedup
    diff: Diff
    verdict: Verdict

    @property
    def passed(self) -> bool:
        """Not slower than the champion (any verdict but `worse`), and the accuracy check passed."""
        return self.diff.passed and self.verdict not in (Verdict.WORSE, Verdict.REJECTED)

    def speed_text(self) -> str:
        """The speed-up, its interval and what it means: `speed-up 0.480x [0.460, 0.500] (95% interval over 6
        rounds): 52.0% slower, beyond the 3.0% this measurement could detect`."""
        s = self.speedup
        return (f"speed-up {s.speedup:.3f}x [{s.ci_low:.3f}, {s.ci_high:.3f}] ({s.confidence:.0%} interval over "
                f"{s.rounds} rounds): {describe(s.speedup, s.mde, s.interval_verdict)}")

    def accuracy_text(self) -> str:
        """The accuracy check's bounds and figures: `(tolerance fp32, rtol 0.0001, atol 0.0001): max_abs 0.35, ...`."""
        bounds = bounds_text(self.diff)
        figures = ", ".join(f"{k.removeprefix('diff.')} {v:.4g}" for k, v in self.diff.metrics().items()
                            if k != METRIC_DIFF_PASSED)
        return f"({bounds}): {figures}"

    def failure(self) -> str | None:
        """Why the new model fails the gate (its verdict and interval, or its accuracy figures); None if it passes."""
        if not self.diff.passed:
            return f"verdict {self.verdict}: the accuracy check against the champion failed {self.accuracy_text()}"
        if self.verdict == Verdict.WORSE:
            return f"verdict {self.verdict}: {self.speed_text()}"
        return None

    def figures(self) -> dict[str, object]:
        """The figures, JSON-ready, for a CI comment."""
        s = self.speedup
        return {
            "speedup": s.speedup, "ci_low": s.ci_low, "ci_high": s.ci_high, "confidence": s.confidence,
            "rounds": s.rounds, "pairs": s.pairs, "mde": s.mde, "disturbed_rounds": s.disturbed_rounds,
            "verdict": str(self.verdict),
            "accuracy": {"passed": bool(self.diff.passed), "bounds": self.diff.params(),
                         "figures": {k: float(v) for k, v in self.diff.metrics().items()}},
            "passed": self.passed,
        }


def check_same_interface(model: onnx.ModelProto, champion: onnx.ModelProto) -> None:
    """Checks that `model` takes the champion's inputs (names, dtypes, shapes) and gives outputs of its names.

    A dim is the same when both are the same size, or both symbolic (exporters name symbols as they like); a fixed
    size against a symbolic dim differs.

    Raises:
        ModelError: one line naming each difference.
    """
    ours, theirs = ({s.name: s for s in input_specs(m)} for m in (model, champion))
    problems = []
    if set(ours) != set(theirs):
        problems.append(f"input names {sorted(ours)} against the champion's {sorted(theirs)}")
    for name in sorted(set(ours) & set(theirs)):
        a, b = ours[name], theirs[name]
        if a.dtype != b.dtype:
            problems.append(f"input {name!r} has dtype {a.dtype}, the champion's {b.dtype}")
        if len(a.dims) != len(b.dims) or any(_dim_differs(x, y) for x, y in zip(a.dims, b.dims)):
            problems.append(f"input {name!r} has shape {_shape(a.dims)}, the champion's {_shape(b.dims)}")
    outputs = [[o.name for o in m.graph.output] for m in (model, champion)]
    if outputs[0] != outputs[1]:
        problems.append(f"outputs {outputs[0]} against the champion's {outputs[1]}")
    if problems:
        raise ModelError(f"the model's inputs or outputs differ from the champion's: {'; '.join(problems)}")


def _dim_differs(a: int | str, b: int | str) -> bool:
    return (isinstance(a, int) or isinstance(b, int)) and a != b


def _shape(dims: tuple[int | str, ...]) -> str:
    return f"[{', '.join(map(str, dims))}]"


def measure_against_champion(model: Attempt, champion: Attempt, feeds: Mapping[str, np.ndarray], *,
                             config: SpeedupConfig) -> AgainstChampion:
    """Runs both models once on `feeds` and checks the new one's outputs against the champion's by `model.tolerance`,
    then times them interleaved in rounds of fresh sessions (`time_against`) and judges the speed-up (`judge`).

    Raises:
        ModelError: the two models' inputs or outputs differ (`check_same_interface`), or their outputs cannot be
            compared (their number or shapes differ).
        FeedError: `feeds` do not fit one of them.
    """
    ours, theirs = (a.load(external_data=get_runtime(a.runtime).needs_weights) for a in (model, champion))
    check_same_interface(ours, theirs)
    for loaded in (ours, theirs):
        check_feeds(loaded, feeds)
        check_indices(loaded, feeds)
    expected = get_runtime(champion.runtime).runner(champion, theirs)(feeds)
    got = get_runtime(model.runtime).runner(model, ours)(feeds)
    try:
        diff = model.tolerance.compare(expected, got)
    except ValueError as e:
        raise ModelError(f"the model's outputs cannot be compared with the champion's on these feeds: {e}") from e
    del expected, got  # the sessions' outputs, before the timing makes its own sessions
    speedup = time_against(model, champion, feeds, config, model=ours)
    verdict = judge(speedup, accuracy_passed=diff.passed)
    assert verdict is not None, "a timed speed-up always has a verdict"
    return AgainstChampion(speedup=speedup, diff=diff, verdict=verdict)
