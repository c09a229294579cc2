"""Text the CLI prints, made safe for a terminal: names from models and profiles can hold escape sequences."""

from __future__ import annotations

import re

# C0 controls but tab and newline, DEL, and C1 controls (0x9b is CSI on terminals that read 8-bit controls).
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """`text` with each control character but tab and newline spelled as its `\\xNN` escape.

    A node named "\\x1b[2J" clears the screen when printed raw; printed by this, it reads `\\x1b[2J`.
    """
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)
