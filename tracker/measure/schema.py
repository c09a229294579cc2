"""What a run's figures mean, typed per scenario, and the one mapping between them and metric keys.

An attempt is measured in scenarios (`Phase`): forward (one pass over the study's feeds), and generation's prefill
(the prompt pass at a length) and decode (one token against a past of a length). In each it has the same typed
figures (`ScenarioFigures`): the median latency, the speed-up against its baseline, the accuracy check, and where
its matrix products sit under the roof. `Scope` says where a scenario's figures live among a run's metrics; the
writers (`speedup_metrics`, the generation result, the live attempt) and the reader (`read_scenarios`, used for
live rows and read-back rows alike) both go through it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from tracker.base.keys import METRIC_DIFF_PASSED
from tracker.base.vocabulary import GENERATION_PHASES, Phase
from tracker.measure.costmodel.roofline import MATMULS
from tracker.measure.costmodel.step_split import StepSplit, read_step_split
from tracker.measure.timing.speedup import Speedup

GENERATION_PREFIX = "gen."  # the generation phases' keys
# Forward keys read back by name: the check, the latency, the graph.
DIFF_PASSED = METRIC_DIFF_PASSED
GEN_DIFF_PASSED = GENERATION_PREFIX + METRIC_DIFF_PASSED  # the generation check along the baseline's tokens: both phases'
P50_MS = "latency.p50_ms"
SPEEDUP_VS_BASELINE = "latency.speedup_vs_baseline"
DIFF_MAX_ABS = "diff.max_abs"
DIFF_NONFINITE = "diff.nonfinite_mismatches"
TOP1 = "diff.top1_agreement"
COSINE_MIN = "diff.cosine_min"
# A language model's quality on real text (`text_quality.TextQuality.metrics`): the forward scenario's.
PPL_INCREASE = "quality.ppl_increase"
GREEDY_PREFIX = "quality.greedy_prefix"
SIZE_BYTES = "model.size_bytes"
NODE_COUNT = "graph.node_count"

# A speed-up's fields and the suffix of their keys (after the scope's timing prefix).
_SPEEDUP_KEYS = {"speedup": "speedup", "ci_low": "speedup_ci_low", "ci_high": "speedup_ci_high",
                 "pairs": "speedup_pairs", "rounds": "speedup_rounds", "mde": "speedup_mde",
                 "calls_per_block": "speedup_calls_per_block"}
_COUNTS = ("pairs", "rounds", "calls_per_block")
# The length's marker in a phase's keys: `gen.prefill.s128.`, `gen.decode.past512.`.
_LENGTH_MARK = {Phase.PREFILL: "s", Phase.DECODE: "past"}


@dataclass(frozen=True)
class Scope:
    """Where one scenario's figures live among a run's metrics."""

    phase: Phase
    length: int | None = None  # prompt tokens (prefill) or past length (decode); None for forward

    @property
    def prefix(self) -> str:
        """`latency.` for forward's timing; `gen.prefill.s128.`, `gen.decode.past512.` for a phase's."""
        if self.phase is Phase.FORWARD:
            return "latency."
        return f"{GENERATION_PREFIX}{self.phase}.{_LENGTH_MARK[self.phase]}{self.length}."

    @property
    def roofline_prefix(self) -> str:
        """Forward's roofline is `roofline.*`; a phase's sits under its prefix."""
        return "" if self.phase is Phase.FORWARD else self.prefix

    @property
    def check_key(self) -> str:
        return DIFF_PASSED if self.phase is Phase.FORWARD else GEN_DIFF_PASSED


def phase_prefix(phase: Phase | str, length: int) -> str:
    """The start of a generation phase's metric keys at a length (`Scope.prefix`)."""
    return Scope(Phase(phase), length).prefix


def speedup_metrics(speedup: Speedup, scope: Scope = Scope(Phase.FORWARD)) -> dict[str, float]:
    """A speed-up's metrics under a scope: `latency.speedup`, `latency.speedup_ci_low`, ... for forward."""
    return {scope.prefix + key: float(getattr(speedup, name)) for name, key in _SPEEDUP_KEYS.items()}


