"""A study's scenarios side by side: forward (one pass over the study's feeds: the attempts' own speed-up and
check), and the generation scenario's two phases, prefill (the prompt pass) and decode (one token against a past),
from the rows' typed figures (`AttemptRow.phases`). For each: the best attempt, and the roof the phase's time sits
under; on a study over several node types, for each node type."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pandas as pd

from tracker.base.keys import NO_BEST, TAG_BEST, sanitize_key
from tracker.base.vocabulary import GENERATION_PHASES, Phase, Verdict
from tracker.measure.costmodel import roofline as R
from tracker.measure.costmodel.step_split import StepSplit
from tracker.measure.schema import ScenarioFigures
from tracker.measure.timing.speedup import BASELINE_SPEEDUP, Speedup, judge
from tracker.report.rows import (
    NODE_TYPE,
    AttemptRow,
    attempt_labels,
    best_attempt,
    node_type_groups,
    pick_best,
    several_node_types,
)

FORWARD, PREFILL, DECODE = Phase.FORWARD, Phase.PREFILL, Phase.DECODE
PHASES = GENERATION_PHASES
_WHAT = {FORWARD: "one pass over the study's inputs", PREFILL: "the prompt pass of {n} tokens",
         DECODE: "one token after a past of {n}"}


def best_tag(scenario: str) -> str:
    """The study run's tag naming a scenario's best attempt: `tracker.best_attempt` for forward (the study's
    best), `tracker.best_attempt.prefill`, `tracker.best_attempt.decode`."""
    return TAG_BEST if scenario == FORWARD else f"{TAG_BEST}.{scenario}"


def node_type_best_tag(scenario: str, node_type: str) -> str:
    """The study run's tag naming a scenario's best attempt on one node type, when it ran on several:
    `tracker.best_attempt.node_type.<type>`, `tracker.best_attempt.decode.node_type.<type>`; a type MLflow would
    refuse in a key (`Xeon(R) 8480+`) is sanitized (`tracker.base.keys.sanitize_key`)."""
    return sanitize_key(f"{best_tag(scenario)}.node_type.{node_type}")


@dataclass(frozen=True)
class PhaseFigures:
    """One attempt's figures in one generation phase, and its verdict there.

    Attributes:
        attempt: the attempt's name.
        figures: its typed figures in the phase (`tracker.measure.schema.ScenarioFigures`).
        speedup: against the baseline (`BASELINE_SPEEDUP` for the baseline itself), or None when not timed.
        verdict: `judge`'s: the baseline, the speed-up's, or rejected when the generation check failed; None when
            the phase was not timed against the baseline.
    """

    attempt: str
    figures: ScenarioFigures
    speedup: Speedup | None
    verdict: Verdict | None

    @property
    def length(self) -> int | None:
        return self.figures.length


def phase_figures(row: AttemptRow, phase: Phase) -> PhaseFigures | None:
    """The row's figures in `phase`, or None when it has none (no generation, or it failed)."""
    figures = row.phases.get(phase)
    if row.failed or figures is None:
        return None
    baseline = row.verdict == Verdict.BASELINE
    speedup = BASELINE_SPEEDUP if baseline else figures.speedup
    verdict = judge(speedup, accuracy_passed=figures.passed, baseline=baseline) if speedup is not None else None
    return PhaseFigures(row.attempt, figures, speedup, verdict)


def scenario_bests(rows: Sequence[AttemptRow]) -> dict[Phase, str | None]:
    """The best attempt of each scenario the rows have: forward always (`pick_best`), prefill and decode when some
    row has generation figures. A phase's best is the largest speed-up among its "better" verdicts (faster beyond
    the noise, generation check passed), else the baseline: the same rule as forward's (`best_attempt`)."""
    bests: dict[Phase, str | None] = {FORWARD: pick_best(rows)}
    for phase in PHASES:
        figures = [f for f in (phase_figures(r, phase) for r in rows) if f is not None]
        if figures:
            bests[phase] = best_attempt((f.attempt, f.verdict, f.speedup.speedup if f.speedup else None)
                                        for f in figures)
    return bests


def scenario_tags(rows: Sequence[AttemptRow]) -> dict[str, str]:
    """The study run's tags naming each generation phase's best attempt (forward's is `log_study_summary`'s), and
    on rows of several node types each scenario's best on each type (`node_type_best_tag`): the overall tags stay
    the overall rule's answer, the per-type ones are the answers to read there."""
    tags = {best_tag(s): best or NO_BEST for s, best in scenario_bests(rows).items() if s != FORWARD}
    for node_type, bests in node_type_bests(rows).items():
        tags |= {node_type_best_tag(s, node_type): best or NO_BEST for s, best in bests.items()}
    return tags


def node_type_bests(rows: Sequence[AttemptRow]) -> dict[str, dict[Phase, str | None]]:
    """Each node type's `scenario_bests`, from its own rows (its speed-ups are against its own baseline), when the
    rows hold several node types; else empty (a local study, or a cluster of one node type)."""
    if not several_node_types(rows):
        return {}
    return {t: scenario_bests(group) for t, group in node_type_groups(rows).items() if t is not None}


# --- the report's section ---------------------------------------------------------------------------------------

GENERATION_COLUMNS = ("attempt", "phase", "length", "p50_ms", "speedup", "speedup_ci_low", "speedup_ci_high",
                      "verdict", "gen_check_passed", "matmul_pct_peak", "matmul_flop_per_byte", "roof")
SCENARIO_COLUMNS = ("scenario", "measured", "best", "speedup", "speedup_ci_low", "speedup_ci_high", "roof",
                    "matmul_pct_peak", "matmul_flop_per_byte")


