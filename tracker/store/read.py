"""Reads studies back from the tracking store for `tracker compare`: runs, their tags, metrics and tables.

Writing runs is `tracker.store.write`'s; this module only reads, and hands back plain data (`FetchedRun`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import mlflow
import pandas as pd

from tracker.base.errors import TrackerError
from tracker.base.keys import ROLE_ATTEMPT, ROLE_STUDY, TAG_ROLE, TAG_STUDY, TAG_SUPERSEDED_BY
from tracker.base.redaction import redact_uri
from tracker.base.terminal import one_line
from tracker.measure.graph_stats import DELTA
from tracker.profile import columns as C
from tracker.store import abandoned

ATTEMPT_TABLES = ("ops_by_op", "graph_diff")  # per-attempt tables the study report shows
# The columns the report reads from each (True: numeric); a table without them is unreadable, not a crash.
TABLE_COLUMNS = {"ops_by_op": {C.KEY: False, C.US_PER_RUN: True}, "graph_diff": {C.OP_TYPE: False, DELTA: True}}


@dataclasses.dataclass(frozen=True)
class FetchedRun:
    """What `tracker compare` needs of one run, without MLflow types.

    Attributes:
        run_id, name, experiment_id: the run's identity.
        status: MLflow's run status ("FINISHED", "FAILED", "RUNNING", "KILLED", ...).
        start_time_ms: when the run started.
        metrics, tags: the run's latest metric values and its tags.
        tables: the run's `tables/<name>.json` tables among those asked for, by name.
        unreadable: "FILE: reason" for each of those that could not be read (damaged, of other columns, or gone
            while read): the run's other figures stand, the report goes without that table.
    """

    run_id: str
    name: str
    experiment_id: str
    status: str
    start_time_ms: int
    metrics: dict[str, float]
    tags: dict[str, str]
    tables: dict[str, pd.DataFrame] = dataclasses.field(default_factory=dict, repr=False)
    unreadable: tuple[str, ...] = ()


def find_study_run(experiment: str, study: str) -> str:
    """The id of the latest parent run of `study` (tags `tracker.study`, `tracker.role=study`).

    Raises:
        TrackerError: the experiment or the study does not exist in the tracking store.
    """
    client = mlflow.MlflowClient()
    found = client.get_experiment_by_name(experiment)
    if found is None:
        raise TrackerError(f"no experiment named {experiment!r} in {redact_uri(mlflow.get_tracking_uri())}")
    runs = client.search_runs(
        [found.experiment_id],
        filter_string=f"tags.`{TAG_STUDY}` = '{_quote(study)}' and tags.`{TAG_ROLE}` = '{ROLE_STUDY}'",
        order_by=["attributes.start_time DESC"], max_results=1,
    )
    if not runs:
        raise TrackerError(f"experiment {experiment!r} has no run of study {study!r} (tags {TAG_STUDY}={study}, "
                           f"{TAG_ROLE}={ROLE_STUDY})")
    return runs[0].info.run_id


def fetch_runs(run_ids: Sequence[str], *, tables: Sequence[str] = ATTEMPT_TABLES) -> list[FetchedRun]:
    """The runs `run_ids`, in that order, with their `tables/<name>.json` tables.

    Raises:
        TrackerError: a run does not exist.
    """
    client = mlflow.MlflowClient()
    runs = []
    for run_id in run_ids:
        try:
            runs.append(client.get_run(run_id))
        except mlflow.exceptions.MlflowException as e:
            raise TrackerError(f"no run {run_id!r} in {redact_uri(mlflow.get_tracking_uri())}: {e.message}") from None
    return [_fetched(client, run, tables) for run in runs]


def fetch_study_runs(
    study_run_id: str, *, tables: Sequence[str] = ATTEMPT_TABLES
) -> tuple[FetchedRun, list[FetchedRun]]:
    """A study's parent run and its attempt runs, oldest first.

    Runs replaced by `tracker upload` (tag `tracker.superseded_by`) are left out.

    Raises:
        TrackerError: the run does not exist, or it has no attempt runs.
    """
    client = mlflow.MlflowClient()
    (parent,) = fetch_runs([study_run_id], tables=())
    children = client.search_runs(
        [parent.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{_quote(study_run_id)}'",
        order_by=["attributes.start_time ASC"], max_results=5000,
    )
    # Runs a killed process left RUNNING are ended KILLED first, and read as such (`tracker.store.abandoned`).
    found = [(r.info.run_id, r.info.status, r.data.tags) for r in children]
    if abandoned.end_abandoned([(parent.run_id, parent.status, parent.tags), *found], by="tracker compare"):
        return fetch_study_runs(study_run_id, tables=tables)
    attempts = [r for r in children if r.data.tags.get(TAG_ROLE) == ROLE_ATTEMPT
                and TAG_SUPERSEDED_BY not in r.data.tags]
    if not attempts:
        studies = sorted(r.info.run_name for r in children if r.data.tags.get(TAG_ROLE) == ROLE_STUDY)
        hint = f"; its nested study runs are {studies}: pass one of them" if studies else ""
        raise TrackerError(f"run {study_run_id} ({parent.name}) has no attempt runs{hint}")
    return parent, [_fetched(client, r, tables) for r in attempts]


def _fetched(client, run, tables: Sequence[str]) -> FetchedRun:
    found, unreadable = {}, []
    if tables:
        try:
            present = {Path(a.path).name for a in client.list_artifacts(run.info.run_id, "tables")}
        except (mlflow.exceptions.MlflowException, OSError) as e:
            present = set()
            unreadable.append(f"tables/: {_why(e)}")
        wanted = [name for name in tables if f"{name}.json" in present]
        if wanted:
            import tempfile

            with tempfile.TemporaryDirectory(prefix="tracker-fetch-") as tmp, no_progress_bar():
                for name in wanted:
                    try:
                        path = client.download_artifacts(run.info.run_id, f"tables/{name}.json", tmp)
                        found[name] = _read_table(Path(path), TABLE_COLUMNS.get(name, {}))
                    except (mlflow.exceptions.MlflowException, OSError, ValueError, RecursionError) as e:
                        unreadable.append(f"tables/{name}.json: {_why(e)}")
    return FetchedRun(run_id=run.info.run_id, name=run.info.run_name or run.info.run_id,
                      experiment_id=run.info.experiment_id, status=run.info.status,
                      start_time_ms=int(run.info.start_time or 0), metrics=dict(run.data.metrics),
                      tags=dict(run.data.tags), tables=found, unreadable=tuple(unreadable))


def _why(error: BaseException) -> str:
    return one_line(str(error), 160) or type(error).__name__


def _read_table(path: Path, columns: dict[str, bool]) -> pd.DataFrame:
    """A `log_table` JSON (pandas "split" orient: `columns`, `data` rows), read by hand so that keys like "12" stay
    strings, holding `columns` (each True when it must be numeric).

    Raises:
        ValueError: the file is not such a table (saying what is wrong), or lacks a column.
    """
    content = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(content, dict) or not isinstance(content.get("columns"), list) \
            or not isinstance(content.get("data"), list):
        keys = f" with keys {sorted(map(str, content))[:5]}" if isinstance(content, dict) else ""
        raise ValueError(f"not a table: expected a JSON object with lists 'columns' and 'data', got "
                         f"{type(content).__name__}{keys}")
    names = content["columns"]
    if not all(isinstance(row, list) and len(row) == len(names) for row in content["data"]):
        raise ValueError(f"not a table: every row of 'data' must be a list of {len(names)} values")
    missing = [c for c in columns if c not in names]
    if missing:
        raise ValueError(f"no column {', '.join(missing)} (it has {', '.join(map(str, names[:8])) or 'none'})")
    frame = pd.DataFrame(content["data"], columns=names)
    for column in (c for c, numeric in columns.items() if numeric):
        pd.to_numeric(frame[column], errors="raise")  # ValueError naming the value
    return frame


@contextlib.contextmanager
def no_progress_bar() -> Iterator[None]:
    """Downloads inside draw no progress bar: MLflow draws one per download on stderr, and a CLI printing a table
    (or JSON for a CI comment) wants none."""
    from mlflow.environment_variables import MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR as flag

    before = os.environ.get(flag.name)
    os.environ[flag.name] = "false"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(flag.name, None)
        else:
            os.environ[flag.name] = before


def _quote(value: str) -> str:
    return value.replace("\\", "\\\\").replace("'", "\\'")
