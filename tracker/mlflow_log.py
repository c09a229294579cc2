"""The one module that talks to MLflow: study runs, nested attempt runs, and what each run carries."""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import traceback
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path

import mlflow
import onnx
import pandas as pd

from tracker import columns as C
from tracker.artifacts import AttemptArtifacts
from tracker.attempt import AttemptResult
from tracker.errors import TrackingServerError
from tracker.keys import metric_keys, sanitize_key
from tracker.settings import resolve_tracking_uri

logger = logging.getLogger(__name__)

TAG_STUDY = "tracker.study"
TAG_ATTEMPT = "tracker.attempt"
TAG_RUNTIME = "tracker.runtime"
TAG_STATUS = "tracker.status"
TAG_ERROR = "tracker.error"
TAG_DIFF = "tracker.diff"
TAG_ROLE = "tracker.role"
TAG_BEST = "tracker.best_attempt"
_STANDARD_DOMAINS = ("", "ai.onnx", "ai.onnx.ml", "com.microsoft")
_MAX_TAG_CHARS = 5000


def setup_tracking(uri: str | None = None, *, timeout_s: float = 5.0) -> str:
    """Points MLflow at `uri` (default: `settings.resolve_tracking_uri()`) and checks a server answers.

    Raises:
        TrackingServerError: an http(s) tracking server does not answer, before any work is done.
    """
    uri = uri or resolve_tracking_uri()
    if uri.startswith(("http://", "https://")):
        _check_server(uri, timeout_s)
    mlflow.set_tracking_uri(uri)
    return uri


def _check_server(uri: str, timeout_s: float) -> None:
    health = uri.rstrip("/") + "/health"
    try:
        with urllib.request.urlopen(health, timeout=timeout_s) as response:
            response.read()
    except (urllib.error.URLError, OSError) as e:
        shown = _redact(uri)
        raise TrackingServerError(
            f"MLflow tracking server {shown} is unreachable ({e}); start it or fix MLFLOW_TRACKING_URI"
        ) from None


