"""Decodes the trace events of an ONNX Runtime profile from its JSON text: whole, or batch by batch from a stream."""

from __future__ import annotations

import gzip
import mmap
import re
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import ClassVar

import msgspec

from tracker.errors import ProfileFormatError

_GZIP_MAGIC = b"\x1f\x8b"
# How many candidate cut points to try when recovering the complete events of a truncated file.
_MAX_RECOVERY_TRIES = 64
_OPEN, _COMMA, _CLOSE, _BLANKS = ord("["), ord(","), ord("]"), b" \t\r\n"
_LIST_START = re.compile(rb"[ \t\r\n]*\[")  # matched in place: lstrip() would copy the whole text
_LEADING_BLANKS = re.compile(rb"[ \t\r\n]*")
# The comma between two events as ORT lays them out, one per line: `},\n{`. In other layouts it may also match
# inside an event (a pretty-printed list of shapes); the stretches cut there then fail to decode as event lists.
_EVENT_COMMA = re.compile(rb"\}[ \t\r]*(,)[ \t\r]*\n[ \t\r\n]*\{")
# How far past a wanted cut to look for the comma after an event.
_COMMA_WINDOW_BYTES = 2**20


class Args(msgspec.Struct, gc=False):
    # Fields we do not keep (thread_scheduling_stats, node_index, mem_* but one) are skipped by the decoder
    # without being materialized. Numbers are strings in every ORT release ("40000"): the decoder is not strict,
    # so it turns them into ints itself.
    op_name: str = ""
    provider: str = ""
    input_type_shape: msgspec.Raw = msgspec.Raw(b"[]")
    output_type_shape: msgspec.Raw = msgspec.Raw(b"[]")
    output_size: int = 0
    activation_size: int = 0
    parameter_size: int = 0
    mem_in_use_delta: int | None = None


# gc=False: the cyclic GC need not track half a million objects that hold no containers and so make no cycles.
class Event(msgspec.Struct, gc=False):
    """A trace event of any category."""

    cat: str
    name: str
    ts: int
    dur: int = 0
    tid: int | str = 0
    args: Args = msgspec.field(default_factory=Args)


# ORT writes events of these two categories. Decoding them as a tagged union spares a string per event and the
# args of Session events; a list that holds anything else is decoded again as `Event`s (foreign JSON fails there).
class NodeEvent(msgspec.Struct, tag_field="cat", tag="Node", gc=False):
    cat: ClassVar[str] = "Node"
    name: str
    ts: int
    dur: int = 0
    tid: int | str = 0
    args: Args = msgspec.field(default_factory=Args)


class SessionEvent(msgspec.Struct, tag_field="cat", tag="Session", gc=False):
    cat: ClassVar[str] = "Session"
    name: str
    ts: int
    dur: int = 0


AnyEvent = Event | NodeEvent | SessionEvent
_ort_decoder = msgspec.json.Decoder(list[NodeEvent | SessionEvent], strict=False)
_any_decoder = msgspec.json.Decoder(list[Event], strict=False)


def _decode_list(text: bytes | bytearray | memoryview) -> list[AnyEvent]:
    try:
        return _ort_decoder.decode(text)
    except msgspec.ValidationError:
        return _any_decoder.decode(text)


def empty_message(source: str) -> str:
    return f"profile {source!r} is empty; expected a JSON list of trace events"


def decode_events(text: bytes | bytearray, source: str, *, events_before: int = 0) -> tuple[list[AnyEvent], bool]:
    """Decodes a JSON list of trace events; a list cut short gives its complete events and True.

    Args:
        text: the JSON text.
        source: the file it came from, for messages.
        events_before: events already read before `text`, which then starts between two events of a longer
            list: a tail holding no complete event is the cut end of that list, not garbage.

    Raises:
        ProfileFormatError: the text is not JSON (and not a cut list), or JSON that is not a list of events.
    """
    try:
        return _decode_list(text), False
    except msgspec.ValidationError as e:
        raise ProfileFormatError(_foreign_message(source, e)) from e
    except msgspec.DecodeError as e:
        events = _recover_truncated(text)
        if events is None and events_before:
            events = []
        if events is None:
            raise ProfileFormatError(
                f"profile {source!r} is not valid JSON ({e}); expected the JSON list of trace "
                "events that onnxruntime writes with enable_profiling=True"
            ) from e
        return events, True


