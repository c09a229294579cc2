"""What the command line prints is escaped: control and bidirectional characters in names, in MLflow's own messages
and in the tables (`summarize --by node` stays aligned) too; a working folder removed under the process is one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.commands import run_cli
from tracker.base.terminal import printable

FIXTURES = Path(__file__).parents[1] / "fixtures"


def test_bidirectional_controls_are_spelled_as_escapes():
    assert printable("report\u202egpj.exe") == "report\\u202egpj.exe"
    assert printable("a\u2066b\u2069\u200f") == "a\\u2066b\\u2069\\u200f"
    assert printable("naïve 名前\ttab\nline") == "naïve 名前\ttab\nline"  # letters, tab and newline stay


def test_the_message_about_a_new_experiment_reaches_the_terminal_escaped(tmp_path):
    model = tmp_path / "linear.onnx"
    subprocess.run([sys.executable, "-c", "import onnx; from tracker.studies.fusion import make_linear_model; "
                    f"onnx.save(make_linear_model(n_features=4), {str(model)!r})"], check=True)
    name = "exp\x1b[2J\u202eevil"
    done = subprocess.run([sys.executable, "-m", "tracker", "profile", str(model), "--dim", "N=2", "--profile-runs", "2",
                           "--experiment", name], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"})
    assert done.returncode == 0, done.stderr
    printed = done.stdout + done.stderr
    assert "\x1b" not in printed and "\u202e" not in printed
    assert "exp\\x1b[2J\\u202eevil" in printed  # the "experiment ... did not exist: made it" line, escaped


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


def _profile_with_node_name(tmp_path: Path, name: str) -> Path:
    events = json.loads((FIXTURES / "profile_ort_1_32.json").read_text())
    for event in events:
        if event.get("name") == "mm_kernel_time":
            event["name"] = f"{name}_kernel_time"
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(events))
    return path


def test_summarize_prints_control_characters_of_node_names_escaped(tmp_path, capsys):
    path = _profile_with_node_name(tmp_path, "mm\x1b]0;owned\x07\x1b[2J\r\x9b")
    code, out, _ = run_cli(capsys, "summarize", str(path), "--by", "node")
    assert code == 0
    assert "mm\\x1b]0;owned\\x07\\x1b[2J\\x0d\\x9b" in out
    assert not any(c in out for c in "\x1b\x07\r\x9b")
    lines = out.splitlines()
    assert len({len(line) for line in lines[1:]}) == 1  # the table stays aligned