def _redact(uri: str) -> str:
    """The URI without a password, for messages and logs."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(uri)
    if parts.password is None:
        return uri
    netloc = f"{parts.username}:***@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def set_experiment(name: str) -> None:
    """Makes `name` the active experiment, unless `mlflow run` already chose one for this process."""
    if not os.environ.get("MLFLOW_RUN_ID"):
        mlflow.set_experiment(name)


@contextlib.contextmanager
def study_run(
    study: str, *, experiment: str | None, params: Mapping[str, str], tags: Mapping[str, str]
) -> Iterator[mlflow.ActiveRun]:
    """The parent run of a study.

    Outside any run it starts one (inside `mlflow run` that attaches to the project's run); inside an
    active run it is nested under it.
    """
    if experiment and mlflow.active_run() is None:
        set_experiment(experiment)
    nested = mlflow.active_run() is not None
    with mlflow.start_run(run_name=study, nested=nested) as run:
        mlflow.set_tags({TAG_STUDY: study, TAG_ROLE: "study", **tags})
        mlflow.log_params(dict(params))
        yield run


@contextlib.contextmanager
def attempt_run(study: str | None, attempt_name: str, runtime: str) -> Iterator[mlflow.ActiveRun]:
    """A run for one attempt, nested under the active run if there is one.

    An exception inside marks the run FAILED with the error text before it propagates.
    """
    nested = mlflow.active_run() is not None
    run = mlflow.start_run(run_name=attempt_name, nested=nested)
    tags = {TAG_ATTEMPT: attempt_name, TAG_RUNTIME: runtime, TAG_ROLE: "attempt"}
    if study:
        tags[TAG_STUDY] = study
    mlflow.set_tags(tags)
    try:
        yield run
    except BaseException as e:
        log_failure(e)
        mlflow.end_run(status="FAILED")
        raise
    else:
        mlflow.end_run(status="FINISHED")


def log_failure(error: BaseException) -> None:
    """Records an error on the active run: status tag, error text tag and the traceback as a file."""
    text = "".join(traceback.format_exception(error))
    mlflow.set_tags({TAG_STATUS: "failed", TAG_ERROR: f"{type(error).__name__}: {error}"[:_MAX_TAG_CHARS]})
    mlflow.log_text(text, "error.txt")


def log_attempt_result(
    result: AttemptResult,
    artifacts: AttemptArtifacts,
    *,
    params: Mapping[str, str],
    metrics: Mapping[str, float],
    log_model: bool = True,
) -> None:
    """Logs a measured attempt on the active run: params, metrics, tables, charts, profile, model."""
    attempt = result.attempt
    mlflow.log_params({k: str(v)[:6000] for k, v in params.items()})
    mlflow.log_metrics(_clean_metrics(metrics))
    status = "ok" if result.diff is None or result.diff.passed else "diff_failed"
    tags = {TAG_STATUS: status}
    if result.diff is not None:
        tags[TAG_DIFF] = "passed" if result.diff.passed else "failed"
    if attempt.description:
        tags["mlflow.note.content"] = attempt.description
    mlflow.set_tags(tags)
    mlflow.log_artifacts(str(artifacts.folder))
    for name, table in artifacts.tables.items():
        mlflow.log_table(_json_safe(table), artifact_file=f"tables/{name}.json")
    if result.profile_path is not None:
        mlflow.log_artifact(str(result.profile_path), "profile")
    if result.optimized_model_path is not None:
        mlflow.log_artifact(str(result.optimized_model_path), "profile")
    if log_model:
        _log_model(result)


def op_metrics(summary: pd.DataFrame) -> dict[str, float]:
    """`op.<OpType>.{total_us,calls,pct,us_per_run}` from a per-op-type summary."""
    metrics = {}
    names = list(summary[C.KEY])
    for column, suffix in ((C.TOTAL_US, "total_us"), (C.CALLS, "calls"), (C.PCT, "pct"), (C.US_PER_RUN, "us_per_run")):
        keys = metric_keys("op", names, suffix)
        metrics.update({keys[k]: float(v) for k, v in zip(names, summary[column])})
    return metrics


def _clean_metrics(metrics: Mapping[str, float]) -> dict[str, float]:
    return {sanitize_key(k) if sanitize_key(k) != k else k: float(v) for k, v in metrics.items()}


def _json_safe(table: pd.DataFrame) -> pd.DataFrame:
    # log_table writes JSON: nullable ints and NaN become None
    return table.astype(object).where(table.notna(), None)


def _log_model(result: AttemptResult) -> None:
    model = result.attempt.load()
    if _ort_can_load(model):
        # No input_example: it would make MLflow load and run the model once more.
        mlflow.onnx.log_model(
            onnx_model=_copy_model(model),
            name="model",
            signature=_signature(model),
            pip_requirements=_pip_requirements(),
            onnx_execution_providers=["CPUExecutionProvider"],
        )
    else:
        # The onnx flavor's pyfunc would fail on an op ORT does not know: keep the file as is.
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "model.onnx"
            onnx.save(model, str(path))
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


def _copy_model(model: onnx.ModelProto) -> onnx.ModelProto:
    # log_model moves large tensors to external data by mutating the proto it is given.
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    return copy


def _ort_can_load(model: onnx.ModelProto) -> bool:
    local = {(f.domain, f.name) for f in model.functions}
    return all(
        n.domain in _STANDARD_DOMAINS or (n.domain, n.op_type) in local for n in model.graph.node
    )


def _pip_requirements() -> list[str]:
    from importlib import metadata

    return [f"{p}=={metadata.version(p)}" for p in ("onnx", "onnxruntime")]


def log_study_summary(rows: list[dict[str, object]], *, metrics: Mapping[str, float], best: str | None) -> None:
    """Logs the table of a study's attempts, and the best attempt that passed its check, on the study run."""
    mlflow.set_tag(TAG_BEST, best or "none passed")
    table = pd.DataFrame(rows)
    if not table.empty:
        mlflow.log_table(_json_safe(table), artifact_file="study/attempts.json")
        mlflow.log_text(table.to_csv(index=False), "study/attempts.csv")
    mlflow.log_metrics(_clean_metrics(metrics))
