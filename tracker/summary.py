"""The end of a study on its parent run: the summary (its rows' counts and bests, time per step) and the report; a
summary the tracking store does not take is kept in the outbox for `tracker upload`. And a search's candidates timed
only on the screen, as light runs beside its attempts."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from tracker.base.errors import TrackerError
from tracker.base.files import no_space_note
from tracker.base.steps import StepTimes
from tracker.measure.attempt import AttemptResult
from tracker.measure.costmodel.machine import MachinePeaks
from tracker.report.rows import AttemptRow, pick_best, study_counts
from tracker.report.scenarios import scenario_tags
from tracker.report.search import build_search_report
from tracker.report.study import build_study_report
from tracker.run.record import keep, save_summary
from tracker.search import SearchResult
from tracker.store import connect, faults
from tracker.store.summary import log_candidate_runs, log_study_report, log_study_summary

logger = logging.getLogger(__name__)


def log_end(rows: Callable[..., list[AttemptRow]], totals: StepTimes, wall: float, *, study: str, run_id: str,
            folder: Path, results: Sequence[AttemptResult], machine: MachinePeaks | None,
            search: SearchResult | None) -> None:
    """Logs the end of a study that did not fail on its run `run_id`: the time per step (`totals` over `wall` seconds,
    in the log too), the machine's roofs and the search's counts with the summary of its `rows()` (`log_summary`); once
    that is logged, the report with the rows' per-op tables (`log_report`, written under `folder`)."""
    logger.info("study %s: time per step (* the tracker's own)\n%s", study, totals.table(wall))
    metrics = {**totals.metrics(wall), **(machine.metrics() if machine else {}), **(search.metrics() if search else {})}
    if log_summary(rows(), metrics, study=study, run_id=run_id):
        log_report(rows(tables=True), folder, study=study, run_id=run_id, results=results, search=search)


def log_search_candidates(search: SearchResult, *, study: str, study_run) -> None:
    """Logs a search's candidates timed only on the screen as light runs under `study_run` (`log_candidate_runs`); the
    table on the study run holds the same rows, so losing these runs loses no figure: a failure is a warning."""
    try:
        log_candidate_runs(search.candidate_runs(study), study_run=study_run)
    except Exception as e:
        logger.warning("could not log the search's candidate runs (%s: %s); the study run's "
                       "report/search_candidates.json holds them", type(e).__name__, e)


def log_summary(rows: Sequence[AttemptRow], metrics: Mapping[str, float], *, study: str, run_id: str) -> bool:
    """Logs on the study run `run_id` `metrics`, the rows' counts, the best attempt (`pick_best`) and each scenario's
    best (`scenario_tags`). Returns whether it was logged: else it is kept in the outbox and the log says so."""
    metrics = {**study_counts(rows), **metrics}
    best, tags = pick_best(rows), scenario_tags(rows)
    try:
        connect.ensure_reachable()
        log_study_summary(run_id, metrics=metrics, best=best, tags=tags)
    except Exception as e:
        why = "could not log" if faults.is_outage(e) else "the tracking store refused"
        try:
            kept = keep(lambda root: save_summary({"metrics": metrics, "best": best, "tags": tags}, study=study,
                                                  parent_run_id=run_id, root=root), f"the summary of study {study}")
        except TrackerError as lost:
            logger.error("%s the summary of study %s (%s), and %s", why, study, faults.describe(e), lost)
            return False
        logger.error("%s the summary of study %s (%s); it is kept in %s and its run stays open on the server until "
                     "`tracker upload %s`", why, study, faults.describe(e), kept.parent, kept.parent.parent)
        return False
    return True


def log_report(rows: Sequence[AttemptRow], folder: Path, *, study: str, run_id: str, results: Sequence[AttemptResult],
               search: SearchResult | None) -> None:
    """Logs the study report (with the rooflines of the `results` measured here, and the search's page after a
    search) on the study run `run_id`; a report problem never costs the study its summary."""
    best = pick_best(rows)
    ok = [r for r in results if r.ok]
    rooflines = {r.attempt.name: r.roofline for r in ok if r.roofline is not None}
    phase_rooflines = {r.attempt.name: r.phase_rooflines for r in ok if r.phase_rooflines}
    try:
        built = build_study_report(rows, folder, study=study, best=best, rooflines=rooflines,
                                   phase_rooflines=phase_rooflines)
        log_study_report(run_id, built.html, built.tables)
        if search is not None:
            page = build_search_report(search, rows, folder, study=study, best=best)
            log_study_report(run_id, page.html, page.tables)
    except Exception as e:
        logger.error("could not log the report of study %s (%s: %s%s)", study, type(e).__name__, e, no_space_note(e))
