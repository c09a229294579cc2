"""What the command line prints is escaped: control and bidirectional characters in names, in MLflow's own messages
too; a working folder removed under the process is one line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tracker.base.terminal import printable


def test_bidirectional_controls_are_spelled_as_escapes():
    assert printable("report\u202egpj.exe") == "report\\u202egpj.exe"
    assert printable("a\u2066b\u2069\u200f") == "a\\u2066b\\u2069\\u200f"
    assert printable("naïve 名前\ttab\nline") == "naïve 名前\ttab\nline"  # letters, tab and newline stay


def test_mlflows_message_about_a_new_experiment_reaches_the_terminal_escaped(tmp_path):
    model = tmp_path / "linear.onnx"
    subprocess.run([sys.executable, "-c", "import onnx; from tracker.optimize.add_eyelike import make_linear_model; "
                    f"onnx.save(make_linear_model(n_features=4), {str(model)!r})"], check=True)
    name = "exp\x1b[2J\u202eevil"
    done = subprocess.run([sys.executable, "-m", "tracker", "profile", str(model), "--dim", "N=2", "--profile-runs", "2",
                           "--experiment", name], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"})
    assert done.returncode == 0, done.stderr
    printed = done.stdout + done.stderr
    assert "\x1b" not in printed and "\u202e" not in printed
    assert "exp\\x1b[2J\\u202eevil" in printed  # MLflow's "Experiment with name ... does not exist" line, escaped


@pytest.mark.parametrize("command", [["compare", "--experiment", "e", "--study", "s"], ["upload", "."],
                                     ["profile", "model.onnx"]])
def test_a_removed_working_folder_is_a_one_line_error(tmp_path, command):
    gone = tmp_path / "gone"
    gone.mkdir()
    tracker = Path(sys.executable).parent / "tracker"  # the console script: `python -c` would import from the cwd
    done = subprocess.run(["bash", "-c", 'cd "$1" && rmdir "$1" && shift && exec "$@"', "-", str(gone), str(tracker),
                           *command], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert errors == [errors[0]] and "the working folder was removed" in errors[0]
