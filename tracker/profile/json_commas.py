"""Finds the commas between the elements of a JSON list in its text, read piece by piece; numpy only.

`tracker.profile.stream` cuts a profile's text at these commas when its events are not one per line (one long
line, a pretty-printed list), so that it never decodes more than about a block of text at a time.
"""

from __future__ import annotations

import numpy as np

_QUOTE, _BACKSLASH, _COMMA = ord('"'), ord("\\"), ord(",")
_OPENS, _CLOSES = (ord("["), ord("{")), (ord("]"), ord("}"))
# The bytes that can change whether the text is in a string or how deep it is; bytes.translate finds them in C.
_SYNTAX = bytes(int(byte in b'"\\[]{},') for byte in range(256))


class ListCommas:
    """The commas between the elements of one JSON list, in its text given piece after piece.

    The text starts just after the list's `[`. It is assumed to be JSON: in text that is not, the commas found
    may be anywhere, and decoding what lies between two of them tells so.
    """

    def __init__(self) -> None:
        self._in_string = False
        self._depth = 0  # of the text scanned so far, in brackets and braces inside the list

    def scan(self, text: bytes | bytearray | memoryview) -> tuple[int, int]:
        """Scans the next piece of the text.

        Returns:
            (last comma, scanned): the offset in `text` of the last comma between two elements of the list in it
            (-1 if none), and how much of `text` was scanned: all of it but a run of backslashes at its end,
            which escapes what follows it. The next piece starts there.
        """
        piece = bytes(text)
        scanned = len(piece.rstrip(b"\\"))
        piece = piece[:scanned]
        at = np.flatnonzero(np.frombuffer(piece.translate(_SYNTAX), dtype=np.bool_))
        chars = np.frombuffer(piece, dtype=np.uint8)[at]
        quotes = chars == _QUOTE
        backslashes = at[chars == _BACKSLASH]
        if len(backslashes):
            quotes &= ~np.isin(at, _escaped(backslashes))
        # True from an opening quote up to its closing one (exclusive): the bytes of a string.
        in_string = np.logical_xor.accumulate(quotes) ^ self._in_string
        if len(in_string):
            self._in_string = bool(in_string[-1])
        syntax = ~in_string & ~quotes
        at, chars = at[syntax], chars[syntax]
        steps = np.isin(chars, _OPENS).astype(np.int64) - np.isin(chars, _CLOSES)
        depth = self._depth + np.cumsum(steps)
        if len(depth):
            self._depth = int(depth[-1])
        commas = at[(chars == _COMMA) & (depth == 0)]
        return (int(commas[-1]) if len(commas) else -1), scanned


def _escaped(backslashes: np.ndarray) -> np.ndarray:
    """The offsets of the bytes that a run of backslashes escapes: those after a run of odd length."""
    breaks = np.flatnonzero(np.diff(backslashes) != 1)
    firsts = backslashes[np.r_[0, breaks + 1]]
    lasts = backslashes[np.r_[breaks, len(backslashes) - 1]]
    return (lasts + 1)[(lasts - firsts) % 2 == 0]
