"""What one attempt run carries, as plain data and files: logged live, or kept locally and uploaded later."""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path

OUTBOX_ENV = "TRACKER_OUTBOX"
RECORD_FILE = "record.json"
SUMMARY_FILE = "study_summary.json"
_SAFE = re.compile(r"[^A-Za-z0-9_.-]")


@dataclass
class AttemptRecord:
    """Everything the run of one attempt holds.

    Attributes:
        attempt, study, runtime: names (`study` is None for a lone attempt).
        status: "FINISHED", or "FAILED" when the attempt crashed (then `error` and `traceback` are set).
        params, metrics, tags: what goes on the run.
        artifact_dir: a folder logged as the run's artifact root (tables/, charts/, traces/...).
        files: file path -> artifact folder it goes to (the raw profile, ORT's optimized graph).
        tables: names of `artifact_dir/tables/<name>.csv` also logged with `mlflow.log_table`.
        model_path: the model file, logged with the onnx flavor if `model_flavor`, else as an artifact.
        run_id, parent_run_id, experiment_id: where it was (or was meant to be) logged.
    """

    attempt: str
    study: str | None
    runtime: str
    status: str = "FINISHED"
    params: dict[str, str] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    artifact_dir: str | None = None
    files: dict[str, str] = field(default_factory=dict)
    tables: list[str] = field(default_factory=list)
    model_path: str | None = None
    model_flavor: bool = True
    error: str | None = None
    traceback: str | None = None
    run_id: str | None = None
    parent_run_id: str | None = None
    experiment_id: str | None = None


def outbox_root() -> Path:
    """Where records that could not be logged are kept: `$TRACKER_OUTBOX`, else ./tracker-outbox."""
    return Path(os.environ.get(OUTBOX_ENV) or Path.cwd() / "tracker-outbox").resolve()


def save_record(record: AttemptRecord, root: Path | None = None) -> Path:
    """Copies a record and its files into a new folder of the outbox; returns that folder."""
    root = root or outbox_root()
    parent = _SAFE.sub("_", f"{record.study or 'attempts'}-{record.parent_run_id or 'no-parent'}")
    folder = root / parent / _SAFE.sub("_", record.attempt)
    suffix = 1
    while folder.exists():
        suffix += 1
        folder = root / parent / _SAFE.sub("_", f"{record.attempt}-{suffix}")
    folder.mkdir(parents=True)
    saved = AttemptRecord(**asdict(record))
    if record.artifact_dir and Path(record.artifact_dir).is_dir():
        shutil.copytree(record.artifact_dir, folder / "artifacts")
        saved.artifact_dir = "artifacts"
    saved.files = {}
    for index, (path, artifact_folder) in enumerate(record.files.items()):
        target = folder / "files" / str(index) / Path(path).name  # names kept: they are artifact names
        target.parent.mkdir(parents=True)
        shutil.copyfile(path, target)
        saved.files[str(target.relative_to(folder))] = artifact_folder
    if record.model_path:
        target = folder / "model" / Path(record.model_path).name
        target.parent.mkdir()
        shutil.copyfile(record.model_path, target)
        _copy_external_data(Path(record.model_path), target.parent)
        saved.model_path = str(target.relative_to(folder))
    (folder / RECORD_FILE).write_text(json.dumps(asdict(saved), indent=1, sort_keys=True))
    return folder


def load_record(folder: str | Path) -> AttemptRecord:
    """Reads a record saved by `save_record`, with its paths made absolute again."""
    folder = Path(folder)
    data = json.loads((folder / RECORD_FILE).read_text())
    record = AttemptRecord(**data)
    if record.artifact_dir:
        record.artifact_dir = str(folder / record.artifact_dir)
    record.files = {str(folder / p): a for p, a in record.files.items()}
    if record.model_path:
        record.model_path = str(folder / record.model_path)
    return record


def save_summary(summary: dict, *, study: str, parent_run_id: str, root: Path | None = None) -> Path:
    """Keeps a study's summary (rows, metrics, best attempt) that could not be logged on its run."""
    folder = (root or outbox_root()) / _SAFE.sub("_", f"{study}-{parent_run_id}")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / SUMMARY_FILE
    path.write_text(json.dumps({"study": study, "parent_run_id": parent_run_id, **summary}, indent=1, default=str))
    return path


def find_summaries(root: str | Path) -> list[Path]:
    """Study summaries kept under `root`."""
    return sorted(Path(root).rglob(SUMMARY_FILE))


def find_records(root: str | Path) -> list[Path]:
    """Folders under `root` holding a saved record, in a stable order."""
    return sorted(p.parent for p in Path(root).rglob(RECORD_FILE))


def _copy_external_data(model: Path, target_dir: Path) -> None:
    import onnx

    proto = onnx.load(str(model), load_external_data=False)
    locations = {e.value for t in proto.graph.initializer for e in t.external_data if e.key == "location"}
    for location in locations:
        shutil.copyfile(model.parent / location, target_dir / location)
