"""The module that writes to MLflow: study runs, nested attempt runs, and what each run carries.

Reading studies back (for `tracker compare`) is `tracker.mlflow_read`'s.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import traceback
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import mlflow
import onnx
import pandas as pd

from tracker import columns as C
from tracker.errors import TrackerError, TrackingServerError
from tracker.keys import metric_keys, sanitize_key
from tracker.model_io import load_model
from tracker.record import AttemptRecord
from tracker.redaction import protect_uri, redact_uri, without_credentials
from tracker.redaction import redact as redact_text
from tracker.settings import resolve_tracking_uri, server_timeout_s
from tracker.steps import StepTimes
from tracker.termination import deferred, defers_sigterm

if TYPE_CHECKING:
    from tracker.report import StudyReport

logger = logging.getLogger(__name__)

TAG_STUDY = "tracker.study"
TAG_ATTEMPT = "tracker.attempt"
TAG_RUNTIME = "tracker.runtime"
TAG_STATUS = "tracker.status"
TAG_ERROR = "tracker.error"
TAG_DIFF = "tracker.diff"
TAG_ROLE = "tracker.role"
TAG_BEST = "tracker.best_attempt"
TAG_VERDICT = "tracker.verdict"
TAG_DISTURBED = "tracker.disturbed"  # measuring steps other processes disturbed, e.g. "latency,profiling"
_MAX_TAG_CHARS = 5000


def setup_tracking(uri: str | None = None, *, timeout_s: float | None = None) -> str:
    """Points MLflow at `uri` (default: `settings.resolve_tracking_uri()`) and checks its store answers.

    Before any work is done: an http(s) server must answer a real read of its store (its /health stays
    200 while its database is down), and a local store must open. MLflow's HTTP retries are bounded by
    `timeout_s` (default `settings.server_timeout_s()`), and the URI's password is kept out of all output.

    Raises:
        TrackingServerError: the server or its store does not answer, or the store cannot be opened.
    """
    uri = uri or resolve_tracking_uri()
    protect_uri(uri)
    timeout_s = server_timeout_s() if timeout_s is None else timeout_s
    if uri.startswith(("http://", "https://")):
        bound_http_retries(timeout_s)
        _check_server(uri, timeout_s)
    else:
        _open_store(uri)
    mlflow.set_tracking_uri(uri)
    return uri


def bound_http_retries(timeout_s: float) -> None:
    """Makes one MLflow HTTP call give up after about `timeout_s` instead of ~4 minutes of retries.

    MLflow's defaults (7 retries, backoff 2 s doubling, 120 s per request) suit a rate-limited hosted
    service; against a team server whose database is down they stall a study for minutes per call.
    Settings the user made (the `MLFLOW_HTTP_REQUEST_*` variables) are kept.
    """
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1")  # waits 0 s, then 2 s
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", str(max(1, int(timeout_s / 3))))


def ensure_reachable(*, timeout_s: float = 5.0) -> None:
    """Checks the current tracking server and its store answer (no-op for a local store).

    Raises:
        TrackingServerError: they do not.
    """
    uri = mlflow.get_tracking_uri()
    if uri.startswith(("http://", "https://")):
        _check_server(uri, timeout_s)


def _check_server(uri: str, timeout_s: float) -> None:
    """One search of the store's experiments, authenticated as MLflow's client would be, no retries."""
    import base64
    from urllib.parse import unquote, urlsplit, urlunsplit

    # urllib does not take credentials from the URL (it would resolve "user:pw@host" as a host name);
    # MLflow's client sends them as basic auth, so the check does too.
    parts = urlsplit(uri)
    base = urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2])).rstrip("/")
    request = urllib.request.Request(base + "/api/2.0/mlflow/experiments/search?max_results=1")
    username = parts.username if parts.username is not None else os.environ.get("MLFLOW_TRACKING_USERNAME")
    password = parts.password if parts.username is not None else os.environ.get("MLFLOW_TRACKING_PASSWORD")
    if username is not None:
        token = base64.b64encode(f"{unquote(username)}:{unquote(password or '')}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    elif os.environ.get("MLFLOW_TRACKING_TOKEN"):
        request.add_header("Authorization", f"Bearer {os.environ['MLFLOW_TRACKING_TOKEN']}")
    shown = redact_uri(uri)
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as e:
        detail = redact_text(_error_detail(e.read(4000)))
        if e.code in (401, 403):
            hint = "check the user name and password (MLFLOW_TRACKING_USERNAME/PASSWORD)"
        else:
            hint = "is the server's database running? see the server's log"
        raise TrackingServerError(
            f"MLflow tracking server {shown} answers, but a read of its store failed with HTTP {e.code} "
            f"({detail or e.reason}); {hint}"
        ) from None
    except (urllib.error.URLError, OSError, ValueError) as e:
        raise TrackingServerError(
            f"MLflow tracking server {shown} is unreachable ({redact_text(str(e))}); start it or fix "
            "MLFLOW_TRACKING_URI"
        ) from None


def _error_detail(body: bytes) -> str:
    """The first line of an MLflow error response's message (its JSON holds a whole SQL error)."""
    text = body.decode(errors="replace").strip()
    with contextlib.suppress(ValueError, AttributeError):
        text = str(json.loads(text).get("message") or text)
    lines = text.strip().splitlines()
    return lines[0][:300] if lines else ""


