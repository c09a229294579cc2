"""Runs opened and ended by their ids, never through MLflow's process-global run stack or active experiment.

Each run is created in its experiment under its parent (MLflow's `mlflow.parentRunId` tag), with the context tags
MLflow's own `start_run` adds (user, source, git commit), and ended FINISHED or FAILED by its id. A run's place is
decided once, where the work enters (`enclosing_run`, `experiment_id_for`), and handed down explicitly: the study run
to its attempts, a record to the run it is uploaded into.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from contextvars import ContextVar

import mlflow
from mlflow.entities import Run
from mlflow.exceptions import MlflowException
from mlflow.tracking.context.registry import resolve_tags
from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID

from tracker.base.termination import defers_sigterm
from tracker.store import faults
from tracker.store.connect import ensure_reachable

logger = logging.getLogger(__name__)

DEFAULT_EXPERIMENT = "Default"  # MLflow's own, made with every store
# The study run open in this context (this project's own scope, not MLflow's run stack): a study started inside it
# nests under it by its id.
_OPEN_STUDY_RUN: ContextVar[Run | None] = ContextVar("tracker_open_study_run", default=None)
# Runs this process could not end (the store did not answer) -> the status they ended with, or DISCARD: `end_unended`
# tells the store once it answers again. A run still here when the process ends is left to `tracker.store.abandoned`.
_UNENDED: dict[str, str] = {}
DISCARD = "discard"  # a run that holds nothing (its study could not open it): deleted


def experiment_id_for(name: str | None) -> str:
    """The id of the experiment `name` (made if missing; made by another process a moment before, read back); with no
    name, MLflow's environment's ($MLFLOW_EXPERIMENT_ID, $MLFLOW_EXPERIMENT_NAME), else its default experiment.

    MLflow's process-global active experiment (`mlflow.set_experiment`) is not read: name the experiment.

    Raises:
        MlflowException: `name` is a deleted experiment (restore it, or choose another name).
    """
    if not name and os.environ.get("MLFLOW_EXPERIMENT_ID"):
        return os.environ["MLFLOW_EXPERIMENT_ID"]
    name = name or os.environ.get("MLFLOW_EXPERIMENT_NAME") or DEFAULT_EXPERIMENT
    client = mlflow.MlflowClient()
    found = client.get_experiment_by_name(name)
    if found is None and name == DEFAULT_EXPERIMENT:
        return "0"  # the default experiment's id in every MLflow store
    if found is None:
        try:
            made = client.create_experiment(name)
            logger.info("experiment %s did not exist: made it (id %s)", name, made)
            return made
        except MlflowException:
            found = client.get_experiment_by_name(name)
            if found is None:
                raise
    if found.lifecycle_stage == "deleted":
        raise MlflowException(f"cannot log into the deleted experiment {name!r}: restore it (`mlflow experiments "
                              f"restore --experiment-id {found.experiment_id}`) or choose another name")
    return found.experiment_id


def enclosing_run() -> Run | None:
    """The run this process works inside, read once where the work enters: the study run open around it
    (`open_study_run`: `main`'s, around each of its studies), the one `mlflow run` started for it ($MLFLOW_RUN_ID), or
    the caller's own active run; None outside any."""
    opened = _OPEN_STUDY_RUN.get()
    if opened is not None:
        return opened
    run_id = os.environ.get("MLFLOW_RUN_ID")
    if not run_id:
        active = mlflow.active_run()
        run_id = active.info.run_id if active is not None else None
    return mlflow.MlflowClient().get_run(run_id) if run_id else None


@contextlib.contextmanager
def open_study_run(run: Run) -> Iterator[Run]:
    """`run` as the enclosing run of what starts inside the block (`enclosing_run`)."""
    token = _OPEN_STUDY_RUN.set(run)
    try:
        yield run
    finally:
        _OPEN_STUDY_RUN.reset(token)


def attaches_to_mlflow_run(enclosing: Run | None) -> bool:
    """Whether a study run started now is `enclosing` itself: the run `mlflow run` started for this process, with no
    study run of this process open around it."""
    return (enclosing is not None and _OPEN_STUDY_RUN.get() is None
            and os.environ.get("MLFLOW_RUN_ID") == enclosing.info.run_id)


def inside_run() -> bool:
    """Whether this process works inside a run: `mlflow run`'s, or the caller's active one."""
    return bool(os.environ.get("MLFLOW_RUN_ID")) or mlflow.active_run() is not None


def place(experiment: str | None) -> tuple[str | None, str]:
    """(parent run id, experiment id) of a run started where the work enters: under the enclosing run, in its
    experiment (`enclosing_run`); else top-level in `experiment` (`experiment_id_for`)."""
    enclosing = enclosing_run()
    if enclosing is not None:
        return enclosing.info.run_id, enclosing.info.experiment_id
    return None, experiment_id_for(experiment)


def create_run(name: str, *, experiment_id: str, parent_run_id: str | None = None,
               tags: dict[str, str] | None = None, start_time: int | None = None) -> Run:
    """A new RUNNING run named `name` in `experiment_id`, nested under `parent_run_id` when given, with `tags` and
    MLflow's context tags."""
    tags = {**(tags or {}), **({MLFLOW_PARENT_RUN_ID: parent_run_id} if parent_run_id else {})}
    return mlflow.MlflowClient().create_run(experiment_id, start_time=start_time, tags=resolve_tags(tags),
                                            run_name=name)


@defers_sigterm
def end_run(run_id: str, status: str) -> None:
    """Ends the run `run_id` with `status` (and, for the run `mlflow run` started, lets this process's later work
    start runs of its own).

    Raises:
        Exception: the store could not be told; the run stays RUNNING there (the caller keeps its record).
    """
    if os.environ.get("MLFLOW_RUN_ID") == run_id:
        del os.environ["MLFLOW_RUN_ID"]
    ensure_reachable()  # a dead server would make set_terminated retry for minutes
    mlflow.MlflowClient().set_terminated(run_id, status)


def end_run_quietly(run_id: str, status: str) -> bool:
    """`end_run`, with a store that cannot be told logged (naming the run) instead of raised; returns whether the
    store was told."""
    try:
        end_run(run_id, status)
    except Exception as e:
        logger.warning("could not tell the tracking store that run %s ended %s (%s); it shows RUNNING there until "
                       "this process's next run, or `tracker.store.abandoned`, ends it", run_id, status,
                       faults.describe(e))
        _UNENDED[run_id] = status
        return False
    _UNENDED.pop(run_id, None)
    return True


def discard_run_quietly(run_id: str) -> bool:
    """Deletes the run `run_id`, which holds nothing (its study could not open it: the store stopped answering), so
    that no empty run stays behind; a store that cannot be told is logged, and told by `end_unended` later."""
    try:
        ensure_reachable()
        mlflow.MlflowClient().delete_run(run_id)
    except Exception as e:
        logger.warning("could not delete the empty run %s (%s); this process's next run deletes it", run_id,
                       faults.describe(e))
        _UNENDED[run_id] = DISCARD
        return False
    return True


def end_unended() -> list[str]:
    """Ends, now that the store answers, the runs this process could not end before (`end_run_quietly`); returns
    those it ended."""
    ended = []
    for run_id, status in list(_UNENDED.items()):
        try:
            if status == DISCARD:
                mlflow.MlflowClient().delete_run(run_id)
            elif mlflow.MlflowClient().get_run(run_id).info.status == "RUNNING":
                end_run(run_id, status)
        except Exception as e:
            logger.warning("could not yet end run %s %s (%s)", run_id, status, faults.describe(e))
            continue
        del _UNENDED[run_id]
        ended.append(run_id)
    return ended
