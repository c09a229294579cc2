"""Writing a study to the tracking store as it runs: the study run, its nested attempt runs, and what an attempt
record logs on its run (each part on its own, a refused one left out and named).

The model and feeds in MLflow's forms are `tracker.store.model_and_feeds`'; the study's end (its summary, report and
candidates' runs) is `tracker.store.summary`'; the runs of records the outbox kept are `tracker.store.kept_runs`'. Connecting is `tracker.store.connect`'s; reading studies back (for
`tracker compare`) is `tracker.store.read`'s.
"""

from __future__ import annotations

import contextlib
import logging
import traceback
from collections.abc import Iterator, Mapping
from pathlib import Path

import mlflow
import pandas as pd
from mlflow.data.dataset import Dataset
from mlflow.entities import Param, Run, RunTag

from tracker.base.errors import TrackingServerError
from tracker.base.keys import (
    ROLE_ATTEMPT,
    ROLE_STUDY,
    TAG_ATTEMPT,
    TAG_ERROR,
    TAG_MODEL_ID,
    TAG_NOT_LOGGED,
    TAG_ROLE,
    TAG_RUNTIME,
    TAG_STATUS,
    TAG_STUDY,
    sanitize_key,
)
from tracker.base.model_io import load_model
from tracker.base.redaction import redact_uri, without_credentials
from tracker.base.steps import StepTimes
from tracker.base.termination import deferred, defers_sigterm
from tracker.base.vocabulary import Status
from tracker.profile import columns as C
from tracker.run.record import AttemptRecord
from tracker.store import abandoned, faults
from tracker.store.abandoned import process_tags
from tracker.store.model_and_feeds import (
    feeds_dataset,
    log_feeds_input,
    log_onnx_flavor,
    log_plain_model,
    model_figures,
    tensor_signature,
)
from tracker.store.runs import (
    attaches_to_mlflow_run,
    create_run,
    discard_run_quietly,
    enclosing_run,
    end_run,
    end_run_quietly,
    end_unended,
    experiment_id_for,
    open_study_run,
)

logger = logging.getLogger(__name__)

_MAX_TAG_CHARS = 5000


@contextlib.contextmanager
def study_run(
    study: str, *, experiment: str | None, params: Mapping[str, str], tags: Mapping[str, str]
) -> Iterator[Run]:
    """The parent run of a study, ended FINISHED, or FAILED when the block raises (as `mlflow.ActiveRun` ends one).

    Inside `mlflow run` it is the project's run; inside a caller's active run it is nested under it (in that run's
    experiment); otherwise a new run in `experiment` (`runs.experiment_id_for`). Its attempts are nested under it by
    its id (`attempt_run`), not through MLflow's run stack.
    """
    run, created, opened = None, False, False
    run_tags = {TAG_STUDY: study, TAG_ROLE: ROLE_STUDY, **process_tags(), **tags}
    try:
        with deferred():  # SIGTERM waits: a run started must get its tags, and end FAILED below
            run, created = _open_study_run(study, experiment, run_tags)  # made with its tags: found by them
            run_id = run.info.run_id
            log_batch(run_id, params=params, tags=run_tags)
        opened = True
        end_unended()  # runs this process opened while the store went away, ended now that it answers
        abandoned.end_abandoned_in([run.info.experiment_id], by=f"study {study}")
        if _on_server():  # its runs can be watched there while the study runs
            logger.info("study %s: view it at %s", study, run_link(run))
        with open_study_run(run):
            yield run
    except BaseException as e:
        outage = not opened and isinstance(e, Exception) and faults.is_outage(e)
        if run is not None and outage and created:  # it holds nothing: the study starts again once the store answers
            discard_run_quietly(run.info.run_id)
        elif run is not None:
            end_run_quietly(run.info.run_id, "FAILED")
            logger.info("study %s failed: %s", study, _view_hint(run))
        if outage and not isinstance(e, TrackingServerError):
            raise TrackingServerError(f"the tracking store stopped answering while the run of study {study} was "
                                      f"being opened ({faults.describe(e)}); nothing was measured") from e
        raise
    else:
        end_run_quietly(run.info.run_id, "FINISHED")
        logger.info("study %s: %s", study, _view_hint(run))


def _open_study_run(study: str, experiment: str | None, tags: dict[str, str]) -> tuple[Run, bool]:
    """The study's run, and whether it was made here (not `mlflow run`'s own)."""
    enclosing = enclosing_run()
    if attaches_to_mlflow_run(enclosing):  # `mlflow run`'s own
        assert enclosing is not None
        mlflow.MlflowClient().update_run(enclosing.info.run_id, status="RUNNING", name=study)
        return enclosing, False
    if enclosing is not None:
        return create_run(study, experiment_id=enclosing.info.experiment_id, parent_run_id=enclosing.info.run_id,
                          tags=tags), True
    return create_run(study, experiment_id=experiment_id_for(experiment), tags=tags), True


