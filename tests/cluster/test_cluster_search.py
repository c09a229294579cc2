"""`Study.search` on a real Ray cluster of two node processes (`local_cluster`, in a private network namespace): the
candidates are made and checked on the driver and screened on both nodes, each against its node's own baseline;
the search ends with the same best as the same search here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import local_cluster
import mlflow
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.conftest import new_sqlite_store
from tracker.base.keys import TAG_NODE, TAG_ROLE

pytestmark = [pytest.mark.slow, pytest.mark.subprocess,
              pytest.mark.skipif(local_cluster.namespace_error() is not None,
                                 reason=f"no private network namespace: {local_cluster.namespace_error()}")]

WIDTH = 512
# The driver: one study whose search has a clear winner (dynamic int8 of three wide MatMuls: the session entries
# time like the baseline, and int4 with float compute is slower), one thread per session so that the two nodes'
# screens do not share a core. It writes the search's rows and the study's best to a JSON file.
DRIVER = """
import json, logging, sys
import numpy as np
import tracker.study.study
tracker.study.study.measure_machine_or_none = lambda: None  # no machine roofs (~7 s per node these runs do not look at)
from tracker.api import Study
from tracker.measure.accuracy.task_diff import task_tolerances
from tracker.measure.attempt import MeasureConfig
from tracker.measure.runtimes.ort_runtime import SessionConfig
from tracker.measure.timing.latency import TimingConfig
from tracker.measure.timing.speedup import SpeedupConfig
from tracker.report.rows import pick_best
from tracker.search import SearchConfig

logging.basicConfig(level=logging.WARNING)
logging.getLogger("tracker").setLevel(logging.INFO)
model, cluster, out, WIDTH = sys.argv[1], sys.argv[2] or None, sys.argv[3], int(sys.argv[4])
feeds = {"X": np.random.default_rng(1).standard_normal((64, WIDTH)).astype(np.float32)}
fast = MeasureConfig(profile_runs=3, skip_runs=1, timing=TimingConfig(warmup_runs=1, min_runs=3, min_seconds=0.0),
                     speedup=SpeedupConfig(rounds=4, seconds=0.0, round_seconds=0.05, min_pairs=3, warmup_runs=1))
config = SearchConfig(
    entries=("ort_opt_disabled", "ort_threads_1", "ort_parallel", "int8_dynamic", "int4_block32"), max_full=2,
    max_fallbacks=0, max_chains=0,
    knobs={"int8_dynamic": {"per_channel": (True,), "weight_type": ("QInt8",), "reduce_range": (False,),
                            "op_types": ("all",)},
           "int4_block32": {"block_size": (32,), "accuracy_level": (0,), "symmetric": (True,)}})
with Study("searched", feeds=feeds, experiment="search", config=fast, log_models=False, cluster=cluster) as study:
    result = study.search(model, config=config, session=SessionConfig(intra_op_num_threads=1),
                          tolerance=task_tolerances("regression"))
rows = [{"name": r.name, "node": r.node, "status": r.status, "screen": r.screen_speedup} for r in result.rows]
json.dump({"best": pick_best(study.rows()), "rows": rows}, open(out, "w"))
"""


@pytest.fixture(scope="module")
def wide_mlp(tmp_path_factory) -> Path:
    rng = np.random.default_rng(0)
    names = ["X", "h1", "r1", "h2", "r2", "Y"]
    weights = [numpy_helper.from_array((rng.standard_normal((WIDTH, WIDTH)) / np.sqrt(WIDTH)).astype(np.float32),
                                       f"w{i}") for i in range(3)]
    nodes = [helper.make_node("MatMul", ["X", "w0"], ["h1"]), helper.make_node("Relu", ["h1"], ["r1"]),
             helper.make_node("MatMul", ["r1", "w1"], ["h2"]), helper.make_node("Relu", ["h2"], ["r2"]),
             helper.make_node("MatMul", ["r2", "w2"], ["Y"])]
    assert [n.output[0] for n in nodes] == names[1:]
    graph = helper.make_graph(nodes, "wide_mlp", [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["batch", WIDTH])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["batch", WIDTH])], weights)
    path = tmp_path_factory.mktemp("wide_mlp") / "mlp.onnx"
    onnx.save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), str(path))
    return path


@pytest.fixture(scope="module")
def searches(tmp_path_factory, wide_mlp):
    """The search on a two-node cluster, then here, into one store: (the cluster's driver, its output, the local
    output, the store's URI)."""
    folder, uri, _ = new_sqlite_store(tmp_path_factory, "search")
    script = folder / "driver.py"
    script.write_text(DRIVER)
    env = {"MLFLOW_TRACKING_URI": uri, "TRACKER_OUTBOX": str(folder / "outbox")}
    done = local_cluster.run([sys.executable, str(script), str(wide_mlp), local_cluster.ADDRESS,
                              str(folder / "cluster.json"), str(WIDTH)], nodes=2, cwd=folder, env=env, timeout_s=300)
    assert done.returncode == 0, done.stderr[-6000:]
    local = subprocess.run([sys.executable, str(script), str(wide_mlp), "", str(folder / "local.json"), str(WIDTH)], cwd=folder,
                           capture_output=True, text=True, env={**os.environ, **env}, timeout=300)
    assert local.returncode == 0, local.stderr[-6000:]
    return (done, json.loads((folder / "cluster.json").read_text()), json.loads((folder / "local.json").read_text()),
            uri)


def test_the_candidates_are_screened_on_both_nodes_and_their_runs_say_where(searches):
    done, on_cluster, _, uri = searches
    screened = [r for r in on_cluster["rows"] if r["screen"] is not None]
    assert len(screened) >= 4, on_cluster["rows"]
    assert len({r["node"] for r in screened}) == 2 and None not in {r["node"] for r in screened}, screened
    client = mlflow.MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("search").experiment_id], max_results=200)
    studies = [r for r in runs if r.data.tags.get(TAG_ROLE) == "study"]
    cluster_study = min(studies, key=lambda r: r.info.start_time)  # the cluster's ran first
    mine = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == cluster_study.info.run_id]
    candidates = [r for r in mine if r.data.tags.get(TAG_ROLE) == "candidate"]
    assert candidates and all(r.data.tags.get(TAG_NODE) for r in candidates), [r.data.tags for r in candidates]
    leaders = [r for r in mine if r.data.tags.get(TAG_ROLE) == "attempt" and r.info.run_name != "baseline"]
    assert leaders and all(r.data.tags.get(TAG_NODE) and r.info.status == "FINISHED" for r in leaders)
    assert "search, screen: " in done.stderr and " on node " in done.stderr  # the log says where each was timed


def test_the_cluster_ends_with_the_same_best_as_the_same_search_here(searches):
    _, on_cluster, local, _ = searches
    assert on_cluster["best"] == local["best"], (on_cluster, local)
    assert on_cluster["best"].startswith("int8_dynamic"), on_cluster
    assert all(r["node"] is None for r in local["rows"])
