"""Reads studies back from a tracking server over HTTP and checks every run, metric and artifact arrived.

Each artifact listed by the server is also compared (path and size) with the file the server stored in
its artifacts folder, so that "listed" means "stored whole", and nothing is stored that is not listed.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, fields
from pathlib import Path

from mlflow import MlflowClient
from mlflow.entities import LoggedModelStatus

import tracker

# Keys every measured attempt carries, so the MLflow UI can compare them.
COMMON_METRICS = {
    "latency.p50_ms", "latency.p90_ms", "latency.mean_ms", "latency.std_ms", "latency.runs",
    "latency.speedup_vs_baseline", "profile.overhead_ratio", "diff.max_abs", "diff.max_rel", "diff.passed",
    "graph.node_count", "model.size_bytes",
}
COMMON_PARAMS = {"attempt.name", "attempt.runtime", "ort.graph_optimization_level", "measure.profile_runs",
                 "model.opsets", "diff.tolerance"}
# The README's table: profile, per-op tables (.csv, and .json as MLflow tables), charts, graph statistics.
ATTEMPT_ARTIFACTS = {
    "profile/ort_profile.json", "charts/profile.html", "graph.json",
    *(f"tables/ops_by_{view}.{ext}" for view in ("op", "node", "provider") for ext in ("csv", "json")),
}
STUDY_ARTIFACTS = {"report/attempts.json", "report/study_report.html"}
_SCHEME = "mlflow-artifacts:/"


@dataclass
class Counts:
    """What a read-back verified."""

    runs: int = 0
    metrics: int = 0
    params: int = 0
    artifacts: int = 0
    artifact_bytes: int = 0
    logged_models: int = 0
    model_files: int = 0

    def __iadd__(self, other: Counts) -> Counts:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))
        return self


def listed_artifacts(client: MlflowClient, run_id: str, path: str | None = None) -> dict[str, int]:
    """Every file of a run, recursively, as the server lists it: path -> size."""
    files = {}
    for info in client.list_artifacts(run_id, path):
        files.update(listed_artifacts(client, run_id, info.path) if info.is_dir else {info.path: info.file_size})
    return files


def listed_model_artifacts(client: MlflowClient, model_id: str, path: str | None = None) -> dict[str, int]:
    files = {}
    for info in client.list_logged_model_artifacts(model_id, path):
        inner = listed_model_artifacts(client, model_id, info.path) if info.is_dir else {info.path: info.file_size}
        files.update(inner)
    return files


def stored_files(artifacts_root: Path | None, artifact_uri: str) -> dict[str, int]:
    """The files kept for `artifact_uri`: under the server's artifacts folder for `mlflow-artifacts:/...`
    (proxied artifacts), else at the local path itself (an embedded sqlite store)."""
    if artifact_uri.startswith(_SCHEME):
        folder = artifacts_root / artifact_uri[len(_SCHEME):].lstrip("/")
    else:
        folder = Path(artifact_uri.removeprefix("file://"))
    return {p.relative_to(folder).as_posix(): p.stat().st_size for p in folder.rglob("*") if p.is_file()}


def verify_experiment(
    client: MlflowClient, artifacts_root: Path | None, experiment: str, expected: dict[str, list[str]],
    p50_by_run: dict[str, float] | None = None,
) -> Counts:
    """Checks an experiment holds exactly the studies `expected` ({study: [attempt names]}), each attempt
    nested once under its study with its metrics, params, artifacts and logged model; no run twice.

    `p50_by_run` ({attempt run id: latency.p50_ms} as the logging process saw it) is compared too.
    """
    exp = client.get_experiment_by_name(experiment)
    assert exp is not None, f"experiment {experiment} missing"
    runs = client.search_runs([exp.experiment_id], max_results=1000)
    run_ids = [r.info.run_id for r in runs]
    assert len(run_ids) == len(set(run_ids))
    assert len(runs) == len(expected) + sum(len(a) for a in expected.values()), sorted(r.info.run_name for r in runs)
    studies = [r for r in runs if r.data.tags.get("tracker.role") == "study"]
    assert sorted(r.info.run_name for r in studies) == sorted(expected)

    counts = Counts()
    attempt_runs = {}
    for study in studies:
        name = study.info.run_name
        assert study.info.status == "FINISHED"
        assert "mlflow.parentRunId" not in study.data.tags
        assert study.data.metrics["study.attempts"] == len(expected[name])
        assert study.data.metrics["study.failed"] == 0
        counts += _verify_files(client, artifacts_root, study, STUDY_ARTIFACTS)
        children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == study.info.run_id]
        assert sorted(r.info.run_name for r in children) == sorted(expected[name])
        for run in children:
            assert run.data.tags["tracker.study"] == name
            counts += _verify_attempt(client, artifacts_root, run, p50_by_run)
            attempt_runs[run.info.run_id] = run
        counts.runs += 1 + len(children)

    models = list(client.search_logged_models(experiment_ids=[exp.experiment_id], max_results=1000))
    assert sorted(m.source_run_id for m in models) == sorted(attempt_runs), "one logged model per attempt run"
    for m in models:
        assert m.status == LoggedModelStatus.READY, (m.model_id, m.status)
        listed = listed_model_artifacts(client, m.model_id)
        assert "model.onnx" in listed and "MLmodel" in listed, sorted(listed)
        assert listed == stored_files(artifacts_root, m.artifact_location)
        counts.logged_models += 1
        counts.model_files += len(listed)
    return counts


def _verify_attempt(
    client: MlflowClient, artifacts_root: Path | None, run, p50_by_run: dict[str, float] | None
) -> Counts:
    assert run.info.status == "FINISHED", run.data.tags.get("tracker.error")
    assert run.data.tags["tracker.role"] == "attempt"
    assert run.data.tags["tracker.status"] == "ok"
    assert set(run.data.metrics) >= COMMON_METRICS, sorted(COMMON_METRICS - set(run.data.metrics))
    assert set(run.data.params) >= COMMON_PARAMS, sorted(COMMON_PARAMS - set(run.data.params))
    assert run.data.params["attempt.name"] == run.info.run_name
    # Logged once, not retried into a second point.
    assert len(client.get_metric_history(run.info.run_id, "latency.p50_ms")) == 1
    if p50_by_run is not None:
        assert run.data.metrics["latency.p50_ms"] == p50_by_run[run.info.run_id]
    counts = _verify_files(client, artifacts_root, run, ATTEMPT_ARTIFACTS)
    with tempfile.TemporaryDirectory() as tmp:
        profile = tracker.parse_profile(client.download_artifacts(run.info.run_id, "profile/ort_profile.json", tmp))
        table = json.loads(Path(client.download_artifacts(run.info.run_id, "tables/ops_by_op.json", tmp)).read_text())
    assert len(profile.events) > 0 and table["data"], "profile and per-op table came back empty"
    counts.metrics += len(run.data.metrics)
    counts.params += len(run.data.params)
    return counts


def _verify_files(client: MlflowClient, artifacts_root: Path | None, run, required: set[str]) -> Counts:
    listed = listed_artifacts(client, run.info.run_id)
    assert required <= set(listed), f"{run.info.run_name}: missing {sorted(required - set(listed))}"
    assert listed == stored_files(artifacts_root, run.info.artifact_uri), run.info.run_name
    assert all(size > 0 for size in listed.values()), listed
    return Counts(artifacts=len(listed), artifact_bytes=sum(listed.values()))
