"""Several processes logging studies at once: into one experiment on the server, and into one sqlite file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from mlflow import MlflowClient
from readback import verify_experiment

CHILD = Path(__file__).with_name("log_study.py")
ATTEMPTS = ["attempt0", "attempt1", "attempt2"]  # what log_study.py names them


def log_studies_at_once(studies: list[str], experiment: str, tracking_uri: str, folder: Path,
                        *, attempts: int = 3, timeout_s: float = 240) -> list[dict]:
    """Runs one `log_study.py` process per study, all released at the same moment; their JSON reports."""
    env = {**os.environ, "MLFLOW_TRACKING_URI": tracking_uri, "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false"}
    env.pop("MLFLOW_RUN_ID", None)
    start = folder / "start"
    procs = {}
    for name in studies:
        with open(folder / f"{name}.out", "w") as out, open(folder / f"{name}.err", "w") as err:
            procs[name] = subprocess.Popen(
                [sys.executable, str(CHILD), name, experiment, str(attempts), str(start)],
                cwd=folder, env=env, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
            )
    deadline = time.monotonic() + timeout_s
    try:
        while not all((folder / f"{name}.ready").exists() for name in studies):
            assert all(p.poll() is None for p in procs.values()), _tails(folder, studies)
            assert time.monotonic() < deadline, "children never got ready"
            time.sleep(0.05)
        start.touch()
        for p in procs.values():
            p.wait(max(1.0, deadline - time.monotonic()))
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    assert all(p.returncode == 0 for p in procs.values()), _tails(folder, studies)
    return [json.loads((folder / f"{name}.out").read_text().splitlines()[-1]) for name in studies]


def _tails(folder: Path, studies: list[str]) -> str:
    return "\n".join(f"--- {n}:\n" + "\n".join((folder / f"{n}.err").read_text().splitlines()[-15:]) for n in studies)


def _strays(client: MlflowClient, studies: list[str]) -> list[str]:
    """Runs of these studies in MLflow's "Default" experiment: where the loser of MLflow's race to create
    a new experiment used to log (mlflow.set_experiment returns it without activating it)."""
    return [r.info.run_name for r in client.search_runs(["0"]) if r.data.tags.get("tracker.study") in studies]


def _overlap_s(reports: list[dict]) -> float:
    """How long every study was logging at the same time."""
    return min(r["seconds"][1] for r in reports) - max(r["seconds"][0] for r in reports)


def test_four_processes_logging_into_one_server_experiment_lose_and_duplicate_nothing(tracking_server, tmp_path):
    studies = [f"study{i}" for i in range(4)]
    reports = log_studies_at_once(studies, "concurrent", tracking_server.tracking_uri, tmp_path)

    written_runs = {r["run_id"] for r in reports} | {a["run_id"] for r in reports for a in r["attempts"]}
    assert all(a["error"] is None for r in reports for a in r["attempts"]), reports
    assert _overlap_s(reports) > 0, "the studies did not overlap"
    p50 = {a["run_id"]: a["p50_ms"] for r in reports for a in r["attempts"]}
    client = MlflowClient(tracking_server.tracking_uri)
    counts = verify_experiment(
        client, tracking_server.mlflow.artifacts_folder, "concurrent", {s: ATTEMPTS for s in studies}, p50
    )
    assert not _strays(client, studies)
    print(f"\nconcurrency (server): {len(studies)} processes wrote {len(written_runs)} runs "
          f"({len(studies)} studies x {len(ATTEMPTS)} attempts + {len(studies)} study runs), all logging at once "
          f"for {_overlap_s(reports):.1f} s; verified {counts.runs} runs, {counts.metrics} metrics, "
          f"{counts.params} params, {counts.artifacts} run artifacts ({counts.artifact_bytes / 1e6:.1f} MB), "
          f"{counts.logged_models} logged models ({counts.model_files} files), no duplicates")
    assert len(written_runs) == counts.runs == 16
    assert counts.logged_models == 12
    assert counts.artifacts >= 12 * 9 + 4 * 2


def test_two_studies_logged_at_once_into_one_new_sqlite_store_both_arrive(tmp_path):
    # MLflow creates a new sqlite store's tables without a lock: a second process starting on the same new
    # file used to fail with "table ... already exists". The tracker creates them under a file lock first.
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    studies = ["study0", "study1"]
    reports = log_studies_at_once(studies, "sqlite-concurrent", uri, tmp_path, attempts=2)

    assert all(a["error"] is None for r in reports for a in r["attempts"]), reports
    client = MlflowClient(uri)
    counts = verify_experiment(client, None, "sqlite-concurrent", {s: ATTEMPTS[:2] for s in studies},
                               {a["run_id"]: a["p50_ms"] for r in reports for a in r["attempts"]})
    assert not _strays(client, studies)
    print(f"\nconcurrency (sqlite): 2 processes, overlap {_overlap_s(reports):.1f} s; verified {counts.runs} runs, "
          f"{counts.artifacts} artifacts, {counts.logged_models} logged models")
    assert counts.runs == 6 and counts.logged_models == 4
