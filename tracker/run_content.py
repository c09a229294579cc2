"""What an attempt's run carries: params, metrics, tags and files, assembled into an `AttemptRecord`."""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import onnx

from tracker.artifacts import AttemptArtifacts
from tracker.keys import (
    STATUS_DIFF_FAILED,
    STATUS_FAILED,
    STATUS_OK,
    TAG_DIFF,
    TAG_DISTURBED,
    TAG_STATUS,
    TAG_VERDICT,
    metric_keys,
    op_metrics,
)
from tracker.measure.attempt import Attempt, AttemptResult, MeasureConfig
from tracker.measure.environment import fingerprint
from tracker.measure.speedup import BASELINE_SPEEDUP
from tracker.record import AttemptRecord


def fill_record(
    record: AttemptRecord,
    result: AttemptResult,
    artifacts: AttemptArtifacts,
    config: MeasureConfig,
    reference: AttemptResult,
    workdir: Path,
    *,
    log_model: bool,
) -> None:
    """Puts a measured attempt's params, metrics, tags, tables, files and model into `record`."""
    attempt = result.attempt
    record.params.update(measured_params(result, config))
    record.metrics = measured_metrics(result, reference, artifacts.tables)
    record.tags = {TAG_STATUS: STATUS_OK if result.diff.passed else STATUS_DIFF_FAILED,
                   TAG_DIFF: "passed" if result.diff.passed else "failed",
                   TAG_VERDICT: result.verdict}
    if result.disturbed_steps:
        record.tags[TAG_DISTURBED] = ",".join(result.disturbed_steps)
    if attempt.description:
        record.tags["mlflow.note.content"] = attempt.description
    record.artifact_dir = str(artifacts.folder)
    record.tables = list(artifacts.tables)
    files = [result.profile_path and compress_if_large(result.profile_path), result.optimized_model_path]
    record.files = {str(p): "profile" for p in files if p is not None}
    if log_model:
        if isinstance(attempt.model, onnx.ModelProto):
            path = workdir / "model" / "model.onnx"
            path.parent.mkdir(parents=True, exist_ok=True)
            onnx.save(attempt.model, str(path))
        else:
            path = attempt.model
        record.model_path = str(path)
        record.model_flavor = result.ort_loadable


GZIP_ABOVE_BYTES = 16 * 2**20


def compress_if_large(path: Path) -> Path:
    """A raw profile above GZIP_ABOVE_BYTES is logged gzip-compressed (JSON traces shrink ~10x);
    `tracker summarize` and `parse_profile` read both."""
    if path.stat().st_size <= GZIP_ABOVE_BYTES:
        return path
    target = path.with_name(path.name + ".gz")
    with open(path, "rb") as source, gzip.open(target, "wb", compresslevel=6) as sink:
        shutil.copyfileobj(source, sink, length=2**20)
    return target


def attempt_params(attempt: Attempt) -> dict[str, str]:
    params = {"attempt.name": attempt.name, "attempt.runtime": attempt.runtime}
    if attempt.runtime == "onnxruntime":
        params.update(attempt.session.params())
    else:
        params["reference.new_ops"] = ",".join(f"{c.op_domain}:{c.__name__}" for c in attempt.new_ops) or "none"
    params.update(attempt.params)
    return params


def measured_params(result: AttemptResult, config: MeasureConfig) -> dict[str, str]:
    params = {**config.params(), **fingerprint()}
    if result.graph is not None:
        params.update(result.graph.params())
    if result.diff is not None:
        params.update(result.diff.params())
    params.update(result.attempt.params)
    return params


def measured_metrics(result: AttemptResult, reference: AttemptResult | None, tables: dict) -> dict[str, float]:
    metrics: dict[str, float] = {}
    if result.latency is not None:
        metrics.update(result.latency.metrics())
    if result.overhead_ratio is not None:
        metrics["profile.overhead_ratio"] = result.overhead_ratio
    if result.profile is not None:
        metrics["profile.runs"] = float(result.profile.run_count)
        metrics["profile.kernel_events"] = float(len(result.profile.events))
    if reference is not None and reference.latency is not None and result.latency is not None:
        metrics["latency.speedup_vs_baseline"] = reference.latency.p50_ms / result.latency.p50_ms
    if result.speedup is not None:
        metrics.update(result.speedup.metrics())
    elif reference is result:
        metrics.update(BASELINE_SPEEDUP.metrics())
    metrics.update({f"measure.other_load.{step}": load for step, load in result.cpu_load.items()})
    metrics["measure.disturbed"] = float(bool(result.disturbed_steps))
    for label, latency in result.latencies.items():
        metrics.update(latency.metrics(prefix=f"latency.{label}"))
        if reference is not None and label in reference.latencies:
            metrics[f"latency.{label}.speedup_vs_baseline"] = reference.latencies[label].p50_ms / latency.p50_ms
    if result.diff is not None:
        metrics.update(result.diff.metrics())
    if result.graph is not None:
        metrics.update(result.graph.metrics())
        if reference is not None and reference.graph is not None:
            metrics["graph.node_delta"] = float(result.graph.node_count - reference.graph.node_count)
    if "graph_diff" in tables:
        metrics.update(graph_delta_metrics(tables["graph_diff"]))
    if "ops_by_op" in tables:
        metrics.update(op_metrics(tables["ops_by_op"]))
    metrics.update(result.extra_metrics)
    metrics.update(result.attempt.metrics)
    return metrics


def graph_delta_metrics(graph_diff) -> dict[str, float]:
    """`graph.delta.<OpType>` for every op type whose node count changed, and `graph.reshape_removed`."""
    from tracker.measure.graph_stats import DELTA, OP_TYPE

    changed = graph_diff[graph_diff[DELTA] != 0]
    keys = metric_keys("graph.delta", list(changed[OP_TYPE]), "nodes")
    metrics = {keys[op]: float(d) for op, d in zip(changed[OP_TYPE], changed[DELTA])}
    reshape = graph_diff.loc[graph_diff[OP_TYPE] == "Reshape", DELTA]
    metrics["graph.reshape_removed"] = float(max(0, -int(reshape.iloc[0]))) if len(reshape) else 0.0
    return metrics


def summary_row(result: AttemptResult, reference: AttemptResult | None) -> dict[str, object]:
    """One row of the study's attempts table."""
    speedup = None
    if result.latency is not None and reference is not None and reference.latency is not None:
        speedup = reference.latency.p50_ms / result.latency.p50_ms
    return {
        "attempt": result.attempt.name,
        "runtime": result.attempt.runtime,
        "status": (STATUS_FAILED if not result.ok
                   else STATUS_OK if result.diff is None or result.diff.passed else STATUS_DIFF_FAILED),
        "verdict": result.verdict,
        "speedup": result.speedup.speedup if result.speedup else None,
        "speedup_ci_low": result.speedup.ci_low if result.speedup else None,
        "speedup_ci_high": result.speedup.ci_high if result.speedup else None,
        "speedup_mde": result.speedup.mde if result.speedup else None,
        "disturbed": ",".join(result.disturbed_steps) or None,
        "p50_ms": result.latency.p50_ms if result.latency else None,
        "speedup_vs_baseline": speedup,
        "diff_max_abs": result.diff.max_abs if result.diff else None,
        "diff_passed": result.diff.passed if result.diff else None,
        "node_count": result.graph.node_count if result.graph else None,
        "size_bytes": result.graph.size_bytes if result.graph else None,
        "run_id": result.run_id,
        "error": result.error,
    }
