"""SIGTERM handled like Ctrl-C: what `timeout`, a CI cancel and `kill` send must not leave a run RUNNING.

Python's default for SIGTERM ends the process at once: no `finally`, no `with` exit, so the MLflow runs
stay RUNNING forever and temporary folders stay behind. Inside `sigterm_as_exit()` SIGTERM raises
`Terminated` (a `SystemExit` with code 143) instead, which unwinds like Ctrl-C's KeyboardInterrupt:
runs are ended FAILED, work folders removed, and the process exits 143 without a traceback.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

EXIT_CODE = 128 + signal.SIGTERM  # 143, what a shell reports for a process ended by SIGTERM


class Terminated(SystemExit):
    """Raised in the main thread when the process receives SIGTERM."""

    def __init__(self) -> None:
        super().__init__(EXIT_CODE)

    def __str__(self) -> str:
        return "terminated by SIGTERM"


def _raise_terminated(signum, frame) -> None:
    raise Terminated()


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
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def handle_sigterm() -> None:
    """For a script's `main`: SIGTERM raises `Terminated` from now on (see the module docstring)."""
    signal.signal(signal.SIGTERM, _raise_terminated)
