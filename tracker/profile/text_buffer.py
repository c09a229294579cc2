"""The text a profile's stream decodes, held from the first event not yet decoded on: read block by block into a
reused buffer (`BlockText`), or a plain file mapped into memory (`MappedText`)."""

from __future__ import annotations

import mmap
import re
from collections.abc import Iterator
from pathlib import Path

OPEN, COMMA, CLOSE = ord("["), ord(","), ord("]")
_LEADING_BLANKS = re.compile(rb"[ \t\r\n]*")


class BlockText:
    """Text read block by block into a bytearray, which holds it from `start` (a list's bracket) to `length`.

    The buffer is reused: the text still needed is moved to its front when a block does not fit, and it is
    replaced by a larger one only when a line is longer than it, so its pages are faulted in once. (Its text is
    moved in place, not resized, as decoded events may still point into it: Python forbids resizing a buffer
    that has views.)
    """

    def __init__(self, blocks: Iterator[bytes | memoryview]) -> None:
        self._blocks = blocks
        self.buffer = bytearray(2**16)
        self.start = self.length = self.searched = 0
        self._dropped = 0  # text moved out of the buffer's front

    def offset(self, position: int) -> int:
        """Where a position in the buffer is in the whole text."""
        return self._dropped + position

    def open(self) -> bool:
        """Finds the first character that is not blank: True if it opens a list."""
        while True:
            blanks = _LEADING_BLANKS.match(self.buffer, self.start, self.length)
            assert blanks is not None  # `*`: the empty text matches too
            self.start = blanks.end()
            if self.start < self.length:
                self.searched = self.start + 1
                return self.buffer[self.start] == OPEN
            if not self.more():
                return False

    def more(self) -> bool:
        block = next(self._blocks, None)
        if block is None:
            return False
        end = self.length + len(block)
        if end > len(self.buffer):
            self._make_room(len(block))
            end = self.length + len(block)
        self.buffer[self.length : end] = block  # the same length: in place
        self.length = end
        return True

    def _make_room(self, needed: int) -> None:
        kept = self.length - self.start
        text = memoryview(self.buffer)[self.start : self.length]
        if kept + needed > len(self.buffer):
            self.buffer = bytearray(max(kept + needed, 2 * len(self.buffer)))
            memoryview(self.buffer)[:kept] = text
        elif self.start:
            memoryview(self.buffer)[:kept] = bytes(text)  # the two may overlap
        self.length, self.searched = kept, self.searched - self.start
        self._dropped += self.start
        self.start = 0

    def done_before(self, offset: int) -> None:
        pass  # the text before `offset` is dropped when room is made

    def head(self) -> memoryview:
        """The text read so far, from `start`."""
        return memoryview(self.buffer)[self.start : self.length]

    def rest(self) -> bytes:
        rest = bytearray(memoryview(self.buffer)[self.start : self.length])
        for block in self._blocks:
            rest += block
        return bytes(rest)


class MappedText:
    """A plain file mapped into memory, copy-on-write: the brackets written into it never reach the file.

    Holds the text of a stretch from `start` (a list's bracket) to `length`, which grows by `block_bytes` at a
    time up to the end of the stretch.
    """

    def __init__(self, path: Path, block_bytes: int, start: int, stop: int | None) -> None:
        with path.open("rb") as file:
            self.buffer = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_COPY)
        size = len(self.buffer)
        self._block_bytes = block_bytes
        self._end = size if stop is None or stop >= size else stop + 1
        if start:  # the comma before the stretch opens its list, the comma after it closes it
            self._bracket(start - 1, OPEN)
        if stop is not None and stop < size:
            self._bracket(stop, CLOSE)
        self.start = self.length = self.searched = max(0, start - 1)
        self._released = 0
        if hasattr(self.buffer, "madvise"):
            self.buffer.madvise(mmap.MADV_SEQUENTIAL)

    def _bracket(self, offset: int, bracket: int) -> None:
        if self.buffer[offset] != COMMA:
            raise ValueError(f"offset {offset} holds {bytes([self.buffer[offset]])!r}, not a comma between events")
        self.buffer[offset] = bracket

    def offset(self, position: int) -> int:
        return position

    def open(self) -> bool:
        blanks = _LEADING_BLANKS.match(self.buffer, self.start, self._end)
        assert blanks is not None  # `*`: the empty text matches too
        self.start = blanks.end()
        self.length = self.searched = min(self.start + 1, self._end)
        return self.start < self._end and self.buffer[self.start] == OPEN

    def more(self) -> bool:
        if self.length >= self._end:
            return False
        self.length = min(self.length + self._block_bytes, self._end)
        return True

    def done_before(self, offset: int) -> None:
        """Lets the pages before `offset` go: they would otherwise count as this process's memory."""
        release = offset - offset % mmap.PAGESIZE
        if release > self._released and hasattr(mmap, "MADV_DONTNEED"):
            self.buffer.madvise(mmap.MADV_DONTNEED, self._released, release - self._released)
            self._released = release

    def head(self) -> memoryview:
        """The text from `start` to the end of the stretch, where it lies: decoding it reads only what it needs."""
        return memoryview(self.buffer)[self.start : self._end]

    def rest(self) -> bytes:
        return self.buffer[self.start : self._end]


# What `tracker.profile.stream` decodes from: the two share `buffer`, `start`, `length`, `searched` and their methods.
HeldText = BlockText | MappedText
