"""A record or study summary kept in the outbox, read back: everything checked before anything is uploaded (the keys
and their types, and every file a record names a regular file inside its folder, reached through no symbolic link).

Saving them is `tracker.run.record`'s; the cluster's wire reads a node's record back through the same checks.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import fields
from pathlib import Path
from typing import TypeVar

import msgspec

from tracker.base.errors import ModelError, RecordError
from tracker.base.files import read_small_file
from tracker.measure.inputs.feeds_description import FeedsDescription, FeedSpec
from tracker.run.record import RECORD_FILE, AttemptRecord, external_locations

_S = TypeVar("_S", bound=msgspec.Struct)


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
        return external_locations(model)
    except ModelError as e:  # not an ONNX file, or its external data is missing
        raise _Refused(f"'model_path' names {model.name!r}: {e}") from None
