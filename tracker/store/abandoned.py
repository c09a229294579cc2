"""Runs a killed process left RUNNING: each study and attempt run records the process that writes it (host, pid,
start time: `process_tags`). The next study in the experiment, `tracker compare` and `tracker upload` end KILLED
each RUNNING run whose process ended on this host, with why in `tracker.killed`; runs of other hosts, and of
processes still alive, are left alone."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence

import mlflow

from tracker.base.files import process_gone, this_process
from tracker.base.keys import TAG_HOST, TAG_KILLED, TAG_PID, TAG_PID_STARTED
from tracker.store import faults

logger = logging.getLogger(__name__)


def process_tags() -> dict[str, str]:
    """This process as a run's tags."""
    process = this_process()
    return {TAG_HOST: process["host"], TAG_PID: process["pid"], TAG_PID_STARTED: process["started_s"]}


def end_abandoned(runs: Iterable[tuple[str, str, Mapping[str, str]]], *, by: str) -> dict[str, str]:
    """Ends KILLED each of `runs` ((run id, status, tags)) that is RUNNING and whose process is gone from this host;
    returns run id -> why. `by` names who found it (e.g. "tracker compare"), for the tag and the log. A store that
    refuses is logged, never raised: this is housekeeping, the work that asked goes on."""
    ended = {}
    client = mlflow.MlflowClient()
    for run_id, status, tags in runs:
        owner = {"host": tags.get(TAG_HOST), "pid": tags.get(TAG_PID), "started_s": tags.get(TAG_PID_STARTED)}
        if status != "RUNNING" or not process_gone(owner):  # type: ignore[arg-type]
            continue
        why = f"process {owner['pid']} on {owner['host']} ended without ending this run (found by {by})"
        try:
            client.set_tag(run_id, TAG_KILLED, why)
            client.set_terminated(run_id, "KILLED")
        except Exception as e:  # housekeeping: the work that asked goes on
            logger.warning("run %s was left RUNNING (%s), and could not be ended KILLED (%s)", run_id, why,
                           faults.describe(e))
            continue
        logger.warning("run %s was left RUNNING: %s; it is now KILLED", run_id, why)
        ended[run_id] = why
    return ended


def end_abandoned_in(experiment_ids: Sequence[str], *, by: str) -> dict[str, str]:
    """`end_abandoned` over the RUNNING runs of `experiment_ids` written on this host. Housekeeping: a store that
    fails here is logged, never raised (the work that asked goes on)."""
    if not experiment_ids:
        return {}
    host = this_process()["host"].replace("'", "")
    try:
        runs = mlflow.MlflowClient().search_runs(
            list(experiment_ids), filter_string=f"attributes.status = 'RUNNING' and tags.`{TAG_HOST}` = '{host}'",
            max_results=1000)
        return end_abandoned(((r.info.run_id, r.info.status, r.data.tags) for r in runs), by=by)
    except Exception as e:
        logger.warning("could not look for runs a killed process left RUNNING (%s)", faults.describe(e))
        return {}
