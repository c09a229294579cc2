"""A soak of the team setup: many small studies, from concurrent processes, against the project's PostgreSQL-backed
`mlflow server`, while the server is restarted at random (SIGTERM, and SIGKILL) and PostgreSQL once.

    python benchmarks/soak.py --studies 100            # 4 processes; restarts spread over the run
    python benchmarks/soak.py --studies 10 --restarts 2 --processes 2

Each worker process runs its share of the studies one after another (`baseline` and `ort_opt_disabled` of a small
model, each logged with its model), its outbox its own folder. A study that cannot start because the server is down
is tried again until it starts (nothing was logged); once started, what the store refuses goes to the outbox. The
controller restarts the server each time another share of the studies has ended (one of the restarts is PostgreSQL's,
under a live server). Afterwards each outbox is uploaded with `tracker upload`, and the store is read back:

- lost: an attempt of a study that ended, neither in the store nor in an outbox (must be 0);
- duplicates: a study or an attempt with more than one run (runs an upload superseded are not counted);
- left RUNNING: runs not ended;
- FAILED: runs that failed (the model and feeds are good: an outage is the only cause there could be);
- KILLED: runs `tracker.store.abandoned` ended because their process had gone (no worker is killed here).

Exit 1 if any of these is not 0. Needs PostgreSQL's server tools (initdb, pg_ctl) and psycopg2, as `tracker server`.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

EXPERIMENT = "soak"
ATTEMPTS = ("baseline", "ort_opt_disabled")
N_FEATURES = 16
TRIES_S = 300.0  # how long a worker keeps trying to start a study while the server is down


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--studies", type=int, default=100, help="how many studies in all (default 100)")
    parser.add_argument("--processes", type=int, default=4, help="concurrent worker processes (default 4)")
    parser.add_argument("--restarts", type=int, default=None,
                        help="restarts of the mlflow server, half SIGTERM and half SIGKILL (default: one per 15 "
                             "studies, at least 2); PostgreSQL is restarted once besides")
    parser.add_argument("--seed", type=int, default=0, help="seed of the restarts' kinds and down times")
    parser.add_argument("--folder", type=Path, default=None, help="where the server, outboxes and logs go (default: "
                        "a temporary folder, removed at the end unless --keep)")
    parser.add_argument("--keep", action="store_true", help="keep the folder")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures to this JSON file")
    parser.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)  # a worker process's index
    args = parser.parse_args(argv)
    if args.worker is not None:
        return _work(args)
    if args.studies < 1 or args.processes < 1:
        parser.error("--studies and --processes must be at least 1")
    return _soak(args)


def _soak(args: argparse.Namespace) -> int:
    from tracker.server import LocalTrackingServer

    folder = args.folder or Path(tempfile.mkdtemp(prefix="tracker-soak-"))
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o711)  # PostgreSQL runs as its own user, which must pass through it
    restarts = args.restarts if args.restarts is not None else max(2, args.studies // 15)
    rng = random.Random(args.seed)
    kinds = ["SIGTERM", "SIGKILL"] * ((restarts + 1) // 2)
    rng.shuffle(kinds)
    plan = kinds[:restarts]
    plan.insert(len(plan) // 2 + 1 if plan else 0, "postgres")
    started = time.monotonic()
    server = LocalTrackingServer(folder / "server")
    server.start()
    _log(f"server up at {server.tracking_uri}; {args.studies} studies in {args.processes} processes; "
         f"restarts planned: {', '.join(plan)}")
    try:
        workers = [_start_worker(args, folder, server.tracking_uri, k) for k in range(args.processes)]
        done: list[str] = []
        for n, kind in enumerate(plan, start=1):  # each after another share of the studies has ended
            threshold = args.studies * n // (len(plan) + 1)
            while len(_ended(folder)) < threshold and any(w.poll() is None for w in workers):
                time.sleep(0.2)
            if all(w.poll() is not None for w in workers):
                _log(f"the studies ended before restart {n} ({kind})")
                break
            _restart(server, kind, rng)
            done.append(kind)
        for w in workers:
            w.wait()
        codes = [w.returncode for w in workers]
        if not server.mlflow.running:  # a worker may have ended with the server down
            server.mlflow.start()
        uploads = _upload_outboxes(folder, server.tracking_uri)
        figures = _count(folder, server.tracking_uri, args.studies)
    finally:
        server.stop()
    figures.update(restarts=dict(Counter(done)), workers_exit=codes, uploads=uploads,
                   wall_s=round(time.monotonic() - started, 1))
    _print(figures)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    if not (args.keep or args.folder):
        shutil.rmtree(folder, ignore_errors=True)
    bad = figures["lost"] + figures["duplicates"] + figures["left_running"] + figures["failed"] + figures["killed"] + len(
        figures["study_errors"])
    return 1 if bad or any(codes) else 0


def _start_worker(args: argparse.Namespace, folder: Path, uri: str, k: int) -> subprocess.Popen:
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "TRACKER_OUTBOX": str(folder / f"outbox-{k}"),
           "TRACKER_SERVER_TIMEOUT_S": "10"}
    for name in ("MLFLOW_RUN_ID", "MLFLOW_EXPERIMENT_ID", "MLFLOW_EXPERIMENT_NAME"):
        env.pop(name, None)
    log = open(folder / f"worker-{k}.log", "wb")  # noqa: SIM115 (the worker's to write until it ends)
    return subprocess.Popen([sys.executable, __file__, "--worker", str(k), "--processes", str(args.processes),
                             "--studies", str(args.studies), "--folder", str(folder)],
                            stdout=log, stderr=subprocess.STDOUT, env=env, cwd=folder)


def _restart(server, kind: str, rng: random.Random) -> None:
    """One restart: the mlflow server stopped (SIGTERM) or killed (SIGKILL), or PostgreSQL stopped under it; down for
    a random 0.5-3 s, then started again."""
    down = rng.uniform(0.5, 3.0)
    began = time.monotonic()
    if kind == "postgres":
        server.postgres.stop()
        time.sleep(down)
        server.postgres.start()
    else:
        server.mlflow.stop() if kind == "SIGTERM" else server.mlflow.kill()
        time.sleep(down)
        server.mlflow.start()
    _log(f"restart {kind}: back after {time.monotonic() - began:.1f} s")


def _ended(folder: Path) -> list[dict]:
    """The studies the workers have ended so far (their lines in `worker-*.jsonl`)."""
    lines = []
    for path in folder.glob("worker-*.jsonl"):
        lines += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return lines


def _upload_outboxes(folder: Path, uri: str) -> dict[str, int]:
    """`tracker upload` of each worker's outbox that holds something: the records kept, and those uploaded."""
    from tracker.run.record import find_records, find_summaries

    env = {**os.environ, "MLFLOW_TRACKING_URI": uri}
    kept = uploaded = summaries = 0
    for outbox in sorted(folder.glob("outbox-*")):
        records, pending = len(find_records(outbox)), len(find_summaries(outbox))
        if not records and not pending:
            continue
        kept, summaries = kept + records, summaries + pending
        done = subprocess.run([sys.executable, "-m", "tracker", "upload", str(outbox)], env=env, cwd=folder,
                              capture_output=True, text=True)
        _log(f"tracker upload {outbox.name}: exit {done.returncode}, {records} records, {pending} study summaries")
        if done.returncode == 0:
            uploaded += records
        else:
            print(done.stdout[-2000:], done.stderr[-2000:], sep="\n")
    return {"outbox_records": kept, "outbox_summaries": summaries, "uploaded_records": uploaded}


