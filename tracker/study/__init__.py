"""A study: `Study` (`study`), what it holds open while it runs (`context`: the store, the outbox, SIGTERM, its work
folder and parent run), and what it makes of a registry entry before measuring it (`candidates`)."""

from tracker.study.study import Study

__all__ = ["Study"]
