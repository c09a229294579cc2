"""A search's candidates (`CandidatePool`): each one's row; made from its entry, or taken from the search cache, and
checked as the study judges an attempt; its model kept until it is out of the running."""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from tracker.base.termination import reraise_if_received
from tracker.optimize import Candidate, Chain, Context, Entry
from tracker.optimize.quantize.prepare import model_bytes
from tracker.search.budget import Budget
from tracker.search.cache import Cached, SearchCache
from tracker.search.result import Row, Rows
from tracker.search.screen import AccuracyCheck
from tracker.search.space import family

logger = logging.getLogger(__name__)

# Until the search has made one, what making and checking a candidate is assumed to cost (seconds).
MAKE_GUESS_S = 10.0


class CandidatePool:
    """The candidates of one search, by name: their rows (`rows`, in the order they were added), the models made and
    still in the running (`made`), and what the cache held of each (`cached`).

    Args:
        source: the model file the candidates are made from.
        workdir: where each is made (`made-NAME`, removed by `drop`).
        context: what each entry is told.
        check: judges a made candidate as the study judges an attempt (on the feeds, or on real text).
        cache: the search cache, read before a candidate is made and written after; None: no cache.
        budget: the search's; making and checking a candidate counts as its `make` work.
    """

    def __init__(self, source: Path, workdir: Path, context: Context, check: Callable[[Candidate], AccuracyCheck],
                 cache: SearchCache | None, budget: Budget) -> None:
        self.source, self.workdir, self.context, self.check = source, workdir, context, check
        self.cache, self.budget = cache, budget
        self.rows = Rows()
        self.made: dict[str, tuple[Entry, Candidate]] = {}
        self.made_s: dict[str, float] = {}  # seconds each took to make (the leaders' runs log it)
        self.cached: dict[str, Cached] = {}  # what the cache held of each candidate
        self.hits: dict[str, Cached | None] = {}  # the cache's entries read to order the candidates, until used

    def make_and_check(self, entry: Entry, *, stage: str, reserve: float, fallback_of: str | None = None) -> Row | None:
        """`entry`'s row, its candidate made (or taken from the cache) and checked; skipped when making it would not
        leave `reserve` seconds of the budget for the later stages; None when it has a row already."""
        if entry.name in self.rows:
            return None
        self.rows.add(Row(entry.name, family(entry), entry.kind, stage=stage, fallback_of=fallback_of,
                          pipeline=entry.name if isinstance(entry, Chain) else None))
        if self._from_cache(entry):
            return self.rows[entry.name]
        if not self.budget.fits("make", MAKE_GUESS_S, reserve=reserve):
            return self.rows.update(entry.name, status="skipped",
                                    reason="not tried: the budget was kept for the later stages")
        try:
            with self.budget.timing("make"):
                start = time.perf_counter()
                candidate = entry(self.source, self.workdir / f"made-{entry.name}", self.context)
                made_s = time.perf_counter() - start
                check = self.check(candidate)
        except Exception as e:  # noqa: BLE001 -- a candidate that cannot be made or run is a row with its reason
            reraise_if_received(e)
            row = self.rows.update(entry.name, status="failed", reason=f"{type(e).__name__}: {e}"[:300])
            logger.warning("search: %s failed: %s", entry.name, row.reason)
            return row
        size_bytes = _size(candidate.path)
        row = self.rows.update(
            entry.name, precision=candidate.precision, passed=check.passed, margin=check.margin,
            params={**candidate.params, "precision": candidate.precision},
            diff={k: v for k, v in check.metrics.items() if k.startswith("diff.")}, size_bytes=size_bytes,
            reason="" if check.passed else f"accuracy check failed (margin {check.margin:.3f})")
        self.made[entry.name], self.made_s[entry.name] = (entry, candidate), made_s
        if self.cache is not None:
            self.cache.put(entry, candidate, passed=check.passed, margin=check.margin, metrics=row.diff,
                           size_bytes=size_bytes, made_s=made_s)
        logger.info("search: %s %s its accuracy check (margin %.3f)", entry.name,
                    "passed" if check.passed else "failed", check.margin)
        return row

    def _from_cache(self, entry: Entry) -> bool:
        """Fills `entry`'s row from the cache's check of it (and makes its cached model the candidate); False on a
        miss, or when the model it needs is not there."""
        hit = self.hits.pop(entry.name) if entry.name in self.hits else self.cache.get(entry) if self.cache else None
        if hit is None or (hit.candidate is None and (hit.passed or "exclude" in entry.knobs())):
            return False
        self.rows.update(entry.name, precision=hit.precision, passed=hit.passed, margin=hit.margin, params=hit.params,
                         diff=hit.metrics, size_bytes=hit.size_bytes,
                         reason="" if hit.passed else f"accuracy check failed (margin {hit.margin:.3f})")
        if hit.candidate is not None:
            self.made[entry.name] = (entry, hit.candidate)
            self.made_s[entry.name] = hit.made_s
        self.cached[entry.name] = hit
        self.cache.reused[entry.name] = "check"  # type: ignore[union-attr]  # a hit came from it
        logger.info("search: %s from the cache: %s its accuracy check (margin %.3f)", entry.name,
                    "passed" if hit.passed else "failed", hit.margin)
        return True

    def drop(self, name: str) -> None:
        """Lets `name`'s model go: its files go once it is out of the running (or measured in full)."""
        made = self.made.pop(name, None)
        if made is not None:
            shutil.rmtree(self.workdir / f"made-{name}", ignore_errors=True)


def _size(path: Path) -> int:
    try:
        return model_bytes(Path(path))
    except Exception:  # noqa: BLE001 -- a size is a nice-to-have of the table
        return 0
