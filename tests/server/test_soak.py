"""benchmarks/soak.py, short: 10 studies from 4 processes against a real PostgreSQL-backed `mlflow server`, restarted
twice (SIGTERM and SIGKILL, in a seeded order) and its PostgreSQL once; then every attempt is in the store (directly,
or uploaded from an outbox), once, and no run is left RUNNING or FAILED."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import child_env

SOAK = Path(__file__).resolve().parents[2] / "benchmarks" / "soak.py"


def test_ten_studies_through_three_restarts_lose_nothing_and_duplicate_nothing(server_folder, tmp_path):
    figures_file = tmp_path / "soak.json"

    done = subprocess.run([sys.executable, str(SOAK), "--studies", "10", "--restarts", "2", "--folder",
                           str(server_folder / "soak"), "--json", str(figures_file)],
                          env=child_env(None), capture_output=True, text=True, timeout=600)

    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    figures = json.loads(figures_file.read_text())
    assert figures["restarts"] == {"SIGTERM": 1, "SIGKILL": 1, "postgres": 1}, done.stdout
    assert figures["studies_ended"] == 10 and figures["attempts_expected"] == 20
    assert (figures["lost"], figures["duplicates"], figures["left_running"], figures["failed"], figures["killed"]) == (
        0, 0, 0, 0, 0)
    assert figures["uploads"]["uploaded_records"] == figures["uploads"]["outbox_records"]
    assert "lost                     0" in done.stdout