@defers_sigterm  # a store half-created by MLflow's migrations could not be opened again
def _open_store(uri: str) -> None:
    """Opens a local store (sqlite, a database URI, a file store) with one read; creates a new one."""
    try:
        if uri.startswith("sqlite:///"):
            _create_sqlite_tables(uri)
        else:
            if uri.split(":", 1)[0].split("+")[0] in _DATABASE_SCHEMES:
                _connect_once(uri)  # MLflow itself retries a refused connection for ~100 s, silently
            mlflow.MlflowClient(uri).search_experiments(max_results=1)
    except TrackerError:
        raise
    except Exception as e:  # whatever the store's library raises: a missing driver, a bad path, a refused login
        raise TrackingServerError(
            f"cannot open the MLflow tracking store {redact_uri(uri)} ({type(e).__name__}: "
            f"{redact_text(str(e)).strip().splitlines()[0] if str(e).strip() else 'no detail'}); fix "
            "MLFLOW_TRACKING_URI, or unset it to use ./mlflow.db"
        ) from None


_DATABASE_SCHEMES = ("postgresql", "mysql", "mssql")


def _connect_once(uri: str) -> None:
    """One connection to a database store, so that a wrong address fails at once."""
    import sqlalchemy
    from sqlalchemy.pool import NullPool

    engine = sqlalchemy.create_engine(uri, poolclass=NullPool)
    try:
        with engine.connect():
            pass
    finally:
        engine.dispose()