@contextlib.contextmanager
def attempt_run(
    study: str | None, attempt_name: str, runtime: str, *, experiment_id: str, status: str = "FINISHED",
    parent_run_id: str | None = None,
) -> Iterator[Run]:
    """A run for one attempt in `experiment_id`, nested under `parent_run_id` when given (the study's run).

    It ends with `status`; an exception inside marks it FAILED with the error text, then propagates.
    """
    tags = {TAG_ATTEMPT: attempt_name, TAG_RUNTIME: runtime, TAG_ROLE: ROLE_ATTEMPT, **process_tags()}
    if study:
        tags[TAG_STUDY] = study
    run = None
    try:
        with deferred():
            run = create_run(attempt_name, experiment_id=experiment_id, parent_run_id=parent_run_id, tags=tags)
        yield run
    except BaseException as e:
        if run is not None:
            with contextlib.suppress(Exception):  # the server may be what failed
                log_failure(run.info.run_id, e)
            end_run_quietly(run.info.run_id, "FAILED")
        raise
    try:
        end_run(run.info.run_id, status)  # a store that cannot be told raises: the caller keeps the record
    except BaseException:
        end_run_quietly(run.info.run_id, "FAILED")
        raise


# MLflow 3.17 opens an experiment on its GenAI overview (traces, an empty dashboard) unless the URL asks for
# the model-training view; the experiment tag `mlflow.experimentKind` does not change that.
RUNS_VIEW = "workflowType=machine_learning"
LOCAL_UI = "http://127.0.0.1:5000"  # where `mlflow ui` serves a local store by default


def run_link(run: Run) -> str:
    """The UI page of a run, in the model-training view, without any credentials: on the tracking server,
    or for a local store on `mlflow ui`'s default address."""
    base = without_credentials(mlflow.get_tracking_uri()).rstrip("/") if _on_server() else LOCAL_UI
    return f"{base}/#/experiments/{run.info.experiment_id}/runs/{run.info.run_id}?{RUNS_VIEW}"


def _view_hint(run: Run) -> str:
    """Where to see a study's run: its link, and for a local store the command that serves it."""
    if _on_server():
        return f"view it at {run_link(run)}"
    return (f"view it at {run_link(run)} after `mlflow ui --backend-store-uri "
            f"{redact_uri(mlflow.get_tracking_uri())}`")


def _on_server() -> bool:
    return mlflow.get_tracking_uri().startswith(("http://", "https://"))


@defers_sigterm
def log_failure(run_id: str, error: BaseException | str, traceback_text: str | None = None) -> None:
    """Records an error on the run `run_id`: status tag, error text tag and the traceback as a file."""
    if isinstance(error, BaseException):
        traceback_text = traceback_text or "".join(traceback.format_exception(error))
        error = f"{type(error).__name__}: {error}"
    log_batch(run_id, tags={TAG_STATUS: Status.FAILED, TAG_ERROR: error[:_MAX_TAG_CHARS]})
    mlflow.MlflowClient().log_text(run_id, traceback_text or error, "error.txt")


@defers_sigterm
def log_record(record: AttemptRecord, run_id: str, *, steps: StepTimes | None = None) -> dict[str, str]:
    """Logs everything an attempt record holds on the run `run_id` (timed into `steps` if given).

    Each part (params, metrics, tags, artifacts, tables, files, dataset, model) is logged on its own: a part
    MLflow refuses for its content (`faults.is_outage` says it is not an outage) is left out and named in the
    run's `tracker.not_logged` tag, and the rest is logged. A model whose signature or flavor is refused is
    logged without the signature, else as a plain file. Returns what was left out, part -> why.

    Raises:
        Exception: whatever an outage raised (the caller keeps the record in the outbox).
    """
    steps = steps or StepTimes()
    left_out: dict[str, str] = {}
    dataset = _described_feeds(record, left_out)  # the run's input, and the dataset its figures were measured on
    with steps.step("mlflow_logging"):
        for part, log in _record_parts(record, run_id, dataset):
            _log_part(part, log, left_out)
    model_id = None
    if record.model_path:
        with steps.step("model_logging"):
            model_id = _log_model(record, run_id, Path(record.model_path), left_out)
    figures = clean_metrics(model_figures(record.metrics))  # the rest went with `_record_parts`
    if figures:  # on the run, and linked to its logged model and the feeds they were measured on: the Models tab
        # shows a dataset's metrics as columns
        _log_part("model figures", lambda: mlflow.log_metrics(figures, run_id=run_id, model_id=model_id,
                                                              dataset=dataset), left_out)
    if model_id is not None:
        _log_part("model id tag", lambda: log_batch(run_id, tags={TAG_MODEL_ID: model_id}), left_out)
    if left_out:
        note = "; ".join(f"{part}: {why}" for part, why in left_out.items())
        logger.warning("attempt %s: MLflow refused part of its run, logged without it: %s", record.attempt, note)
        _log_part("note", lambda: log_batch(run_id, tags={TAG_NOT_LOGGED: note[:_MAX_TAG_CHARS]}), {})
    if record.status == "FAILED":
        log_failure(run_id, record.error or "failed", record.traceback)
    return left_out


