"""Benchmark: a 12-attempt study (`tracker optimize` of a small two-MatMul model) here, then on a local Ray cluster
of 1 node and of 2 nodes (`local_cluster`: real node processes in a private network namespace): the wall time of
each, and the cluster's scheduling overhead per attempt.

Overhead per attempt: the node-seconds the cluster's nodes spent not measuring while the study ran (its wall time
times the nodes, less the sum of each run's `cluster.measure_start_s`..`end_s`), over the attempts. It holds the
driver's work the nodes waited for (making candidates, sending models, logging records) and Ray's scheduling. Its
parts: the start (the study's start to its first measurement: connecting, starting the nodes' measurers) and the
median gap between two measurements on one node (sending the next attempt, returning the last record).

On a 2-core machine the two "nodes" share the cores (and each times its attempts with 2 threads): two nodes are
no faster there, and their timings disturb each other. What this shows is the overhead, not the speed-up of a
real cluster, whose nodes are machines of their own. Prints figures only; asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import local_cluster
import mlflow

# Twelve attempts besides the baseline: the session entries, int8 and int4 with variants.
ATTEMPTS = ("ort_opt_disabled", "ort_opt_enabled", "ort_threads_1", "ort_parallel", "int8_dynamic",
            "int8_dynamic:per_channel=true", "int8_dynamic:reduce_range=true", "int8_static_minmax",
            "int8_static_percentile", "int4_block32", "int4_block128", "int4_block32:accuracy_level=0")
MEASURE = ("--min-seconds", "0.2", "--min-runs", "20", "--profile-runs", "5", "--speedup-rounds", "4",
           "--speedup-seconds", "0.5")


def make_model(path: Path) -> Path:
    """X[batch, 256] -> MatMul 256x256 -> Add -> Relu -> MatMul 256x16, seeded float weights."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array((rng.standard_normal(s) / 16).astype(np.float32), n)
               for n, s in (("w1", (256, 256)), ("b1", (256,)), ("w2", (256, 16)))]
    nodes = [helper.make_node("MatMul", ["X", "w1"], ["h"]), helper.make_node("Add", ["h", "b1"], ["a"]),
             helper.make_node("Relu", ["a"], ["r"]), helper.make_node("MatMul", ["r", "w2"], ["Y"])]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["batch", 256])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["batch", 16])], weights)
    onnx.save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), str(path))
    return path


def run_study(model: Path, folder: Path, *, nodes: int) -> dict[str, float]:
    """One study into a store of its own in `folder`: here (`nodes` 0) or on a new cluster of `nodes` nodes."""
    uri = f"sqlite:///{folder}/mlflow.db"
    driver = [sys.executable, local_cluster.__file__, "optimize", str(model), "--attempts", ",".join(ATTEMPTS),
              "--dim", "batch=8", *MEASURE, "--experiment", "bench",
              *(["--cluster", local_cluster.ADDRESS] if nodes else [])]
    start = time.perf_counter()
    if nodes:
        done = local_cluster.run(driver, nodes=nodes, cwd=folder, env={"MLFLOW_TRACKING_URI": uri}, timeout_s=900)
    else:
        done = subprocess.run(driver, cwd=folder, capture_output=True, text=True, timeout=900,
                              env={**os.environ, "MLFLOW_TRACKING_URI": uri})
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"the study on {nodes} node(s) failed ({done.returncode}):\n{done.stderr[-4000:]}")
    client = mlflow.MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("bench").experiment_id], max_results=500)
    study = next(r for r in runs if r.data.tags.get("tracker.role") == "study")
    spans: dict[str, list[tuple[float, float]]] = {}
    for r in runs:
        if "cluster.measure_start_s" in r.data.metrics:
            spans.setdefault(r.data.tags["tracker.node"], []).append(
                (r.data.metrics["cluster.measure_start_s"], r.data.metrics["cluster.measure_end_s"]))
    busy = sum(end - start for node in spans.values() for start, end in node)
    gaps = [b[0] - a[1] for node in spans.values() for a, b in zip(sorted(node), sorted(node)[1:])]
    wall, nan = study.data.metrics["time.wall_s"], float("nan")
    return {"process_s": seconds, "study_s": wall, "runs": len(runs) - 1, "measuring_s": busy if nodes else nan,
            "overhead_s": (wall * nodes - busy) / len(ATTEMPTS) if nodes else nan,
            "start_s": min(s for node in spans.values() for s, _ in node) - study.info.start_time / 1000 if nodes
            else nan, "gap_s": statistics.median(gaps) if gaps else nan}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.parse_args(argv)
    why_not = local_cluster.namespace_error()
    if why_not:
        raise SystemExit(f"cannot start a local cluster here: {why_not}")
    with tempfile.TemporaryDirectory(prefix="bench-cluster-") as tmp:
        model = make_model(Path(tmp) / "mlp.onnx")
        rows = {}
        for nodes in (0, 1, 2):
            folder = Path(tmp) / f"nodes{nodes}"
            folder.mkdir()
            rows[nodes] = run_study(model, folder, nodes=nodes)
    print(f"a study of {len(ATTEMPTS)} attempts and its baseline ({os.cpu_count()} cores here)")
    print(f"{'where':<9}{'process s':>10}{'study s':>9}{'runs':>6}{'measuring s':>13}{'overhead s/attempt':>20}"
          f"{'start s':>9}{'median gap s':>14}")
    for nodes, row in rows.items():
        where = "here" if nodes == 0 else f"{nodes} node{'s' if nodes > 1 else ''}"
        print(f"{where:<9}{row['process_s']:>10.1f}{row['study_s']:>9.1f}{row['runs']:>6.0f}{row['measuring_s']:>13.1f}"
              f"{row['overhead_s']:>20.2f}{row['start_s']:>9.1f}{row['gap_s']:>14.2f}")
    print("process s: the driver's command, the cluster's start included; study s: the study run's time.wall_s;\n"
          "measuring s: the nodes' measurements, summed. overhead: node-seconds not spent measuring while the study\n"
          "ran, per attempt (the start, the driver making candidates and logging records, the object store, Ray);\n"
          "start: from the study's start to its first measurement; gap: between two measurements on one node.\n"
          f"On this {os.cpu_count()}-core machine the two nodes share the cores: two nodes are no faster here, and "
          "this is\nthe cluster's overhead, not the speed of a real cluster, whose nodes are machines of their own.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