def _create_sqlite_tables(uri: str) -> None:
    """Creates a new sqlite store's tables while holding a file lock beside the database.

    MLflow creates them unlocked on first use: two processes that start on the same new file race, and
    one fails with "table ... already exists". Once they exist, concurrent runs are fine. The lock lives
    in the database's own folder (whoever can write the database can write there), not in a shared
    /tmp where a planted symlink could redirect it; it is never followed if it is a symlink.
    """
    import fcntl

    path = uri[len("sqlite:///"):].split("?")[0]
    if not path or path == ":memory:":
        return
    db = Path(path)
    lock_path = db.with_name(f".{db.name}.init-lock")
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as e:
        raise TrackingServerError(
            f"cannot create the lock {lock_path} beside the sqlite store {db} ({e.strerror}); the folder must "
            "exist and be writable, and the lock must not be a symlink"
        ) from None
    with os.fdopen(fd, "r+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        mlflow.MlflowClient(uri).search_experiments(max_results=1)  # builds the store: tables, migrations


redact = redact_uri  # the name callers use for a URI shown in a message


def set_experiment(name: str) -> None:
    """Makes `name` the active experiment, unless `mlflow run` already chose one for this process."""
    if not os.environ.get("MLFLOW_RUN_ID"):
        experiment = mlflow.set_experiment(name)
        # When another process creates the experiment a moment before, MLflow (3.17) returns it without
        # making it active, and this process's runs would land in "Default": activate it by id.
        mlflow.set_experiment(experiment_id=experiment.experiment_id)


@contextlib.contextmanager
def study_run(
    study: str, *, experiment: str | None, params: Mapping[str, str], tags: Mapping[str, str]
) -> Iterator[mlflow.ActiveRun]:
    """The parent run of a study.

    Outside any run it starts one (inside `mlflow run` that attaches to the project's run); inside an
    active run it is nested under it.
    """
    run = None
    try:
        with deferred():  # SIGTERM waits: a run started must get its tags, and end FAILED below
            if experiment and mlflow.active_run() is None:
                set_experiment(experiment)
            nested = mlflow.active_run() is not None
            run = mlflow.start_run(run_name=study, nested=nested)
            mlflow.set_tags({TAG_STUDY: study, TAG_ROLE: "study", **tags})
            mlflow.log_params(dict(params))
        link = run_link(run)
        if link:
            logger.info("study %s: view it at %s", study, link)
        yield run
    except BaseException:
        if run is not None:
            end_run_quietly("FAILED")
        raise
    else:
        end_run_quietly("FINISHED")


@contextlib.contextmanager
def attempt_run(
    study: str | None, attempt_name: str, runtime: str, *, status: str = "FINISHED",
    parent_run_id: str | None = None, experiment_id: str | None = None,
) -> Iterator[mlflow.ActiveRun]:
    """A run for one attempt, nested under the active run (or `parent_run_id`) if there is one.

    It ends with `status`; an exception inside marks it FAILED with the error text, then propagates.
    """
    tags = {TAG_ATTEMPT: attempt_name, TAG_RUNTIME: runtime, TAG_ROLE: "attempt"}
    if study:
        tags[TAG_STUDY] = study
    run = None
    try:
        with deferred():
            nested = mlflow.active_run() is not None
            run = mlflow.start_run(run_name=attempt_name, nested=nested, parent_run_id=parent_run_id,
                                   experiment_id=experiment_id)
            mlflow.set_tags(tags)
        yield run
        with deferred():
            mlflow.end_run(status=status)
    except BaseException as e:
        if run is not None and mlflow.active_run() is not None and mlflow.active_run().info.run_id == run.info.run_id:
            with contextlib.suppress(Exception):  # the server may be what failed
                log_failure(e)
            end_run_quietly("FAILED")
        raise


def run_link(run: mlflow.ActiveRun) -> str | None:
    """The UI page of a run on a tracking server, without any credentials; None for a local store."""
    uri = mlflow.get_tracking_uri()
    if not uri.startswith(("http://", "https://")):
        return None
    return f"{without_credentials(uri).rstrip('/')}/#/experiments/{run.info.experiment_id}/runs/{run.info.run_id}"


@defers_sigterm
def end_run_quietly(status: str) -> None:
    """Ends the active run; if the server cannot be told, still leaves this process's run stack clean."""
    try:
        ensure_reachable()  # a dead server would make end_run retry for minutes
        mlflow.end_run(status=status)
    except Exception:
        run = mlflow.active_run()
        logger.warning("could not tell the tracking server that run %s ended", run.info.run_id if run else None)
        with contextlib.suppress(Exception):
            mlflow.tracking.fluent._active_run_stack.get().pop()  # no public way to drop a dead run


@defers_sigterm
def log_failure(error: BaseException | str, traceback_text: str | None = None) -> None:
    """Records an error on the active run: status tag, error text tag and the traceback as a file."""
    if isinstance(error, BaseException):
        traceback_text = traceback_text or "".join(traceback.format_exception(error))
        error = f"{type(error).__name__}: {error}"
    mlflow.set_tags({TAG_STATUS: "failed", TAG_ERROR: error[:_MAX_TAG_CHARS]})
    mlflow.log_text(traceback_text or error, "error.txt")


@defers_sigterm
def log_record(record: AttemptRecord, *, steps: StepTimes | None = None) -> None:
    """Logs everything an attempt record holds on the active run (timed into `steps` if given)."""
    steps = steps or StepTimes()
    with steps.step("mlflow_logging"):
        _log_record_data(record)
    if record.model_path:
        with steps.step("model_logging"):
            _log_model_file(Path(record.model_path), flavor=record.model_flavor)
    if record.status == "FAILED":
        log_failure(record.error or "failed", record.traceback)


def _log_record_data(record: AttemptRecord) -> None:
    if record.params:
        mlflow.log_params({k: str(v)[:6000] for k, v in record.params.items()})
    if record.metrics:
        mlflow.log_metrics(_clean_metrics(record.metrics))
    if record.tags:
        mlflow.set_tags(record.tags)
    if record.artifact_dir:
        mlflow.log_artifacts(record.artifact_dir)
        for name in record.tables:
            table = pd.read_csv(Path(record.artifact_dir) / "tables" / f"{name}.csv", dtype={C.KEY: str})
            mlflow.log_table(_json_safe(table), artifact_file=f"tables/{name}.json")
    for path, folder in record.files.items():
        mlflow.log_artifact(path, folder)


def op_metrics(summary: pd.DataFrame) -> dict[str, float]:
    """`op.<OpType>.{total_us,calls,pct,us_per_run}` from a per-op-type summary."""
    metrics = {}
    names = list(summary[C.KEY])
    for column, suffix in ((C.TOTAL_US, "total_us"), (C.CALLS, "calls"), (C.PCT, "pct"), (C.US_PER_RUN, "us_per_run")):
        keys = metric_keys("op", names, suffix)
        metrics.update({keys[k]: float(v) for k, v in zip(names, summary[column])})
    return metrics


def _clean_metrics(metrics: Mapping[str, float]) -> dict[str, float]:
    return {sanitize_key(k): float(v) for k, v in metrics.items()}  # valid keys come back unchanged


def _json_safe(table: pd.DataFrame) -> pd.DataFrame:
    # log_table writes JSON: nullable ints and NaN become None
    return table.astype(object).where(table.notna(), None)


def _log_model_file(path: Path, *, flavor: bool) -> None:
    if flavor:
        # No input_example: it would make MLflow load and run the model once more.
        model = load_model(path, check=False)  # by content: a protobuf named .json too
        mlflow.onnx.log_model(
            onnx_model=model,
            name="model",
            signature=_signature(model),
            pip_requirements=_pip_requirements(),
            onnx_execution_providers=["CPUExecutionProvider"],
        )
    else:
        # The onnx flavor's pyfunc would fail on an op ORT does not know: keep the file as is.
        mlflow.log_artifact(str(path), "model")
        mlflow.set_tag("tracker.model_format", "plain artifact (custom-domain op)")


def _signature(model: onnx.ModelProto):
    """The model's tensor signature, symbolic dims as -1."""
    from mlflow.models import ModelSignature
    from mlflow.types import Schema, TensorSpec
    from onnx import helper

    def specs(values) -> Schema:
        out = []
        for v in values:
            t = v.type.tensor_type
            dims = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in t.shape.dim)
            out.append(TensorSpec(helper.tensor_dtype_to_np_dtype(t.elem_type), dims, v.name))
        return Schema(out)

    initializers = {t.name for t in model.graph.initializer}
    inputs = [v for v in model.graph.input if v.name not in initializers]
    return ModelSignature(inputs=specs(inputs), outputs=specs(model.graph.output))


