"""`tracker upload`: sends what the outbox kept (`tracker.record`) to the tracking store, and finishes its studies.

Every record is checked before any run is created: a refused record creates nothing and stays in the
outbox, the others are uploaded. A study whose summary could not be logged gets it rebuilt from its
attempt runs, as `tracker compare` reads them, with its report.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from tracker.errors import RecordError, TrackerError
from tracker.keys import NO_BEST, ROLE_STUDY, TAG_BEST, TAG_ROLE, TAG_STUDY
from tracker.record import SUMMARY_FILE, AttemptRecord, find_records, find_summaries, load_record, load_summary

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Upload:
    """What `upload_outbox` did.

    Attributes:
        run_ids: the attempt runs created, one per uploaded record.
        studies: the study runs whose summary and report it logged (they had none).
        refused: the records (or summaries) left in the outbox, path -> why (names the path at fault).
    """

    run_ids: list[str] = field(default_factory=list)
    studies: list[str] = field(default_factory=list)
    refused: dict[Path, str] = field(default_factory=dict)


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

    Call `store.connect.setup_tracking` first. A study run whose summary never arrived (no best-attempt
    tag) gets it now, rebuilt from its attempt runs with the report; a study that still has a refused
    record in the outbox is left open until that record is uploaded or removed.
    """
    from tracker.store import write

    result = Upload()
    records: dict[Path, AttemptRecord] = {}
    for folder in find_records(root):
        try:
            records[folder] = load_record(folder)
        except RecordError as e:
            result.refused[folder] = str(e)
    summaries: dict[Path, dict] = {}
    for path in find_summaries(root):
        try:
            summaries[path] = load_summary(path)
        except RecordError as e:
            result.refused[path] = str(e)

    studies: dict[str, Path] = {}  # study run id -> its folder in the outbox
    for folder, record in records.items():
        result.run_ids.append(write.log_kept_record(record, source=folder))
        shutil.rmtree(folder)
        logger.info("uploaded %s as run %s", folder, result.run_ids[-1])
        if record.parent_run_id:
            studies.setdefault(record.parent_run_id, folder.parent)
    metrics = {}
    for path, summary in summaries.items():
        studies.setdefault(summary["parent_run_id"], path.parent)
        metrics[summary["parent_run_id"]] = summary["metrics"]

    for run_id, folder in studies.items():
        if any(folder in refused.parents or folder == refused for refused in result.refused):
            logger.warning("study run %s stays open: a record of it was refused (see above)", run_id)
            continue
        if _end_study(run_id, saved_metrics=metrics.get(run_id, {})):
            result.studies.append(run_id)
        (folder / SUMMARY_FILE).unlink(missing_ok=True)
    return result


def _end_study(run_id: str, *, saved_metrics: dict[str, float]) -> bool:
    """Ends a study run, after logging its summary and report if it has none; whether it logged them."""
    from tracker.report import compare
    from tracker.report.rows import study_counts
    from tracker.report.study import build_study_report
    from tracker.store import read, write

    try:
        (parent,) = read.fetch_runs([run_id], tables=())
    except TrackerError:
        logger.warning("study run %s no longer exists: its attempts were uploaded without it", run_id)
        return False
    if parent.tags.get(TAG_ROLE) != ROLE_STUDY:
        return False  # a run of the user's own that attempts were nested in: not the tracker's to end
    if TAG_BEST in parent.tags:  # its process logged the summary and the report
        write.end_uploaded_study(run_id)
        return False
    comparison = compare.load_comparison(study_run_id=run_id)
    rows, best = comparison.rows, comparison.best
    # The step times only the study's process knew, with the counts of what is on the server now.
    summary = {"metrics": {**saved_metrics, **study_counts(rows)}, "best": best}
    study = parent.tags.get(TAG_STUDY, parent.name)
    with tempfile.TemporaryDirectory(prefix="tracker-upload-") as tmp:
        built = build_study_report(rows, tmp, study=study, best=best)
        write.end_uploaded_study(run_id, summary=summary, report=built)
    logger.info("study %s (run %s): summary and report logged from %d attempt runs, best: %s",
                study, run_id, len(rows), best or NO_BEST)
    return True