def read_speedup(metrics: Mapping[str, float], scope: Scope = Scope(Phase.FORWARD)) -> Speedup | None:
    """The speed-up `speedup_metrics` wrote under `scope`, or None when there is none (the interval's level is
    not logged: it is the measurement's, 0.95)."""
    values = {name: metrics.get(scope.prefix + key) for name, key in _SPEEDUP_KEYS.items()}
    if values["speedup"] is None or values["ci_low"] is None or values["ci_high"] is None:
        return None
    counts = {name: int(values[name] or (1 if name == "calls_per_block" else 0)) for name in _COUNTS}
    return Speedup(values["speedup"], values["ci_low"], values["ci_high"], 0.95, counts["pairs"],
                   rounds=counts["rounds"], mde=values["mde"] or 0.0, calls_per_block=counts["calls_per_block"])


@dataclass(frozen=True)
class ScenarioFigures:
    """One attempt's figures in one scenario.

    Attributes:
        scope: the scenario, and the length its speed-up and roofline are at.
        p50_ms: the median latency there.
        speedup: against the baseline, or None when not timed against it.
        passed: the scenario's accuracy check (`diff.passed`, `gen.diff.passed`), or None when none was made.
        matmul_pct_peak: the matrix products' share of the roof at their intensity.
        matmul_intensity: their FLOP per byte.
        memory_bound: whether most of the kernel time is below the ridge.
        split: where a step's time goes (`StepSplit`, under `<prefix>split.`); the decode phase's, at its length.
    """

    scope: Scope
    p50_ms: float | None = None
    speedup: Speedup | None = None
    passed: bool | None = None
    matmul_pct_peak: float | None = None
    matmul_intensity: float | None = None
    memory_bound: bool | None = None
    split: StepSplit | None = None

    @property
    def phase(self) -> Phase:
        return self.scope.phase

    @property
    def length(self) -> int | None:
        return self.scope.length

    @property
    def roof(self) -> str | None:
        return None if self.memory_bound is None else ("memory" if self.memory_bound else "compute")


def scenario_figures(metrics: Mapping[str, float], scope: Scope) -> ScenarioFigures:
    """An attempt's figures in one scenario, read from its metrics."""
    roofline = scope.roofline_prefix + "roofline."
    passed, bound = metrics.get(scope.check_key), metrics.get(roofline + "memory_bound")
    return ScenarioFigures(
        scope=scope,
        p50_ms=metrics.get(scope.prefix + "p50_ms"),
        speedup=read_speedup(metrics, scope),
        passed=None if passed is None else bool(passed),
        matmul_pct_peak=metrics.get(f"{roofline}{MATMULS}.pct_peak"),
        matmul_intensity=metrics.get(f"{roofline}{MATMULS}.intensity"),
        memory_bound=None if bound is None else bool(bound),
        split=read_step_split(metrics, scope.prefix),
    )


def phase_lengths(metrics: Mapping[str, float], phase: Phase) -> list[int]:
    """The lengths a generation phase has figures at, ascending (from `gen.decode.past512.p50_ms` and the like)."""
    start, mark = f"{GENERATION_PREFIX}{phase}.", _LENGTH_MARK[phase]
    lengths = set()
    for key in metrics:
        if key.startswith(start):
            segment = key[len(start):].split(".", 1)[0]
            if segment.startswith(mark) and segment[len(mark):].isdigit():
                lengths.add(int(segment[len(mark):]))
    return sorted(lengths)


def read_phases(metrics: Mapping[str, float]) -> dict[Phase, ScenarioFigures]:
    """The generation phases' figures, each at the longest length that has a speed-up or a roofline (the length the
    phase is judged at); a phase with neither has no figures."""
    phases = {}
    for phase in GENERATION_PHASES:
        judged = [n for n in phase_lengths(metrics, phase) if _judged_at(metrics, Scope(phase, n))]
        if judged:
            phases[phase] = scenario_figures(metrics, Scope(phase, max(judged)))
    return phases


def _judged_at(metrics: Mapping[str, float], scope: Scope) -> bool:
    roofline = scope.roofline_prefix + "roofline."
    return scope.prefix + "speedup" in metrics or any(key.startswith(roofline) for key in metrics)
