"""What a search is given and what it answers: its config (`SearchConfig`), a frozen row per candidate (where it ended
and why) in a table that keeps their order (`Rows`), the result with its counts, metrics and light candidate runs, and
the lines the command prints; and how a study runs one (`Strategy`: it proposes its leaders, the study measures each
and hands back the outcome).

Running the stages is `tracker.search.run`'s (and `decode_search`'s).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from tracker.base.keys import (
    TAG_ATTEMPT,
    TAG_FALLBACK_OF,
    TAG_NODE,
    TAG_PIPELINE,
    TAG_SEARCH_REASON,
    TAG_SEARCH_STAGE,
    TAG_SEARCH_STATUS,
    TAG_STUDY,
)
from tracker.optimize import Entry
from tracker.outcome import Failed, Outcome
from tracker.search.sensitivity import Sensitivity

STAGES = ("applicability", "accuracy", "fallback", "speed_screen", "full")


@dataclass(frozen=True)
class Proposal:
    """A candidate a strategy asks the study to measure in full: its entry (its knobs are in its name) and its run's
    tags. The study applies it to the source it runs the strategy on; a model the search already made of it waits in
    the study's `MadeModels`, so it is not made again."""

    entry: Entry
    tags: Mapping[str, str] = field(default_factory=dict)


class Strategy(Protocol):
    """A search as the study runs it (`Study.run_strategy`): it does its own screening, then proposes the candidates it
    wants measured in full, one at a time, and takes back each one's outcome before proposing the next. It never
    calls the study."""

    def proposals(self) -> Iterator[Proposal]: ...

    def record(self, proposal: Proposal, outcome: Outcome) -> None: ...

    def result(self) -> SearchResult: ...


def full_measurement(row: Row, outcome: Outcome) -> Row:
    """`row` at its last stage, from what measuring it in full gave back."""
    if isinstance(outcome, Failed):
        return replace(row, stage="full", status="failed",
                       reason=f"its full measurement failed: {outcome.reason}"[:300])
    # Measured here, or sent to a cluster's nodes: its runs are the study's either way.
    return replace(row, stage="full", status="timed", reason="measured in full (a nested run)")


@dataclass(frozen=True)
class SearchConfig:
    """What a search tries and how much time it has.

    Attributes:
        budget_s: wall seconds for the whole search (None: no limit), kept within 10 %.
        entries: registered entries whose spaces are searched (None: the whole registry).
        per_entry: at most this many variants of one entry's space.
        max_full: leaders measured in full (nested runs with the calibrated speed-up).
        max_fallbacks: failing quantizations given the sensitivity fallback.
        max_chains: chains tried (a faster fp32 graph, then the best quantization).
        knobs: the values to try per entry and knob, instead of the entry's space, e.g.
            `{"int8_dynamic": {"per_channel": (False, True), "reduce_range": (False,)}}`.
        cache_dir: the search cache's folder (`tracker.search.cache`): checks, screens and made models of an earlier
            search of the same model on the same machine are reused. None: no cache.
        fresh: read nothing from the cache (what is measured is still written to it).
    """

    budget_s: float | None = None
    entries: tuple[str, ...] | None = None
    per_entry: int | None = None
    max_full: int = 3
    max_fallbacks: int = 2
    max_chains: int = 2
    knobs: Mapping[str, Mapping[str, tuple]] | None = None
    cache_dir: Path | None = None
    fresh: bool = False

    def __post_init__(self) -> None:
        if self.budget_s is not None and not self.budget_s > 0:
            raise ValueError(f"budget_s must be > 0 or None, got {self.budget_s}")
        if min(self.max_full, 1) < 1 or min(self.max_fallbacks, self.max_chains) < 0:
            raise ValueError(f"max_full must be >= 1, max_fallbacks and max_chains >= 0; got {self.max_full}, "
                             f"{self.max_fallbacks}, {self.max_chains}")


