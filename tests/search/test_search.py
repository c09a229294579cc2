"""The search end to end on real sessions and a real sqlite store: the fallback inside a search, the budget, the
study run's tables, Ctrl-C, and the command line's errors."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from mlflow import MlflowClient

from tests.conftest import FAST_SPEEDUP, child_env
from tests.search.conftest import SENSITIVE
from tracker.api import Study
from tracker.measure.accuracy.task_diff import task_tolerances
from tracker.measure.attempt import MeasureConfig
from tracker.measure.timing.latency import TimingConfig
from tracker.search import SearchConfig, parse_budget

ROOT = Path(__file__).resolve().parents[2]
FAST = MeasureConfig(profile_runs=3, skip_runs=1, timing=TimingConfig(warmup_runs=1, min_runs=3, min_seconds=0.0),
                     speedup=FAST_SPEEDUP)
TOLERANCES = task_tolerances("regression")


def _study(store, feeds, name="searched"):
    return Study(name, feeds=feeds, config=FAST, experiment="search", log_models=False)


def _children(store, study: Study) -> dict[str, object]:
    runs = store.search_runs([study.run.info.experiment_id],
                             filter_string=f"tags.mlflow.parentRunId = '{study.run.info.run_id}'")
    return {r.info.run_name: r for r in runs}


@pytest.mark.slow
def test_a_search_keeps_the_planted_layer_in_fp32_and_measures_the_rescued_int8_in_full(store, sensitive_mlp):
    path, feeds = sensitive_mlp
    with _study(store, feeds) as study:
        result = study.search(path, tolerance=TOLERANCES,
                              config=SearchConfig(entries=("int8_dynamic",), per_entry=1, max_chains=0))
    rows = {r.name: r for r in result.rows}
    assert rows["int8_dynamic"].passed is False and "fallback int8_dynamic.fp32-1 keeps 1 node" in \
        rows["int8_dynamic"].reason, rows["int8_dynamic"]
    rescued = rows["int8_dynamic.fp32-1"]
    assert rescued.passed and rescued.fallback_of == "int8_dynamic" and rescued.status == "timed"
    assert [s.kept for s in result.sensitivities] == [(SENSITIVE,)]
    runs = _children(store, study)
    roles = {name: r.data.tags["tracker.role"] for name, r in runs.items()}
    assert roles == {"baseline": "attempt", "int8_dynamic.fp32-1": "attempt", "int8_dynamic": "candidate"}, roles
    screened = runs["int8_dynamic"].data
    assert screened.tags["tracker.search.status"] == "screened" and "fallback" in screened.tags["tracker.search.reason"]
    assert screened.metrics["search.margin"] < 0 < screened.metrics["search.screen_speedup"]
    assert screened.params["quantization.per_channel"] == "false" and screened.params["precision"] == "int8"
    from tracker.compare import load_comparison

    compared = load_comparison(study_run_id=study.run.info.run_id, experiment=None, study=None, run_ids=())
    assert [r.attempt for r in compared.rows] == ["baseline", "int8_dynamic.fp32-1"]  # candidates are not attempts
    run = runs["int8_dynamic.fp32-1"]
    assert run.data.params["quantization.nodes_to_exclude"] == SENSITIVE
    assert run.data.tags["tracker.search.stage"] == "speed_screen"
    assert run.data.tags["tracker.search.fallback_of"] == "int8_dynamic"
    parent = store.get_run(study.run.info.run_id)
    assert parent.data.metrics["search.timed"] == 1 and parent.data.metrics["search.considered"] == 2
    logged = {a.path for a in store.list_artifacts(study.run.info.run_id, "report")}
    assert {"report/search.html", "report/search_candidates.json", "report/search_sensitivity.json",
            "report/search_pareto.json"} <= logged, logged
    page = Path(store.download_artifacts(study.run.info.run_id, "report/search.html", str(Path.cwd())))
    assert "Sensitivity of int8_dynamic" in page.read_text() and "Pareto front" in page.read_text()


@pytest.mark.slow
def test_a_search_respects_its_budget_and_says_which_candidates_it_left_out(store, sensitive_mlp):
    path, feeds = sensitive_mlp
    budget = 12.0
    with _study(store, feeds, "budgeted") as study:
        start = time.perf_counter()
        result = study.search(path, tolerance=TOLERANCES, config=SearchConfig(budget_s=budget, max_full=1))
        took = time.perf_counter() - start
    assert result.seconds <= budget * 1.1 + 2.0, (result.seconds, result.stage_seconds)
    assert took < budget * 1.1 + 30.0  # the baseline, measured first, is not the search's
    skipped = [r for r in result.rows if r.status == "skipped"]
    assert skipped and all("budget" in r.reason for r in skipped), [(r.name, r.reason) for r in result.rows]
    coverage = result.coverage()
    not_reached = {f: c["not_reached"] for f, c in coverage.items() if c["not_reached"]}
    assert sum(not_reached.values()) == len(skipped) > 0
    line = result.coverage_line()
    assert "; the budget did not reach " in line and all(f"{f} ({n} of " in line for f, n in not_reached.items())


def _run_cli(tmp_path: Path, *args: str, **kwargs) -> subprocess.CompletedProcess:
    env = child_env(f"sqlite:///{tmp_path / 'mlflow.db'}", TRACKER_OUTBOX=str(tmp_path / "outbox"))
    return subprocess.run([sys.executable, "-m", "tracker", "optimize", *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600, **kwargs)


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.parametrize(("args", "message"), [
    (["--search", "--budget", "20x"],
     "--budget expects a duration such as 20m, 90s, 1h30m or 1200 (seconds), got '20x'"),
    (["--search", "--budget", "0m"], "--budget must be a positive duration"),
    (["--budget", "5m"], "--budget bounds a search: add --search"),
    (["--search", "--attempts", "int8_dynamic:per_channel=true"], "--search takes registered entries in --attempts"),
    (["--attempts", "int8_dynamic:weight_type=QInt2"],
     "weight_type=QInt2 is not allowed; expected one of QInt8, QUInt8"),
], ids=["budget-unit", "budget-zero", "budget-alone", "search-variant", "knob-value"])
def test_bad_search_arguments_get_a_one_line_error_and_exit_2_with_nothing_logged(tmp_path, sensitive_mlp, args,
                                                                                   message):
    done = _run_cli(tmp_path, str(sensitive_mlp[0]), *args)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [f"error: {done.stderr.strip()[7:]}"] and message in done.stderr
    assert not (tmp_path / "mlflow.db").exists()


@pytest.mark.parametrize(("raw", "seconds"), [("20m", 1200), ("90s", 90), ("1h30m", 5400), ("1.5h", 5400), ("45", 45)])
def test_a_budget_is_read_in_hours_minutes_and_seconds(raw, seconds):
    assert parse_budget(raw) == seconds


def _poisoned(path: Path) -> Path:
    """One MatMul whose weight has a huge value in every column of a row the feeds never use: the float model does
    not feel it, every int8 scale (per tensor or per channel) is sized for it, and with one node there is nothing
    the fallback can keep in fp32 and still quantize."""
    from onnx import TensorProto, helper, numpy_helper

    weight = (np.random.default_rng(0).standard_normal((256, 8)) / 16).astype(np.float32)
    weight[0, :] = 400.0
    graph = helper.make_graph([helper.make_node("MatMul", ["X", "W"], ["Y"], name="only")], "poisoned",
                              [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 256])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", 8])],
                              initializer=[numpy_helper.from_array(weight, "W")])
    onnx.save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), str(path))
    return path


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_search_where_nothing_passes_exits_0_with_the_baseline_and_every_reason(tmp_path):
    model = _poisoned(tmp_path / "poisoned.onnx")
    feeds = np.random.default_rng(1).standard_normal((64, 256)).astype(np.float32)
    feeds[:, 0] = 0.0  # the first layer's dead row too
    np.save(tmp_path / "x.npy", feeds)
    done = _run_cli(tmp_path, str(model), "--feeds", str(tmp_path / "x.npy"), "--task", "regression", "--search",
                    "--attempts", "int8_dynamic", "--experiment", "own", "--profile-runs", "3", "--min-runs", "3",
                    "--min-seconds", "0", "--speedup-rounds", "4", "--speedup-seconds", "0")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "best: baseline" in done.stdout, done.stdout
    assert "screened out:" in done.stdout and "accuracy check failed" in done.stdout
    assert "search: 24 candidates, 24 screened out, 0 measured in full" in done.stdout, done.stdout


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.timing  # Ctrl-C must land inside a measurement of ~2 s on a shared machine: retried if it lands after
def test_ctrl_c_during_a_search_keeps_what_was_logged_marks_the_cut_attempt_failed_and_exits_130(tmp_path,
                                                                                                  sensitive_mlp):
    env = child_env(f"sqlite:///{tmp_path / 'mlflow.db'}", TRACKER_OUTBOX=str(tmp_path / "outbox"))
    # A session entry always passes, so it is measured in full: 20 rounds against the baseline, where Ctrl-C lands.
    proc = subprocess.Popen([sys.executable, "-m", "tracker", "optimize", str(sensitive_mlp[0]), "--search",
                             "--attempts", "ort_opt_disabled", "--task", "regression", "--experiment", "own",
                             "--dim", "N=64", "--speedup-seconds", "30", "--speedup-rounds", "20"],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            # Ctrl-C as a terminal sends it, even when this test runs with SIGINT ignored (`&`)
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if "timing against baseline" in line and "search, full measurement" in "".join(lines):
                time.sleep(0.2)  # into the rounds, which take ~2 s in all for this model
                proc.send_signal(signal.SIGINT)
                break
        output = "".join(lines) + proc.communicate(timeout=120)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, output[-3000:]
    assert "Traceback" not in output and "interrupted (Ctrl-C)" in output
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = {r.info.run_name: r for r in client.search_runs([client.get_experiment_by_name("own").experiment_id])}
    statuses = {name: r.info.status for name, r in runs.items()}
    cut = [name for name in statuses if name not in ("mlp", "baseline")]
    assert statuses["mlp"] == "FAILED" and statuses["baseline"] == "FINISHED" and len(cut) == 1, statuses
    assert statuses[cut[0]] == "FAILED" and "interrupted (Ctrl-C)" in runs[cut[0]].data.tags["tracker.error"]
