"""What an attempt's run carries: params, metrics, tags and files, assembled into an `AttemptRecord`."""

from __future__ import annotations

import gzip
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path

import onnx
import pandas as pd

from tracker.base.keys import TAG_DIFF, TAG_DISTURBED, TAG_STATUS, TAG_VERDICT, metric_keys
from tracker.base.memory import MIB
from tracker.base.vocabulary import Verdict
from tracker.measure.attempt import Attempt, AttemptResult, MeasureConfig
from tracker.measure.environment import fingerprint
from tracker.measure.graph_stats import diff_graphs
from tracker.measure.runtimes.runtime import get_runtime
from tracker.measure.schema import speedup_metrics
from tracker.measure.timing.speedup import BASELINE_SPEEDUP, Speedup
from tracker.profile import columns as C
from tracker.report.rows import (
    AttemptRow,
    attempt_status,
    failed_row,
    row_from_content,
    runtime_baselines,
)
from tracker.run.artifacts import AttemptArtifacts
from tracker.run.record import AttemptRecord


def fill_record(
    record: AttemptRecord,
    result: AttemptResult,
    artifacts: AttemptArtifacts,
    config: MeasureConfig,
    baseline: AttemptResult,
    workdir: Path,
    *,
    log_model: bool,
) -> None:
    """Puts a measured attempt's params, metrics, tags, tables, files and model into `record`."""
    attempt = result.attempt
    record.params.update(measured_params(result, config))
    record.metrics = measured_metrics(result, baseline, artifacts.tables)
    record.feeds = result.feeds
    record.tags = attempt_tags(result)
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


def attempt_tags(result: AttemptResult) -> dict[str, str]:
    """The tags a measured attempt's run carries: its status, check, verdict and what disturbed it."""
    passed = None if result.diff is None else bool(result.diff.passed)
    tags: dict[str, str] = {TAG_STATUS: attempt_status(failed=False, diff_passed=passed)}
    if passed is not None:
        tags[TAG_DIFF] = "passed" if passed else "failed"
    if result.verdict is not None:
        tags[TAG_VERDICT] = result.verdict
    if result.disturbed_steps:
        tags[TAG_DISTURBED] = ",".join(result.disturbed_steps)
    return tags


def carried_speedup(result: AttemptResult) -> Speedup | None:
    """The speed-up an attempt carries: the one measured against its baseline, `BASELINE_SPEEDUP` for a
    baseline itself, else None."""
    if result.speedup is not None:
        return result.speedup
    return BASELINE_SPEEDUP if result.verdict == Verdict.BASELINE else None


def rows_from_results(
    results: Sequence[AttemptResult],
    *,
    failures: Mapping[str, str] | None = None,
    skip_runs: int = 0,
    tables: bool = True,
) -> list[AttemptRow]:
    """Rows of a study's attempts as measured in this process (`Study.results`, `Study.failures`): each built from
    the metrics and tags its run gets (`measured_metrics`, `attempt_tags`) by `row_from_content`, as a row read
    back from MLflow is.

    Args:
        results: the attempts, in order; each runtime's baseline is `runtime_baselines`'.
        failures: attempts that failed before they had a model, name -> error text.
        skip_runs: warm-up runs left out of the per-op times (the study's `MeasureConfig.skip_runs`).
        tables: fill `ops_by_op` and `graph_diff` (the report's per-op tables); the other fields do not
            depend on it.
    """
    baselines = runtime_baselines(results)
    rows = []
    for r in results:
        name, runtime = r.attempt.name, r.attempt.runtime
        if not r.ok:
            rows.append(failed_row(name, r.error or "failed", runtime=runtime, run_id=r.run_id))
            continue
        base = baselines.get(runtime)
        per_op = {}
        if tables and r.profile is not None:
            per_op["ops_by_op"] = r.summary(by="op", skip_runs=skip_runs)
        if tables and base is not None and base.graph and r.graph:
            per_op["graph_diff"] = diff_graphs(base.graph, r.graph)
        rows.append(row_from_content(name, metrics=measured_metrics(r, base, {}), tags=attempt_tags(r),
                                     runtime=runtime, run_id=r.run_id, tables=per_op))
    rows += [failed_row(name, error) for name, error in (failures or {}).items()]
    return rows


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
    params.update(get_runtime(attempt.runtime).params(attempt))
    params.update(attempt.params)
    return params


def measured_params(result: AttemptResult, config: MeasureConfig) -> dict[str, str]:
    params = {**config.params(), **fingerprint()}
    if result.graph is not None:
        params.update(result.graph.params())
    if result.diff is not None:
        params.update(result.diff.params())
    if result.feeds is not None and result.feeds.nonfinite:  # NaN at the same place on both sides counts as equal
        params["feeds.nonfinite"] = str(result.feeds.nonfinite)
    params.update(result.attempt.params)
    return params


def measured_metrics(result: AttemptResult, baseline: AttemptResult | None, tables: dict) -> dict[str, float]:
    metrics: dict[str, float] = {}
    if result.session_create_ms is not None:
        metrics["session.create_ms"] = result.session_create_ms
    if result.first_run_ms is not None:
        metrics["latency.first_run_ms"] = result.first_run_ms
    if result.session_bytes is not None:
        metrics["memory.session_mb"] = result.session_bytes / MIB
    if result.latency is not None:
        metrics.update(result.latency.metrics())
    if result.overhead_ratio is not None:
        metrics["profile.overhead_ratio"] = result.overhead_ratio
    if result.profile is not None:
        metrics["profile.runs"] = float(result.profile.run_count)
        metrics["profile.kernel_events"] = float(len(result.profile.events))
    if baseline is not None and baseline.latency is not None and result.latency is not None:
        metrics["latency.speedup_vs_baseline"] = baseline.latency.p50_ms / result.latency.p50_ms
    speedup = carried_speedup(result)
    if speedup is not None:
        metrics.update(speedup_metrics(speedup))
    metrics.update({f"measure.other_load.{step}": load for step, load in result.cpu_load.items()})
    metrics["measure.disturbed"] = float(bool(result.disturbed_steps))
    for label, latency in result.latencies.items():
        metrics.update(latency.metrics(prefix=f"latency.{label}"))
        if baseline is not None and label in baseline.latencies:
            metrics[f"latency.{label}.speedup_vs_baseline"] = baseline.latencies[label].p50_ms / latency.p50_ms
    if result.diff is not None:
        metrics.update(result.diff.metrics())
    if result.graph is not None:
        metrics.update(result.graph.metrics())
        if baseline is not None and baseline.graph is not None:
            metrics["graph.node_delta"] = float(result.graph.node_count - baseline.graph.node_count)
    if "graph_diff" in tables:
        metrics.update(graph_delta_metrics(tables["graph_diff"]))
    if "ops_by_op" in tables:
        metrics.update(op_metrics(tables["ops_by_op"]))
    if result.roofline is not None:
        metrics.update(result.roofline.metrics())
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


def op_metrics(summary: pd.DataFrame) -> dict[str, float]:
    """`op.<OpType>.{total_us,calls,pct,us_per_run}` from a per-op-type summary."""
    metrics = {}
    names = list(summary[C.KEY])
    for column, suffix in ((C.TOTAL_US, "total_us"), (C.CALLS, "calls"), (C.PCT, "pct"), (C.US_PER_RUN, "us_per_run")):
        keys = metric_keys("op", names, suffix)
        metrics.update({keys[k]: float(v) for k, v in zip(names, summary[column])})
    return metrics