@dataclass(frozen=True)
class Row:
    """One candidate of the search: where it ended and why. A stage that moves it on makes a new one (`Rows.update`)."""

    name: str
    family: str
    kind: str
    stage: str = "applicability"
    status: str = "screened"  # screened | skipped | failed | timed
    reason: str = ""
    precision: str | None = None
    passed: bool | None = None
    margin: float | None = None
    screen_speedup: float | None = None
    screen_ci_low: float | None = None
    screen_ci_high: float | None = None
    node: str | None = None  # the cluster node that screened it (None: here)
    size_bytes: int | None = None
    fallback_of: str | None = None
    pipeline: str | None = None
    diff: dict[str, float] = field(default_factory=dict)
    params: dict[str, str] = field(default_factory=dict)  # what the candidate's entry did (its knobs among them)


class Rows:
    """A search's table: its rows in the order they were added, a candidate's found by its name (`rows[name]`). A row
    is frozen: a stage that moves a candidate on puts its new row in the old one's place (`update`)."""

    def __init__(self) -> None:
        self._rows: list[Row] = []
        self._at: dict[str, int] = {}  # each candidate's place in `_rows`

    def add(self, row: Row) -> Row:
        """`row`, a candidate's, at the end of the table: found by its name from now on."""
        self._at[row.name] = len(self._rows)
        self._rows.append(row)
        return row

    def refuse(self, name: str, family: str, why: str) -> None:
        """A row at the end of the table for `name`, which does not apply (`why`): no kind, and never moved on."""
        self._rows.append(Row(name, family, "", reason=f"does not apply: {why}"))

    def put(self, row: Row) -> Row:
        """`row` in the place of the candidate's row of its name."""
        self._rows[self._at[row.name]] = row
        return row

    def update(self, name: str, **changes: Any) -> Row:
        """Candidate `name`'s row with `changes` (fields of `Row`), in its place: the new row."""
        return self.put(replace(self[name], **changes))

    def add_reason(self, name: str, reason: str, **changes: Any) -> Row:
        """Candidate `name`'s row with `reason` after the reason it had (and `changes`), in its place: the new row."""
        row = self[name]
        return self.put(replace(row, reason=(row.reason + "; " if row.reason else "") + reason, **changes))

    def __getitem__(self, name: str) -> Row:
        return self._rows[self._at[name]]

    def __contains__(self, name: object) -> bool:
        return name in self._at

    def __iter__(self) -> Iterator[Row]:  # the rows as they are now: a stage may update some as it goes
        return iter(tuple(self._rows))

    def __len__(self) -> int:
        return len(self._rows)


