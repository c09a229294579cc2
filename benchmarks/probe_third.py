"""Probe cases of issue 35 (the third outside probe): items 1 to 11 (r3.1 to r3.11).

Each case runs `python -m tracker ...` (the console script where the working folder is removed) from outside, in an
empty folder with its own sqlite store, and returns (held, one-line observation). Each takes a few seconds; the
ones that make a study first ~10-20 s. The cases of a full disk mount a small tmpfs (root on Linux); where none can
be mounted they do not hold, and say why.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import onnx
from onnx import TensorProto, helper
from probe_common import (
    QUICK_OPTIMIZE,
    Case,
    linear_model,
    one_line_error,
    run_tracker,
    save,
    seen,
    temp_root,
    tracker_env,
)


def _study(tmp: Path) -> tuple[str, dict[str, str]]:
    """A small study of two attempts in the folder's store: its store URI, each attempt's run id and the study's
    (under "study")."""
    done = run_tracker(tmp, "optimize", str(save(linear_model(), tmp / "linear.onnx")), "--attempts",
                       "ort_opt_disabled", *QUICK_OPTIMIZE)
    if done.returncode != 0:
        raise RuntimeError(f"the study failed: {seen(done)}")
    import mlflow

    uri = f"sqlite:///{tmp / 'mlflow.db'}"
    client = mlflow.MlflowClient(uri)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    ids = {r.data.tags.get("tracker.attempt", ""): r.info.run_id for r in runs}
    ids["study"] = next(r.info.run_id for r in runs if r.data.tags.get("tracker.role") == "study")
    return uri, ids


# Item 1: the project owns its runs' lifecycle.

def _runs(uri: str) -> list:
    import mlflow

    client = mlflow.MlflowClient(uri)
    return client.search_runs([e.experiment_id for e in client.search_experiments()])


def a_store_refusing_one_runs_ending(tmp: Path) -> tuple[bool, str]:
    import mlflow

    uri = f"sqlite:///{tmp / 'mlflow.db'}"
    run_tracker(tmp, "compare", "--experiment", "x", "--study", "y")  # creates the store's tables
    (tmp / "artifacts").write_text("a file: no artifact can be written")
    mlflow.MlflowClient(uri).create_experiment("onnx-optimization", artifact_location=str(tmp / "artifacts"))
    _sql(tmp, "CREATE TRIGGER refuse BEFORE UPDATE OF status ON runs WHEN NEW.name = 'ort_opt_disabled' "
              "AND NEW.status != 'RUNNING' BEGIN SELECT RAISE(ABORT, 'refused'); END")
    done = run_tracker(tmp, "optimize", str(save(linear_model(), tmp / "linear.onnx")), "--attempts",
                       "ort_opt_disabled,ort_threads_1", *QUICK_OPTIMIZE)
    runs = _runs(uri)
    study = [r for r in runs if r.data.tags.get("tracker.role") == "study"]
    stray = [r.info.run_name for r in runs if "tracker.role" not in r.data.tags]
    held = (len(study) == 1 and study[0].info.status == "FINISHED" and "tracker.best_attempt" in study[0].data.tags
            and not stray and "Traceback" not in done.stderr)
    return held, (f"exit {done.returncode}; study run {study[0].info.status if study else 'missing'}, best tag "
                  f"{study[0].data.tags.get('tracker.best_attempt') if study else None}; stray runs {stray}")


def _sql(tmp: Path, statement: str) -> None:
    import sqlite3

    with sqlite3.connect(tmp / "mlflow.db") as connection:
        connection.execute(statement)


def _tmpfs(folder: Path, size: str, *, leave_kb: int | None = None, read_only: bool = False) -> str | None:
    """Mounts a tmpfs of `size` on `folder`, filled to leave `leave_kb`; None, else why it could not."""
    folder.mkdir(exist_ok=True)
    options = f"size={size}" + (",ro" if read_only else "")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)], capture_output=True,
                             text=True)
    if mounted.returncode != 0:
        return f"no tmpfs: {mounted.stderr.strip()[:100]}"
    if leave_kb is not None:
        subprocess.run(["dd", "if=/dev/zero", f"of={folder / 'fill'}", "bs=1k"], capture_output=True)
        subprocess.run(["truncate", "-s", f"-{leave_kb}k", str(folder / "fill")], check=True)
    return None


def _umount(folder: Path) -> None:
    subprocess.run(["umount", "-l", str(folder)], capture_output=True)


def a_full_working_folder(tmp: Path) -> tuple[bool, str]:
    work = tmp / "small"
    why = _tmpfs(work, "3m", leave_kb=64)
    if why:
        return False, why
    try:
        run_tracker(tmp, "compare", "--experiment", "x", "--study", "y")  # creates the store's tables
        _sql(tmp, "CREATE TRIGGER refuse BEFORE INSERT ON runs WHEN NEW.name != 'linear' "
                  "BEGIN SELECT RAISE(ABORT, 'refused'); END")
        _sql(tmp, "CREATE TRIGGER no_summary BEFORE INSERT ON tags WHEN NEW.key = 'tracker.best_attempt' "
                  "BEGIN SELECT RAISE(ABORT, 'refused'); END")
        env = tracker_env(tmp)  # its TMPDIR: where the emergency outbox goes
        env.pop("TRACKER_OUTBOX")  # ./tracker-outbox, on the full folder
        done = subprocess.run([sys.executable, "-m", "tracker", "optimize", str(save(linear_model(),
                               tmp / "linear.onnx")), "--attempts", "ort_opt_disabled", *QUICK_OPTIMIZE],
                              cwd=work, env=env, capture_output=True, text=True, timeout=300)
    finally:
        _umount(work)
    kept = sorted(p.parent.parent.name for p in temp_root(tmp).glob("tracker-outbox-*/*/*/record.json"))
    summaries = list(temp_root(tmp).glob("tracker-outbox-*/*/study_summary.json"))
    held = ("Traceback" not in done.stderr and "2 attempts" in done.stdout and len(set(kept)) == 1
            and len(kept) == 2 and len(summaries) == 1)
    return held, (f"exit {done.returncode}; {len(kept)} records in {len(set(kept))} emergency folder(s), "
                  f"{len(summaries)} summary kept; compared: {'2 attempts' in done.stdout}")


# Item 2: upload touches only its own runs.

def upload_note_naming_a_foreign_run(tmp: Path) -> tuple[bool, str]:
    import mlflow

    from tracker.run.record import AttemptRecord, save_record

    uri = f"sqlite:///{tmp / 'mlflow.db'}"
    run_tracker(tmp, "compare", "--experiment", "x", "--study", "y")  # creates the store's tables
    foreign = mlflow.MlflowClient(uri).create_run("0", run_name="the users own").info.run_id
    folder = save_record(AttemptRecord("kept", None, "onnxruntime", metrics={"latency.p50_ms": 1.0}), tmp / "outbox")
    (folder / ".upload.json").write_text(json.dumps({"run_id": foreign, "done": False}))
    done = run_tracker(tmp, "upload", str(tmp / "outbox"))
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
        done = run_tracker(tmp, "upload", str(tmp / "outbox"))
    except subprocess.TimeoutExpired:
        return False, "upload hung on the FIFO"
    return (one_line_error(done, "must be a regular file") and "uploaded 1 attempt run" in done.stdout,
            seen(done))


def record_json_nested_200k_deep(tmp: Path) -> tuple[bool, str]:
    from tracker.run.record import AttemptRecord, save_record

    bad = save_record(AttemptRecord("bad", None, "onnxruntime", metrics={"latency.p50_ms": 1.0}), tmp / "outbox")
    save_record(AttemptRecord("good", None, "onnxruntime", metrics={"latency.p50_ms": 1.0}), tmp / "outbox")
    (bad / "record.json").write_text("[" * 200_000 + "]" * 200_000)
    done = run_tracker(tmp, "upload", str(tmp / "outbox"))
    return (one_line_error(done, "nested too deeply") and "uploaded 1 attempt run" in done.stdout, seen(done))


# Item 5: compare reads defensively.

def compare_with_a_damaged_table(tmp: Path) -> tuple[bool, str]:
    uri, runs = _study(tmp)
    import mlflow

    artifacts = mlflow.MlflowClient(uri).get_run(runs["ort_opt_disabled"]).info.artifact_uri.removeprefix("file://")
    (Path(artifacts) / "tables" / "ops_by_op.json").write_text("[1, 2]")
    done = run_tracker(tmp, "compare", runs["study"])
    row = next((line for line in done.stdout.splitlines() if "ort_opt_disabled" in line), "")
    held = done.returncode == 0 and "Traceback" not in done.stderr and "unreadable: tables/ops_by_op.json" in row
    return held, f"exit {done.returncode}: {row.split('unreadable')[-1][:120] if row else seen(done)}"


# Item 4: what a SIGKILL leaves.

def a_study_killed_during_its_second_attempt(tmp: Path) -> tuple[bool, str]:
    import signal
    import time

    model = str(save(linear_model(), tmp / "linear.onnx"))
    study = subprocess.Popen([sys.executable, "-m", "tracker", "optimize", model, "--attempts",
                              "ort_opt_disabled,ort_threads_1", "--name", "killed", *QUICK_OPTIMIZE], cwd=tmp,
                             env=tracker_env(tmp), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    for line in study.stderr:
        if "optimizing ort_opt_disabled" in line:
            time.sleep(1)
            break
    study.send_signal(signal.SIGKILL)
    study.wait()
    left = [p.name for p in temp_root(tmp).glob("tracker-killed-*")]
    compared = run_tracker(tmp, "compare", "--experiment", "onnx-optimization", "--study", "killed")
    run_tracker(tmp, "optimize", model, "--attempts", "ort_opt_disabled", "--name", "next", *QUICK_OPTIMIZE)
    after = [p.name for p in temp_root(tmp).glob("tracker-killed-*")]
    killed = [r for r in _runs(f"sqlite:///{tmp / 'mlflow.db'}") if r.info.run_name == "killed"]
    held = (bool(left) and not after and "[did not finish]" in compared.stdout and len(killed) == 1
            and killed[0].info.status == "KILLED" and "tracker.killed" in killed[0].data.tags)
    head = (compared.stdout.splitlines() or [""])[0][:120]
    return held, (f"work folder left {len(left)}, after the next study {len(after)}; study run "
                  f"{killed[0].info.status if killed else 'missing'}; compare: {head}")


# Items 6 to 10: bad input.

def config_a_fifo_and_dev_zero(tmp: Path) -> tuple[bool, str]:
    os.mkfifo(tmp / "config.json")
    model = str(save(linear_model(), tmp / "linear.onnx"))
    said, held = [], True
    for config in (tmp / "config.json", Path("/dev/zero")):
        try:
            done = run_tracker(tmp, "optimize", model, "--config", str(config), "--dry-run")
        except subprocess.TimeoutExpired:
            return False, f"--config {config}: hung"
        held &= one_line_error(done, "must be a regular file")
        said.append(seen(done))
    return held, "; ".join(said)


def a_models_static_zero(tmp: Path) -> tuple[bool, str]:
    x = helper.make_tensor_value_info("features", TensorProto.FLOAT, [0, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [0, 4])
    graph = helper.make_graph([helper.make_node("Relu", ["features"], ["y"])], "g", [x], [y])
    path = save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp / "empty.onnx")
    done = run_tracker(tmp, "optimize", str(path), *QUICK_OPTIMIZE)
    return one_line_error(done, "input 'features' declares axis 0 of size 0"), seen(done)


def a_chain_name_over_100(tmp: Path) -> tuple[bool, str]:
    chain = "ort_opt_disabled+io_binding+ort_threads_1+" * 3
    done = run_tracker(tmp, "optimize", str(save(linear_model(), tmp / "linear.onnx")), "--attempts",
                       chain.rstrip("+"), *QUICK_OPTIMIZE)
    no_store = not (tmp / "mlflow.db").exists() or "baseline" not in subprocess.run(
        ["sqlite3", str(tmp / "mlflow.db"), "select name from runs"], capture_output=True, text=True).stdout
    return one_line_error(done, "an attempt name is at most 100") and no_store, seen(done)


def a_token_in_the_uri(tmp: Path) -> tuple[bool, str]:
    said, held = [], True
    for uri in ("http://dapiTOKEN5150@127.0.0.1:9/", "http://127.0.0.1:9/?token=qtoken5150"):
        done = subprocess.run([sys.executable, "-m", "tracker", "profile", str(save(linear_model(),
                               tmp / "linear.onnx"))], cwd=tmp, capture_output=True, text=True, timeout=120,
                              env={**tracker_env(tmp), "MLFLOW_TRACKING_URI": uri, "TRACKER_SERVER_TIMEOUT_S": "2"})
        held &= done.returncode == 2 and "5150" not in done.stdout + done.stderr
        said.append(seen(done))
    return held, "; ".join(said)


def control_and_bidi_in_an_experiment_name(tmp: Path) -> tuple[bool, str]:
    done = run_tracker(tmp, "profile", str(save(linear_model(), tmp / "linear.onnx")), "--profile-runs", "2",
                       "--experiment", "exp\x1b[2J\u202eevil")
    printed = done.stdout + done.stderr
    raw = "\x1b" in printed or "\u202e" in printed
    return done.returncode == 0 and not raw, f"exit {done.returncode}; raw control or bidi printed: {raw}"


def a_negative_seed(tmp: Path) -> tuple[bool, str]:
    done = run_tracker(tmp, "profile", str(save(linear_model(), tmp / "linear.onnx")), "--seed", "-1")
    return one_line_error(done, "(CLI: --seed)"), seen(done)


def a_removed_working_folder(tmp: Path) -> tuple[bool, str]:
    gone = tmp / "gone"
    gone.mkdir()
    tracker = Path(sys.executable).parent / "tracker"
    said, held = [], True
    for command in (["compare", "--experiment", "e", "--study", "s"], ["upload", "."]):
        gone.mkdir(exist_ok=True)
        done = subprocess.run(["bash", "-c", 'cd "$1" && rmdir "$1" && shift && exec "$@"', "-", str(gone),
                               str(tracker), *command], capture_output=True, text=True, timeout=120,
                              env=tracker_env(tmp))
        held &= one_line_error(done, "the working folder was removed")
        said.append(f"{command[0]} {seen(done)}")
    return held, "; ".join(said)


def a_full_tmpdir(tmp: Path) -> tuple[bool, str]:
    full = tmp / "full"
    why = _tmpfs(full, "1m", leave_kb=64)
    if why:
        return False, why
    try:
        done = subprocess.run([sys.executable, "-m", "tracker", "profile", str(save(linear_model(),
                               tmp / "linear.onnx")), "--profile-runs", "3"], cwd=tmp,
                              env={**tracker_env(tmp), "TMPDIR": str(full)},
                              capture_output=True, text=True, timeout=300)
    finally:
        _umount(full)
    return one_line_error(done, f"space left: {full} (the temporary folder, $TMPDIR) 0.0 MB"), seen(done)


def a_read_only_working_folder(tmp: Path) -> tuple[bool, str]:
    work = tmp / "read-only"
    why = _tmpfs(work, "1m", read_only=True)
    if why:
        return False, why
    try:
        env = tracker_env(tmp)
        env.pop("TRACKER_OUTBOX")
        done = subprocess.run([sys.executable, "-m", "tracker", "profile", str(save(linear_model(),
                               tmp / "linear.onnx"))], cwd=work, env=env, capture_output=True, text=True, timeout=300)
    finally:
        _umount(work)
    return (one_line_error(done, "cannot be written", "set $TRACKER_OUTBOX to one") and "unset" not in done.stderr,
            seen(done))


# Item 11: a model at the newest opset.

def a_model_at_the_newest_opset(tmp: Path) -> tuple[bool, str]:
    model = linear_model()
    model.opset_import[0].version = onnx.defs.onnx_opset_version()
    path = str(save(model, tmp / "newest.onnx"))
    planned = run_tracker(tmp, "optimize", path, "--dry-run")
    done = run_tracker(tmp, "optimize", path, "--attempts", "int8_static_minmax,int8_static_percentile",
                       *QUICK_OPTIMIZE)
    rows = [line for line in done.stdout.splitlines() if line.strip().startswith("int8_static")]
    note = next((line for line in planned.stdout.splitlines() if line.startswith("opset:")), "no opset line")
    ok = [line for line in rows if line.rstrip().endswith("ok")]
    held = done.returncode == 0 and len(rows) == len(ok) == 2
    return held, f"exit {done.returncode}; {len(ok)} of {len(rows)} static int8 rows ok; --dry-run: {note[:110]}"


CASES: list[Case] = [
    ("r3.1", "the store refuses one attempt run's ending, artifacts unwritable", a_store_refusing_one_runs_ending),
    ("r3.1", "a full 3 MB working folder on that path", a_full_working_folder),
    ("r3.2", "an upload note naming a run of another", upload_note_naming_a_foreign_run),
    ("r3.3", "record.json a FIFO", record_json_a_fifo),
    ("r3.3", "record.json nested 200k deep", record_json_nested_200k_deep),
    ("r3.4", "a study killed (SIGKILL) during its second attempt", a_study_killed_during_its_second_attempt),
    ("r3.5", "compare with an ops_by_op.json of [1, 2]", compare_with_a_damaged_table),
    ("r3.6", "--config a FIFO and /dev/zero (--dry-run)", config_a_fifo_and_dev_zero),
    ("r3.7", "a model's own static 0", a_models_static_zero),
    ("r3.8", "a chain named past 100 characters", a_chain_name_over_100),
    ("r3.9", "a token as the URI's user and in its query", a_token_in_the_uri),
    ("r3.10", "control and bidi characters in an experiment name", control_and_bidi_in_an_experiment_name),
    ("r3.10", "--seed -1", a_negative_seed),
    ("r3.10", "a working folder removed under the process", a_removed_working_folder),
    ("r3.10", "a full TMPDIR", a_full_tmpdir),
    ("r3.10", "a read-only working folder, $TRACKER_OUTBOX unset", a_read_only_working_folder),
    ("r3.11", "a model at onnx's newest opset, static int8", a_model_at_the_newest_opset),
]
