"""This process's memory, as Linux reports it: its peak, now, and what a block of code leaves resident."""

from __future__ import annotations

import contextlib
import ctypes
import gc
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

MIB = 2**20


def peak_rss_bytes() -> int:
    """This process's peak resident memory (`VmHWM`), or 0 where /proc does not tell it.

    Not `ru_maxrss`: Linux carries that over fork + exec, so a child would start at its parent's peak.
    """
    return _status_bytes("VmHWM:")


def rss_bytes() -> int:
    """This process's resident memory now (`VmRSS`), or 0 where /proc does not tell it."""
    return _status_bytes("VmRSS:")


def release_free_memory() -> None:
    """Collects Python's garbage and hands the C heap's free pages back to the OS (glibc's `malloc_trim`).

    Without it, memory a previous attempt freed stays in the heap: a new session would reuse it without
    growing the resident set, and temporaries freed while a session was made would still count.
    """
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):  # not glibc: nothing to trim
        ctypes.CDLL("libc.so.6").malloc_trim(0)


@dataclass
class Growth:
    """How much the resident set grew inside a `rss_growth` block (filled when the block ends)."""

    before_bytes: int = 0
    after_bytes: int = 0

    @property
    def bytes(self) -> int:
        return self.after_bytes - self.before_bytes


@contextlib.contextmanager
def rss_growth() -> Iterator[Growth]:
    """Measures what the code inside the block leaves resident: `VmRSS` after minus before, each read
    after `release_free_memory`, so freed temporaries and reused free heap do not count. It can be
    negative (memory freed inside the block); it is 0 where /proc does not tell it.
    """
    release_free_memory()
    growth = Growth(before_bytes=rss_bytes())
    yield growth
    release_free_memory()
    growth.after_bytes = rss_bytes() if growth.before_bytes else 0


def _status_bytes(field: str) -> int:
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return 0
    return next((int(line.split()[1]) * 1024 for line in status.splitlines() if line.startswith(field)), 0)
