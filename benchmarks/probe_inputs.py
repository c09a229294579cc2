"""Probe cases of issue 22, items 9, 11 and 12: feed files that declare more than memory holds, string-input
models, and small bad inputs (`--dim N=0`, a `--config` too deep or of the wrong type, an `--experiment` name
over MLflow's limit, external data cut short, escape sequences in node names).

Each case runs `python -m tracker ...` from outside in an empty folder, on a sqlite store there, and returns
(held, one-line observation). Most take a second or two; the string-model runs ~10 s each.
"""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

import numpy as np
import onnx
from probe_common import (
    QUICK_OPTIMIZE,
    QUICK_PROFILE,
    Case,
    error_line,
    linear_model,
    npy_header,
    one_line_error,
    run_tracker,
    save,
    seen,
    string_model,
    temp_root,
)

# Item 9: feed files.

def npy_declaring_14_tib(tmp: Path) -> tuple[bool, str]:
    """A 128-byte .npy whose header declares float32 [1e12, 4]: refused from the header, no MemoryError."""
    model = save(linear_model(), tmp / "linear.onnx")
    (tmp / "X.npy").write_bytes(npy_header((10**12, 4)))
    done = run_tracker(tmp, "profile", str(model), "--feeds", str(tmp / "X.npy"), *QUICK_PROFILE)
    return one_line_error(done, "would take 14.6 TiB", "more than the limit of"), seen(done)


def npz_with_an_unused_2_gib_member(tmp: Path) -> tuple[bool, str]:
    """A ~2 MB .npz: X, and 'unused', 2 GiB of deflated zeros. Refused as an unknown input without reading it."""
    model = save(linear_model(), tmp / "linear.onnx")
    with zipfile.ZipFile(tmp / "feeds.npz", "w", compression=zipfile.ZIP_DEFLATED) as archive:
        buffer = io.BytesIO()
        np.lib.format.write_array(buffer, np.ones((2, 4), np.float32))
        archive.writestr("X.npy", buffer.getvalue())
        chunk = bytes(2**24)
        with archive.open("unused.npy", "w", force_zip64=True) as member:
            member.write(npy_header((2**29,)))
            for _ in range(2**31 // len(chunk)):
                member.write(chunk)
    done = run_tracker(tmp, "profile", str(model), "--feeds", str(tmp / "feeds.npz"), *QUICK_PROFILE, peak=True)
    peak = next((line.split()[1] for line in done.stderr.splitlines() if line.startswith("peak_mib")), "?")
    held = one_line_error(done, "unknown inputs ['unused']") and peak.isdigit() and int(peak) < 1024
    size = (tmp / "feeds.npz").stat().st_size / 2**20
    return held, f"{size:.1f} MB file; peak {peak} MiB; {seen(done)}"


# Item 11: string inputs.

def string_model_generated_feeds(tmp: Path) -> tuple[bool, str]:
    done = run_tracker(tmp, "profile", str(save(string_model(), tmp / "colors.onnx")), "--dim", "N=8", *QUICK_PROFILE)
    return done.returncode == 0 and "LabelEncoder" in done.stdout, seen(done)


def string_model_npz_of_unicode(tmp: Path) -> tuple[bool, str]:
    np.savez(tmp / "colors.npz", color=np.array(["red", "blue", "pink"]))
    done = run_tracker(tmp, "profile", str(save(string_model(), tmp / "colors.onnx")), "--feeds",
                       str(tmp / "colors.npz"), *QUICK_PROFILE)
    return done.returncode == 0 and "LabelEncoder" in done.stdout, seen(done)


# Item 12: small bad inputs.

def dim_of_zero(tmp: Path) -> tuple[bool, str]:
    done = run_tracker(tmp, "profile", str(save(linear_model(), tmp / "linear.onnx")), "--dim", "N=0", *QUICK_PROFILE)
    return one_line_error(done, "--dim N=0: a dimension must be at least 1"), seen(done)


def config_nested_100k_deep(tmp: Path) -> tuple[bool, str]:
    (tmp / "config.json").write_text('{"model_type": ' + "[" * 100_000 + "]" * 100_000 + "}")
    done = run_tracker(tmp, "optimize", str(save(linear_model(), tmp / "linear.onnx")), "--config",
                       str(tmp / "config.json"), "--dry-run")
    return one_line_error(done, "config.json", "nested too deeply"), seen(done)


def config_model_type_a_list(tmp: Path) -> tuple[bool, str]:
    (tmp / "config.json").write_text(json.dumps({"model_type": ["bert"], "num_attention_heads": 2, "hidden_size": 8}))
    done = run_tracker(tmp, "optimize", str(save(linear_model(), tmp / "linear.onnx")), "--config",
                       str(tmp / "config.json"), "--dry-run")
    said = next((line for line in done.stdout.splitlines() if "model_type must be a string" in line), "")
    held = done.returncode == 0 and "Traceback" not in done.stderr and bool(said)
    return held, f"exit {done.returncode}: {said.strip()[:160] or error_line(done)}"


def experiment_name_over_the_limit(tmp: Path) -> tuple[bool, str]:
    model = save(linear_model(), tmp / "linear.onnx")
    said = []
    held = True
    for command, quick in (("profile", QUICK_PROFILE), ("optimize", QUICK_OPTIMIZE)):
        done = run_tracker(tmp, command, str(model), "--experiment", "e" * 501, *quick)
        left = list(temp_root(tmp).iterdir())
        held &= one_line_error(done, "at most 500 characters") and not left
        said.append(f"{command} {seen(done)}{'; left ' + left[0].name if left else ''}")
    return held, "; ".join(said)


def external_data_offset_past_the_end(tmp: Path) -> tuple[bool, str]:
    path = save(linear_model(), tmp / "linear.onnx", save_as_external_data=True, location="linear.weights",
                size_threshold=0)
    model = onnx.load(str(path), load_external_data=False)
    for entry in model.graph.initializer[0].external_data:
        if entry.key == "offset":
            entry.value = "1000000"
    save(model, path)
    profile = run_tracker(tmp, "profile", str(path), *QUICK_PROFILE)
    optimize = run_tracker(tmp, "optimize", str(path), *QUICK_OPTIMIZE)
    held = all(one_line_error(d, "past the end of") for d in (profile, optimize))
    return held, f"profile {seen(profile)}; optimize exit {optimize.returncode}"


def escape_sequences_in_node_names(tmp: Path) -> tuple[bool, str]:
    import onnxruntime as ort

    model = linear_model(node_name="\x1b]0;owned\x07\x1b[2J\x1b[31mmatmul")
    options = ort.SessionOptions()
    options.enable_profiling, options.profile_file_prefix = True, str(tmp / "profile")
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    session.run(None, {"X": np.ones((2, 4), np.float32)})
    profile = session.end_profiling()
    done = run_tracker(tmp, "summarize", profile, "--by", "node")
    raw = any(c in done.stdout for c in "\x1b\x07")
    row = next((line.strip() for line in done.stdout.splitlines() if "matmul" in line), "")
    return done.returncode == 0 and not raw and "\\x1b" in row, f"exit {done.returncode}; row {row[:100]!r}"


CASES: list[Case] = [
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
