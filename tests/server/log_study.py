"""Child process of the concurrency tests: logs one small study, then prints its runs as one JSON line.

    python log_study.py STUDY EXPERIMENT ATTEMPTS START_FILE

It imports everything and builds its model first, touches STUDY.ready beside START_FILE, and starts
logging only once START_FILE exists, so that every child logs at the same time.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

import tracker
import tracker.api  # noqa: F401  (MLflow's import time must not stagger the start)
from tracker.measure.timing.speedup import SpeedupConfig
from tracker.studies.fusion import make_linear_model

FAST = tracker.MeasureConfig(profile_runs=3,
                             speedup=SpeedupConfig(rounds=4, seconds=0, round_seconds=0, min_pairs=3, block_ms=0),
                             timing=tracker.TimingConfig(warmup_runs=1, min_runs=3, min_seconds=0))
SESSIONS = (
    tracker.SessionConfig(),
    tracker.SessionConfig(graph_optimization_level="disable"),
    tracker.SessionConfig(intra_op_num_threads=1),
)


def main(argv: list[str]) -> int:
    study_name, experiment, attempts, start = argv[0], argv[1], int(argv[2]), Path(argv[3])
    model = make_linear_model(n_features=8)
    feeds = {"X": np.random.default_rng(0).standard_normal((2, 8)).astype(np.float32)}
    (start.parent / f"{study_name}.ready").touch()
    deadline = time.monotonic() + 300
    while not start.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{start} never appeared")
        time.sleep(0.02)
    started = time.time()
    with tracker.Study(study_name, feeds=feeds, experiment=experiment, config=FAST) as study:
        for i in range(attempts):
            study.attempt(f"attempt{i}", model, session=SESSIONS[i % len(SESSIONS)])
    print(json.dumps({
        "study": study_name,
        "run_id": study.run.info.run_id,
        "seconds": [started, time.time()],
        "attempts": [
            {"name": r.attempt.name, "run_id": r.run_id, "error": r.error,
             "p50_ms": r.latency.p50_ms if r.latency else None}
            for r in study.results
        ],
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