def _foreign_message(source: str, error: Exception) -> str:
    return (
        f"{source!r} is JSON but not an ONNX Runtime profile ({error}); expected a list of trace "
        'events like {"cat": "Node", "name": "..._kernel_time", "ts": 0, "dur": 0, "args": {...}}'
    )


def _recover_truncated(text: bytes | bytearray) -> list[AnyEvent] | None:
    """Returns the complete events before the cut of a truncated list, or None if it is not one."""
    if not _LIST_START.match(text):
        return None
    end = len(text)
    for _ in range(_MAX_RECOVERY_TRIES):
        end = text.rfind(b"}", 0, end)
        if end < 0:
            return None
        try:
            events = _decode_list(text[: end + 1] + b"]")
        except msgspec.ValidationError:
            return None
        except msgspec.DecodeError:
            continue
        return events
    return None


def iter_blocks(path: Path, block_bytes: int) -> Iterator[memoryview]:
    """The text of a profile file (decompressed if it is gzip), `block_bytes` at a time.

    Every block is read into the same buffer: a block is valid until the next one is asked for. (Fresh 1 MiB
    buffers cost a page fault per 4 KiB, on a 540 MB file ~0.3 s.)
    """
    if block_bytes < 1:
        raise ValueError(f"block_bytes must be at least 1, got {block_bytes}")
    with path.open("rb") as file:
        is_gzip = file.read(2) == _GZIP_MAGIC
        file.seek(0)
        stream = gzip.GzipFile(fileobj=file, mode="rb") if is_gzip else file
        buffer = memoryview(bytearray(block_bytes))
        while True:
            try:
                read = stream.readinto(buffer)
            except (OSError, EOFError, zlib.error) as e:  # a corrupt deflate stream raises zlib.error
                if not is_gzip:
                    raise
                raise ProfileFormatError(f"profile {str(path)!r} is a damaged gzip file: {e}") from e
            if not read:
                return
            yield buffer[:read]


def event_commas(path: Path, wanted: list[int]) -> list[int]:
    """Offsets of the first comma between two events at or after each wanted offset of a plain profile file.

    Fewer (none for a one-line file) when no such comma follows a wanted offset closely. Each stretch between two
    commas is a JSON list once bracketed, if the commas are between events: a stretch that does not decode as a
    list of events tells that one was not.
    """
    commas: list[int] = []
    with path.open("rb") as file:
        for offset in wanted:
            offset = max(offset, commas[-1] + 1 if commas else 0)
            file.seek(offset)
            found = _EVENT_COMMA.search(file.read(_COMMA_WINDOW_BYTES))
            if found is not None:
                commas.append(offset + found.start(1))
    return commas


def iter_event_batches(blocks: Iterable[bytes | memoryview], source: str) -> Iterator[tuple[list[AnyEvent], bool]]:
    """Decodes a JSON list of trace events from consecutive blocks of its text, about one batch per block.

    The text is held from the first event not yet decoded on, in one buffer reused from batch to batch: a batch
    is valid until the next one is asked for (its `msgspec.Raw` fields point into the buffer). See `_batches`.

    Yields:
        (events, truncated): truncated is True only in the last batch, when the list was cut short.

    Raises:
        ProfileFormatError: as `decode_events`, or the text is empty.
    """
    return _batches(_BlockText(iter(blocks)), source)


def iter_mapped_batches(
    path: Path, source: str, block_bytes: int, *, start: int = 0, stop: int | None = None
) -> Iterator[tuple[list[AnyEvent], bool]]:
    """Decodes the JSON list of trace events of a plain file in batches of about `block_bytes` of its text.

    The file is mapped into memory, privately, and decoded where it lies: no copy of its text is made, and the
    pages already decoded are let go. See `_batches`.

    Args:
        start, stop: decode only the events between the commas at `start - 1` and `stop` (a stretch that
            `event_commas` found), as a list of their own.

    Yields:
        (events, truncated): truncated is True only in the last batch, when the list was cut short.

    Raises:
        ProfileFormatError: as `decode_events`, or the text is empty.
    """
    if block_bytes < 1:
        raise ValueError(f"block_bytes must be at least 1, got {block_bytes}")
    if not path.stat().st_size:
        raise ProfileFormatError(empty_message(source))
    return _batches(_MappedText(path, block_bytes, start, stop), source)


