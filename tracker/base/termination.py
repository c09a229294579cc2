"""SIGTERM handled like Ctrl-C: what `timeout`, a CI cancel and `kill` send must not leave a run RUNNING.

Python's default for SIGTERM ends the process at once: no `finally`, no `with` exit, so the MLflow runs
stay RUNNING forever and temporary folders stay behind. Inside `sigterm_as_exit()` SIGTERM raises
`Terminated` (a `SystemExit` with code 143) instead, which unwinds like Ctrl-C's KeyboardInterrupt:
runs are ended FAILED, work folders removed, and the process exits 143 without a traceback.

SIGTERM is never lost. Python runs the handler between any two bytecodes, and where that is inside a
weakref callback or a `__del__` (SQLAlchemy's pool has both) the exception is printed as "Exception
ignored" and dropped, or a C extension's import turns it into an ImportError. So the handler also notes
that the signal came (`received()`): the block of `sigterm_as_exit()` raises `Terminated` when it ends
normally after one, and code that catches errors wholesale asks `received()` before calling one a failure.

A write to the tracking store is never cut in half: inside `deferred()` (every function of
`tracker.store.write` that writes) SIGTERM waits until the write is done. Interrupted inside a SQLAlchemy
transaction, a sqlite store stays locked, and the runs could not be ended at all.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import signal
import threading
from collections.abc import Callable, Iterator
from typing import TypeVar

logger = logging.getLogger(__name__)
F = TypeVar("F", bound=Callable)

EXIT_CODE = 128 + signal.SIGTERM  # 143, what a shell reports for a process ended by SIGTERM


class Terminated(SystemExit):
    """Raised in the main thread when the process receives SIGTERM."""

    def __init__(self) -> None:
        super().__init__(EXIT_CODE)

    def __str__(self) -> str:
        return "terminated by SIGTERM"


_deferring = 0  # depth of `deferred()` blocks in the main thread
_pending = False  # SIGTERM arrived inside one
_received = False  # SIGTERM arrived since `sigterm_as_exit()` or `handle_sigterm()` began


def received() -> bool:
    """Whether SIGTERM arrived: then an error raised meanwhile may be the signal in disguise."""
    return _received


def reraise_if_received(error: BaseException) -> None:
    """For an `except Exception` that would carry on: raises `Terminated` (from `error`) if SIGTERM arrived,
    since `error` may be the signal in disguise (an ImportError from a cut import, say)."""
    if _received:
        raise Terminated() from error


def _raise_terminated(signum, frame) -> None:
    global _pending, _received
    _received = True
    if _deferring:
        _pending = True
        logger.warning("SIGTERM received: stopping once the current write to the tracking store is done")
        return
    raise Terminated()


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Within the block SIGTERM only takes note; `Terminated` is raised when the outermost block ends."""
    global _deferring, _pending
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers run in the main thread only
        return
    _deferring += 1
    try:
        yield
    finally:
        _deferring -= 1
        if not _deferring and _pending:
            _pending = False
            raise Terminated()


def defers_sigterm(function: F) -> F:
    """Decorator: the whole call is `deferred()`."""

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        with deferred():
            return function(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


@contextlib.contextmanager
def sigterm_as_exit() -> Iterator[None]:
    """Within the block, SIGTERM raises `Terminated`; the previous handler comes back afterwards.

    Only the main thread can receive signals, and a handler the application installed itself is left
    alone: then this does nothing.
    """
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) not in (
        signal.SIG_DFL, _raise_terminated
    ):
        yield
        return
    global _received
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    if previous is not _raise_terminated:  # the outermost block: a signal before it is not this one's
        _received = False
    try:
        yield
        if _received:  # it was raised where it got swallowed (see the module docstring): still end
            logger.warning("SIGTERM received, and its exception was swallowed on the way: ending now")
            raise Terminated()
    finally:
        signal.signal(signal.SIGTERM, previous)


def handle_sigterm() -> None:
    """For a script's `main`: SIGTERM raises `Terminated` from now on (see the module docstring)."""
    signal.signal(signal.SIGTERM, _raise_terminated)
