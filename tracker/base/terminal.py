"""Text the CLI prints, made safe for a terminal: names from models and profiles can hold escape sequences."""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable

# C0 controls but tab and newline, DEL, and C1 controls (0x9b is CSI on terminals that read 8-bit controls).
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
# Bidirectional controls: U+202E (right-to-left override) makes "exe.txt" of "txt.exe" on the screen.
_BIDI = re.compile("[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """`text` with each control character but tab and newline spelled as its `\\xNN` escape, and each bidirectional
    control as its `\\uNNNN` escape.

    A node named "\\x1b[2J" clears the screen when printed raw; printed by this, it reads `\\x1b[2J`.
    """
    text = _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)
    return _BIDI.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def one_line(text: str, limit: int = 300) -> str:
    """`text` on one line, at most `limit` characters."""
    text = " ".join(str(text).split())
    return text if len(text) <= limit else f"{text[:limit - 3]}..."


def escape_all_logs() -> None:
    """Escapes every log record's message as `printable` does, when it is made, whichever library logs it and
    whichever handler writes it (MLflow's loggers have their own, and its messages hold the names it was given)."""
    rewrite_log_records(printable)


def rewrite_log_records(rewrite: Callable[[str], str], *, exceptions: bool = False) -> None:
    """Passes every log record's message (and, with `exceptions`, its traceback) through `rewrite` when the record is
    made, so that it holds whichever handler writes it. Installed once per `rewrite`."""
    with _rewrites_lock:
        if rewrite in _rewrites:
            return
        _rewrites.add(rewrite)
    make_record = logging.getLogRecordFactory()

    def rewriting_factory(*args, **kwargs) -> logging.LogRecord:
        record = make_record(*args, **kwargs)
        try:
            message = record.getMessage()
        except Exception:  # a malformed call: logging reports it when the record is written
            return record
        clean = rewrite(message)
        if clean != message:
            record.msg, record.args = clean, None
        if exceptions and record.exc_info and record.exc_info[1] is not None:
            record.exc_text = rewrite(logging.Formatter().formatException(record.exc_info))
        return record

    logging.setLogRecordFactory(rewriting_factory)


_rewrites: set[Callable[[str], str]] = set()
_rewrites_lock = threading.Lock()


def setup_logging(*, progress: bool) -> None:
    """The command line's logging: warnings on stderr, the tracker's progress (`progress`) at INFO, and every message
    escaped (`escape_all_logs`): names from the user reach the terminal escaped, in MLflow's messages too."""
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    escape_all_logs()
    if progress:
        logging.getLogger("tracker").setLevel(logging.INFO)