def _pip_requirements() -> list[str]:
    from importlib import metadata

    return [f"{p}=={metadata.version(p)}" for p in ("onnx", "onnxruntime")]


@defers_sigterm
def log_kept_record(record: AttemptRecord, *, source: Path) -> str:
    """Logs a record the outbox kept (`tracker.upload`) as a new attempt run; returns the run's id.

    The run goes under its study run and into its experiment when they still exist, and it starts at
    `record.start_time_ms` (when it would have started), so the study's attempts keep their order. A
    run created for the record before the failure is marked FAILED and `tracker.superseded_by` the new one.
    """
    from mlflow.tracking.context.registry import resolve_tags
    from mlflow.tracking.fluent import _get_experiment_id
    from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID

    client = mlflow.MlflowClient()
    tags = {TAG_ATTEMPT: record.attempt, TAG_RUNTIME: record.runtime, TAG_ROLE: "attempt",
            "tracker.uploaded_from": str(source)}
    if record.study:
        tags[TAG_STUDY] = record.study
    experiment_id = record.experiment_id
    if experiment_id and not _experiment_exists(client, experiment_id):
        experiment_id = None
    if record.parent_run_id and _run_exists(client, record.parent_run_id):
        tags[MLFLOW_PARENT_RUN_ID] = record.parent_run_id
        experiment_id = client.get_run(record.parent_run_id).info.experiment_id  # a child lives with its parent
    run = client.create_run(experiment_id or _get_experiment_id(), start_time=record.start_time_ms,
                            tags=resolve_tags(tags), run_name=record.attempt)
    mlflow.start_run(run_id=run.info.run_id, nested=mlflow.active_run() is not None)
    try:
        log_record(record)
    except BaseException:
        end_run_quietly("FAILED")
        raise
    mlflow.end_run(status=record.status)
    if record.run_id and _run_exists(client, record.run_id):
        client.set_tag(record.run_id, "tracker.superseded_by", run.info.run_id)
        client.set_terminated(record.run_id, status="FAILED")
    return run.info.run_id


