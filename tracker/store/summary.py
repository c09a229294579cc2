"""Writing a study's end to the tracking store: its summary and report on the study run, the best attempt's logged
model marked, and a search's candidates that were only screened as light runs beside its attempts.

What the summary holds is decided by `tracker.summary`; the runs written while the study runs are
`tracker.store.write`'s.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import mlflow
import pandas as pd
from mlflow.entities import Metric, Run, RunTag

from tracker.base.keys import NO_BEST, ROLE_CANDIDATE, TAG_ATTEMPT, TAG_BEST, TAG_BEST_MODEL, TAG_MODEL_ID, TAG_ROLE
from tracker.base.termination import defers_sigterm
from tracker.store.runs import create_run, end_run, end_run_quietly
from tracker.store.write import clean_metrics, json_safe, log_batch


@defers_sigterm
def log_candidate_runs(candidates: Sequence[Mapping[str, Mapping]], *, study_run: Run) -> list[str]:
    """Logs each candidate of a search that was timed but not measured in full as a light run nested under the
    study run: its `params`, `metrics` and `tags` (`tracker.role` = "candidate", so `tracker compare` and the study
    report, which read attempt runs, leave them out). Returns the run ids."""
    ids = []
    for candidate in candidates:
        tags = {**candidate["tags"], TAG_ROLE: ROLE_CANDIDATE}
        run = create_run(str(tags.get(TAG_ATTEMPT, "candidate")), experiment_id=study_run.info.experiment_id,
                         parent_run_id=study_run.info.run_id)
        try:
            log_batch(run.info.run_id, params=candidate["params"], tags=tags)
            mlflow.log_metrics(clean_metrics(candidate["metrics"]), run_id=run.info.run_id)
        except BaseException:
            end_run_quietly(run.info.run_id, "FAILED")
            raise
        end_run(run.info.run_id, "FINISHED")
        ids.append(run.info.run_id)
    return ids


@defers_sigterm
def log_study_summary(run_id: str, *, metrics: Mapping[str, float], best: str | None,
                      tags: Mapping[str, str] | None = None) -> None:
    """Logs on the study run `run_id` (by its id: never on whichever run is active) its metrics, the best attempt that
    passed its check (`tracker.best_attempt`) and other tags of the summary (e.g. each scenario's best,
    `tracker.report.scenarios.scenario_tags`).

    The table of its attempts is the report's `report/attempts.json` (`log_study_report`).
    """
    now = int(time.time() * 1000)
    mlflow.MlflowClient().log_batch(
        run_id, metrics=[Metric(key, value, now, 0) for key, value in clean_metrics(metrics).items()],
        tags=[RunTag(key, value) for key, value in {**(tags or {}), TAG_BEST: best or NO_BEST}.items()])
    if best:
        _mark_best_model(run_id, best)


def _mark_best_model(study_run_id: str, best: str) -> None:
    """Tags the logged model of the study's best attempt `tracker.best=true`, so the Models tab marks it; a study
    whose best has no logged model (a plain file, `log_models=False`) has nothing to mark."""
    client = mlflow.MlflowClient()
    experiment = client.get_run(study_run_id).info.experiment_id
    children = client.search_runs([experiment], filter_string=f"tags.mlflow.parentRunId = '{study_run_id}'",
                                  max_results=5000)
    for run in children:
        model_id = run.data.tags.get(TAG_MODEL_ID)
        if run.data.tags.get(TAG_ATTEMPT) == best and run.data.tags.get(TAG_ROLE) != ROLE_CANDIDATE and model_id:
            client.set_logged_model_tags(model_id, {TAG_BEST_MODEL: "true"})


@defers_sigterm
def log_study_report(run_id: str, html: str | Path, tables: Mapping[str, pd.DataFrame]) -> None:
    """Logs the study report on the study run `run_id`: `report/<html file name>` and each table as
    `report/<name>.json` with `mlflow.log_table`, so the UI's table view shows them."""
    mlflow.MlflowClient().log_artifact(run_id, str(html), "report")
    for name, table in tables.items():
        if not table.empty:  # an empty table (no graph change) has nothing to show in the UI
            mlflow.log_table(json_safe(table), artifact_file=f"report/{name}.json", run_id=run_id)
