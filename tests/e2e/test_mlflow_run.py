"""`mlflow run .` exactly as the README types it: no `--env-manager`, from a clean copy of the project.

MLflow builds python_env.yaml's environment (pyenv's Python, venv, pip) in ~/.mlflow/envs, or
$MLFLOW_ENV_ROOT, under a hash of that file's Python version and dependencies. The hash does not see
the project's folder, so every copy of the project, every test session and the user's own
`mlflow run .` share one environment: only the first run anywhere on a machine builds it (~1.5 min).
That folder is the one thing these tests leave outside tmp_path, on purpose.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from mlflow import MlflowClient

# Every test runs `mlflow run .` in a child process.
pytestmark = [pytest.mark.subprocess, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
FAST = ["-P", "profile_runs=3", "-P", "min_runs=5", "-P", "min_seconds=0.05", "-P", "threads=1",
        "-P", "speedup_rounds=4", "-P", "speedup_seconds=0"]
# Building the environment takes ~1.5 min here; a slow package mirror may take several.
BUILD_TIMEOUT_S = 1200


def copy_project(destination: Path) -> Path:
    """The project's files as a fresh clone would have them, plus files not yet committed.

    Tracked and untracked-but-not-ignored files: no .venv, mlflow.db, mlruns or egg-info.
    """
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs the project's git checkout to know which files a clone holds")
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file():  # listed but deleted in the working tree: a clone of the next commit lacks it too
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, destination / name)
    return destination


def run_mlflow(args: list[str], *, cwd: Path, env: dict[str, str], timeout_s: float) -> subprocess.CompletedProcess:
    """`mlflow ARGS` from this interpreter's MLflow; on a timeout its whole process group (pip too) is killed."""
    command = [str(Path(sys.executable).parent / "mlflow"), *args]
    with subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          stdin=subprocess.DEVNULL, start_new_session=True) as process:
        try:
            output, _ = process.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            # A build killed halfway leaves a folder MLflow would take for a finished environment.
            os.killpg(process.pid, signal.SIGKILL)
            output, _ = process.communicate()
            pytest.fail(f"`mlflow {' '.join(args)}` ran past {timeout_s} s; remove the environment it was "
                        f"building (its folder is named in the log) before rerunning:\n{output[-5000:]}")
    return subprocess.CompletedProcess(command, process.returncode, output, "")


def mlflow_env(tracking_uri: str) -> dict[str, str]:
    """The caller's environment with an explicit store and no experiment chosen by an earlier in-process test."""
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_EXPERIMENT_ID", "MLFLOW_EXPERIMENT_NAME")}
    return {**env, "MLFLOW_TRACKING_URI": tracking_uri}


@pytest.mark.skipif(shutil.which("pyenv") is None, reason="MLflow builds python_env.yaml's Python with pyenv")
def test_a_bare_mlflow_run_builds_or_reuses_the_project_environment_and_logs_the_study(tmp_path):
    project = copy_project(tmp_path / "project")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"  # tmp_path is absolute: sqlite://// + path

    done = run_mlflow(["run", ".", "-e", "linreg", *FAST], cwd=project, env=mlflow_env(uri), timeout_s=BUILD_TIMEOUT_S)

    assert done.returncode == 0, done.stdout[-5000:]
    client = MlflowClient(tracking_uri=uri)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()], max_results=100)
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert len(parents) == 1
    parent = parents[0]
    assert parent.info.status == "FINISHED"
    assert parent.data.tags["mlflow.project.env"] == "virtualenv"  # MLflow's environment, not the active one
    assert parent.data.tags["tracker.study"] == "linreg"
    attempts = {r.info.run_name: r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id}
    assert sorted(attempts) == ["baseline", "ort_opt_disabled", "ort_opt_enabled"]
    assert all(r.info.status == "FINISHED" for r in attempts.values())
    assert len(runs) == 1 + len(attempts)
    # The environment holds the dependencies; the code ran is the copy's own tracker/ (see python_env.yaml).
    assert re.search(r"Running command 'source \S+/bin/activate && "
                     r"GLIBC_TUNABLES=glibc\.malloc\.hugetlb=1 python -m experiments\.linreg ", done.stdout)
    # ...with the weights on huge pages, as every MLproject entry runs (recorded on each attempt)
    assert {r.data.params["env.huge_pages"] for r in attempts.values()} <= {"malloc", "always", "unknown"}


def test_without_pyenv_mlflow_run_fails_with_the_message_the_readme_quotes(tmp_path):
    """MLflow 3.17 does not say that pyenv is missing. The README quotes what it does print, and why."""
    readme = (ROOT / "README.md").read_text()
    quoted = re.search(r"`(FileNotFoundError: [^`]+)`", readme)
    assert quoted, "README.md quotes MLflow's error for a machine without pyenv"
    project = copy_project(tmp_path / "project")
    env = mlflow_env(f"sqlite:///{tmp_path / 'mlflow.db'}")
    # No pyenv on PATH, and no cached environment that would spare MLflow from looking for it.
    env["PATH"] = os.pathsep.join(d for d in env["PATH"].split(os.pathsep)
                                  if d and not (Path(d) / "pyenv").exists())
    env["MLFLOW_ENV_ROOT"] = str(tmp_path / "envs")

    done = run_mlflow(["run", ".", "-e", "linreg", *FAST], cwd=project, env=env, timeout_s=300)

    assert done.returncode != 0
    python = yaml.safe_load((ROOT / "python_env.yaml").read_text())["python"]
    assert f"Installing python {python} if it does not exist" in done.stdout
    assert quoted.group(1) in done.stdout
