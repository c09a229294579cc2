"""Where a search's speed screens run: here, one at a time, or on a cluster's nodes, several at once, each node
against the baseline it measured itself (`Remote`: the cluster's `Fanout`); and the cache's screens, reused instead
of timed again."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from tracker.base.termination import reraise_if_received
from tracker.measure.attempt import Attempt
from tracker.measure.runtimes.ort_runtime import SessionConfig
from tracker.measure.timing.speedup import Speedup, SpeedupConfig
from tracker.optimize import Candidate, Entry
from tracker.search.budget import Budget
from tracker.search.cache import Cached, SearchCache
from tracker.search.screen import screen_speed


@dataclass(frozen=True)
class Screened:
    """A screen's outcome: its speed-up (None when it failed: `error` says why), why racing stopped it early, and the
    cluster node that timed it (None: here)."""

    speedup: Speedup | None
    raced_out: str | None
    node_id: str | None = None
    error: str | None = None


class Remote(Protocol):
    """Screens on other machines (`tracker.cluster.driver.Fanout`)."""

    def submit_screen(self, candidate: Candidate, *, session: SessionConfig, config: SpeedupConfig,
                      must_beat: float | None) -> int: ...

    def screens(self, *, wait: bool = False) -> Mapping[int, Screened]: ...


class Screens:
    """The search's screens: `start` one, `finished` collects those done (name, kind, outcome), in the order they
    ended. Here a screen ends before `start` returns; on a cluster `start` sends it and the search goes on making
    candidates meanwhile."""

    def __init__(self, baseline: Attempt, feeds: Mapping[str, np.ndarray], session: SessionConfig, budget: Budget,
                 cache: SearchCache | None, remote: Remote | None = None) -> None:
        self.baseline, self.feeds, self.session, self.budget = baseline, dict(feeds), session, budget
        self.cache, self.remote = cache, remote
        self._sent: dict[int, tuple[str, str, Entry]] = {}  # a cluster's screen number -> (name, kind, entry)
        self._done: list[tuple[str, str, Screened]] = []

    def start(self, name: str, entry: Entry, candidate: Candidate, *, kind: str, config: SpeedupConfig,
              must_beat: float, cached: Cached | None) -> None:
        """Screens `candidate` against the baseline, to beat `must_beat` (racing): from the cache when it holds this
        screen (`Cached.screen`), else timed here or sent to the cluster."""
        hit = cached.screen(kind, must_beat) if cached is not None else None
        if hit is not None:
            self.cache.reused[name] += f", {kind}"  # type: ignore[union-attr]  # a hit came from it
            self._done.append((name, kind, Screened(*hit)))
            return
        if self.remote is not None:
            seq = self.remote.submit_screen(candidate, session=self.session, config=config, must_beat=must_beat)
            self._sent[seq] = (name, kind, entry)
            return
        try:
            with self.budget.timing(kind):
                found, raced_out = screen_speed(candidate, self.baseline, self.feeds, session=self.session,
                                                config=config, must_beat=must_beat)
        except Exception as e:  # noqa: BLE001 -- a candidate that cannot be timed is a row with its reason
            reraise_if_received(e)
            self._done.append((name, kind, Screened(None, None, error=f"{type(e).__name__}: {e}"[:300])))
            return
        self._ended(name, kind, entry, Screened(found, raced_out))

    def finished(self, *, wait: bool = False) -> list[tuple[str, str, Screened]]:
        """The screens that ended since the last call; with `wait`, once every one sent to the cluster is back."""
        if self.remote is not None and self._sent:
            for seq, screened in self.remote.screens(wait=wait).items():
                name, kind, entry = self._sent.pop(seq)
                self._ended(name, kind, entry, screened)
        done, self._done = self._done, []
        return done

    def _ended(self, name: str, kind: str, entry: Entry, screened: Screened) -> None:
        if self.cache is not None and screened.speedup is not None:
            self.cache.put_screen(entry, kind, screened.speedup, screened.raced_out)
        self._done.append((name, kind, screened))
