"""Study of the user's own model (`tracker optimize MODEL.onnx`): the baseline, then every registry entry that
applies to it, each judged by the model's task; the plan it runs is `tracker.studies.own_plan`'s."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path

from tracker.api import Study, StudySetup
from tracker.base.settings import cache_folder
from tracker.compare import Comparison
from tracker.measure.accuracy.lm_diff import LOGITS_RECORDED
from tracker.measure.accuracy.task_diff import TaskTolerance, task_tolerances
from tracker.measure.accuracy.text_quality import load_bounds
from tracker.measure.attempt import AttemptResult
from tracker.measure.generation.text_scoring import TextCheck, TextSet
from tracker.optimize import REGISTRY
from tracker.report.rows import attempt_rows, pick_best
from tracker.search import SearchConfig
from tracker.studies.gpt2 import CHECK_QUALITY, CHECK_SAME_FUNCTION
from tracker.studies.own_plan import OwnModelConfig, Plan, plan

logger = logging.getLogger(__name__)


def run(config: OwnModelConfig, *, experiment: str | None = None, chosen: Plan | None = None) -> Study:
    """Logs the baseline and every planned entry as nested runs of one study run.

    An entry that raises is a FAILED run with the reason; the study goes on. A baseline that fails ends the study:
    no attempt could be judged against it (`study_failure` says so). With real text (`Plan.text`), an LM is judged by
    its quality on the text within each precision's bound; its logits on the feeds are recorded, not bounded.
    """
    chosen = chosen or plan(config)
    tolerances: Mapping[str, TaskTolerance] = task_tolerances(config.task)
    setup = None
    if chosen.text is not None:
        tolerances = LOGITS_RECORDED
        setup = StudySetup(quality=TextCheck(TextSet(chosen.text.eval_ids, chosen.text.prompt_ids),
                                             load_bounds(max_ppl_increase=config.max_ppl_increase)))
    params = {
        "model.file": Path(config.model).name,
        "task": config.task,
        "feeds.source": chosen.feeds_source,
        "attempts.chosen": ",".join(chosen.run),
    }
    if chosen.info is not None:
        params.update({"model.type": str(chosen.info.model_type), "model.num_heads": str(chosen.info.num_heads),
                       "model.hidden_size": str(chosen.info.hidden_size), "model.info_source": chosen.info_source})
    if config.search:
        params["search.budget_s"] = "none" if config.budget_s is None else f"{config.budget_s:g}"
    if chosen.text is not None:
        params.update(chosen.text.params())
    if config.task == "lm":
        params["lm.check"] = CHECK_QUALITY if chosen.text is not None else CHECK_SAME_FUNCTION
    with Study(config.study_name, feeds=chosen.feeds, experiment=experiment, config=config.measure,
               params=params, setup=setup, cluster=config.cluster, register=config.register) as study:
        baseline = study.attempt("baseline", Path(config.model), session=config.session,
                                 tolerance=tolerances["fp32"], description=f"{Path(config.model).name} as given")
        if not baseline.ok:
            logger.error("study %s: the baseline failed, so no attempt can be judged against it; the %d planned "
                         "attempt(s) are not run", study.name, len(chosen.run))
            return study
        if config.search:
            entries = tuple(n for n in chosen.run if n in REGISTRY)
            searched = SearchConfig(budget_s=config.budget_s, entries=entries, cache_dir=cache_folder(),
                                    fresh=config.fresh)
            study.search(Path(config.model), config=searched, info=chosen.info, session=config.session,
                         tolerance=tolerances)
            return study
        for name in chosen.run:
            study.optimize(name, Path(config.model), info=chosen.info, session=config.session, tolerance=tolerances)
    return study


def study_failure(results: Sequence[AttemptResult], failures: Mapping[str, str]) -> str | None:
    """Why a study of `run` gave nothing to judge, in one line, or None: its baseline failed, or every other
    attempt did (`failures` are those that failed before they had a model to measure, as `Study.failures`)."""
    baseline = next((r for r in results if r.attempt.name == "baseline"), None)
    if baseline is not None and baseline.error is not None:  # not ok
        return f"the baseline attempt failed ({_one_line(baseline.error)}); no attempt can be judged, so none was run"
    errors = {r.attempt.name: r.error for r in results if r is not baseline} | dict(failures)
    if errors and all(e is not None for e in errors.values()):
        name, error = next(iter(errors.items()))
        assert error is not None  # every one failed
        return (f"every attempt failed ({len(errors)} of {len(errors)}; {name}: {_one_line(error)}); see the status "
                f"column above")
    return None


def _one_line(text: str, head: int = 150, tail: int = 250) -> str:
    """`text` on one line; a long one keeps its start (the error's type) and its end (ORT's reason)."""
    text = " ".join(str(text).split())
    return text if len(text) <= head + tail else f"{text[:head]} ... {text[-tail:]}"


def comparison(study: Study) -> Comparison:
    """The study's attempts as `tracker compare` shows them."""
    rows = attempt_rows(study.rows())  # as `tracker compare` reads them back: a node's repeated baseline left out
    return Comparison(title=f"study {study.name}", rows=rows, best=pick_best(rows), study_run_id=study.run.info.run_id)

