"""Probe cases of issue 22, items 9, 11 and 12: feed files that declare more than memory holds, string-input
models, and small bad inputs (`--dim N=0`, a `--config` too deep or of the wrong type, an `--experiment` name
over MLflow's limit, external data cut short, escape sequences in node names).

Each case runs `python -m tracker ...` from outside in an empty folder, on a sqlite store there, and returns
(held, one-line observation). Most take a second or two; the string-model runs ~10 s each.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

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


def _env(tmp: Path) -> dict[str, str]:
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp / 'mlflow.db'}", "TRACKER_OUTBOX": str(tmp / "outbox"),
           "TMPDIR": str(_temp_root(tmp))}
    for name in ("MLFLOW_RUN_ID", "MLFLOW_EXPERIMENT_ID"):
        env.pop(name, None)
    return env


def _temp_root(tmp: Path) -> Path:
    """Where the child's work folders go, watched for leftovers."""
    root = tmp / "tmpdir"
    root.mkdir(exist_ok=True)
    return root


def _tracker(tmp: Path, *args: str, peak: bool = False) -> subprocess.CompletedProcess:
    command = [sys.executable, "-c", _PEAK_CHILD] if peak else [sys.executable, "-m", "tracker"]
    return subprocess.run([*command, *args], cwd=tmp, env=_env(tmp), capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=300)


def _error_line(done: subprocess.CompletedProcess) -> str:
    lines = [line for line in done.stderr.splitlines() if line.startswith(("error:", "Traceback"))]
    return (lines[-1] if lines else "")[:160]


def _one_line_error(done: subprocess.CompletedProcess, *fragments: str) -> bool:
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    return (done.returncode == 2 and "Traceback" not in done.stderr and len(errors) == 1
            and all(f in errors[0] for f in fragments))


def _seen(done: subprocess.CompletedProcess) -> str:
    return f"exit {done.returncode}: {_error_line(done) or (done.stdout.strip().splitlines() or [''])[-1][:160]}"


def _save(model: onnx.ModelProto, path: Path, **kwargs) -> Path:
    onnx.save_model(model, str(path), **kwargs)
    return path