def _count(folder: Path, uri: str, studies: int) -> dict:
    """The store read back against what the workers say they ended."""
    import mlflow

    from tracker.base.keys import ROLE_ATTEMPT, ROLE_STUDY, TAG_ATTEMPT, TAG_ROLE, TAG_STUDY, TAG_SUPERSEDED_BY

    client = mlflow.MlflowClient(uri)
    experiment = client.get_experiment_by_name(EXPERIMENT)
    runs, token = [], None
    while experiment is not None:
        page = client.search_runs([experiment.experiment_id], max_results=1000, page_token=token)
        runs += page
        token = page.token
        if not token:
            break
    live = [r for r in runs if TAG_SUPERSEDED_BY not in r.data.tags]
    study_runs = Counter(r.data.tags.get(TAG_STUDY) for r in live if r.data.tags.get(TAG_ROLE) == ROLE_STUDY)
    attempt_runs = Counter((r.data.tags.get(TAG_STUDY), r.data.tags.get(TAG_ATTEMPT)) for r in live
                           if r.data.tags.get(TAG_ROLE) == ROLE_ATTEMPT)
    ended = _ended(folder)
    started = [e for e in ended if e["started"]]
    expected = {(e["study"], a) for e in started for a in ATTEMPTS}
    failed = [r for r in live if r.info.status == "FAILED"]
    twice = {k for k, n in (*study_runs.items(), *attempt_runs.items()) if n > 1}
    for r in live:  # what each run of a duplicate is, to tell how it came about
        key = r.data.tags.get(TAG_STUDY) if r.data.tags.get(TAG_ROLE) == ROLE_STUDY else (
            r.data.tags.get(TAG_STUDY), r.data.tags.get(TAG_ATTEMPT))
        if key in twice:
            print(f"duplicate {key}: run {r.info.run_id} {r.info.status}, {len(r.data.metrics)} metrics, "
                  f"{len(r.data.params)} params, tags {sorted(k for k in r.data.tags if k.startswith('tracker.'))}")
    for r in failed:
        print(f"FAILED run {r.info.run_name} of {r.data.tags.get(TAG_STUDY)}: {r.data.tags.get('tracker.error')}")
    return {
        "studies": studies, "studies_ended": len(started), "studies_not_started": len(ended) - len(started),
        "start_tries": sum(e["tries"] for e in ended), "attempts_expected": len(expected),
        "runs": len(runs), "runs_superseded": len(runs) - len(live),
        "lost": len(expected - set(attempt_runs)) + sum(1 for e in started if e["study"] not in study_runs)
                + (studies - len(ended)),
        "duplicates": sum(n - 1 for n in (*study_runs.values(), *attempt_runs.values()) if n > 1),
        "duplicated": sorted([str(k) for k, n in (*study_runs.items(), *attempt_runs.items()) if n > 1]),
        "left_running": sum(1 for r in live if r.info.status == "RUNNING"),
        "killed": sum(1 for r in live if r.info.status == "KILLED"),
        "failed": len(failed),
        "study_errors": [f"{e['study']}: {e['error']}" for e in ended if e.get("error")],
    }


