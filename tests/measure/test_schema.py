"""The one mapping between a scenario's typed figures and metric keys: what is written is read back whole."""

from __future__ import annotations

import dataclasses

import pytest

from tracker.base.vocabulary import Phase
from tracker.measure.schema import (
    Scope,
    phase_lengths,
    read_phases,
    read_speedup,
    scenario_figures,
    speedup_metrics,
)
from tracker.measure.timing.speedup import Speedup

SPEEDUP = Speedup(1.8, 1.7, 1.9, 0.95, 48, rounds=6, mde=0.031, calls_per_block=3)


@pytest.mark.parametrize(
    ("scope", "key"),
    [
        pytest.param(Scope(Phase.FORWARD), "latency.speedup_ci_low", id="forward"),
        pytest.param(Scope(Phase.PREFILL, 128), "gen.prefill.s128.speedup_ci_low", id="prefill"),
        pytest.param(Scope(Phase.DECODE, 512), "gen.decode.past512.speedup_ci_low", id="decode"),
    ],
)
def test_a_speedup_written_under_a_scope_is_read_back_whole(scope, key):
    metrics = speedup_metrics(SPEEDUP, scope)
    assert metrics[key] == 1.7  # the keys runs have always carried
    assert len(metrics) == 7
    assert dataclasses.astuple(read_speedup(metrics, scope)) == dataclasses.astuple(SPEEDUP)
    assert read_speedup(metrics, Scope(Phase.DECODE, 64)) is None  # another length has none


def test_a_phase_is_read_at_the_length_it_was_judged_at_with_its_check_and_roof():
    judged, other = Scope(Phase.DECODE, 512), Scope(Phase.DECODE, 64)
    metrics = {**speedup_metrics(SPEEDUP, judged), judged.prefix + "p50_ms": 4.2, other.prefix + "p50_ms": 2.6,
               judged.prefix + "roofline.memory_bound": 1.0, judged.prefix + "roofline.matmuls.pct_peak": 55.0,
               "gen.diff.passed": 0.0, "gen.decode.pastx.p50_ms": 1.0, "gen.decode_tokens_per_s": 80.0}
    assert phase_lengths(metrics, Phase.DECODE) == [64, 512]  # not "pastx", not the tokens/s figure
    figures = read_phases(metrics)
    assert set(figures) == {Phase.DECODE}
    decode = figures[Phase.DECODE]
    assert (decode.length, decode.p50_ms, decode.passed, decode.roof, decode.matmul_pct_peak) == (
        512, 4.2, False, "memory", 55.0)
    assert decode.speedup.speedup == 1.8


def test_forward_figures_come_from_the_forward_keys():
    metrics = {**speedup_metrics(SPEEDUP), "latency.p50_ms": 3.0, "diff.passed": 1.0,
               "roofline.memory_bound": 0.0, "roofline.matmuls.intensity": 12.5}
    forward = scenario_figures(metrics, Scope(Phase.FORWARD))
    assert (forward.p50_ms, forward.passed, forward.roof, forward.matmul_intensity) == (3.0, True, "compute", 12.5)
    assert read_phases(metrics) == {}
