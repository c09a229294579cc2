"""What one attempt run carries, as plain data and files: logged live, or kept locally and uploaded later."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import TypeVar

import msgspec

from tracker.base.errors import ModelError, RecordError, TrackerError
from tracker.base.files import read_small_file
from tracker.base.vocabulary import RunStatus
from tracker.measure.inputs.feeds_description import FeedsDescription, FeedSpec

logger = logging.getLogger(__name__)

OUTBOX_ENV = "TRACKER_OUTBOX"
RECORD_FILE = "record.json"
SUMMARY_FILE = "study_summary.json"
_SAFE = re.compile(r"[^A-Za-z0-9_.-]")
_S = TypeVar("_S", bound=msgspec.Struct)


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


def load_record(folder: str | Path) -> AttemptRecord:
    """Reads a record saved by `save_record`, with its paths made absolute again.

    Everything is checked before anything is uploaded: the keys and their types, and every file the
    record names must be a regular file inside `folder`, reached through no symbolic link.

    Raises:
        RecordError: the record is unreadable or malformed, or names a file it must not (the message
            names the record and the path).
    """
    folder = Path(folder)
    path = folder / RECORD_FILE
    data = _read_json(path, "record")
    record = _convert(data, AttemptRecord, f"record {path}")
    assert isinstance(data, dict)  # msgspec made a record of it: a JSON object
    if record.feeds is not None:  # dataclasses: msgspec checks their types, but would ignore a key it does not know
        _refuse_unknown(data["feeds"], FeedsDescription, "$.feeds", f"record {path}")
        for index, spec in enumerate(data["feeds"]["inputs"]):
            _refuse_unknown(spec, FeedSpec, f"$.feeds.inputs[{index}]", f"record {path}")
    try:
        _check_files(record, folder)
    except _Refused as e:
        raise RecordError(f"record {path}: {e}") from None
    if record.artifact_dir:
        record.artifact_dir = str(folder / record.artifact_dir)
    record.files = {str(folder / p): a for p, a in record.files.items()}
    if record.model_path:
        record.model_path = str(folder / record.model_path)
    return record


def save_summary(summary: dict, *, study: str, parent_run_id: str, root: Path | None = None) -> Path:
    """Keeps a study's summary (metrics, best attempt) that could not be logged on its run."""
    folder = (root or outbox_root()) / _SAFE.sub("_", f"{study}-{parent_run_id}")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / SUMMARY_FILE
    path.write_text(json.dumps({"study": study, "parent_run_id": parent_run_id, **summary}, indent=1, default=str))
    return path


def load_summary(path: str | Path) -> dict:
    """Reads a summary saved by `save_summary`: its `study`, `parent_run_id` and `metrics` are checked.

    Raises:
        RecordError: the file is unreadable or malformed.
    """
    path = Path(path)
    data = _read_json(path, "study summary")
    _convert(data, _SavedSummary, f"study summary {path}")
    assert isinstance(data, dict)  # msgspec made a summary of it: a JSON object
    return data


class _SavedSummary(msgspec.Struct):
    """What upload reads of a saved summary; its other keys (the best attempt, the counts) are rebuilt from the
    runs, so they are not checked."""

    study: str
    parent_run_id: str
    metrics: dict[str, float]


def find_summaries(root: str | Path) -> list[Path]:
    """Study summaries kept under `root`."""
    return sorted(Path(root).rglob(SUMMARY_FILE))


def find_records(root: str | Path) -> list[Path]:
    """Folders under `root` holding a saved record, in a stable order."""
    return sorted(p.parent for p in Path(root).rglob(RECORD_FILE))


def _external_locations(model: Path) -> set[str]:
    """The files a model's initializers keep their data in, relative to the model's folder."""
    from tracker.base.model_io import load_model

    proto = load_model(model, load_external_data=False, check=False)  # by content: a protobuf named .json too
    return {e.value for t in proto.graph.initializer for e in t.external_data if e.key == "location"}


def _copy_external_data(model: Path, target_dir: Path) -> None:
    for location in _external_locations(model):
        (target_dir / location).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(model.parent / location, target_dir / location)


_ONLY = "upload reads only regular files inside the record's folder, never through a symbolic link"
# A record holds names, metrics, params and a traceback: far less than this.
MAX_RECORD_BYTES = 64 * 2**20


class _Refused(Exception):
    """A path of a record that upload must not read (the reason is the message)."""


def _read_json(path: Path, what: str) -> object:
    for link in (path.parent, path):
        if link.is_symlink():
            raise RecordError(f"{what} {path}: {link} is a symbolic link (to {os.readlink(link)}); {_ONLY}")
    try:
        # a regular file only (a FIFO would block the upload, holding its lock), of a bounded size
        return json.loads(read_small_file(path, max_bytes=MAX_RECORD_BYTES, what=f"a {what}").decode("utf-8"))
    except json.JSONDecodeError as e:
        raise RecordError(f"{what} {path}: not valid JSON ({e})") from None
    except (OSError, ValueError) as e:  # unreadable, not UTF-8, not a regular file, too large
        raise RecordError(f"{what} {path}: cannot be read ({e})") from None
    except RecursionError:  # json recurses once per level of nesting
        raise RecordError(f"{what} {path}: nested too deeply for Python's JSON reader (a {what} is a few levels "
                          "deep)") from None


