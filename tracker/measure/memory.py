"""This process's memory, as Linux reports it; imports nothing heavy, so measuring it costs nothing."""

from __future__ import annotations

from pathlib import Path


def peak_rss_bytes() -> int:
    """This process's peak resident memory (`VmHWM`), or 0 where /proc does not tell it.

    Not `ru_maxrss`: Linux carries that over fork + exec, so a child would start at its parent's peak.
    """
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return 0
    return next((int(line.split()[1]) * 1024 for line in status.splitlines() if line.startswith("VmHWM:")), 0)
