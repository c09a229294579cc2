"""The files and folders a user names or the process works in: a small file read without blocking or running out of
memory, the working folder, and which folder is full when a write fails for space.

Opening a FIFO waits for a writer and a device such as /dev/zero reads for ever: only a regular file is opened, and
only when it is within its bound.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
import tempfile
from pathlib import Path

from tracker.base.errors import TrackerError


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
