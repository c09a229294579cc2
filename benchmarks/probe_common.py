"""What the outside probes (`probe_*.py`, run by `bench_hardening.py --probe`) share, with the tests that check the same
cases from inside (pytest puts benchmarks/ on the path): running `python -m tracker` from outside in an empty folder on
a sqlite store there and reading what it said, the small models the cases feed it, the state of a store being built,
the bystanders a case needs (an unrelated process, another HTTP service), and the loop that runs the cases.

Nothing here imports `tracker`: a probe runs against whichever checkout PYTHONPATH names, an older one too.
"""

from __future__ import annotations

import http.server
import io
import os
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

# A case: (the item it probes, what it does, the case itself: folder -> (held, one-line observation)).
Case = tuple[str, str, Callable[[Path], tuple[bool, str]]]

QUICK_PROFILE = ["--profile-runs", "2", "--min-seconds", "0"]
QUICK_OPTIMIZE = ["--profile-runs", "2", "--min-runs", "2", "--min-seconds", "0", "--speedup-seconds", "0"]
# Runs the CLI and prints its own peak memory last on stderr (VmHWM: ru_maxrss would carry the parent's over).
_PEAK_CHILD = """
import sys
from tracker.cli import main
from tracker.base.memory import peak_rss_bytes
code = main(sys.argv[1:])
print(f"peak_mib {peak_rss_bytes() / 2**20:.0f}", file=sys.stderr)
sys.exit(code)
"""
# SIGTERM landing in a weakref callback, whose exceptions Python ignores (as SQLAlchemy's pool runs its callbacks):
# the process must still end with 143 rather than print "finished normally".
SIGTERM_IN_A_WEAKREF_CALLBACK = """
import os, signal, weakref
from tracker.base.termination import sigterm_as_exit

class Pooled:
    pass

def on_collect(_):  # like SQLAlchemy's pool: the handler runs inside a weakref callback, whose errors are ignored
    os.kill(os.getpid(), signal.SIGTERM)
    sum(range(10000))

with sigterm_as_exit():
    pooled = Pooled()
    ref = weakref.ref(pooled, on_collect)
    del pooled
    print("work went on", flush=True)
print("finished normally", flush=True)
"""


def temp_root(tmp: Path) -> Path:
    """Where a child's work folders go (its TMPDIR), watched for leftovers."""
    root = tmp / "tmpdir"
    root.mkdir(exist_ok=True)
    return root


def tracker_env(tmp: Path, **extra: str) -> dict[str, str]:
    """The environment of a child that logs to the sqlite store in `tmp`, keeps its outbox there and its work folders
    in `temp_root(tmp)`, in no run of this process."""
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_RUN_ID", "MLFLOW_EXPERIMENT_ID")}
    return {**env, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp / 'mlflow.db'}", "TRACKER_OUTBOX": str(tmp / "outbox"),
            "TMPDIR": str(temp_root(tmp)), **extra}


def run_tracker(tmp: Path, *args: str, env: dict[str, str] | None = None, peak: bool = False,
                timeout_s: float = 300) -> subprocess.CompletedProcess:
    """`python -m tracker ARGS...` in `tmp` (with `peak`, through a child that prints its peak memory last)."""
    command = [sys.executable, "-c", _PEAK_CHILD] if peak else [sys.executable, "-m", "tracker"]
    return subprocess.run([*command, *args], cwd=tmp, env=env or tracker_env(tmp), capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=timeout_s)


def error_line(done: subprocess.CompletedProcess) -> str:
    """The last `error:` (or `Traceback`) line the command wrote; empty if none."""
    lines = [line for line in done.stderr.splitlines() if line.startswith(("error:", "Traceback"))]
    return (lines[-1] if lines else "")[:160]


def one_line_error(done: subprocess.CompletedProcess, *fragments: str) -> bool:
    """Whether the command refused as it must: exit 2, one `error:` line holding each fragment, no traceback."""
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    return (done.returncode == 2 and "Traceback" not in done.stderr and len(errors) == 1
            and all(f in errors[0] for f in fragments))


def seen(done: subprocess.CompletedProcess) -> str:
    """What a user saw, in one line: the exit code and the error line, else the last line printed."""
    return f"exit {done.returncode}: {error_line(done) or (done.stdout.strip().splitlines() or [''])[-1][:160]}"


def last_line(done: subprocess.CompletedProcess) -> str:
    """The last line the command wrote to stderr (MLflow's INFO lines aside), else to stdout."""
    lines = [line for line in done.stderr.strip().splitlines() if "INFO mlflow" not in line]
    return (lines or done.stdout.strip().splitlines() or [""])[-1][:200]