@dataclass(frozen=True)
class SearchResult:
    """What the search did: a row per candidate, the sensitivity fallbacks, seconds per stage. Made once, when the
    search is done (`Strategy.result`)."""

    rows: tuple[Row, ...]
    sensitivities: tuple[Sensitivity, ...]
    stage_seconds: Mapping[str, float]
    budget_s: float | None
    seconds: float = 0.0
    leaders: tuple[tuple[float, str], ...] = ()  # (seconds into the search, name): each new leader

    def first_led(self, name: str) -> float | None:
        """Seconds into the search when `name` first led the screen (the best passing lower bound), or None."""
        return next((seconds for seconds, leader in self.leaders if leader == name), None)

    def counts(self) -> dict[str, int]:
        timed = sum(r.status == "timed" for r in self.rows)
        return {"considered": len(self.rows), "screened_out": len(self.rows) - timed, "timed": timed}

    def candidate_runs(self, study: str) -> list[dict[str, dict]]:
        """The candidates timed on the screen but not measured in full, as light runs (params, metrics, tags):
        every timed candidate is then a run of the study, those measured in full being its attempt runs."""
        runs: list[dict[str, dict]] = []
        for row in self.rows:
            if row.screen_speedup is None or row.status == "timed":
                continue
            tags = {TAG_ATTEMPT: row.name, TAG_STUDY: study, TAG_SEARCH_STAGE: row.stage, TAG_SEARCH_STATUS: row.status,
                    TAG_SEARCH_REASON: row.reason}
            if row.pipeline:
                tags[TAG_PIPELINE] = row.pipeline
            if row.fallback_of:
                tags[TAG_FALLBACK_OF] = row.fallback_of
            if row.node:
                tags[TAG_NODE] = row.node
            metrics = {"search.screen_speedup": row.screen_speedup, "search.screen_ci_low": row.screen_ci_low,
                       "search.screen_ci_high": row.screen_ci_high, "search.margin": row.margin,
                       "model.size_bytes": row.size_bytes, **row.diff}
            runs.append({"tags": tags, "params": dict(row.params),
                         "metrics": {k: float(v) for k, v in metrics.items() if v is not None and np.isfinite(v)}})
        return runs

    def coverage(self) -> dict[str, dict[str, int]]:
        """How much of the space the search reached, per family of the candidates that apply: `applied`, `checked`
        (made and judged, or failed trying), `timed` (screened for speed), `not_reached` (the budget ran out before it
        was made, or timed)."""
        families: dict[str, dict[str, int]] = {}
        for row in self.rows:
            if not row.kind:  # an entry that does not apply
                continue
            counts = families.setdefault(row.family, dict.fromkeys(("applied", "checked", "timed", "not_reached"), 0))
            counts["applied"] += 1
            counts["checked"] += row.passed is not None or row.status == "failed"
            counts["timed"] += row.screen_speedup is not None
            counts["not_reached"] += row.status == "skipped"  # not made, or made and not timed
        return families

    def coverage_line(self) -> str:
        """The coverage in one line: what the budget reached, and which families it left unscreened."""
        families = self.coverage()
        total = {k: sum(c[k] for c in families.values()) for k in ("applied", "checked", "timed", "not_reached")}
        line = f"coverage: {total['checked']} of {total['applied']} candidates checked, {total['timed']} timed"
        short = {f: c for f, c in families.items() if c["not_reached"]}
        if not short:
            return line + "; the budget reached every one"
        return line + "; the budget did not reach " + ", ".join(
            f"{f} ({c['not_reached']} of {c['applied']})" for f, c in sorted(short.items(), key=lambda i: -i[1]["not_reached"]))

    def metrics(self) -> dict[str, float]:
        metrics = {f"search.{k}": float(v) for k, v in self.counts().items()}
        metrics.update({f"search.seconds.{stage}": s for stage, s in self.stage_seconds.items()})
        metrics["search.seconds"] = self.seconds
        coverage = self.coverage().values()
        metrics["search.not_reached"] = float(sum(c["not_reached"] for c in coverage))
        if self.budget_s is not None:
            metrics["search.budget_s"] = self.budget_s
        return metrics


def format_search(result: SearchResult) -> str:
    """What the command line prints after a search: the counts, seconds per stage, and each candidate that was
    not measured in full with where it stopped and why."""
    counts = result.counts()
    budget = "no budget" if result.budget_s is None else f"budget {result.budget_s:.0f} s"
    stages = ", ".join(f"{stage} {s:.0f} s" for stage, s in result.stage_seconds.items() if s)
    lines = [f"search: {counts['considered']} candidates, {counts['screened_out']} screened out, {counts['timed']} "
             f"measured in full; {result.seconds:.0f} s ({budget}): {stages}", result.coverage_line()]
    out = [r for r in result.rows if r.status != "timed"]
    if out:
        width = min(48, max(len(r.name) for r in out))
        lines.append("screened out:")
        for row in out:
            screen = f"{row.screen_speedup:.2f}x" if row.screen_speedup is not None else "-"
            lines.append(f"  {row.name[:width].ljust(width)}  {row.stage:<13} {screen:>6}  {row.reason}")
    return "\n".join(lines)