def _described_feeds(record: AttemptRecord, left_out: dict[str, str]) -> Dataset | None:
    """The record's feeds as an MLflow dataset (`feeds_dataset`); None without feeds, or when MLflow refuses their
    description (a dtype its tensor schema has no type for), that reason then in `left_out`."""
    if record.feeds is None:
        return None
    try:
        return feeds_dataset(record)
    except Exception as e:
        left_out["dataset"] = faults.describe(e)
        return None


def _log_part(part: str, log, left_out: dict[str, str]) -> bool:
    """Runs `log()`; a refusal of its content goes into `left_out[part]`, an outage propagates."""
    try:
        log()
    except Exception as e:
        if faults.is_outage(e):
            raise
        left_out[part] = faults.describe(e)
        return False
    return True


def _record_parts(record: AttemptRecord, run_id: str, dataset: Dataset | None):
    """(part name, function logging it on `run_id`) for each part of `record` but its model; `dataset` describes its
    feeds."""
    client = mlflow.MlflowClient()
    if record.params:
        yield "params", lambda: log_batch(run_id, params=record.params)
    figures = model_figures(record.metrics)
    others = {k: v for k, v in record.metrics.items() if k not in figures}
    if others:  # the model's figures are logged with the model (`log_record`)
        yield "metrics", lambda: mlflow.log_metrics(clean_metrics(others), run_id=run_id)
    if record.tags:
        yield "tags", lambda: log_batch(run_id, tags=record.tags)
    if record.artifact_dir:
        yield "artifacts", lambda: client.log_artifacts(run_id, record.artifact_dir)
        for name in record.tables:
            yield f"table {name}", lambda name=name: _log_table_file(run_id, Path(record.artifact_dir), name)
    for path, folder in record.files.items():
        yield f"file {Path(path).name}", lambda path=path, folder=folder: client.log_artifact(run_id, path, folder)
    if dataset is not None:
        yield "dataset", lambda: log_feeds_input(run_id, dataset)


def log_batch(run_id: str, *, params: Mapping[str, object] | None = None,
              tags: Mapping[str, object] | None = None) -> None:
    """`params` and `tags` on the run `run_id`, as text (cut to MLflow's lengths)."""
    mlflow.MlflowClient().log_batch(
        run_id, params=[Param(k, str(v)[:6000]) for k, v in (params or {}).items()],
        tags=[RunTag(k, str(v)[:_MAX_TAG_CHARS]) for k, v in (tags or {}).items()])


def _log_table_file(run_id: str, artifact_dir: Path, name: str) -> None:
    table = pd.read_csv(artifact_dir / "tables" / f"{name}.csv", dtype={C.KEY: str})
    mlflow.MlflowClient().log_table(run_id, json_safe(table), artifact_file=f"tables/{name}.json")


def _log_model(record: AttemptRecord, run_id: str, path: Path, left_out: dict[str, str]) -> str | None:
    """The model at `path` (the record's) with the onnx flavor and its signature; refused, without the signature;
    refused again (or a custom-domain model), as a plain file. Returns the logged model's id (None: a plain file)."""
    if record.model_flavor:
        model = load_model(path, check=False)  # by content: a protobuf named .json too
        signature, why_not = tensor_signature(model)
        logged: list[str] = []
        if why_not:
            left_out["model signature"] = why_not
        elif _log_part("model signature", lambda: logged.append(log_onnx_flavor(model, record, signature, run_id)),
                       left_out):
            return logged[0]
        if _log_part("onnx flavor", lambda: logged.append(log_onnx_flavor(model, record, None, run_id)), left_out):
            return logged[0]
    log_plain_model(path, run_id, why="custom-domain op" if not record.model_flavor else "MLflow refused the onnx "
                    "flavor")
    return None


def clean_metrics(metrics: Mapping[str, float]) -> dict[str, float]:
    """`metrics` with MLflow-safe keys (`sanitize_key`) and float values."""
    return {sanitize_key(k): float(v) for k, v in metrics.items()}  # valid keys come back unchanged


def json_safe(table: pd.DataFrame) -> pd.DataFrame:
    """`table` as `log_table` can write it: it writes JSON, so nullable ints and NaN become None."""
    return table.astype(object).where(table.notna(), None)
