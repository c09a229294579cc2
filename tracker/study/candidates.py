"""What a study makes of a registry entry before measuring it: the candidate (made, or taken from what a search made
of the same source), and the attempt it is measured as, with what the entry did (its metrics and params) and a
chain's lineage."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import onnx

from tracker.base.keys import TAG_PARENT_ATTEMPT, TAG_PIPELINE
from tracker.base.model_io import save_model
from tracker.base.steps import StepTimes
from tracker.base.vocabulary import Kind
from tracker.measure.accuracy.task_diff import TaskTolerance, tolerance_for
from tracker.measure.attempt import Attempt
from tracker.measure.runtimes.ort_runtime import SessionConfig
from tracker.optimize import Candidate, Chain, Context, Entry
from tracker.search.cache import MadeModels

PREPARED = "prepared"  # the work folder's pre-processed sources, which entries' variants share (`Context.work`)


def make_candidate(entry: Entry, source: onnx.ModelProto | str | Path, *, name: str, work: Path, context: Context,
                   made: MadeModels, graph_of: Callable[[Path], onnx.ModelProto],
                   steps: StepTimes) -> tuple[Candidate, float, Path]:
    """What `entry` makes of `source` for the attempt `name` (under `work/name/optimized`), and the seconds it took
    (the study's `steps`' "optimize"); what a search already made of the same file (`made`) is taken, not made again.
    Returns the candidate, its seconds and the source's path (a model in memory is saved under `work/name` first)."""
    # A session entry makes nothing: no optimize step in the study's time table.
    with nullcontext() if entry.kind == Kind.SESSION else steps.step("optimize"):
        source_path = Path(source) if not isinstance(source, onnx.ModelProto) else save_model(source, work / name)
        graph = source if isinstance(source, onnx.ModelProto) else graph_of(source_path)
        taken = None if isinstance(source, onnx.ModelProto) else made.take(source_path, entry)
        start = time.perf_counter()
        candidate = taken[0] if taken else entry(source_path, work / name / "optimized", context, graph=graph)
        return candidate, taken[1] if taken else time.perf_counter() - start, source_path


def attempt_of(entry: Entry, candidate: Candidate, seconds: float, *, name: str, source: onnx.ModelProto | str | Path,
               source_path: Path, runtime: str, session: SessionConfig | None,
               tolerance: TaskTolerance | Mapping[str, TaskTolerance], fields: dict[str, Any]) -> Attempt:
    """The attempt `candidate` is measured as: the tolerance its precision picks, its session on top of `session`, what
    `entry` did in its metrics and params; `fields` (other `Attempt` fields) replace the candidate's, their `params`
    and `metrics` added to its."""
    model = source if candidate.path == source_path else candidate.path  # a session entry: its source as given
    metrics, params = candidate_content(entry, candidate, seconds)
    return Attempt(
        name=name,
        model=model if isinstance(model, onnx.ModelProto) else Path(model),
        runtime=runtime,
        session=candidate.session_on(session or SessionConfig()),
        new_ops=fields.pop("new_ops", candidate.new_ops),
        tolerance=tolerance_for(tolerance, candidate.precision),
        description=fields.pop("description", "; ".join(candidate.notes)),
        metrics={**metrics, **fields.pop("metrics", {})},
        params={**params, **fields.pop("params", {})},
        **fields,
    )


def candidate_content(entry: Entry, candidate: Candidate, seconds: float) -> tuple[dict[str, float], dict[str, str]]:
    """The metrics and params saying what an entry did. A session entry made no model: it says it in its
    session params, which every attempt logs."""
    if entry.kind == Kind.SESSION:
        return {}, dict(candidate.params)
    metrics = {f"fusion.{op}": float(n) for op, n in candidate.fusions.items()}
    metrics["optimize.seconds"] = seconds
    if candidate.fully_optimized is not None:
        metrics["fusion.fully_optimized"] = float(candidate.fully_optimized)
    params = {**candidate.params, "precision": candidate.precision, "applied": str(candidate.applied)}
    return metrics, params


def lineage_tags(entry: Entry) -> dict[str, str]:
    """A chain's lineage: `tracker.pipeline` (its steps) and `tracker.parent_attempt` (every step but the last)."""
    if not isinstance(entry, Chain):
        return {}
    return {TAG_PIPELINE: entry.name, TAG_PARENT_ATTEMPT: entry.parent}
