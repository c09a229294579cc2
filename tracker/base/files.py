"""The files and folders a user names or the process works in: a small file read without blocking or running out of
memory, the working folder, which folder is full when a write fails for space, and the work folders a process owns
(marked with the process, so that the next one removes those a killed process left).

Opening a FIFO waits for a writer and a device such as /dev/zero reads for ever: only a regular file is opened, and
only when it is within its bound.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import shutil
import socket
import stat
import tempfile
from collections.abc import Mapping
from pathlib import Path

import psutil

from tracker.base.errors import TrackerError

logger = logging.getLogger(__name__)


def read_small_file(path: str | Path, *, max_bytes: int, what: str) -> bytes:
    """The bytes of `path`, a regular file of at most `max_bytes`.

    Args:
        path: the file.
        max_bytes: the largest size read.
        what: what the file should be, for the messages (e.g. "a Hugging Face config.json").

    Raises:
        ValueError: `path` is not a regular file (naming its mode), or is larger than `max_bytes` (naming both sizes).
        OSError: it cannot be read.
    """
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        raise ValueError(f"{path} must be a regular file ({what}), got {stat.filemode(st.st_mode)}")
    if st.st_size > max_bytes:
        raise ValueError(f"{path} has {st.st_size} bytes, more than {what} holds (at most {max_bytes} are read)")
    with open(path, "rb") as f:
        return f.read(max_bytes + 1)


def working_folder() -> Path:
    """The working folder.

    Raises:
        TrackerError: it was removed while the process was in it (`os.getcwd` fails).
    """
    try:
        return Path(os.getcwd())
    except FileNotFoundError:
        raise TrackerError("the working folder was removed while this shell was in it: cd to a folder that exists, "
                           "then run this again (the default store ./mlflow.db and ./tracker-outbox are relative "
                           "to it)") from None


_NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT})


def no_space_note(error: BaseException | None) -> str:
    """For a write that failed for space (ENOSPC, EDQUOT: the kernel names no file), the folders this process writes
    to and the space left in each, the file's own first when the error names one: " (space left: /tmp (the
    temporary folder, $TMPDIR) 0.0 MB; ...)". Empty for any other error (its causes and contexts are looked at too).
    """
    while error is not None and not (isinstance(error, OSError) and error.errno in _NO_SPACE):
        error = error.__cause__ or error.__context__  # e.g. MLflow's error about a file it could not write
    if error is None:
        return ""
    folders = {Path(tempfile.gettempdir()): "the temporary folder, $TMPDIR"}
    with contextlib.suppress(FileNotFoundError):
        folders[Path(os.getcwd())] = "the working folder"
    if error.filename:
        folders = {Path(os.fsdecode(error.filename)).parent: "the file's folder", **folders}
    left = []
    for folder, role in folders.items():
        try:
            free = f"{shutil.disk_usage(folder).free / 1e6:.1f} MB"
        except OSError:
            free = "unknown"
        left.append(f"{folder} ({role}) {free}")
    return f" (space left: {'; '.join(left)})"


# A pid alone names whatever process holds that number now: a process is its pid and when it started.
_SAME_START_S = 1.0
WORK_MARKER = ".tracker-owner.json"  # in each work folder `make_work_folder` makes: the process that owns it


def this_process() -> dict[str, str]:
    """This process as its runs and work folders record it: its host's name, its pid, and when it started (seconds
    after boot, which a clock change does not move)."""
    process = psutil.Process()
    return {"host": socket.gethostname(), "pid": str(process.pid), "started_s": f"{started_s(process):.2f}"}


def process_gone(owner: Mapping[str, str]) -> bool:
    """Whether the process `owner` names (`this_process`'s fields) ran on this host and has ended: its pid is free,
    or held by a process that started at another time. False for another host's process, or for fields that do not
    parse: nothing is claimed about a process this host cannot see."""
    if owner.get("host") != socket.gethostname():
        return False
    try:
        pid, recorded_s = int(owner["pid"]), float(owner["started_s"])
    except (KeyError, TypeError, ValueError):
        return False
    try:
        return abs(started_s(psutil.Process(pid)) - recorded_s) > _SAME_START_S
    except psutil.NoSuchProcess:
        return True
    except psutil.AccessDenied:
        return False


def started_s(process: psutil.Process) -> float:
    """When `process` started, in seconds after boot: /proc's start time, whatever the wall clock did since."""
    return process.create_time() - psutil.boot_time()


def make_work_folder(prefix: str) -> Path:
    """A new folder under the temporary folder (`prefix` starts with "tracker-") for this process's work, marked as
    its own; the folders of processes gone are removed first (`remove_dead_work_folders`)."""
    remove_dead_work_folders()
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    (folder / WORK_MARKER).write_text(json.dumps(this_process()))
    return folder


def remove_dead_work_folders(root: Path | None = None) -> list[Path]:
    """Removes the work folders `make_work_folder` made under `root` (default: the temporary folder) whose process
    ended on this host without removing them (a SIGKILL leaves its models there). A folder without the marker is
    never removed: it is not known to be ours. Returns the folders removed."""
    removed = []
    for marker in (root or Path(tempfile.gettempdir())).glob(f"tracker-*/{WORK_MARKER}"):
        try:
            owner = json.loads(read_small_file(marker, max_bytes=4096, what="a work folder's owner"))
        except (OSError, ValueError, RecursionError):
            continue
        if isinstance(owner, dict) and process_gone(owner):
            shutil.rmtree(marker.parent, ignore_errors=True)
            removed.append(marker.parent)
            logger.info("removed %s, the work folder of process %s, which ended without removing it", marker.parent,
                        owner.get("pid"))
    return removed
