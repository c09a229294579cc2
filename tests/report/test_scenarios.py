"""Each scenario's best attempt and roof, from rows whose gen.* metrics are written by hand."""

from __future__ import annotations

import pytest

from tracker.base.keys import TAG_VERDICT
from tracker.report.rows import AttemptRow, row_from_content
from tracker.report.scenarios import generation_table, phase_figures, scenario_bests, scenario_tags, scenarios_table


def phase_metrics(phase: str, length: int, speedup: float | None, *, low: float, high: float, memory_bound: float,
                  pct: float = 50.0) -> dict[str, float]:
    prefix = f"gen.{phase}.s{length}." if phase == "prefill" else f"gen.{phase}.past{length}."
    metrics = {prefix + "p50_ms": 10.0, prefix + "roofline.memory_bound": memory_bound,
               prefix + "roofline.matmuls.pct_peak": pct, prefix + "roofline.matmuls.intensity": 0.5}
    if speedup is not None:
        metrics.update({prefix + "speedup": speedup, prefix + "speedup_ci_low": low, prefix + "speedup_ci_high": high,
                        prefix + "speedup_mde": 0.02})
    return metrics


def row(name: str, *, verdict: str, forward: float, prefill: float | None, decode: float | None,
        passed: float = 1.0) -> AttemptRow:
    metrics = {"gen.diff.passed": passed, "latency.speedup": forward, "latency.speedup_ci_low": forward * 0.97,
               "latency.speedup_ci_high": forward * 1.03,
                  **phase_metrics("prefill", 128, prefill, low=(prefill or 1) * 0.97, high=(prefill or 1) * 1.03,
                                  memory_bound=0.0),
                  **phase_metrics("decode", 512, decode, low=(decode or 1) * 0.97, high=(decode or 1) * 1.03,
                                  memory_bound=1.0)}
    return row_from_content(name, metrics=metrics, tags={TAG_VERDICT: verdict})


ROWS = [
    row("baseline", verdict="baseline", forward=1.0, prefill=None, decode=None),
    row("fast_prefill", verdict="better", forward=2.0, prefill=3.0, decode=1.5),
    row("fast_decode", verdict="better", forward=1.2, prefill=0.8, decode=2.2),
    # the fastest decode of all, but its generation check failed: it cannot be the best of any phase
    row("broken", verdict="better", forward=1.1, prefill=1.0, decode=5.0, passed=0.0),
]


def test_each_scenario_names_its_own_best_and_a_failed_generation_check_is_never_it():
    assert scenario_bests(ROWS) == {"forward": "fast_prefill", "prefill": "fast_prefill", "decode": "fast_decode"}
    assert phase_figures(ROWS[3], "decode").verdict == "rejected"
    assert phase_figures(ROWS[2], "prefill").verdict == "worse"
    assert scenario_tags(ROWS) == {"tracker.best_attempt.prefill": "fast_prefill",
                                   "tracker.best_attempt.decode": "fast_decode"}


def test_no_attempt_faster_beyond_the_noise_leaves_the_baseline_best():
    same = [ROWS[0], row("same", verdict="same", forward=1.0, prefill=1.01, decode=0.99)]
    assert scenario_bests(same) == {"forward": "baseline", "prefill": "baseline", "decode": "baseline"}


def test_rows_without_generation_figures_have_the_forward_scenario_only():
    rows = [AttemptRow(attempt="baseline", verdict="baseline", speedup=1.0)]
    assert scenario_bests(rows) == {"forward": "baseline"}
    assert generation_table(rows).empty and scenario_tags(rows) == {}


def test_the_tables_carry_each_phase_length_roof_and_speed_up():
    scenarios = scenarios_table(ROWS).set_index("scenario")
    assert scenarios.loc["prefill", "measured"] == "the prompt pass of 128 tokens"
    assert scenarios.loc["decode", "measured"] == "one token after a past of 512"
    assert scenarios.loc["prefill", "roof"] == "compute" and scenarios.loc["decode", "roof"] == "memory"
    assert scenarios.loc["decode", "speedup"] == pytest.approx(2.2)
    generation = generation_table(ROWS)
    assert len(generation) == 2 * len(ROWS)
    assert set(generation[generation["phase"] == "decode"]["length"]) == {512}
