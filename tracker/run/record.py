"""What one attempt run carries, as plain data and files: logged live, or kept locally (the outbox) and uploaded later.

Reading a kept record or summary back, everything checked before anything is uploaded, is `tracker.run.loading`'s.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import msgspec

from tracker.base.errors import TrackerError
from tracker.base.vocabulary import RunStatus
from tracker.measure.inputs.feeds_description import FeedsDescription

logger = logging.getLogger(__name__)

OUTBOX_ENV = "TRACKER_OUTBOX"
RECORD_FILE = "record.json"
SUMMARY_FILE = "study_summary.json"
_SAFE = re.compile(r"[^A-Za-z0-9_.-]")


class AttemptRecord(msgspec.Struct, forbid_unknown_fields=True):
    """Everything the run of one attempt holds.

    Attributes:
        attempt, study, runtime: names (`study` is None for a lone attempt).
        status: `RunStatus.FINISHED`, or `FAILED` when the attempt crashed (then `error` and `traceback` are set).
        params, metrics, tags: what goes on the run.
        artifact_dir: a folder logged as the run's artifact root (tables/, charts/, traces/...).
        files: file path -> artifact folder it goes to (the raw profile, ORT's optimized graph).
        tables: names of `artifact_dir/tables/<name>.csv` also logged with `mlflow.log_table`.
        model_path: the model file, logged with the onnx flavor if `model_flavor`, else as an artifact.
        feeds: the inputs it ran on (names, dtypes, shapes, digest), logged as the run's dataset input.
        run_id, parent_run_id, experiment_id: where it was (or was meant to be) logged.
        start_time_ms: when its run started, or would have (epoch ms): an uploaded run starts then, so a
            study's attempts keep their order.

    A Struct that forbids unknown fields: `load_record` refuses a `record.json` with a key it does not know or
    a value of the wrong type, naming the field.
    """

    attempt: str
    study: str | None
    runtime: str
    status: RunStatus = RunStatus.FINISHED
    params: dict[str, str] = msgspec.field(default_factory=dict)
    metrics: dict[str, float] = msgspec.field(default_factory=dict)
    tags: dict[str, str] = msgspec.field(default_factory=dict)
    artifact_dir: str | None = None
    files: dict[str, str] = msgspec.field(default_factory=dict)
    tables: list[str] = msgspec.field(default_factory=list)
    model_path: str | None = None
    model_flavor: bool = True
    feeds: FeedsDescription | None = None
    error: str | None = None
    traceback: str | None = None
    run_id: str | None = None
    parent_run_id: str | None = None
    experiment_id: str | None = None
    start_time_ms: int | None = None


def outbox_root() -> Path:
    """Where records that could not be logged are kept: `$TRACKER_OUTBOX`, else ./tracker-outbox."""
    return Path(os.environ.get(OUTBOX_ENV) or Path.cwd() / "tracker-outbox").resolve()


_EMERGENCY: list[Path] = []  # this process's one folder for what the outbox could not take (`keep`)


def keep(save: Callable[[Path], Path], what: str) -> Path:
    """`save(outbox_root())`: where the outbox cannot take it (a full disk, a folder that went), `save` in this
    process's one emergency folder under the temporary folder (every record and summary of the process in the same
    one), with an error line naming the folder that failed. Returns what `save` returned.

    Raises:
        TrackerError: neither folder could take it; the message names both and why.
    """
    root = outbox_root()
    try:
        return save(root)
    except OSError as e:
        first = f"{type(e).__name__}: {e}"
    try:
        if not _EMERGENCY or not _EMERGENCY[0].is_dir():
            _EMERGENCY[:] = [Path(tempfile.mkdtemp(prefix="tracker-outbox-"))]
        kept = save(_EMERGENCY[0])
    except OSError as e:
        where = _EMERGENCY[0] if _EMERGENCY else Path(tempfile.gettempdir())
        raise TrackerError(f"could not keep {what} in the outbox {root} ({first}), nor in {where} "
                           f"({type(e).__name__}: {e}): free space there, or set ${OUTBOX_ENV} to a folder that "
                           "has some") from e
    logger.error("could not keep %s in the outbox %s (%s); it is kept in %s instead", what, root, first,
                 _EMERGENCY[0])
    return kept


def check_outbox(root: Path | None = None) -> Path:
    """The outbox folder (default `outbox_root()`), checked before any work: it is a folder, or can be made.

    Raises:
        TrackerError: it names a file, or lies under one, or in a folder that cannot be written.
    """
    root = root or outbox_root()
    existing = next(p for p in (root, *root.parents) if p.exists())
    # Only a variable that is set can be fixed or unset; otherwise the outbox is the working folder's.
    fix = (f"fix ${OUTBOX_ENV}, or unset it to use ./tracker-outbox" if os.environ.get(OUTBOX_ENV)
           else f"run from a folder you can write to, or set ${OUTBOX_ENV} to one")
    if not existing.is_dir():
        where = "" if existing == root else f" ({existing} is a file)"
        raise TrackerError(f"the outbox {root} is not a folder{where}; expected a folder, made if missing, to keep "
                           f"records the tracking store does not take: {fix}")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise TrackerError(f"the outbox {root} cannot be written ({existing} is not writable); {fix}")
    return root


def save_record(record: AttemptRecord, root: Path | None = None) -> Path:
    """Copies a record and its files into a new folder of the outbox; returns that folder.

    `record.json` is written last and whole (renamed into place), so an upload running meanwhile sees either
    no record in the folder, or all of it.
    """
    root = root or outbox_root()
    parent = _SAFE.sub("_", f"{record.study or 'attempts'}-{record.parent_run_id or 'no-parent'}")
    folder = root / parent / _SAFE.sub("_", record.attempt)
    suffix = 1
    while folder.exists():
        suffix += 1
        folder = root / parent / _SAFE.sub("_", f"{record.attempt}-{suffix}")
    folder.mkdir(parents=True)
    # As MLflow will store them, so that the saved record has the types `load_record` checks.
    saved = msgspec.structs.replace(record, params={str(k): str(v) for k, v in record.params.items()},
                                    tags={str(k): str(v) for k, v in record.tags.items()},
                                    metrics={str(k): float(v) for k, v in record.metrics.items()})
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
    partial = folder / f".{RECORD_FILE}.partial"
    # json, not msgspec.json: a NaN metric is written as NaN, as json.loads reads it back.
    partial.write_text(json.dumps(msgspec.to_builtins(saved), indent=1, sort_keys=True))
    partial.rename(folder / RECORD_FILE)
    return folder


def save_summary(summary: dict, *, study: str, parent_run_id: str, root: Path | None = None) -> Path:
    """Keeps a study's summary (metrics, best attempt) that could not be logged on its run."""
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


def external_locations(model: Path) -> set[str]:
    """The files a model's initializers keep their data in, relative to the model's folder."""
    from tracker.base.model_io import load_model

    proto = load_model(model, load_external_data=False, check=False)  # by content: a protobuf named .json too
    return {e.value for t in proto.graph.initializer for e in t.external_data if e.key == "location"}


def _copy_external_data(model: Path, target_dir: Path) -> None:
    for location in external_locations(model):
        (target_dir / location).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(model.parent / location, target_dir / location)
