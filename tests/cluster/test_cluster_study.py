"""`tracker optimize --cluster` on a real Ray cluster of two node processes on this machine (`local_cluster`: in a
private network namespace, each node with one `tracker_slot`): where each attempt ran, that no two measurements
shared a node, that each node judged against its own baseline, that the runs, report and `compare` look like a
local study's; then a node killed mid-measurement, and Ctrl-C on the driver."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import local_cluster
import mlflow
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.conftest import new_sqlite_store
from tracker.base.keys import ROLE_NODE_BASELINE, TAG_DISTURBED, TAG_NODE, TAG_NODE_TYPE, TAG_ROLE
from tracker.cli import main
from tracker.cluster.node import METRIC_END, METRIC_START
from tracker.cluster.records import TAG_BASELINE_RUN, TAG_RETRIED

pytestmark = [pytest.mark.slow, pytest.mark.subprocess,
              pytest.mark.skipif(local_cluster.namespace_error() is not None,
                                 reason=f"no private network namespace: {local_cluster.namespace_error()}")]

ATTEMPTS = ("ort_opt_disabled", "ort_threads_1", "ort_parallel", "int8_dynamic", "int4_block32")
FAST = ("--min-seconds", "0.05", "--min-runs", "5", "--profile-runs", "3", "--speedup-rounds", "4",
        "--speedup-seconds", "0")
CLUSTER_TAGS = {TAG_NODE, TAG_NODE_TYPE, TAG_BASELINE_RUN, TAG_RETRIED, TAG_DISTURBED}  # TAG_DISTURBED: noise
CLUSTER_METRICS = {METRIC_START, METRIC_END}
# A line a node's measurer logs when it starts timing an attempt other than the baseline.
TIMING_AN_ATTEMPT = r"attempt (ort|int)[a-z0-9_]*: timing \("
# Each attempt's speed-up timed for seconds, not a fraction of one: a signal sent once a node's log (flushed by Ray
# now and then) shows it timing an attempt must still find attempts in flight on a fast machine (on one, the FAST
# study ended before the Ctrl-C arrived).
IN_FLIGHT = (*FAST[:-2], "--speedup-seconds", "3")


@pytest.fixture(scope="module")
def mlp(tmp_path_factory) -> Path:
    """Two MatMuls with float weights: session attempts, dynamic int8 and int4 apply to it."""
    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array((rng.standard_normal(s) / 8).astype(np.float32), n)
               for n, s in (("w1", (64, 64)), ("b1", (64,)), ("w2", (64, 8)))]
    nodes = [helper.make_node("MatMul", ["X", "w1"], ["h"]), helper.make_node("Add", ["h", "b1"], ["a"]),
             helper.make_node("Relu", ["a"], ["r"]), helper.make_node("MatMul", ["r", "w2"], ["Y"])]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["batch", 64])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["batch", 8])], weights)
    path = tmp_path_factory.mktemp("mlp") / "mlp.onnx"
    onnx.save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), str(path))
    return path


def _optimize(model: Path, experiment: str, *, cluster: bool, attempts: tuple[str, ...] = ATTEMPTS,
              timing: tuple[str, ...] = FAST) -> list[str]:
    return [sys.executable, local_cluster.__file__, "optimize", str(model), "--attempts", ",".join(attempts), *timing,
            "--experiment", experiment, *(["--cluster", local_cluster.ADDRESS] if cluster else [])]


def _on_cluster(tmp_path_factory, model: Path, name: str, *, attempts: tuple[str, ...] = ATTEMPTS,
                timing: tuple[str, ...] = FAST, **options) -> tuple[subprocess.CompletedProcess, dict, str]:
    """Runs the study on a new two-node cluster (`options`: `local_cluster.run`'s) into a store of its own: the
    driver's process, the runs of its (only) study (`_runs`) and the store's URI."""
    folder, uri, _ = new_sqlite_store(tmp_path_factory, name)
    done = local_cluster.run(_optimize(model, name, cluster=True, attempts=attempts, timing=timing), nodes=2, cwd=folder,
                             env={"MLFLOW_TRACKING_URI": uri}, timeout_s=240, **options)
    return done, _runs(uri, name), uri


def _runs(uri: str, experiment: str) -> dict:
    """The runs of the experiment's only study: the study run under "study", the attempt runs by name (a list:
    the baseline has one per node)."""
    client = mlflow.MlflowClient(uri)
    found = client.search_runs([client.get_experiment_by_name(experiment).experiment_id], max_results=500,
                               order_by=["attributes.start_time ASC"])
    runs: dict = defaultdict(list)
    for run in found:
        runs["study" if run.data.tags.get(TAG_ROLE) == "study" else run.info.run_name].append(run)
    return runs


@pytest.fixture(scope="module")
def studies(tmp_path_factory, mlp):
    """The same attempts on the cluster, then here; (the cluster's driver, the cluster's runs, the local runs,
    the store's URI)."""
    done, on_cluster, uri = _on_cluster(tmp_path_factory, mlp, "cluster")
    local = subprocess.run(_optimize(mlp, "local", cluster=False), cwd=tmp_path_factory.mktemp("local"),
                           capture_output=True, text=True, env={**os.environ, "MLFLOW_TRACKING_URI": uri}, timeout=240)
    assert local.returncode == 0, local.stderr[-4000:]
    return done, on_cluster, _runs(uri, "local"), uri


def test_the_attempts_ran_on_both_nodes_one_at_a_time_each_against_its_nodes_baseline(studies):
    done, runs, _, _ = studies
    assert done.returncode == 0, done.stderr[-6000:]
    baselines = runs["baseline"]
    attempts = [run for name in ATTEMPTS for run in runs[name]]
    assert len(baselines) == 2 and len(attempts) == len(ATTEMPTS)  # the baseline on each node, each attempt once
    assert all(r.info.status == "FINISHED" for r in baselines + attempts)
    assert sorted(b.data.tags.get(TAG_ROLE) for b in baselines) == ["attempt", ROLE_NODE_BASELINE]
    nodes = {b.data.tags[TAG_NODE]: b for b in baselines}
    assert len(nodes) == 2 and {a.data.tags[TAG_NODE] for a in attempts} == set(nodes)  # both nodes measured
    assert len({r.data.tags[TAG_NODE_TYPE] for r in baselines + attempts}) == 1  # one machine: one node type

    for attempt in attempts:  # judged against the baseline its own node measured
        baseline = nodes[attempt.data.tags[TAG_NODE]]
        assert attempt.data.tags[TAG_BASELINE_RUN] == baseline.info.run_id
        expected = baseline.data.metrics["latency.p50_ms"] / attempt.data.metrics["latency.p50_ms"]
        assert attempt.data.metrics["latency.speedup_vs_baseline"] == pytest.approx(expected, rel=1e-9)

    by_node = defaultdict(list)
    for run in baselines + attempts:
        by_node[run.data.tags[TAG_NODE]].append((run.data.metrics[METRIC_START], run.data.metrics[METRIC_END]))
    for spans in by_node.values():  # one measurement at a time on each node
        spans.sort()
        assert all(start < end for start, end in spans)
        assert all(later[0] >= earlier[1] for earlier, later in zip(spans, spans[1:])), spans


def test_the_runs_report_and_compare_have_a_local_studys_shape(studies, monkeypatch, capsys):
    _, runs, local, uri = studies
    names = {"baseline", *ATTEMPTS}
    assert set(runs) - {"study"} == set(local) - {"study"} == names
    for name in names:
        cluster_run = next(r for r in runs[name] if r.data.tags.get(TAG_ROLE) == "attempt")
        local_run = local[name][0]
        assert set(cluster_run.data.metrics) - CLUSTER_METRICS == set(local_run.data.metrics), name
        assert set(cluster_run.data.tags) - CLUSTER_TAGS == set(local_run.data.tags) - CLUSTER_TAGS, name
        assert set(cluster_run.data.params) == set(local_run.data.params), name
    cluster_study, local_study = runs["study"][0], local["study"][0]
    assert set(cluster_study.data.metrics) == set(local_study.data.metrics)
    assert set(cluster_study.data.tags) == set(local_study.data.tags)
    assert cluster_study.data.metrics["study.attempts"] == local_study.data.metrics["study.attempts"] == len(names)

    client = mlflow.MlflowClient(uri)
    reports = [{a.path for a in client.list_artifacts(s.info.run_id, "report")} for s in (cluster_study, local_study)]
    assert reports[0] == reports[1] and "report/study_report.html" in reports[0]

    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    compared = []
    for study in (cluster_study, local_study):
        assert main(["compare", study.info.run_id, "--json"]) == 0
        compared.append(json.loads(capsys.readouterr().out))
    assert compared[0].keys() == compared[1].keys()
    rows = [sorted(c["attempts"], key=lambda row: row["attempt"]) for c in compared]
    assert [r["attempt"] for r in rows[0]] == [r["attempt"] for r in rows[1]] == sorted(names)  # no second baseline
    assert [r.keys() for r in rows[0]] == [r.keys() for r in rows[1]]
    assert all(r["status"] == "ok" for r in rows[0] + rows[1])


def test_a_node_killed_mid_measurement_costs_its_attempt_one_retry_and_nothing_else(tmp_path_factory, mlp):
    done, runs, _ = _on_cluster(tmp_path_factory, mlp, "killed", timing=IN_FLIGHT, kill_node_when=TIMING_AN_ATTEMPT)

    assert done.returncode == 0, done.stderr[-6000:]
    assert "kill -KILL" in done.stderr  # node 1 was killed while it timed an attempt
    attempts = {name: runs[name] for name in ATTEMPTS}
    assert all(len(found) == 1 for found in attempts.values()), attempts  # every attempt logged, once
    cut = [r for (r,) in attempts.values() if TAG_RETRIED in r.data.tags or r.info.status == "FAILED"]
    assert len(cut) == 1, [(r.info.run_name, r.info.status, r.data.tags.get("tracker.error")) for r in cut]
    why = cut[0].data.tags.get(TAG_RETRIED) or cut[0].data.tags["tracker.error"]
    assert "died while measuring it" in why
    if cut[0].info.status == "FINISHED":  # measured again, on the node left
        assert cut[0].data.tags[TAG_NODE] != cut[0].data.tags[TAG_RETRIED].split()[1]
    assert all(r.info.status == "FINISHED" for (r,) in attempts.values() if r is not cut[0])
    assert runs["study"][0].info.status == "FINISHED"


def test_ctrl_c_on_the_driver_ends_the_attempts_in_flight_as_failed_runs_and_keeps_the_rest(tmp_path_factory, mlp):
    done, runs, _ = _on_cluster(tmp_path_factory, mlp, "interrupted", timing=IN_FLIGHT, interrupt_when=TIMING_AN_ATTEMPT)

    assert done.returncode == 130, done.stderr[-6000:]
    assert "interrupted (Ctrl-C)" in done.stderr
    attempts = [r for name in ATTEMPTS for r in runs[name]]
    assert {r.info.status for r in runs["baseline"]} == {"FINISHED"}  # measured before: kept
    failed = [r for r in attempts if r.info.status == "FAILED"]
    assert failed and all(r.data.tags["tracker.error"].startswith("interrupted (Ctrl-C)") for r in failed)
    assert any("while measuring on node" in r.data.tags["tracker.error"] for r in failed)
    assert all(r.info.status in ("FINISHED", "FAILED") for r in attempts)  # none left running
    assert runs["study"][0].info.status == "FAILED"


def test_on_two_node_types_each_attempt_is_measured_on_each_against_its_own_baseline(tmp_path_factory, mlp,
                                                                                   monkeypatch, capsys):
    attempts = ("ort_opt_disabled", "int8_dynamic")
    done, runs, uri = _on_cluster(tmp_path_factory, mlp, "types", attempts=attempts, labels=["alpha", "beta"])

    assert done.returncode == 0, done.stderr[-6000:]
    baselines = {b.data.tags[TAG_NODE_TYPE]: b for b in runs["baseline"]}
    assert set(baselines) == {"alpha", "beta"}  # each type's baseline row: neither is a node's second baseline
    assert {b.data.tags[TAG_ROLE] for b in baselines.values()} == {"attempt"}
    for name in attempts:
        assert sorted(r.data.tags[TAG_NODE_TYPE] for r in runs[name]) == ["alpha", "beta"]  # once per type
        for run in runs[name]:
            assert run.info.status == "FINISHED"
            assert run.data.tags[TAG_BASELINE_RUN] == baselines[run.data.tags[TAG_NODE_TYPE]].info.run_id
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    assert main(["compare", runs["study"][0].info.run_id, "--json"]) == 0
    compared = json.loads(capsys.readouterr().out)
    assert len(compared["attempts"]) == 2 * (1 + len(attempts))  # one row per (attempt, node type)
    assert set(compared["best_by_node_type"]) == {"alpha", "beta"}