def _convert(data: object, cls: type[_S], what: str) -> _S:
    """`data` (read from JSON) as a `cls`, or a `RecordError` saying `what`, the field (msgspec's path, e.g.
    `$.metrics[...]`) and what it expected."""
    try:
        return msgspec.convert(data, cls)
    except msgspec.ValidationError as e:
        known = ""
        if str(e).startswith("Object contains unknown field") and " - at " not in str(e):  # at the top level
            known = f" - at `$` (known fields: {_names(cls.__struct_fields__)})"
        raise RecordError(f"{what}: {e}{known}") from None


def _refuse_unknown(data: dict, cls: type, at: str, what: str) -> None:
    """As msgspec says it of a Struct that forbids unknown fields, for the dataclass `cls`."""
    known = [f.name for f in fields(cls)]
    unknown = [k for k in data if k not in known]
    if unknown:
        raise RecordError(f"{what}: Object contains unknown field `{unknown[0]}` - at `{at}` "
                          f"(known fields: {_names(known)})")


def _names(keys) -> str:
    return ", ".join(repr(k) for k in keys)


def _check_files(record: AttemptRecord, folder: Path) -> None:
    """Raises `_Refused` unless every file the record names is a regular file inside `folder`."""
    if record.artifact_dir:
        artifacts = _own_path(folder, record.artifact_dir, "'artifact_dir'", is_dir=True)
        _check_tree(folder, artifacts, "'artifact_dir'")
        for name in record.tables:
            _artifact_name(name, "a table name in 'tables'")
            _own_path(folder, str(Path(record.artifact_dir) / "tables" / f"{name}.csv"), "'tables'")
    elif record.tables:
        raise _Refused("'tables' names tables but there is no 'artifact_dir'")
    for path, artifact_folder in record.files.items():
        _own_path(folder, path, "'files'")
        _artifact_name(artifact_folder, f"the artifact folder of {path!r} in 'files'")
    if record.model_path:
        model = _own_path(folder, record.model_path, "'model_path'")
        for location in _external_data(model):
            _own_path(folder, str(Path(record.model_path).parent / location),
                      f"the external data of {record.model_path!r}")


def _own_path(folder: Path, relative: str, what: str, *, is_dir: bool = False) -> Path:
    """`folder/relative` if it is a regular file (a folder if `is_dir`) inside `folder`, with no link on the way."""
    if Path(relative).is_absolute():
        raise _Refused(f"{what} names {relative!r}, an absolute path; {_ONLY}")
    if ".." in Path(relative).parts:
        raise _Refused(f"{what} names {relative!r}, which leaves the record's folder; {_ONLY}")
    path = folder
    for part in Path(relative).parts:
        path = path / part
        if path.is_symlink():
            raise _Refused(f"{what} names {relative!r}, and {path.relative_to(folder)} is a symbolic link "
                           f"(to {os.readlink(path)}); {_ONLY}")
    try:
        mode = path.lstat().st_mode
    except OSError:
        raise _Refused(f"{what} names {relative!r}, which does not exist") from None
    if not (stat.S_ISDIR(mode) if is_dir else stat.S_ISREG(mode)):
        raise _Refused(f"{what} names {relative!r}, which is not a {'folder' if is_dir else 'regular file'}; {_ONLY}")
    return path


def _check_tree(folder: Path, root: Path, what: str) -> None:
    """Every entry under `root` must be a regular file or a folder: no link, no device, no pipe."""
    for parent, dirs, files in os.walk(root):  # does not follow links to folders
        for name in dirs + files:
            path = Path(parent) / name
            mode = path.lstat().st_mode
            if stat.S_ISLNK(mode):
                raise _Refused(f"{what} holds {path.relative_to(folder)}, a symbolic link (to {os.readlink(path)}); "
                               f"{_ONLY}")
            if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
                raise _Refused(f"{what} holds {path.relative_to(folder)}, which is not a regular file; {_ONLY}")


def _artifact_name(name: str, what: str) -> None:
    """An artifact folder or table name is a relative path that stays inside the run's artifacts."""
    if not name or Path(name).is_absolute() or ".." in Path(name).parts:
        raise _Refused(f"{what} is {name!r}; expected a relative artifact path without '..'")


def _external_data(model: Path) -> set[str]:
    """The files a model's initializers keep their data in, relative to the model's folder."""
    try:
        return _external_locations(model)
    except ModelError as e:  # not an ONNX file, or its external data is missing
        raise _Refused(f"'model_path' names {model.name!r}: {e}") from None