def generation_table(rows: Sequence[AttemptRow]) -> pd.DataFrame:
    """One row per attempt and phase (`GENERATION_COLUMNS`), attempts in study order; on rows of several node
    types, one table per type (`NODE_TYPE` first)."""
    if several_node_types(rows):
        return _per_node_type(rows, generation_table)
    records = []
    for phase in PHASES:
        for f in (phase_figures(r, phase) for r in rows):
            if f is None:
                continue
            s = f.speedup
            records.append(dict(zip(GENERATION_COLUMNS, (
                f.attempt, f.figures.phase, f.length, f.figures.p50_ms, s.speedup if s else None, s.ci_low if s else None,
                s.ci_high if s else None, f.verdict, f.figures.passed, f.figures.matmul_pct_peak, f.figures.matmul_intensity,
                f.figures.roof))))
    return pd.DataFrame(records, columns=list(GENERATION_COLUMNS))


def scenarios_table(rows: Sequence[AttemptRow], forward_rooflines: Mapping[str, R.Roofline] | None = None
                    ) -> pd.DataFrame:
    """One row per scenario (`SCENARIO_COLUMNS`): what it measures, its best attempt, the best's speed-up and the
    roof of the best's time (the forward roof from `forward_rooflines`, by attempt name). On rows of several node
    types, one table per type (`NODE_TYPE` first)."""
    if several_node_types(rows):
        return _per_node_type(rows, lambda group: scenarios_table(group, forward_rooflines))
    bests = scenario_bests(rows)
    by_name = {r.attempt: r for r in rows}
    records = []
    for scenario, best in bests.items():
        speedup: tuple[float | None, float | None, float | None] | None = None
        roof: str | None = None
        pct = intensity = None
        length = None
        if best is not None and scenario == FORWARD:
            r = by_name[best]
            speedup = (r.speedup, r.speedup_ci_low, r.speedup_ci_high)
            roofline = (forward_rooflines or {}).get(best)
            if roofline is not None:
                roof = roofline.bound
                if roofline.matmuls is not None:
                    pct, intensity = roofline.matmuls[R.PCT_PEAK], roofline.matmuls[R.INTENSITY]
        elif best is not None:
            f = phase_figures(by_name[best], scenario)
            assert f is not None  # a phase's best has figures in it
            length = f.length
            speedup = (f.speedup.speedup, f.speedup.ci_low, f.speedup.ci_high) if f.speedup else None
            roof, pct, intensity = f.figures.roof, f.figures.matmul_pct_peak, f.figures.matmul_intensity
        records.append(dict(zip(SCENARIO_COLUMNS, (
            scenario, _WHAT[scenario].format(n=length), best, *(speedup or (None, None, None)), roof, pct,
            intensity))))
    return pd.DataFrame(records, columns=list(SCENARIO_COLUMNS))


def _per_node_type(rows: Sequence[AttemptRow], table) -> pd.DataFrame:
    """`table` of each node type's rows, one after the other, with the type as first column (`NODE_TYPE`). Rows
    without a node type (attempts that failed before they reached one) have no figures to show there."""
    parts = [table(group).assign(**{NODE_TYPE: t}) for t, group in node_type_groups(rows).items() if t is not None]
    whole = pd.concat([p for p in parts if not p.empty] or parts[:1], ignore_index=True)
    return whole[[NODE_TYPE, *(c for c in whole.columns if c != NODE_TYPE)]]


def roof_sentences(scenarios: pd.DataFrame) -> list[str]:
    """One plain-text sentence per scenario of `scenarios_table` whose roof is known: its best attempt, the roof,
    and where the matrix products run against it."""
    out = []
    for row in scenarios.to_dict("records"):
        if row["roof"] is None or pd.isna(row["matmul_pct_peak"]):
            continue
        where = f"On {row[NODE_TYPE]}: " if NODE_TYPE in row else ""
        out.append(f"{where}{row['scenario'].capitalize()} ({row['measured']}, {row['best']}): bound by {row['roof']}; "
                   f"the matrix products run at {row['matmul_flop_per_byte']:.3g} FLOP per byte, "
                   f"{row['matmul_pct_peak']:.0f} % of the roof there.")
    return out


SPLIT_NOTE = (
    "One decode step, timed as the decode loop runs it (the past fed as numpy arrays, the presents returned as "
    "arrays) in a profiled session: the means over the middle half of its steps. Matrix products with a weight: the "
    "layers' and the lm_head's (the product that makes the logits), each with its weight's dequantization and its "
    "activation's quantization. Attention: the kernels between the projections (the score and context products, "
    "softmax, the mask, the heads' transposes, fused attention). KV cache I/O: the step's wall time outside ONNX "
    "Runtime's run (the past in, the presents out) and the in-graph Concat of the past and the new key/value. Other: "
    "the rest (layer norms, GELU, embeddings, residual adds) and ONNX Runtime's time between kernels, where the "
    "profiler's own cost lands.")


def decode_splits(rows: Sequence[AttemptRow]) -> tuple[int | None, dict[str, StepSplit]]:
    """The decode phase's length and each attempt's split of its decode step there (`ScenarioFigures.split`), by
    attempt label, in study order; attempts without one (failed, no generation, older runs) are left out."""
    splits, length = {}, None
    for label, row in zip(attempt_labels(rows), rows):
        f = phase_figures(row, DECODE)
        if f is not None and f.figures.split is not None:
            splits[label] = f.figures.split
            length = length or f.length
    return length, splits