def save(model: onnx.ModelProto, path: Path, **kwargs: object) -> Path:
    """`model` saved at `path` (kwargs: onnx.save_model's, e.g. external data); the path."""
    onnx.save_model(model, str(path), **kwargs)
    return path


def linear_model(node_name: str = "matmul") -> onnx.ModelProto:
    """Y = X @ W, X: float32 [N, 4], W [4, 3] seeded, opset 18: the smallest model every command takes."""
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 4])
    y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", 3])
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32), "W")
    graph = helper.make_graph([helper.make_node("MatMul", ["X", "W"], ["Y"], name=node_name)], "linear", [x], [y], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def string_model() -> onnx.ModelProto:
    """color: string [N] -> color_id (LabelEncoder to int64) and color_fr (LabelEncoder to strings), ai.onnx.ml."""
    words = ["red", "green", "blue"]
    nodes = [
        helper.make_node("LabelEncoder", ["color"], ["color_id"], name="encode", domain="ai.onnx.ml",
                         keys_strings=words, values_int64s=[0, 1, 2], default_int64=-1),
        helper.make_node("LabelEncoder", ["color"], ["color_fr"], name="translate", domain="ai.onnx.ml",
                         keys_strings=words, values_strings=["rouge", "vert", "bleu"], default_string="?"),
    ]
    graph = helper.make_graph(
        nodes, "colors", [helper.make_tensor_value_info("color", TensorProto.STRING, ["N"])],
        [helper.make_tensor_value_info("color_id", TensorProto.INT64, ["N"]),
         helper.make_tensor_value_info("color_fr", TensorProto.STRING, ["N"])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("ai.onnx.ml", 2)])
    onnx.checker.check_model(model, full_check=True)
    return model


def npy_header(shape: tuple[int, ...], descr: str = "<f4", body: bytes = b"") -> bytes:
    """A .npy that declares `shape` and `descr` and holds only `body` (a header that lies about the data)."""
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(buffer, {"descr": descr, "fortran_order": False, "shape": shape})
    return buffer.getvalue() + body


def store_revision(db: Path) -> str | None:
    """The schema revision a sqlite store's migrations reached; None if there is no store."""
    if not db.exists():
        return None
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as connection:
        try:
            (revision,) = connection.execute("SELECT version_num FROM alembic_version").fetchone() or ("none",)
        except sqlite3.Error:
            return "no revision"
    return revision


def store_migrating(folder: Path) -> bool:
    """Whether a store being built in `folder` (in place, or beside and renamed in) has begun its migrations."""
    for name in ("mlflow.db", ".mlflow.db.building"):
        try:
            with sqlite3.connect(f"file:{folder / name}?mode=ro", uri=True, timeout=0.01) as connection:
                if connection.execute("SELECT 1 FROM sqlite_master WHERE name = 'alembic_version'").fetchone():
                    return True
        except sqlite3.Error:
            pass
    return False


@contextmanager
def bystander() -> Iterator[subprocess.Popen]:
    """An unrelated process (what a reused or a made-up pid names), killed at the end."""
    proc = subprocess.Popen(["sleep", "120"], stdin=subprocess.DEVNULL)
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


class _Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"OK")

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def foreign_service(port: int = 0) -> Iterator[int]:
    """Another HTTP service on 127.0.0.1 (on `port`, else a free one) that answers /health with 200, as an MLflow server
    would; its port."""
    service = http.server.ThreadingHTTPServer(("127.0.0.1", port), _Health)
    threading.Thread(target=service.serve_forever, daemon=True).start()
    try:
        yield service.server_address[1]
    finally:
        service.shutdown()
        service.server_close()


def run_cases(cases: list[Case], folder: Path | None = None) -> int:
    """Runs each case in an empty folder (under `folder`, else the system's); prints one line per case, then the
    count held. Returns 0: a probe reports, it does not fail."""
    held_count = 0
    for item, name, case in cases:
        start = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="probe_", dir=folder) as tmp:
            try:
                held, observed = case(Path(tmp))
            except Exception as e:  # the probe itself broke (a timeout, an assertion of its setup)
                held, observed = False, f"probe error: {type(e).__name__}: {str(e)[:150]}"
        held_count += held
        print(f"{item:>3} {'held ' if held else 'BROKE'} {time.perf_counter() - start:5.1f} s  {name}: {observed}",
              flush=True)
    print(f"{held_count} of {len(cases)} held")
    return 0
