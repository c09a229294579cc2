"""The search: which candidates can still win, stage by stage, within a time budget.

1. applicability: every entry and knob variant whose `requires` holds (the others are rows with the reason);
2. accuracy: each candidate made and run once on the feeds (in the prior's order), judged by the task with no
   timing, then screened for speed at once (a race); a failing quantization that could still be the fastest gets the
   sensitivity fallback (fewest nodes kept in fp32), a fast fp32 graph a chain with the best quantization;
3. the better half screened again, longer; the leaders proposed to the study (`Strategy`), which measures each in
   full (a nested attempt run each, with the calibrated speed-up and verdict). The answer is the study's best attempt
   (`rows.pick_best`), as without a search.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx

from tracker.base.keys import TAG_FALLBACK_OF, TAG_SEARCH_STAGE
from tracker.base.steps import StepTimes
from tracker.base.vocabulary import Kind
from tracker.measure.accuracy.task_diff import TaskTolerance
from tracker.measure.attempt import Attempt
from tracker.measure.generation.text_scoring import TextCheck
from tracker.measure.runtimes.ort_runtime import SessionConfig
from tracker.optimize import Candidate, Chain, Context, ModelInfo
from tracker.outcome import Outcome
from tracker.profile.parse import Profile
from tracker.search.budget import Budget
from tracker.search.cache import MadeModels, SearchCache
from tracker.search.pool import MAKE_GUESS_S, CandidatePool
from tracker.search.priors import op_time, prior_order
from tracker.search.result import STAGES, Proposal, Row, SearchConfig, SearchResult, full_measurement
from tracker.search.screen import LONG_SCREEN, SHORT_SCREEN, AccuracyCheck, check_accuracy, check_text
from tracker.search.screening import Remote, Screens
from tracker.search.sensitivity import Sensitivity, fallback
from tracker.search.space import by_family, candidates, family, interleave

logger = logging.getLogger(__name__)

# Until a stage has measured one of its own, what it is assumed to cost (seconds).
_GUESS_S = {"make": MAKE_GUESS_S, "screen": 5.0, "long_screen": 10.0, "fallback": 120.0}


class ForwardSearch:
    """The search of a model's forward pass, as a `Strategy`: `proposals` runs the stages up to the leaders, then
    proposes each leader for its full measurement, the model it made kept in `made` for the study to measure.

    Args:
        source: the model file to optimize.
        feeds: the study's inputs (the accuracy check's and the timing's).
        baseline: the study's baseline attempt (the speed screen times against it).
        baseline_outputs: its outputs on `feeds`.
        tolerance: the task's tolerance per precision.
        made: where the leaders' models are kept for the study (`Study.made`).
        workdir: where candidates are made (removed as they are screened out).
        full_attempt_s: what a full attempt costs (the baseline's), to keep time for the last stage.
        prepared: where the pre-processed sources are kept (`Context.work`): the study's own, so that its
            `optimize` finds the leaders' there too (default: under `workdir`).
        text: a language model's check on real text (the study's, its baseline scored): every candidate, and every
            retry of the sensitivity fallback, is judged by it instead of by `tolerance` on the feeds.
        remote: a cluster that screens the candidates on its nodes, several at once, each against its own baseline
            (`Fanout`). None: every screen runs here, against `baseline`.
        profile: the baseline's profile: the cost model orders a family no prior holds by its ops' share of the time.
    """

    def __init__(
        self, source: Path, *, feeds: Mapping[str, np.ndarray], baseline: Attempt,
        baseline_outputs: Sequence[np.ndarray], tolerance: TaskTolerance | Mapping[str, TaskTolerance],
        made: MadeModels, workdir: Path, config: SearchConfig = SearchConfig(), info: ModelInfo | None = None,
        session: SessionConfig = SessionConfig(), full_attempt_s: float = 60.0, prepared: Path | None = None,
        text: TextCheck | None = None, remote: Remote | None = None, profile: Profile | None = None,
    ) -> None:
        self.source, self.feeds, self.baseline = Path(source), dict(feeds), baseline
        self.baseline_outputs, self.tolerance, self.kept = list(baseline_outputs), tolerance, made
        self.workdir, self.config, self.session = Path(workdir), config, session
        self.budget, self.full_attempt_s, self.text, self.profile = Budget(config.budget_s), full_attempt_s, text, profile
        self.context = Context(info=info, feeds=feeds, work=prepared or self.workdir / "prepared")
        self.sensitivities: list[Sensitivity] = []
        self.stages = StepTimes(dict.fromkeys(STAGES, 0.0))  # seconds per stage
        self.expected: dict[str, float] = {}  # each family's expected speed-up (`priors.prior_order`)
        self.cache: SearchCache | None = None
        if config.cache_dir is not None and text is None:  # an LM judged on text is not cached yet
            self.cache = SearchCache.open(Path(config.cache_dir), source=self.source, feeds=feeds,
                                          judged_by=repr(tolerance), session=session, fresh=config.fresh)
        self.screens = Screens(baseline, feeds, session, self.budget, self.cache, remote)
        self.pool = CandidatePool(self.source, self.workdir, self.context, self._check, self.cache, self.budget)
        self.leaders: list[tuple[float, str]] = []  # (seconds into the search, name) each time the leader changed

    def proposals(self) -> Iterator[Proposal]:
        try:
            self._screen_all()
            yield from self._full()
        finally:
            for folder in self.workdir.glob("made-*"):
                shutil.rmtree(folder, ignore_errors=True)
            if self.cache is not None:
                logger.info("search cache %s: %s", self.cache.root, self.cache.reused_line())

    def record(self, proposal: Proposal, outcome: Outcome) -> None:
        self.pool.rows.put(full_measurement(self.pool.rows[proposal.entry.name], outcome))

    def result(self) -> SearchResult:
        return SearchResult(tuple(self.pool.rows), tuple(self.sensitivities), dict(self.stages.seconds),
                            self.config.budget_s, self.budget.spent(), leaders=tuple(self.leaders))

    def _reserve(self, after: str) -> float:
        """Seconds the stages after `after` are expected to need."""
        full = self.config.max_full * self.budget.expected("full", self.full_attempt_s)
        screen = self.budget.expected("screen", _GUESS_S["screen"])
        return {"accuracy": full + 8 * screen, "fallback": full + 4 * screen, "speed_screen": full, "full": 0.0}[after]

    # -- stages
    def _screen_all(self) -> None:
        graph = onnx.load_model(str(self.source), load_external_data=False)
        with self.stages.step("applicability"):
            found, refused = candidates(graph, self.context, entries=self.config.entries,
                                              per_entry=self.config.per_entry, knobs=self.config.knobs)
        for name, why in refused.items():
            self.pool.rows.refuse(name, name, why)
        mixed = interleave(by_family(found).values())
        self.pool.hits = {e.name: self.cache.get(e) for e in mixed} if self.cache is not None else {}
        measured = {n: v for n, hit in self.pool.hits.items() if hit is not None and (v := hit.expected()) is not None}
        order, self.expected, why = prior_order(mixed, [family(e) for e in mixed], graph, measured=measured,
                                                op_time=op_time(self.profile) if self.profile is not None else None)
        logger.info("search: %d candidates apply (%d entries do not); budget %s", len(order), len(refused),
                    "none" if self.config.budget_s is None else f"{self.config.budget_s:.0f} s")
        logger.info("search order: %s", why)
        # Each candidate is screened as soon as it is checked, in the prior's order: the leader is known early, and
        # a candidate that cannot beat it is dropped after its first round (racing).
        for index, entry in enumerate(order):
            logger.info("search, accuracy %d/%d: %s", index + 1, len(order), entry.name)
            with self.stages.step("accuracy"):
                row = self.pool.make_and_check(entry, stage="accuracy", reserve=self._reserve("accuracy"))
            if index == 1:  # two made: what the rest will cost
                self._forecast(len(order))
            # Failing candidates are timed too when the fallback could rescue them: it pays only for a fast one.
            if row is not None and entry.name in self.pool.made and (row.passed or "exclude" in entry.knobs()):
                with self.stages.step("speed_screen"):
                    self._screen_if_it_fits(entry.name)
        with self.stages.step("speed_screen"):
            self._screened(wait=True)  # those a cluster's nodes are still timing
        self._drop_unrescuable()
        with self.stages.step("fallback"):
            self._fallbacks()
            self._chains()
        self._full()

    def _forecast(self, candidates: int) -> None:
        """Logs how much of the space the budget is expected to cover, from what making and checking cost so far,
        with the reserve kept for the full measurement of the leaders."""
        each = self.budget.expected("make", _GUESS_S["make"]) + self.budget.expected("screen", _GUESS_S["screen"])
        reserve = self.config.max_full * self.budget.expected("full", self.full_attempt_s)
        fits = self.budget.covers(candidates - 2, each=each, reserve=reserve) + 2
        if self.config.budget_s is not None:
            logger.info("search, budget: ~%d of the %d candidates fit (~%.1f s each to make, check and screen; %.0f s "
                        "kept for the full measurement of %d leaders)%s", fits, candidates, each, reserve,
                        self.config.max_full, "" if fits >= candidates else ": the prior's order decides which")

    def _check(self, candidate: Candidate) -> AccuracyCheck:
        """A made candidate judged as the study judges an attempt: on real text when it has some, else by the task's
        tolerance on the feeds."""
        if self.text is not None:
            return check_text(candidate, self.text, session=self.session,
                              workdir=self.workdir / "text" / Path(candidate.path).parent.name)
        return check_accuracy(candidate, self.feeds, self.baseline_outputs, self.tolerance, session=self.session)

    def _screen(self, name: str, config=SHORT_SCREEN, kind: str = "screen", *, wait: bool = True) -> None:
        """Screens `name` against the baseline (here, or on a cluster's node: then `wait` False goes on at once),
        and applies every screen that ended meanwhile."""
        entry, candidate = self.pool.made[name]
        # Racing: it must beat the baseline, and the lower bound of the best passing candidate screened so far.
        leader = max([r.screen_ci_low for r in self.pool.rows if r.passed and r.screen_ci_low is not None
                      and r.name != name], default=1.0)
        self.screens.start(name, entry, candidate, kind=kind, config=config, must_beat=max(1.0, leader),
                           cached=self.pool.cached.get(name))
        self._screened(wait=wait)

    def _screened(self, *, wait: bool) -> None:
        for name, kind, screened in self.screens.finished(wait=wait):
            found, raced_out = screened.speedup, screened.raced_out
            if found is None:
                self.pool.rows.update(name, status="failed", reason=f"speed screen: {screened.error}")
                self.pool.drop(name)
                continue
            row = self.pool.rows.update(name, screen_speedup=found.speedup, screen_ci_low=found.ci_low,
                                        screen_ci_high=found.ci_high, stage="speed_screen", node=screened.node_id)
            logger.info("search, %s: %s %.2fx [%.2f, %.2f]%s%s%s", kind.replace("_", " "), name, found.speedup,
                        found.ci_low, found.ci_high, "" if row.passed else " (failed its accuracy check)",
                        f" on node {screened.node_id[:12]}" if screened.node_id else "",
                        f": {raced_out}" if raced_out else "")
            self._note_leader(row)
            if raced_out:  # it cannot win: out of the running now, not after more timing
                self.pool.rows.add_reason(name, f"speed screen: {raced_out}")
                self.pool.drop(name)

    def _note_leader(self, row: Row) -> None:  # the leader: the best passing lower bound, above the baseline's 1.0
        lows = [(r.screen_ci_low, r.name) for r in self.pool.rows if r.passed and r.screen_ci_low is not None]
        leader = max(lows, default=None)
        if row.passed and leader is not None and leader[1] == row.name and leader[0] > 1.0 and (
                not self.leaders or self.leaders[-1][1] != row.name):
            self.leaders.append((self.budget.spent(), row.name))
            logger.info("search: %s leads after %.0f s (lower bound %.2fx)", row.name, self.leaders[-1][0], leader[0])

    def _screen_if_it_fits(self, name: str) -> None:
        if self.budget.fits("screen", _GUESS_S["screen"], reserve=self._reserve("speed_screen")):
            self._screen(name, wait=False)
            return
        self.pool.rows.add_reason(name, "not timed: the budget ran out", status="skipped")

    def _drop_unrescuable(self) -> None:
        for name in list(self.pool.made):  # a failing candidate the fallback cannot rescue, or that was not timed
            row = self.pool.rows[name]
            if not row.passed and ("exclude" not in self.pool.made[name][0].knobs() or row.screen_speedup is None):
                self.pool.drop(name)

    def _fallbacks(self) -> None:
        best = max([r.screen_speedup for r in self.pool.rows if r.passed and r.screen_speedup is not None], default=1.0)
        made = self.pool.made
        hopeful = [r for r in self.pool.rows if r.passed is False and r.name in made and r.screen_speedup is not None
                   and r.pipeline is None and "exclude" in made[r.name][0].knobs() and r.screen_speedup > best]
        hopeful.sort(key=lambda r: -(r.screen_speedup or 0))
        for row in hopeful[: self.config.max_fallbacks]:
            if not self.budget.fits("fallback", _GUESS_S["fallback"], reserve=self._reserve("fallback")):
                self.pool.rows.add_reason(row.name, "no fallback: the budget ran out")
                break
            entry, _ = self.pool.made[row.name]
            logger.info("search, fallback: %s (%.2fx on the screen) failed its check: finding the nodes that cost "
                        "the accuracy", row.name, row.screen_speedup)
            with self.budget.timing("fallback"):
                found = self.pool.cached[row.name].sensitivity_of(entry) if row.name in self.pool.cached else None
                if found is not None:
                    self.cache.reused[row.name] += ", sensitivity"  # type: ignore[union-attr]  # a hit came from it
                else:
                    found = fallback(entry, self.source, self.workdir / "made-sensitivity" / row.name, self.context,
                                     self._check, by_projection=self.text is not None,
                                     out_of_time=lambda: self.budget.left() < self._reserve("fallback"))
                    if self.cache is not None:
                        self.cache.put_sensitivity(entry, found)
            self.sensitivities.append(found)
            if found.found is None:
                self.pool.rows.add_reason(row.name, f"fallback: {found.stopped}")
                continue
            self.pool.rows.add_reason(row.name, f"fallback {found.found.name} keeps {len(found.kept)} node(s) in fp32")
            rescued = self.pool.make_and_check(found.found, stage="fallback", fallback_of=row.name,
                                               reserve=self._reserve("accuracy"))
            if rescued is not None and rescued.passed:
                self.pool.rows.update(rescued.name,
                                      reason=f"{len(found.kept)} node(s) kept in fp32 by the sensitivity fallback")
                self._screen(found.found.name)
        for row in list(self.pool.rows):
            if row.passed is False and row.name in self.pool.made:
                self.pool.drop(row.name)

    def _chains(self) -> None:
        if not self.config.max_chains:
            return
        passing = [r for r in self.pool.rows if r.passed and r.screen_speedup is not None and r.name in self.pool.made]
        # Each of `passing` has a screen speed-up (`or 0.0` is for the type checker).
        graphs = [r for r in passing if r.precision == "fp32" and r.kind == Kind.TRANSFORM
                  and (r.screen_speedup or 0.0) > 1.0 and r.pipeline is None]
        # Without kept-in-fp32 nodes: those are named after the un-chained graph.
        quants = [r for r in passing if r.precision in ("int8", "int4") and r.pipeline is None
                  and not getattr(self.pool.made[r.name][0], "exclude", ())]
        if not graphs or not quants:
            return
        best_q = max(quants, key=lambda r: r.screen_speedup or 0.0)
        q_entry = self.pool.made[best_q.name][0]
        for graph in sorted(graphs, key=lambda r: -(r.screen_speedup or 0.0))[: self.config.max_chains]:
            chain = Chain((self.pool.made[graph.name][0], q_entry))
            row = self.pool.make_and_check(chain, stage="chain", reserve=self._reserve("accuracy"))
            if row is not None and row.passed and chain.name in self.pool.made:
                if self.budget.fits("screen", _GUESS_S["screen"], reserve=self._reserve("speed_screen")):
                    self._screen(chain.name)
            elif row is not None and chain.name in self.pool.made:
                self.pool.drop(chain.name)

    def _full(self) -> Iterator[Proposal]:
        timed = [r for r in self.pool.rows if r.passed and r.screen_speedup is not None and r.name in self.pool.made]
        timed.sort(key=lambda r: -(r.screen_speedup or 0))
        for row in timed[max(1, min(6, (len(timed) + 1) // 2)):]:
            self.pool.rows.update(row.name, reason=f"speed screen: {row.screen_speedup:.2f}x, not in the better half")
            self.pool.drop(row.name)
        rung = [r for r in timed if r.name in self.pool.made]
        with self.stages.step("speed_screen"):
            for row in rung:
                if self.budget.fits("long_screen", _GUESS_S["long_screen"], reserve=self._reserve("speed_screen")):
                    self._screen(row.name, LONG_SCREEN, "long_screen")
        # Their rows as the long screen left them, less those it raced out.
        rung = [self.pool.rows[r.name] for r in rung if r.name in self.pool.made]
        rung.sort(key=lambda r: -(r.screen_speedup or 0))
        top = rung[0].screen_ci_low if rung else None
        finals: list[Row] = []
        for row in rung:
            if len(finals) >= self.config.max_full:
                reason = f"speed screen: {row.screen_speedup:.2f}x, behind the {self.config.max_full} leaders"
            elif top is not None and row.screen_ci_high is not None and row.screen_ci_high < top:
                reason = (f"speed screen: {row.screen_speedup:.2f}x [{row.screen_ci_low:.2f}, "
                          f"{row.screen_ci_high:.2f}], below the leader's interval")
            else:
                finals.append(row)
                continue
            self.pool.rows.update(row.name, reason=reason)
            self.pool.drop(row.name)
        for row in finals:
            if not self.budget.fits("full", self.full_attempt_s):
                self.pool.rows.update(row.name, status="skipped", reason="not measured in full: the budget ran out")
                continue
            logger.info("search, full measurement: %s (%.2fx on the screen)", row.name, row.screen_speedup)
            entry, candidate = self.pool.made[row.name]
            tags = {TAG_SEARCH_STAGE: row.stage}
            if row.fallback_of:  # which nodes stayed in fp32 is in its params and notes; why, here
                tags[TAG_FALLBACK_OF] = row.fallback_of
            # The model the search made (or the cache kept) is measured, not made again.
            self.kept.put(self.source, entry, candidate, self.pool.made_s.get(row.name, 0.0))
            with self.stages.step("full"), self.budget.timing("full"):
                yield Proposal(entry, tags)  # the study measures it, then `record`s its outcome
            self.pool.drop(row.name)