def _linear_model(node_name: str = "matmul") -> onnx.ModelProto:
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 4])
    y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", 3])
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32), "W")
    graph = helper.make_graph([helper.make_node("MatMul", ["X", "W"], ["Y"], name=node_name)], "linear", [x], [y], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def _string_model(tmp: Path) -> Path:
    """color: string [N] -> LabelEncoder (ai.onnx.ml) to int64 and to strings."""
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
    opsets = [helper.make_opsetid("", 18), helper.make_opsetid("ai.onnx.ml", 2)]
    return _save(helper.make_model(graph, opset_imports=opsets), tmp / "colors.onnx")


def _npy_header(shape: tuple[int, ...], descr: str = "<f4") -> bytes:
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(buffer, {"descr": descr, "fortran_order": False, "shape": shape})
    return buffer.getvalue()


# Item 9: feed files.

def npy_declaring_14_tib(tmp: Path) -> tuple[bool, str]:
    """A 128-byte .npy whose header declares float32 [1e12, 4]: refused from the header, no MemoryError."""
    model = _save(_linear_model(), tmp / "linear.onnx")
    (tmp / "X.npy").write_bytes(_npy_header((10**12, 4)))
    done = _tracker(tmp, "profile", str(model), "--feeds", str(tmp / "X.npy"), *QUICK_PROFILE)
    return _one_line_error(done, "would take 14.6 TiB", "more than the limit of"), _seen(done)


def npz_with_an_unused_2_gib_member(tmp: Path) -> tuple[bool, str]:
    """A ~2 MB .npz: X, and 'unused', 2 GiB of deflated zeros. Refused as an unknown input without reading it."""
    model = _save(_linear_model(), tmp / "linear.onnx")
    with zipfile.ZipFile(tmp / "feeds.npz", "w", compression=zipfile.ZIP_DEFLATED) as archive:
        buffer = io.BytesIO()
        np.lib.format.write_array(buffer, np.ones((2, 4), np.float32))
        archive.writestr("X.npy", buffer.getvalue())
        chunk = bytes(2**24)
        with archive.open("unused.npy", "w", force_zip64=True) as member:
            member.write(_npy_header((2**29,)))
            for _ in range(2**31 // len(chunk)):
                member.write(chunk)
    done = _tracker(tmp, "profile", str(model), "--feeds", str(tmp / "feeds.npz"), *QUICK_PROFILE, peak=True)
    peak = next((line.split()[1] for line in done.stderr.splitlines() if line.startswith("peak_mib")), "?")
    held = _one_line_error(done, "unknown inputs ['unused']") and peak.isdigit() and int(peak) < 1024
    size = (tmp / "feeds.npz").stat().st_size / 2**20
    return held, f"{size:.1f} MB file; peak {peak} MiB; {_seen(done)}"


# Item 11: string inputs.

def string_model_generated_feeds(tmp: Path) -> tuple[bool, str]:
    done = _tracker(tmp, "profile", str(_string_model(tmp)), "--dim", "N=8", *QUICK_PROFILE)
    return done.returncode == 0 and "LabelEncoder" in done.stdout, _seen(done)


def string_model_npz_of_unicode(tmp: Path) -> tuple[bool, str]:
    np.savez(tmp / "colors.npz", color=np.array(["red", "blue", "pink"]))
    done = _tracker(tmp, "profile", str(_string_model(tmp)), "--feeds", str(tmp / "colors.npz"), *QUICK_PROFILE)
    return done.returncode == 0 and "LabelEncoder" in done.stdout, _seen(done)


# Item 12: small bad inputs.

def dim_of_zero(tmp: Path) -> tuple[bool, str]:
    done = _tracker(tmp, "profile", str(_save(_linear_model(), tmp / "linear.onnx")), "--dim", "N=0", *QUICK_PROFILE)
    return _one_line_error(done, "--dim N=0: a dimension must be at least 1"), _seen(done)


def config_nested_100k_deep(tmp: Path) -> tuple[bool, str]:
    (tmp / "config.json").write_text('{"model_type": ' + "[" * 100_000 + "]" * 100_000 + "}")
    done = _tracker(tmp, "optimize", str(_save(_linear_model(), tmp / "linear.onnx")), "--config",
                    str(tmp / "config.json"), "--dry-run")
    return _one_line_error(done, "config.json", "nested too deeply"), _seen(done)


def config_model_type_a_list(tmp: Path) -> tuple[bool, str]:
    (tmp / "config.json").write_text(json.dumps({"model_type": ["bert"], "num_attention_heads": 2, "hidden_size": 8}))
    done = _tracker(tmp, "optimize", str(_save(_linear_model(), tmp / "linear.onnx")), "--config",
                    str(tmp / "config.json"), "--dry-run")
    said = next((line for line in done.stdout.splitlines() if "model_type must be a string" in line), "")
    held = done.returncode == 0 and "Traceback" not in done.stderr and bool(said)
    return held, f"exit {done.returncode}: {said.strip()[:160] or _error_line(done)}"


def experiment_name_over_the_limit(tmp: Path) -> tuple[bool, str]:
    model = _save(_linear_model(), tmp / "linear.onnx")
    seen = []
    held = True
    for command, quick in (("profile", QUICK_PROFILE), ("optimize", QUICK_OPTIMIZE)):
        done = _tracker(tmp, command, str(model), "--experiment", "e" * 501, *quick)
        left = list(_temp_root(tmp).iterdir())
        held &= _one_line_error(done, "at most 500 characters") and not left
        seen.append(f"{command} {_seen(done)}{'; left ' + left[0].name if left else ''}")
    return held, "; ".join(seen)


def external_data_offset_past_the_end(tmp: Path) -> tuple[bool, str]:
    path = _save(_linear_model(), tmp / "linear.onnx", save_as_external_data=True, location="linear.weights",
                 size_threshold=0)
    model = onnx.load(str(path), load_external_data=False)
    for entry in model.graph.initializer[0].external_data:
        if entry.key == "offset":
            entry.value = "1000000"
    _save(model, path)
    profile = _tracker(tmp, "profile", str(path), *QUICK_PROFILE)
    optimize = _tracker(tmp, "optimize", str(path), *QUICK_OPTIMIZE)
    held = all(_one_line_error(d, "past the end of") for d in (profile, optimize))
    return held, f"profile {_seen(profile)}; optimize exit {optimize.returncode}"


def escape_sequences_in_node_names(tmp: Path) -> tuple[bool, str]:
    import onnxruntime as ort

    model = _linear_model(node_name="\x1b]0;owned\x07\x1b[2J\x1b[31mmatmul")
    options = ort.SessionOptions()
    options.enable_profiling, options.profile_file_prefix = True, str(tmp / "profile")
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    session.run(None, {"X": np.ones((2, 4), np.float32)})
    profile = session.end_profiling()
    done = _tracker(tmp, "summarize", profile, "--by", "node")
    raw = any(c in done.stdout for c in "\x1b\x07")
    row = next((line.strip() for line in done.stdout.splitlines() if "matmul" in line), "")
    return done.returncode == 0 and not raw and "\\x1b" in row, f"exit {done.returncode}; row {row[:100]!r}"


CASES: list[tuple[str, str, Callable[[Path], tuple[bool, str]]]] = [
    ("9", ".npy header declaring 14.6 TiB", npy_declaring_14_tib),
    ("9", ".npz with an unused 2 GiB member", npz_with_an_unused_2_gib_member),
    ("11", "string-input model, generated feeds", string_model_generated_feeds),
    ("11", "string-input model, .npz of unicode strings", string_model_npz_of_unicode),
    ("12", "--dim N=0", dim_of_zero),
    ("12", "--config nested 100k deep", config_nested_100k_deep),
    ("12", "--config with model_type a list", config_model_type_a_list),
    ("12", "--experiment name of 501 characters", experiment_name_over_the_limit),
    ("12", "external data offset past the end of its file", external_data_offset_past_the_end),
    ("12", "escape sequences in node names (summarize --by node)", escape_sequences_in_node_names),
]
