"""Probe cases of issue 35 (the third outside probe), the ones built so far: items 2, 3, 5 to 10.

Each case runs `python -m tracker ...` (the console script where the working folder is removed) from outside, in an
empty folder with its own sqlite store, and returns (held, one-line observation). Each takes a few seconds; the
ones that make a study first ~10-20 s.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from onnx import TensorProto, helper
from probe_inputs import QUICK_OPTIMIZE, _env, _linear_model, _one_line_error, _save, _seen, _tracker


def _study(tmp: Path) -> tuple[str, dict[str, str]]:
    """A small study of two attempts in the folder's store: its store URI, each attempt's run id and the study's
    (under "study")."""
    done = _tracker(tmp, "optimize", str(_save(_linear_model(), tmp / "linear.onnx")), "--attempts",
                    "ort_opt_disabled", *QUICK_OPTIMIZE)
    if done.returncode != 0:
        raise RuntimeError(f"the study failed: {_seen(done)}")
    import mlflow

    uri = f"sqlite:///{tmp / 'mlflow.db'}"
    client = mlflow.MlflowClient(uri)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    ids = {r.data.tags.get("tracker.attempt", ""): r.info.run_id for r in runs}
    ids["study"] = next(r.info.run_id for r in runs if r.data.tags.get("tracker.role") == "study")
    return uri, ids


# Item 2: upload touches only its own runs.

def upload_note_naming_a_foreign_run(tmp: Path) -> tuple[bool, str]:
    import mlflow

    from tracker.run.record import AttemptRecord, save_record

    uri = f"sqlite:///{tmp / 'mlflow.db'}"
    _tracker(tmp, "compare", "--experiment", "x", "--study", "y")  # creates the store's tables
    foreign = mlflow.MlflowClient(uri).create_run("0", run_name="the users own").info.run_id
    folder = save_record(AttemptRecord("kept", None, "onnxruntime", metrics={"latency.p50_ms": 1.0}), tmp / "outbox")
    (folder / ".upload.json").write_text(json.dumps({"run_id": foreign, "done": False}))
    done = _tracker(tmp, "upload", str(tmp / "outbox"))
    run = mlflow.MlflowClient(uri).get_run(foreign)
    alive = run.info.lifecycle_stage == "active" and run.info.status == "RUNNING"
    return done.returncode == 0 and alive, f"exit {done.returncode}; the foreign run {run.info.lifecycle_stage}, " \
                                           f"{run.info.status}"


# Item 3: records read safely, one at a time.

def record_json_a_fifo(tmp: Path) -> tuple[bool, str]:
    from tracker.run.record import AttemptRecord, save_record

    bad = save_record(AttemptRecord("bad", None, "onnxruntime", metrics={"latency.p50_ms": 1.0}), tmp / "outbox")
    save_record(AttemptRecord("good", None, "onnxruntime", metrics={"latency.p50_ms": 1.0}), tmp / "outbox")
    (bad / "record.json").unlink()
    os.mkfifo(bad / "record.json")
    try:
        done = _tracker(tmp, "upload", str(tmp / "outbox"))
    except subprocess.TimeoutExpired:
        return False, "upload hung on the FIFO"
    return (_one_line_error(done, "must be a regular file") and "uploaded 1 attempt run" in done.stdout,
            _seen(done))


def record_json_nested_200k_deep(tmp: Path) -> tuple[bool, str]:
    from tracker.run.record import AttemptRecord, save_record

    bad = save_record(AttemptRecord("bad", None, "onnxruntime", metrics={"latency.p50_ms": 1.0}), tmp / "outbox")
    save_record(AttemptRecord("good", None, "onnxruntime", metrics={"latency.p50_ms": 1.0}), tmp / "outbox")
    (bad / "record.json").write_text("[" * 200_000 + "]" * 200_000)
    done = _tracker(tmp, "upload", str(tmp / "outbox"))
    return (_one_line_error(done, "nested too deeply") and "uploaded 1 attempt run" in done.stdout, _seen(done))


# Item 5: compare reads defensively.

def compare_with_a_damaged_table(tmp: Path) -> tuple[bool, str]:
    uri, runs = _study(tmp)
    import mlflow

    artifacts = mlflow.MlflowClient(uri).get_run(runs["ort_opt_disabled"]).info.artifact_uri.removeprefix("file://")
    (Path(artifacts) / "tables" / "ops_by_op.json").write_text("[1, 2]")
    done = _tracker(tmp, "compare", runs["study"])
    row = next((line for line in done.stdout.splitlines() if "ort_opt_disabled" in line), "")
    held = done.returncode == 0 and "Traceback" not in done.stderr and "unreadable: tables/ops_by_op.json" in row
    return held, f"exit {done.returncode}: {row.split('unreadable')[-1][:120] if row else _seen(done)}"


# Items 6 to 10: bad input.

def config_a_fifo_and_dev_zero(tmp: Path) -> tuple[bool, str]:
    os.mkfifo(tmp / "config.json")
    model = str(_save(_linear_model(), tmp / "linear.onnx"))
    seen, held = [], True
    for config in (tmp / "config.json", Path("/dev/zero")):
        try:
            done = _tracker(tmp, "optimize", model, "--config", str(config), "--dry-run")
        except subprocess.TimeoutExpired:
            return False, f"--config {config}: hung"
        held &= _one_line_error(done, "must be a regular file")
        seen.append(_seen(done))
    return held, "; ".join(seen)


def a_models_static_zero(tmp: Path) -> tuple[bool, str]:
    x = helper.make_tensor_value_info("features", TensorProto.FLOAT, [0, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [0, 4])
    graph = helper.make_graph([helper.make_node("Relu", ["features"], ["y"])], "g", [x], [y])
    path = _save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp / "empty.onnx")
    done = _tracker(tmp, "optimize", str(path), *QUICK_OPTIMIZE)
    return _one_line_error(done, "input 'features' declares axis 0 of size 0"), _seen(done)


def a_chain_name_over_100(tmp: Path) -> tuple[bool, str]:
    chain = "ort_opt_disabled+io_binding+ort_threads_1+" * 3
    done = _tracker(tmp, "optimize", str(_save(_linear_model(), tmp / "linear.onnx")), "--attempts",
                    chain.rstrip("+"), *QUICK_OPTIMIZE)
    no_store = not (tmp / "mlflow.db").exists() or "baseline" not in subprocess.run(
        ["sqlite3", str(tmp / "mlflow.db"), "select name from runs"], capture_output=True, text=True).stdout
    return _one_line_error(done, "an attempt name is at most 100") and no_store, _seen(done)


def a_token_in_the_uri(tmp: Path) -> tuple[bool, str]:
    seen, held = [], True
    for uri in ("http://dapiTOKEN5150@127.0.0.1:9/", "http://127.0.0.1:9/?token=qtoken5150"):
        done = subprocess.run([sys.executable, "-m", "tracker", "profile", str(_save(_linear_model(),
                               tmp / "linear.onnx"))], cwd=tmp, capture_output=True, text=True, timeout=120,
                              env={**_env(tmp), "MLFLOW_TRACKING_URI": uri, "TRACKER_SERVER_TIMEOUT_S": "2"})
        held &= done.returncode == 2 and "5150" not in done.stdout + done.stderr
        seen.append(_seen(done))
    return held, "; ".join(seen)


def control_and_bidi_in_an_experiment_name(tmp: Path) -> tuple[bool, str]:
    done = _tracker(tmp, "profile", str(_save(_linear_model(), tmp / "linear.onnx")), "--runs", "2",
                    "--experiment", "exp\x1b[2J\u202eevil")
    printed = done.stdout + done.stderr
    raw = "\x1b" in printed or "\u202e" in printed
    return done.returncode == 0 and not raw, f"exit {done.returncode}; raw control or bidi printed: {raw}"


def a_negative_seed(tmp: Path) -> tuple[bool, str]:
    done = _tracker(tmp, "profile", str(_save(_linear_model(), tmp / "linear.onnx")), "--seed", "-1")
    return _one_line_error(done, "(CLI: --seed)"), _seen(done)


def a_removed_working_folder(tmp: Path) -> tuple[bool, str]:
    gone = tmp / "gone"
    gone.mkdir()
    tracker = Path(sys.executable).parent / "tracker"
    seen, held = [], True
    for command in (["compare", "--experiment", "e", "--study", "s"], ["upload", "."]):
        gone.mkdir(exist_ok=True)
        done = subprocess.run(["bash", "-c", 'cd "$1" && rmdir "$1" && shift && exec "$@"', "-", str(gone),
                               str(tracker), *command], capture_output=True, text=True, timeout=120, env=_env(tmp))
        held &= _one_line_error(done, "the working folder was removed")
        seen.append(f"{command[0]} {_seen(done)}")
    return held, "; ".join(seen)


CASES: list[tuple[str, str, Callable[[Path], tuple[bool, str]]]] = [
    ("r3.2", "an upload note naming a run of another", upload_note_naming_a_foreign_run),
    ("r3.3", "record.json a FIFO", record_json_a_fifo),
    ("r3.3", "record.json nested 200k deep", record_json_nested_200k_deep),
    ("r3.5", "compare with an ops_by_op.json of [1, 2]", compare_with_a_damaged_table),
    ("r3.6", "--config a FIFO and /dev/zero (--dry-run)", config_a_fifo_and_dev_zero),
    ("r3.7", "a model's own static 0", a_models_static_zero),
    ("r3.8", "a chain named past 100 characters", a_chain_name_over_100),
    ("r3.9", "a token as the URI's user and in its query", a_token_in_the_uri),
    ("r3.10", "control and bidi characters in an experiment name", control_and_bidi_in_an_experiment_name),
    ("r3.10", "--seed -1", a_negative_seed),
    ("r3.10", "a working folder removed under the process", a_removed_working_folder),
]
