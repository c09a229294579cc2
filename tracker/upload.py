"""`tracker upload`: sends what the outbox kept (`tracker.run.record`) to the tracking store, and finishes its studies.

Every record is checked before any run is created: a refused record creates nothing and stays in the
outbox, the others are uploaded. A study whose summary could not be logged gets it rebuilt from its
attempt runs, as `tracker compare` reads them, with its report.

An upload holds a lock on its outbox folder (another upload of the same folder is refused at once), and
is idempotent: each record's folder notes the run made for it (`.upload.json`), so a try cut off midway
(an outage, Ctrl-C) leaves one run per record once a later try is done, never a duplicate.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from tracker.base.errors import RecordError, TrackerError
from tracker.base.keys import NO_BEST, ROLE_STUDY, TAG_BEST, TAG_ROLE, TAG_STUDY
from tracker.base.termination import deferred
from tracker.run.loading import load_record, load_summary
from tracker.run.record import SUMMARY_FILE, AttemptRecord, find_records, find_summaries
from tracker.store import abandoned, faults

T = TypeVar("T")

logger = logging.getLogger(__name__)

LOCK_FILE = ".upload.lock"
MARKER_FILE = ".upload.json"  # in a record's folder: {"run_id": the run made for it, "done": logged whole}


@dataclass(frozen=True)
class Upload:
    """What `upload_outbox` did, per record.

    Attributes:
        uploaded: record folder -> the attempt run made for it.
        studies: the study runs whose summary and report it logged (they had none).
        refused: the records (or summaries) left in the outbox, path -> why (names the path at fault).
        kept: the records left in the outbox because the store stopped answering, path -> why; try again later.
        left_out: record folder -> the parts of its run MLflow refused, part -> why (the run names them too).
    """

    uploaded: dict[Path, str] = field(default_factory=dict)
    studies: list[str] = field(default_factory=list)
    refused: dict[Path, str] = field(default_factory=dict)
    kept: dict[Path, str] = field(default_factory=dict)
    left_out: dict[Path, dict[str, str]] = field(default_factory=dict)

    @property
    def run_ids(self) -> list[str]:
        """The attempt runs made, one per uploaded record."""
        return list(self.uploaded.values())


def has_pending(root: Path) -> bool:
    """Whether the outbox `root` holds records or study summaries to upload.

    Raises:
        TrackerError: `root` is not a folder.
    """
    if not root.is_dir():
        what = "is not a folder" if root.exists() else "does not exist"
        raise TrackerError(f"outbox folder {root} {what}: give the folder named in the log of the study "
                           "(default $TRACKER_OUTBOX, else ./tracker-outbox)")
    return bool(find_records(root) or find_summaries(root))


def upload_outbox(root: Path) -> Upload:
    """Logs every record kept under `root` as a run and removes it; then ends the studies they belong to.

    Call `store.connect.setup_tracking` first. A record MLflow refuses whole stays (with the reason in
    `refused`) and the others go on; an outage stops the upload, and what is left stays for the next try.
    A study run whose summary never arrived (no best-attempt tag) gets it now, rebuilt from its attempt runs
    with the report; a study that still has a record in the outbox is left open until that record is uploaded
    or removed.

    Raises:
        TrackerError: another upload of `root` is under way.
    """
    with _locked(root):
        return _upload(root)


def _load_each(paths: Iterable[Path], load: Callable[[Path], T], refused: dict[Path, str]) -> dict[Path, T]:
    """`load` of each path; a path whose content is refused (`RecordError`) goes to `refused` with the reason."""
    loaded = {}
    for path in paths:
        try:
            loaded[path] = load(path)
        except RecordError as e:
            refused[path] = str(e)
    return loaded


def _upload(root: Path) -> Upload:
    result = Upload()
    records: dict[Path, AttemptRecord] = _load_each(find_records(root), load_record, result.refused)
    summaries: dict[Path, dict] = _load_each(find_summaries(root), load_summary, result.refused)
    # A study its process left RUNNING is KILLED before its kept records join it (`end_uploaded_study` keeps that).
    abandoned.end_abandoned_in(sorted({r.experiment_id for r in records.values() if r.experiment_id}),
                               by="tracker upload")

    studies: dict[str, Path] = {}  # study run id -> its folder in the outbox
    for folder, record in records.items():
        if result.kept:  # the store stopped answering: the rest waits for the next try
            result.kept[folder] = "not tried: the tracking store stopped answering"
            continue
        try:
            run_id, left_out = _upload_record(folder, record)
        except Exception as e:
            why = faults.describe(e)
            if faults.is_outage(e):
                result.kept[folder] = why
                logger.error("the tracking store stopped answering while uploading %s (%s); it and the records "
                             "after it stay in the outbox: run `tracker upload` again once it answers", folder, why)
            else:
                result.refused[folder] = f"record {folder / 'record.json'}: the tracking store refused it ({why})"
            continue
        result.uploaded[folder] = run_id
        if left_out:
            result.left_out[folder] = left_out
        logger.info("uploaded %s as run %s", folder, run_id)
        if record.parent_run_id:
            studies.setdefault(record.parent_run_id, folder.parent)
    metrics = {}
    for path, summary in summaries.items():
        studies.setdefault(summary["parent_run_id"], path.parent)
        metrics[summary["parent_run_id"]] = summary["metrics"]

    waiting = [*result.refused, *result.kept]
    for run_id, folder in studies.items():
        if any(folder in path.parents or folder == path for path in waiting):
            logger.warning("study run %s stays open: a record of it is still in the outbox (see above)", run_id)
            continue
        if _end_study(run_id, saved_metrics=metrics.get(run_id, {}), ended=run_id in metrics):
            result.studies.append(run_id)
        (folder / SUMMARY_FILE).unlink(missing_ok=True)
    return result


def _upload_record(folder: Path, record: AttemptRecord) -> tuple[str, dict[str, str]]:
    """Logs one record as one run, whatever earlier tries left (see the module docstring); removes its folder.

    Returns the run's id and the parts MLflow refused. A failure discards the run this try made (the
    record stays), unless it is an outage: then the next try discards it.
    """
    from tracker.store import kept_runs

    marker = _read_marker(folder)
    mine = kept_runs.made_from(marker["run_id"], record, source=folder) if marker is not None else None
    if marker is not None and mine is False:
        logger.warning("%s: its upload note names run %s, which was not made from this record (its tags differ): "
                       "that run is left as it is, and the record gets a run of its own", folder, marker["run_id"])
    elif marker is not None and mine:
        if marker.get("done"):
            shutil.rmtree(folder)  # logged whole by a try cut off before it could remove the record
            return marker["run_id"], {}
        kept_runs.discard_kept_run(marker["run_id"])  # a run cut off halfway
    with deferred():  # the run and the note of it in the folder come together
        run_id = kept_runs.create_kept_run(record, source=folder)
        _write_marker(folder, run_id, done=False)
    try:
        left_out = kept_runs.fill_kept_run(run_id, record)
    except Exception as e:
        if not faults.is_outage(e):
            with contextlib.suppress(Exception):
                kept_runs.discard_kept_run(run_id)
                (folder / MARKER_FILE).unlink()
        raise
    _write_marker(folder, run_id, done=True)
    shutil.rmtree(folder)
    return run_id, left_out


def _read_marker(folder: Path) -> dict | None:
    path = folder / MARKER_FILE
    if path.is_symlink() or not path.is_file():
        return None
    try:
        marker = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(marker, dict) or not isinstance(marker.get("run_id"), str):
        return None
    return marker


def _write_marker(folder: Path, run_id: str, *, done: bool) -> None:
    partial = folder / f"{MARKER_FILE}.partial"
    partial.write_text(json.dumps({"run_id": run_id, "done": done}))
    partial.rename(folder / MARKER_FILE)


@contextlib.contextmanager
def _locked(root: Path) -> Iterator[None]:
    """Holds the outbox's upload lock (`root/.upload.lock`, never followed if a symlink) for the block.

    Raises:
        TrackerError: another process holds it.
    """
    path = root / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as e:
        raise TrackerError(f"cannot create the upload lock {path} ({e.strerror}); the outbox must be writable, "
                           "and the lock must not be a symlink") from None
    with os.fdopen(fd, "r+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = lock.read().strip() or "another process"
            raise TrackerError(f"another `tracker upload` (pid {holder}) is uploading {root}; wait for it to end, "
                               "then run this again for what it left") from None
        lock.truncate(0)
        lock.write(str(os.getpid()))
        lock.flush()
        try:
            yield
        finally:
            lock.truncate(0)


def _end_study(run_id: str, *, saved_metrics: dict[str, float], ended: bool = False) -> bool:
    """Ends a study run, after logging its summary and report if it has none; whether it logged them. `ended`: its
    process reached the study's end (it kept the summary it could not log), so the run ends FINISHED even if
    `tracker.store.abandoned` found it RUNNING after that process had gone and ended it KILLED."""
    from tracker import compare
    from tracker.report.rows import study_counts
    from tracker.report.scenarios import scenario_tags
    from tracker.report.study import build_study_report
    from tracker.store import kept_runs, read

    try:
        (parent,) = read.fetch_runs([run_id], tables=())
    except TrackerError:
        logger.warning("study run %s no longer exists: its attempts were uploaded without it", run_id)
        return False
    if parent.tags.get(TAG_ROLE) != ROLE_STUDY:
        return False  # a run of the user's own that attempts were nested in: not the tracker's to end
    if TAG_BEST in parent.tags:  # its process logged the summary and the report
        kept_runs.end_uploaded_study(run_id, ended=ended)
        return False
    comparison = compare.load_comparison(study_run_id=run_id)
    rows, best = comparison.rows, comparison.best
    # The step times only the study's process knew, with the counts and the scenarios' (and node types') bests of what
    # is on the server now.
    summary = {"metrics": {**saved_metrics, **study_counts(rows)}, "best": best, "tags": scenario_tags(rows)}
    study = parent.tags.get(TAG_STUDY, parent.name)
    with tempfile.TemporaryDirectory(prefix="tracker-upload-") as tmp:
        built = build_study_report(rows, tmp, study=study, best=best)
        kept_runs.end_uploaded_study(run_id, summary=summary, report=built, ended=ended)
    logger.info("study %s (run %s): summary and report logged from %d attempt runs, best: %s",
                study, run_id, len(rows), best or NO_BEST)
    return True
