"""Disturbed measurements are detected: other processes' CPU load over a step, on the real machine.

A "disturbance" here is real: one busy Python process per core, started by the test.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator

import numpy as np
import pytest
from mlflow import MlflowClient

from tracker import MeasureConfig, Study, TimingConfig
from tracker.compare import format_table, load_comparison
from tracker.measure.timing.cpu_load import DISTURBED_LOAD, CpuLoad, watch_cpu_load
from tracker.measure.timing.speedup import SpeedupConfig


@pytest.fixture
def busy_cores() -> Iterator[int]:
    """Keeps every core busy from other processes until the test ends."""
    cores = os.cpu_count() or 1
    # Each spins until its parent (pytest) is gone, so a killed test run leaves no busy process behind.
    spin = "import os\nparent = os.getppid()\nwhile os.getppid() == parent:\n    pass"
    spinners = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(cores)]
    time.sleep(0.3)  # let them start
    try:
        yield cores
    finally:
        for p in spinners:
            p.kill()
            p.wait()


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


@pytest.mark.timing  # a quiet machine is the premise: a burst of outside load is retried, not a failure
def test_a_quiet_second_is_not_disturbed():
    with watch_cpu_load() as load:
        _spin(1.0)
    assert load.wall_s >= 1.0 and load.own_cpu_s > 0.5
    assert not load.disturbed, load


@pytest.mark.subprocess
def test_other_processes_busy_on_every_core_are_seen(busy_cores):
    with watch_cpu_load() as load:
        _spin(1.0)
    assert load.other_load > 0.3, load
    assert load.disturbed


def test_a_few_milliseconds_are_never_called_disturbed_whatever_the_ticks_say():
    # 20 ms of wall time: one 10 ms tick from anyone else would read as 25 % of a 2-core machine
    load = CpuLoad(wall_s=0.02, own_cpu_s=0.0, others_cpu_s=0.02, cores=2)
    assert load.other_load > DISTURBED_LOAD
    assert not load.disturbed


@pytest.mark.slow
@pytest.mark.subprocess
def test_an_attempt_timed_while_the_cores_are_busy_is_flagged_in_its_run_and_in_compare(
    busy_cores, model, feeds, tmp_path
):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    config = MeasureConfig(profile_runs=3, timing=TimingConfig(warmup_runs=1, min_runs=3, min_seconds=1.0),
                           speedup=SpeedupConfig(rounds=4, seconds=1.6, redo_disturbed=1))
    with Study("busy", feeds=feeds, config=config, tracking_uri=uri, log_models=False) as study:
        study.attempt("baseline", model)
        attempt = study.attempt("again", model)
    assert {"latency", "speedup"} <= set(attempt.disturbed_steps)
    assert attempt.cpu_load["latency"] > 0.3 and attempt.speedup.disturbed_rounds >= 1
    run = MlflowClient(uri).get_run(attempt.run_id)
    assert set(run.data.tags["tracker.disturbed"].split(",")) >= {"latency", "speedup"}
    assert run.data.metrics["measure.disturbed"] == 1.0
    assert run.data.metrics["measure.other_load.latency"] > 0.3
    table = format_table(load_comparison(study_run_id=study.run.info.run_id))
    assert "disturbed: " in table and "measure it again on a quiet machine" in table


@pytest.mark.slow
@pytest.mark.timing  # as above
def test_the_same_attempt_on_a_quiet_machine_carries_no_flag(model, feeds, tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    config = MeasureConfig(profile_runs=3, timing=TimingConfig(warmup_runs=1, min_runs=3, min_seconds=1.0),
                           speedup=SpeedupConfig(rounds=4, seconds=1.6))
    with Study("quiet", feeds=feeds, config=config, tracking_uri=uri, log_models=False) as study:
        study.attempt("baseline", model)
        attempt = study.attempt("again", model)
    assert attempt.disturbed_steps == [], attempt.cpu_load
    run = MlflowClient(uri).get_run(attempt.run_id)
    assert "tracker.disturbed" not in run.data.tags and run.data.metrics["measure.disturbed"] == 0.0
    assert np.isfinite(run.data.metrics["measure.other_load.speedup"])
