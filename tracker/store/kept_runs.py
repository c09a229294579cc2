"""The runs of records the outbox kept (`tracker.upload`): creating one, filling it, checking or discarding what
an earlier upload left, and ending a study run whose process could not.

Logging a record on a run is `tracker.store.write.log_record`'s, the same as when the study ran.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import mlflow

from tracker.base.keys import (
    ROLE_ATTEMPT,
    TAG_ATTEMPT,
    TAG_KILLED,
    TAG_ROLE,
    TAG_RUNTIME,
    TAG_STUDY,
    TAG_SUPERSEDED_BY,
    TAG_UPLOADED_FROM,
    TAG_UPLOADED_LATER,
)
from tracker.base.termination import defers_sigterm
from tracker.run.record import AttemptRecord
from tracker.store import faults
from tracker.store.runs import create_run, end_run, end_run_quietly, experiment_id_for
from tracker.store.summary import log_study_report, log_study_summary
from tracker.store.write import log_record

logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    from tracker.report.study import StudyReport


@defers_sigterm
def create_kept_run(record: AttemptRecord, *, source: Path) -> str:
    """Creates the run of a record the outbox kept (`tracker.upload`), empty; returns its id.

    The run goes under its study run and into its experiment when they still exist, and it starts at
    `record.start_time_ms` (when it would have started), so the study's attempts keep their order.
    """
    client = mlflow.MlflowClient()
    tags = {TAG_ATTEMPT: record.attempt, TAG_RUNTIME: record.runtime, TAG_ROLE: ROLE_ATTEMPT,
            TAG_UPLOADED_FROM: str(source)}
    if record.study:
        tags[TAG_STUDY] = record.study
    experiment_id = record.experiment_id
    if experiment_id and not _experiment_exists(client, experiment_id):
        experiment_id = None
    parent = record.parent_run_id if record.parent_run_id and _run_exists(client, record.parent_run_id) else None
    if parent is not None:
        experiment_id = client.get_run(parent).info.experiment_id  # a child lives with its parent
    run = create_run(record.attempt, experiment_id=experiment_id or experiment_id_for(None), parent_run_id=parent,
                     tags=tags, start_time=record.start_time_ms)
    return run.info.run_id


@defers_sigterm
def fill_kept_run(run_id: str, record: AttemptRecord) -> dict[str, str]:
    """Logs a kept record on the run `create_kept_run` made, and ends it with the record's status; returns the
    parts MLflow refused (`log_record`). A run created for the record before the failure that sent it to the
    outbox is marked FAILED and `tracker.superseded_by` this one. On an error the run ends FAILED."""
    try:
        left_out = log_record(record, run_id)
    except BaseException:
        end_run_quietly(run_id, "FAILED")
        raise
    end_run(run_id, record.status)
    client = mlflow.MlflowClient()
    if record.run_id and record.run_id != run_id:
        mine = made_from(record.run_id, record)
        if mine:
            client.set_tag(record.run_id, TAG_SUPERSEDED_BY, run_id)
            client.set_terminated(record.run_id, status="FAILED")
        elif mine is False:
            logger.warning("record of attempt %s names run %s as its first run, but that run is another's (its "
                           "attempt, study or parent differ): left as it is", record.attempt, record.run_id)
    return left_out


def made_from(run_id: str, record: AttemptRecord, *, source: Path | None = None) -> bool | None:
    """Whether the run `run_id` was made for `record`: its attempt and study tags and its parent are the record's,
    and, given `source`, it was uploaded from that folder (`tracker.uploaded_from`). None when the run is gone or
    deleted. An upload changes or deletes only a run of its own record: a note naming any other is not trusted.
    """
    from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID

    run = _live_run(run_id)
    if run is None:
        return None
    tags = run.data.tags
    parent = tags.get(MLFLOW_PARENT_RUN_ID)
    if source is not None and tags.get(TAG_UPLOADED_FROM) != str(source):
        return False
    if TAG_ROLE not in tags:  # started, then the store failed before its tags were set: its name and parent tell
        return run.info.run_name == record.attempt and parent == record.parent_run_id
    return (tags.get(TAG_ROLE) == ROLE_ATTEMPT and tags.get(TAG_ATTEMPT) == record.attempt
            and tags.get(TAG_STUDY) == record.study and parent in (record.parent_run_id, None))


def kept_run_status(run_id: str) -> str | None:
    """The status of a run an upload made (FINISHED, FAILED, RUNNING...), None when it is gone or deleted."""
    run = _live_run(run_id)
    return None if run is None else run.info.status


def _live_run(run_id: str):
    """The run `run_id`, None when it is gone or deleted; an outage raises."""
    try:
        run = mlflow.MlflowClient().get_run(run_id)
    except mlflow.exceptions.MlflowException as e:
        if faults.is_outage(e):
            raise
        return None
    return None if run.info.lifecycle_stage == "deleted" else run


@defers_sigterm
def discard_kept_run(run_id: str) -> None:
    """Deletes the run an earlier, cut-off upload of a record made, so that each record has one run."""
    if kept_run_status(run_id) is not None:
        mlflow.MlflowClient().delete_run(run_id)


@defers_sigterm
def end_uploaded_study(run_id: str, *, summary: Mapping[str, object] | None = None,
                       report: StudyReport | None = None, ended: bool = False) -> None:
    """Logs on a study run the summary (`log_study_summary`'s arguments) and the report its process could
    not, when given, and tags it `tracker.uploaded_later`. A run an outage left RUNNING ends FINISHED; one
    that had ended keeps its status, but for a study whose process reached its end (`ended`) and that
    `tracker.store.abandoned` ended KILLED once that process had gone: FINISHED, its `tracker.killed` removed."""
    client = mlflow.MlflowClient()
    run = client.get_run(run_id)
    status = "FINISHED" if run.info.status == "RUNNING" else run.info.status
    if ended and status == "KILLED" and TAG_KILLED in run.data.tags:
        client.delete_tag(run_id, TAG_KILLED)
        status = "FINISHED"
    client.set_tag(run_id, TAG_UPLOADED_LATER, "true")
    if summary is not None:
        # its keys are log_study_summary's keywords (upload reads them back from a saved summary)
        log_study_summary(run_id, **summary)  # type: ignore[arg-type]
    if report is not None:
        log_study_report(run_id, report.html, report.tables)
    client.set_terminated(run_id, status)


def _run_exists(client, run_id: str) -> bool:
    try:
        client.get_run(run_id)
    except mlflow.exceptions.MlflowException:
        return False
    return True


def _experiment_exists(client, experiment_id: str) -> bool:
    try:
        return client.get_experiment(experiment_id) is not None
    except mlflow.exceptions.MlflowException:
        return False