@defers_sigterm
def end_uploaded_study(run_id: str, *, summary: Mapping[str, object] | None = None,
                       report: StudyReport | None = None) -> None:
    """Logs on a study run the summary (`log_study_summary`'s arguments) and the report its process could
    not, when given, and tags it `tracker.uploaded_later`. A run an outage left RUNNING ends FINISHED; one
    that had ended keeps its status."""
    status = mlflow.MlflowClient().get_run(run_id).info.status
    status = "FINISHED" if status == "RUNNING" else status
    mlflow.start_run(run_id=run_id, nested=mlflow.active_run() is not None)
    try:
        mlflow.set_tag("tracker.uploaded_later", "true")
        if summary is not None:
            log_study_summary(**summary)
        if report is not None:
            log_study_report(report.html, report.tables)
    finally:
        end_run_quietly(status)


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


def current_ids() -> tuple[str | None, str | None]:
    """(active run id, experiment id) of this process, for records that may have to be uploaded later."""
    run = mlflow.active_run()
    if run is not None:
        return run.info.run_id, run.info.experiment_id
    from mlflow.tracking.fluent import _get_experiment_id

    return None, _get_experiment_id()


@defers_sigterm
def log_study_summary(rows: list[dict[str, object]], *, metrics: Mapping[str, float], best: str | None) -> None:
    """Logs the table of a study's attempts, and the best attempt that passed its check, on the study run."""
    mlflow.set_tag(TAG_BEST, best or "none passed")
    table = pd.DataFrame(rows)
    if not table.empty:
        mlflow.log_table(_json_safe(table), artifact_file="study/attempts.json")
        mlflow.log_text(table.to_csv(index=False), "study/attempts.csv")
    mlflow.log_metrics(_clean_metrics(metrics))


@defers_sigterm
def log_study_report(html: str | Path, tables: Mapping[str, pd.DataFrame]) -> None:
    """Logs the study report on the active (study) run: `report/<html file name>` and each table as
    `report/<name>.json` with `mlflow.log_table`, so the UI's table view shows them."""
    mlflow.log_artifact(str(html), "report")
    for name, table in tables.items():
        if not table.empty:  # an empty table (no graph change) has nothing to show in the UI
            mlflow.log_table(_json_safe(table), artifact_file=f"report/{name}.json")
