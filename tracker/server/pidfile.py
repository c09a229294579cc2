"""`server.pid`: which process serves a folder, recorded so that no other process can be taken for it.

A pid alone names whatever process holds that number now: once the server is gone, an unrelated one. So the
file holds the pid and when that process started (seconds after boot, which a clock change does not move), and
a process counts as the server only if both match. A file left by a killed server, a reused pid and a garbled
file are all "stale": the caller removes the file and signals nothing.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import psutil

from tracker.base.files import started_s
from tracker.server.common import LocalServerError

# /proc counts start times in clock ticks (1/100 s); their conversion to seconds may differ in the last bits.
_SAME_START_S = 0.05


class StalePidFile(LocalServerError):
    """The pid file names no running server: garbled, or its process ended or is another one now."""


def write_pid_file(path: Path) -> None:
    """Records this process as the server of `path`'s folder (atomically: a reader never sees half a file)."""
    record = json.dumps({"pid": os.getpid(), "started_s": started_s(psutil.Process())})
    partial = path.with_name(path.name + ".partial")
    partial.write_text(record + "\n")
    partial.replace(path)


def running_server(path: Path) -> psutil.Process | None:
    """The server process `path` names; None if there is no such file.

    Raises:
        StalePidFile: the file is garbled, or names a process that ended or that is not the one it recorded.
    """
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return None
    pid, recorded_s = _parse(text, path)
    try:
        process = psutil.Process(pid)
        now_started_s = started_s(process)
        name = process.name()
    except psutil.NoSuchProcess:
        raise StalePidFile(f"{path} names pid {pid}, which is no longer running (a stale pid file)") from None
    except psutil.AccessDenied:
        name = "?"
        now_started_s = None
    if now_started_s is None or abs(now_started_s - recorded_s) > _SAME_START_S:
        raise StalePidFile(f"{path} names pid {pid}, which is now another process ({name}), not the server it "
                           "recorded (a stale pid file)")
    return process


def _parse(text: str, path: Path) -> tuple[int, float]:
    try:
        record = json.loads(text)
        pid, recorded_s = record["pid"], record["started_s"]
        if type(pid) is int and pid > 0 and isinstance(recorded_s, (int, float)):
            return pid, float(recorded_s)
    except (ValueError, TypeError, KeyError):
        pass
    shown = text.strip()
    if shown.isdigit():  # what an older version wrote: it cannot tell its server from a process reusing the pid
        raise StalePidFile(f"{path} holds a bare pid ({shown}), without the start time that tells the server from "
                           "another process with that pid; treated as a stale pid file")
    raise StalePidFile(f"{path} is not a pid file this script wrote ({shown[:40]!r}); treated as a stale pid file")