def _print(f: dict) -> None:
    restarts = ", ".join(f"{n} {kind}" for kind, n in f["restarts"].items()) or "none"
    u = f["uploads"]
    print(f"""
soak: {f['studies']} studies ({f['studies_ended']} ended, {f['studies_not_started']} never started) in {f['wall_s']:.0f} s
  attempts expected        {f['attempts_expected']}
  runs in the store        {f['runs']} ({f['runs_superseded']} superseded by an upload)
  tries to start a study   {f['start_tries']}
  restarts                 {restarts}
  outbox records           {u['outbox_records']} (uploaded {u['uploaded_records']}; {u['outbox_summaries']} study \
summaries)
  lost                     {f['lost']}
  duplicates               {f['duplicates']} {' '.join(f['duplicated'])}
  left RUNNING             {f['left_running']}
  KILLED                   {f['killed']}
  FAILED                   {f['failed']}
  studies that raised      {len(f['study_errors'])}
  workers' exit codes      {f['workers_exit']}""")
    for line in f["study_errors"]:
        print(f"  {line}")


def _work(args: argparse.Namespace) -> int:
    """A worker: the studies `k`, `k + processes`, ...; one JSON line each in `worker-k.jsonl` once it has ended."""
    import logging

    from tracker import MeasureConfig, Study, TimingConfig
    from tracker.base.errors import TrackingServerError
    from tracker.measure.timing.speedup import SpeedupConfig

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    config = MeasureConfig(profile_runs=2, timing=TimingConfig(warmup_runs=1, min_runs=3, min_seconds=0.0),
                           speedup=SpeedupConfig(rounds=4, seconds=0.0, round_seconds=0.0, min_pairs=3,
                                                 warmup_runs=1, block_ms=0.0))
    folder, k = args.folder, args.worker
    model = _model()
    feeds = {"X": np.random.default_rng(k).standard_normal((4, N_FEATURES)).astype(np.float32)}
    out = folder / f"worker-{k}.jsonl"
    for i in range(k, args.studies, args.processes):
        name, tries, began, started, error = f"soak-{i:03d}", 0, time.monotonic(), False, None
        while not started and time.monotonic() - began < TRIES_S:
            tries += 1
            try:
                with Study(name, feeds=feeds, experiment=EXPERIMENT, config=config) as study:
                    started = True
                    study.attempt("baseline", model)
                    for attempt in ATTEMPTS[1:]:
                        study.optimize(attempt, model)
            except TrackingServerError as e:
                if started:  # once started, an outage must go to the outbox, not out of the study
                    error = f"{type(e).__name__}: {e}"
                    break
                print(f"{name}: try {tries} could not start: {e}", flush=True)
                time.sleep(1.0)
            except Exception as e:  # noqa: BLE001 (counted as this study's error; the soak goes on)
                error = f"{type(e).__name__}: {e}"
                break
        if error:
            print(f"{name}: {error}", flush=True)
        with out.open("a") as f:
            f.write(json.dumps({"study": name, "tries": tries, "started": started, "error": error}) + "\n")
    return 0


def _model() -> onnx.ModelProto:
    """Y = X @ W + B, 16 features: small, fast, and the same outputs under any ONNX Runtime setting."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((N_FEATURES, N_FEATURES)).astype(np.float32), "W")
    b = numpy_helper.from_array(rng.standard_normal(N_FEATURES).astype(np.float32), "B")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["X", "W"], ["XW"]), helper.make_node("Add", ["XW", "B"], ["Y"])], "soak",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", N_FEATURES])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", N_FEATURES])], [w, b])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def _log(text: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {text}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
