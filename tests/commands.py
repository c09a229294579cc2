"""Running `tracker` commands in a test's own process: their exit code and output, the one-line error a refusal must
be (exit 2, no traceback), and the runs a store holds afterwards."""

from __future__ import annotations

from pathlib import Path

import mlflow
import pytest

from tracker.cli import main

# `tracker optimize` as quick as it goes, for a test of what it refuses or plans (not of what it measures).
QUICK_OPTIMIZE = ["--min-runs", "1", "--min-seconds", "0", "--profile-runs", "2", "--speedup-seconds", "0"]


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """Runs `tracker ARGS...` through `tracker.cli.main`: (exit code, stdout, stderr)."""
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def run_names(uri: str) -> list[str]:
    """Names of every run in the sqlite store at `uri`; none when the store was never created."""
    if not Path(uri.removeprefix("sqlite:///")).exists():
        return []
    client = mlflow.MlflowClient(uri)
    experiments = [e.experiment_id for e in client.search_experiments()]
    return [r.info.run_name for r in client.search_runs(experiments)]


def assert_one_line_error(code: int, err: str, *fragments: str) -> None:
    """The command refused with exit 2 and one line `error: ...` holding each of `fragments`, and no traceback."""
    lines = [line for line in err.splitlines() if line.startswith("error: ")]
    assert code == 2
    assert len(lines) == 1 and "Traceback" not in err, err
    for fragment in fragments:
        assert fragment in lines[0]
