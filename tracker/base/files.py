"""Reading a small file a user names (a config, a record) without blocking or running out of memory.

Opening a FIFO waits for a writer and a device such as /dev/zero reads for ever: only a regular file is opened, and
only when it is within its bound.
"""

from __future__ import annotations

import os
import stat
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
