"""The decode search's stages (`tracker.search.decode` has its space, check, screen and byte count): graphs made and
checked in the order of the bytes a step reads, each graph's settings screened as they come (racing the leader), the
leaders measured in full by the study, every candidate a row of the search's table with where it stopped and why."""

from __future__ import annotations

import logging
import shutil
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import onnx
import onnx_ir as ir

from tracker.base.keys import TAG_SEARCH_STAGE
from tracker.base.steps import StepTimes
from tracker.base.termination import reraise_if_received
from tracker.base.vocabulary import Kind
from tracker.optimize import Candidate, Chain, Context
from tracker.optimize.quantize.prepare import model_bytes
from tracker.outcome import Outcome
from tracker.search.budget import Budget
from tracker.search.decode import DecodeSpace, DecodeTarget, added_rounding, check_decode, screen_decode, step_bytes
from tracker.search.result import STAGES, Proposal, Row, Rows, SearchConfig, SearchResult, full_measurement

logger = logging.getLogger(__name__)

# Until the search has measured one of its own, what a graph's make and check, and a screen, cost (seconds).
_GUESS_S = {"make": 30.0, "screen": 15.0}

class DecodeSearch:
    """Searches `space` for the fastest decode chain at the target's past that passes the generation check, as a
    `Strategy`: `proposals` makes, checks and screens the graphs, then proposes the leaders for the study to measure
    in full (it makes each again on its sources: the forward model and the decode-ready export).

    Args:
        target: the generation scenario's decode-ready export, its baseline's generation and check.
        workdir: where graphs are made (each removed once its settings are screened).
        space: the decode knobs combined (default `DecodeSpace()`).
        config: the budget and how many leaders are measured in full (`max_full`); the rest is the forward search's.
        full_attempt_s: what a full attempt costs (the baseline's, with its generation), kept for the last stage.
    """

    def __init__(self, target: DecodeTarget, *, workdir: Path, space: DecodeSpace | None = None,
                 config: SearchConfig = SearchConfig(), full_attempt_s: float = 120.0) -> None:
        self.target, self.workdir, self.space, self.config = target, Path(workdir), space or DecodeSpace(), config
        self.budget, self.full_attempt_s = Budget(config.budget_s), full_attempt_s
        self.rows = Rows()
        self.chains: dict[str, Chain] = {}
        self.stages = StepTimes(dict.fromkeys(STAGES, 0.0))
        self.leaders: list[tuple[float, str]] = []

    def proposals(self) -> Iterator[Proposal]:
        try:
            self._screen_all(self.space)
        finally:
            shutil.rmtree(self.workdir / "made", ignore_errors=True)
        yield from self._full()

    def record(self, proposal: Proposal, outcome: Outcome) -> None:
        self.rows.put(full_measurement(self.rows[proposal.entry.name], outcome))

    def result(self) -> SearchResult:
        return SearchResult(tuple(self.rows), (), dict(self.stages.seconds), self.config.budget_s, self.budget.spent(),
                            leaders=tuple(self.leaders))

    def _reserve(self) -> float:  # the full measurement of the leaders
        return self.config.max_full * self.budget.expected("full", self.full_attempt_s)

    def _screen_all(self, space: DecodeSpace) -> None:
        with self.stages.step("applicability"):
            graphs = self._ordered(space)
        failed: list[tuple[str, frozenset[str], str]] = []  # (key, added rounding, name) of each graph that failed
        for index, (graph, candidates) in enumerate(graphs):
            for chain in candidates:
                self._add(chain)
            key, added = added_rounding(graph)
            worse = next((name for k, a, name in failed if k == key and a <= added), None)
            if worse is not None:
                for chain in candidates:  # screened out, not left by the budget
                    self.rows.update(chain.name, reason=f"not tried: {worse} failed the generation check, and this "
                                                        "only adds rounding to it")
                continue
            if not self.budget.fits("make", _GUESS_S["make"], reserve=self._reserve()):
                for chain in candidates:
                    self.rows.update(chain.name, status="skipped",
                                     reason="not tried: the budget was kept for the leaders")
                continue
            logger.info("decode search, graph %d/%d: %s (%d settings)", index + 1, len(graphs), graph.name,
                        len(candidates))
            folder = self.workdir / "made" / str(index)
            with self.stages.step("accuracy"):
                made = self._make_and_check(graph, candidates, folder)
            if made is not None:
                with self.stages.step("speed_screen"):
                    for chain in candidates:
                        self._screen(chain, made)
            elif self.rows[candidates[0].name].passed is False:
                failed.append((key, added, graph.name))
            shutil.rmtree(folder, ignore_errors=True)  # the leaders are made again by the study, in full
            if len(self.budget.costs.get("make", ())) == 1:
                self._forecast(len(graphs) - index - 1)
        self._full()

    def _ordered(self, space: DecodeSpace) -> list[tuple[Chain, list[Chain]]]:
        """The graphs that apply, in groups that differ only by added rounding (`added_rounding`): the groups by the
        fewest bytes any of their settings reads per step, in a group the least rounding first (a graph that fails
        spares those that only add to its rounding); each graph's settings by their bytes. Rows for those that do
        not apply."""
        proto = onnx.load_model(str(self.target.setup.decoder), load_external_data=False)
        model = ir.from_proto(proto)  # once: each candidate's bytes are counted on it
        vocab = self.target.reference.step_logits[0].shape[-1]
        past = self.target.past_len
        baseline = step_bytes(model, (), past_len=past, vocab=vocab)
        context = Context(info=self.target.setup.info)
        expected: dict[str, float] = {}
        groups: dict[str, list[tuple[Chain, list[Chain]]]] = {}
        for graph, candidates in space.graphs():
            why = graph.why_not(proto, context)
            if why is not None:
                for chain in candidates:
                    self.rows.refuse(chain.name, _family(chain), why)
                continue
            for chain in candidates:
                expected[chain.name] = baseline / step_bytes(model, chain.steps, past_len=past, vocab=vocab)
            candidates.sort(key=lambda c: -expected[c.name])
            groups.setdefault(added_rounding(graph)[0], []).append((graph, candidates))
        for group in groups.values():
            group.sort(key=lambda g: (len(added_rounding(g[0])[1]), -expected[g[1][0].name]))
        ordered = sorted(groups.values(), key=lambda group: -max(expected[g[1][0].name] for g in group))
        found = [graph for group in ordered for graph in group]
        if found:
            first, last = found[0][1][0].name, found[-1][1][-1].name
            logger.info("decode search order: by the bytes a decode step reads at past %d (memory-bound: the weights "
                        "at their bits, the KV cache in its type, the present copied out without IO binding), the "
                        "least rounding first among graphs that differ only by it; first %s (~%.1fx fewer bytes than "
                        "the baseline's step), last %s (~%.1fx); %d graphs, %d candidates", past, first,
                        expected[first], last, expected[last], len(found), sum(len(c) for _, c in found))
        return found

    def _add(self, chain: Chain) -> None:
        self.rows.add(Row(chain.name, _family(chain), chain.kind, stage="accuracy", pipeline=chain.name))
        self.chains[chain.name] = chain

    def _make_and_check(self, graph: Chain, settings: list[Chain], folder: Path) -> Candidate | None:
        """`graph` made on the decode-ready export and checked; the rows of its `settings` say how (None: failed)."""
        try:
            with self.budget.timing("make"):
                candidate = graph(self.target.setup.decoder, folder, Context(info=self.target.setup.info))
                diff = check_decode(candidate, self.target, workdir=folder / "quality")
        except Exception as e:  # noqa: BLE001 -- a graph that cannot be made or run is a row with its reason
            reraise_if_received(e)
            reason = f"{type(e).__name__}: {e}"[:300]
            for chain in settings:
                self.rows.update(chain.name, status="failed", reason=reason)
            logger.warning("decode search: %s failed: %s", graph.name, reason)
            return None
        passed = bool(diff.passed) if diff.passed is not None else True
        margin = diff.quality.margin if diff.quality is not None else None
        size = model_bytes(Path(candidate.path))
        for chain in settings:
            self.rows.update(chain.name, precision=candidate.precision, passed=passed, margin=margin, size_bytes=size,
                             diff=diff.metrics(), params={**candidate.params, "precision": candidate.precision},
                             reason="" if passed else "generation check failed: " + _failure(diff))
        logger.info("decode search: %s %s the generation check (greedy agreement %.2f%s)", graph.name,
                    "passed" if passed else "failed", diff.token_agreement,
                    f", perplexity {diff.quality.ppl_increase:+.1%}" if diff.quality is not None else "")
        return candidate if passed else None

    def _screen(self, chain: Chain, graph: Candidate) -> None:
        if not self.budget.fits("screen", _GUESS_S["screen"], reserve=self._reserve()):
            self.rows.update(chain.name, status="skipped", reason="not timed: the budget ran out")
            return
        leader = max([r.screen_ci_low for r in self.rows if r.passed and r.screen_ci_low is not None], default=1.0)
        candidate = _session_of(chain, graph)
        try:
            with self.budget.timing("screen"):
                found, raced_out = screen_decode(candidate, self.target, must_beat=max(1.0, leader))
        except Exception as e:  # noqa: BLE001 -- a candidate that cannot be timed is a row with its reason
            reraise_if_received(e)
            self.rows.update(chain.name, status="failed", reason=f"decode screen: {type(e).__name__}: {e}"[:300])
            return
        self.rows.update(chain.name, stage="speed_screen", screen_speedup=found.speedup, screen_ci_low=found.ci_low,
                         screen_ci_high=found.ci_high)
        logger.info("decode search, screen: %s %.2fx [%.2f, %.2f]%s", chain.name, found.speedup, found.ci_low,
                    found.ci_high, f": {raced_out}" if raced_out else "")
        if raced_out:
            self.rows.update(chain.name, reason=f"decode screen: {raced_out}")
        elif found.ci_low > max(1.0, leader):
            self.leaders.append((self.budget.spent(), chain.name))
            logger.info("decode search: %s leads after %.0f s (lower bound %.2fx)", chain.name, self.budget.spent(),
                        found.ci_low)

    def _forecast(self, graphs: int) -> None:
        """Logs how many of the `graphs` left the budget is expected to cover, from the first graph's costs."""
        each = self.budget.expected("make", _GUESS_S["make"]) + 3 * self.budget.expected("screen", _GUESS_S["screen"])
        fits = self.budget.covers(graphs, each=each, reserve=self._reserve())
        if self.config.budget_s is not None:
            logger.info("decode search, budget: ~%d of the %d graphs left fit (~%.0f s each to make, check and screen; %.0f "
                        "s kept for the full measurement of %d leaders)", fits, graphs, each, self._reserve(),
                        self.config.max_full)

    def _full(self) -> Iterator[Proposal]:
        pool = [r for r in self.rows if r.passed and r.screen_speedup is not None and not r.reason]
        pool.sort(key=lambda r: -(r.screen_speedup or 0.0))
        top = pool[0].screen_ci_low if pool else None
        for rank, row in enumerate(pool):
            if rank >= self.config.max_full:
                self.rows.update(row.name, reason=f"decode screen: {row.screen_speedup:.2f}x, behind the "
                                                  f"{self.config.max_full} leaders")
            elif top is not None and row.screen_ci_high is not None and row.screen_ci_high < top:
                self.rows.update(row.name, reason=f"decode screen: {row.screen_speedup:.2f}x [{row.screen_ci_low:.2f}, "
                                                  f"{row.screen_ci_high:.2f}], below the leader's interval")
            elif not self.budget.fits("full", self.full_attempt_s):
                self.rows.update(row.name, status="skipped", reason="not measured in full: the budget ran out")
            else:
                logger.info("decode search, full measurement: %s (%.2fx on the screen)", row.name, row.screen_speedup)
                with self.stages.step("full"), self.budget.timing("full"):
                    yield Proposal(self.chains[row.name], {TAG_SEARCH_STAGE: row.stage})  # then `record`ed


def _session_of(chain: Chain, graph: Candidate) -> Candidate:
    """The graph under the chain's session steps (their settings on top of the graph's; nothing is made again)."""
    settings = dict(graph.session)
    for step in chain.steps:
        if step.kind == Kind.SESSION:
            settings.update(step.make(graph.path, graph.path.parent, Context()).session)
    return replace(graph, params={**graph.params, "pipeline": chain.name}, session=settings)


def _family(chain: Chain) -> str:
    """The weights' quantization of a decode chain (its third step, or none): what coverage is counted by."""
    quantized = [s.name.split(".")[0].split(":")[0] for s in chain.steps if s.kind == Kind.QUANTIZATION
                 and not s.name.startswith("kv_")]
    return quantized[0] if quantized else "fp32"


def _failure(diff) -> str:
    """Why a generation check failed, in a few words."""
    if diff.quality is not None and diff.quality.failures:
        return "; ".join(diff.quality.failures)
    along = diff.along
    if along is not None and not along.passed:
        return f"along the baseline's tokens: top-1 {along.top1_agreement:.3f}, KL {along.kl_divergence:.3g}"
    return f"greedy agreement {diff.token_agreement:.2f}"
