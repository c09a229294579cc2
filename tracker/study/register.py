"""A study's best attempt registered (`Study(register=NAME)`): its logged model becomes a new version of the registered
model NAME, with tags saying where it came from and how it measured; alias `candidate` moves to it, and `champion`
only when, measured against the champion in this session (`measure_against_champion`), its verdict is `better` and it
passes the accuracy check against the champion's outputs. Otherwise the log and a tag on the version say why."""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tracker.base.errors import FeedError, ModelError
from tracker.base.keys import (
    ALIAS_CANDIDATE,
    ALIAS_CHAMPION,
    TAG_ACCURACY,
    TAG_AGAINST_CHAMPION,
    TAG_ATTEMPT,
    TAG_CHAMPION_KEPT,
    TAG_MACHINE,
    TAG_REGISTERED,
    TAG_SPEEDUP,
    TAG_STUDY_RUN,
    TAG_VERDICT,
)
from tracker.measure.attempt import Attempt, AttemptResult
from tracker.measure.champion import AgainstChampion, bounds_text, measure_against_champion
from tracker.measure.environment import cpu_model
from tracker.measure.timing.interval import Speedup
from tracker.measure.timing.speedup import SpeedupConfig
from tracker.store import registering, registry, write

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Registered:
    """What registering a study's best did.

    Attributes:
        name: the registered model.
        version: the new version (alias `candidate`).
        champion: the version alias `champion` points at now (the new one, or the one it stayed on).
        why: why the champion moved or stayed, in one line.
    """

    name: str
    version: str
    champion: str
    why: str

    @property
    def is_champion(self) -> bool:
        return self.champion == self.version

    def line(self) -> str:
        """`registered model m version 2 (@candidate); @champion stays on version 1: verdict same 1.01x [...]`."""
        moved = "@champion moves to it" if self.is_champion else f"@champion stays on version {self.champion}"
        return f"registered model {self.name} version {self.version} (@candidate); {moved}: {self.why}"


def register_best(best: AttemptResult | None, *, name: str, study: str, study_run_id: str,
                  feeds: Mapping[str, np.ndarray], config: SpeedupConfig, workdir: Path) -> Registered | None:
    """Registers the logged model of the study's `best` attempt as a new version of `name` and moves its aliases (see
    the module); the champion is downloaded into `workdir` and timed against it with `config`, on `feeds`.

    The study run gets a tag saying what was done (`tracker.registered`).

    Returns:
        What it did, or None when there is nothing to register (no attempt passed, or its model was not logged to
        the store: the log says why).
    """
    model_id = _logged_model(best, study=study)
    if best is None or model_id is None:
        return None
    assert best.logged is not None and best.logged.run_id is not None  # _logged_model found its model
    champion = registering.version_with_alias(name, ALIAS_CHAMPION)
    version = registering.register_version(name, model_id=model_id, run_id=best.logged.run_id,
                                           tags=version_tags(best, study_run_id=study_run_id))
    registering.set_alias(name, ALIAS_CANDIDATE, version)
    if champion is None:
        registering.set_alias(name, ALIAS_CHAMPION, version)
        done = Registered(name, version, version, "the first champion of this registered model")
    else:
        moves, why = _against_champion(best.attempt, name=name, champion=champion, feeds=feeds, config=config,
                                       workdir=workdir)
        if moves:
            registering.set_alias(name, ALIAS_CHAMPION, version)
            registering.tag_version(name, version, {TAG_AGAINST_CHAMPION: why})
        else:
            registering.tag_version(name, version, {TAG_CHAMPION_KEPT: why})
        done = Registered(name, version, version if moves else champion, why)
    write.log_batch(study_run_id, tags={TAG_REGISTERED: done.line()})
    logger.info("study %s: %s", study, done.line())
    return done


def _logged_model(best: AttemptResult | None, *, study: str) -> str | None:
    """The logged model of `best`'s run, or None with a warning saying why nothing is registered."""
    if best is None or not best.ok:
        logger.warning("study %s: no attempt passed, so nothing is registered", study)
        return None
    run_id = best.logged.run_id if best.logged is not None else None
    model_id = registering.model_id_of(run_id) if run_id else None
    if model_id is None:
        where = ("its model was not logged as an MLflow model (log_models=False, or a plain file)" if run_id
                 else "its run is not in the tracking store (kept in the outbox)")
        logger.warning("study %s: the best attempt %s is not registered: %s", study, best.attempt.name, where)
    return model_id


def _against_champion(attempt: Attempt, *, name: str, champion: str, feeds: Mapping[str, np.ndarray],
                      config: SpeedupConfig, workdir: Path) -> tuple[bool, str]:
    """Whether `attempt` replaces `champion` (version of `name`): measured against it here, its verdict `better` and
    its accuracy check passed; and why, in one line."""
    version = registry.resolve_version(f"{registry.MODELS_SCHEME}{name}/{champion}")
    path = registry.download_onnx(version, workdir / "champion")
    theirs = Attempt("champion", path, runtime=attempt.runtime, session=attempt.session, tolerance=attempt.tolerance)
    try:
        against = measure_against_champion(attempt, theirs, feeds, config=config)
    except (ModelError, FeedError) as e:
        return False, f"it cannot be measured against the champion (version {champion}): {e}"
    return _judged(against, champion)


def _judged(against: AgainstChampion, champion: str) -> tuple[bool, str]:
    figures = f"verdict {against.verdict} {interval_text(against.speedup)} against version {champion}"
    if not against.diff.passed:
        return False, f"{figures}; the accuracy check against its outputs failed {against.accuracy_text()}"
    if against.verdict == "worse":
        return False, f"{figures}: slower than the champion"
    if against.verdict != "better":
        return False, f"{figures}: not faster beyond the noise"
    return True, f"{figures}, accuracy check passed"


def interval_text(speedup: Speedup) -> str:
    """`1.52x [1.40, 1.63]`."""
    return f"{speedup.speedup:.2f}x [{speedup.ci_low:.2f}, {speedup.ci_high:.2f}]"


def version_tags(best: AttemptResult, *, study_run_id: str) -> dict[str, str]:
    """The tags of the version `best` becomes: the study run, the attempt, its verdict, speed-up interval and accuracy
    check in its study, and the machine it was measured on."""
    diff = best.diff
    if diff is None:
        accuracy = "none: the study's reference"
    else:
        accuracy = f"{'passed' if diff.passed else 'failed'} ({bounds_text(diff)})"
    return {
        TAG_STUDY_RUN: study_run_id,
        TAG_ATTEMPT: best.attempt.name,
        TAG_VERDICT: str(best.verdict) if best.verdict is not None else "baseline",
        TAG_SPEEDUP: interval_text(best.speedup) if best.speedup is not None else "1x (the study's baseline)",
        TAG_ACCURACY: accuracy,
        TAG_MACHINE: f"{socket.gethostname()}: {cpu_model()}, {os.cpu_count()} cores",
    }