def _batches(text: _BlockText | _MappedText, source: str) -> Iterator[tuple[list[AnyEvent], bool]]:
    """Decodes a JSON list of trace events batch by batch, as more of its text becomes available.

    ORT writes one event per line: the text available is cut after its last newline and the lines before the cut
    are decoded as one list, so the whole text is never decoded at once. Cutting at newlines is right for any
    layout: a raw newline never occurs inside a JSON string, and no proper prefix of an object is an object, so
    lines that decode as a list of objects end between two events. The comma before the cut becomes the list's
    closing bracket, the newline after it the next list's opening one: nothing is copied. When a cut falls inside
    an event (a pretty-printed file), the rest of the text is decoded in one go, as a whole file would be.
    """
    if not text.open():  # empty, or not a list: let the whole-text decoder say what it is
        if text.start == text.length and not text.more():
            raise ProfileFormatError(empty_message(source))
        yield decode_events(text.rest(), source)
        return
    events_before = 0
    while True:
        buffer = text.buffer  # a block text may have moved to a larger buffer
        cut = buffer.rfind(b"\n", text.searched, text.length)
        text.searched = text.length
        end = cut - 1
        while cut >= 0 and buffer[end] in _BLANKS:
            end -= 1
        if cut < 0 or end == text.start:  # no line, or nothing but the bracket so far
            if not text.more():
                break
            continue
        if buffer[end] != _COMMA:  # the end of the list, or lines that are not one event each
            break
        buffer[end] = _CLOSE
        try:
            events = _decode_list(memoryview(buffer)[text.start : end + 1])
        except msgspec.ValidationError as e:
            raise ProfileFormatError(_foreign_message(source, e)) from e
        except msgspec.DecodeError:  # the cut fell inside an event
            buffer[end] = _COMMA
            break
        yield events, False
        events_before += len(events)
        del events
        buffer[cut] = _OPEN
        text.start = cut
        text.done_before(cut)
        if not text.more():
            break
    yield decode_events(text.rest(), source, events_before=events_before)


class _BlockText:
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

    def open(self) -> bool:
        """Finds the first character that is not blank: True if it opens a list."""
        while True:
            self.start = _LEADING_BLANKS.match(self.buffer, self.start, self.length).end()
            if self.start < self.length:
                self.searched = self.start + 1
                return self.buffer[self.start] == _OPEN
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
        self.start = 0

    def done_before(self, offset: int) -> None:
        pass  # the text before `offset` is dropped when room is made

    def rest(self) -> bytes:
        rest = bytearray(memoryview(self.buffer)[self.start : self.length])
        for block in self._blocks:
            rest += block
        return bytes(rest)


class _MappedText:
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
            self._bracket(start - 1, _OPEN)
        if stop is not None and stop < size:
            self._bracket(stop, _CLOSE)
        self.start = self.length = self.searched = max(0, start - 1)
        self._released = 0
        if hasattr(self.buffer, "madvise"):
            self.buffer.madvise(mmap.MADV_SEQUENTIAL)

    def _bracket(self, offset: int, bracket: int) -> None:
        if self.buffer[offset] != _COMMA:
            raise ValueError(f"offset {offset} holds {bytes([self.buffer[offset]])!r}, not a comma between events")
        self.buffer[offset] = bracket

    def open(self) -> bool:
        self.start = _LEADING_BLANKS.match(self.buffer, self.start, self._end).end()
        self.length = self.searched = min(self.start + 1, self._end)
        return self.start < self._end and self.buffer[self.start] == _OPEN

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

    def rest(self) -> bytes:
        return self.buffer[self.start : self._end]
