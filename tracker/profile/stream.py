"""Streams a profile's JSON text (read in blocks, or mapped) and decodes it batch by batch, cut between events."""

from __future__ import annotations

import gzip
import re
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path

import msgspec

from tracker.base.errors import ProfileFormatError
from tracker.profile.events import AnyEvent, decode_events, decode_list, empty_message, malformed_at, malformed_message
from tracker.profile.json_commas import ListCommas
from tracker.profile.text_buffer import CLOSE, COMMA, OPEN, BlockText, HeldText, MappedText

_GZIP_MAGIC = b"\x1f\x8b"
_BLANKS = b" \t\r\n"
# The comma between two events as ORT lays them out, one per line: `},\n{`. In other layouts it may also match
# inside an event (a pretty-printed list of shapes); the stretches cut there then fail to decode as event lists.
_EVENT_COMMA = re.compile(rb"\}[ \t\r]*(,)[ \t\r]*\n[ \t\r\n]*\{")
# How far past a wanted cut to look for the comma after an event.
_COMMA_WINDOW_BYTES = 2**20
# Text without a line that ends between two events for this long is not one event per line: it is then cut at the
# commas of the list (`ListCommas`), which costs a scan of the text.
_LINE_BYTES = 2**20
# Text without any cut for this long (then twice as long, and so on) is decoded as far as it goes, to reject
# what is not JSON before holding all of it.
_FIRST_CHECK_BYTES = 4 * 2**20
_JSON_STARTS = frozenset(b'[{"-0123456789tfn')


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
    return _batches(BlockText(iter(blocks)), source)


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
    return _batches(MappedText(path, block_bytes, start, stop), source)


def _batches(text: HeldText, source: str) -> Iterator[tuple[list[AnyEvent], bool]]:
    """Decodes a JSON list of trace events batch by batch, as more of its text becomes available.

    ORT writes one event per line: the text available is cut after its last newline and the lines before the cut
    are decoded as one list, so the whole text is never decoded at once. Cutting at newlines is right for any
    layout: a raw newline never occurs inside a JSON string, and no proper prefix of an object is an object, so
    lines that decode as a list of objects end between two events. The comma before the cut becomes the list's
    closing bracket, the newline after it the next list's opening one: nothing is copied. Text whose lines are not
    one event each (one long line, a pretty-printed list) is cut at the commas of the list instead (`ListCommas`),
    the comma becoming first the closing bracket, then the opening one. Either way memory holds about a block of
    text and its events, whatever the layout; text that is not JSON is rejected within a few MiB of its start.
    """
    if not text.open():  # empty, or not a list
        _reject_what_is_not_a_list(text, source)
    events_before, commas, check_above = 0, None, _FIRST_CHECK_BYTES
    while True:
        buffer = text.buffer  # a block text may have moved to a larger buffer
        cut = _line_cut(text) if commas is None else _list_cut(text, commas)
        if cut is None:  # the list's end, or lines that are not one event each
            if buffer[_last_line_end(text)] == CLOSE and not text.more():
                break
            commas, text.searched = ListCommas(), text.start + 1
            continue
        end, next_start = cut
        if end < 0:  # no cut in the text so far
            if commas is None and text.length - text.start > _LINE_BYTES:
                commas, text.searched = ListCommas(), text.start + 1
                continue
            if not text.more():
                break
            if text.length - text.start > check_above:  # one long element, or text that is not JSON?
                _reject_if_not_json(text, source, events_before)
                check_above *= 2
            continue
        buffer[end] = CLOSE
        try:
            events = decode_list(memoryview(buffer)[text.start : end + 1], source, events_before=events_before)
        except msgspec.DecodeError as e:
            buffer[end] = COMMA
            at = malformed_at(e)
            if commas is None and (at is None or at >= end - text.start):  # the cut fell inside an event
                commas, text.searched = ListCommas(), text.start + 1
                continue
            piece = memoryview(buffer)[text.start : end + 1]
            raise ProfileFormatError(malformed_message(source, piece, e, text.offset(text.start))) from e
        yield events, False
        events_before += len(events)
        del events
        buffer[next_start] = OPEN
        text.start, check_above = next_start, _FIRST_CHECK_BYTES
        text.done_before(next_start)
        if not text.more():
            break
    yield decode_events(text.rest(), source, events_before=events_before, offset=text.offset(text.start))


def _line_cut(text: HeldText) -> tuple[int, int] | None:
    """(comma, newline) of the last line of the new text that ends with a comma, (-1, -1) if none yet, or None
    if the last line ends with something else (the end of the list, or lines that are not one event each)."""
    buffer = text.buffer
    cut = buffer.rfind(b"\n", text.searched, text.length)
    text.searched = text.length
    end = cut - 1
    while cut >= 0 and buffer[end] in _BLANKS:
        end -= 1
    if cut < 0 or end == text.start:  # no line, or nothing but the bracket so far
        return -1, -1
    return (end, cut) if buffer[end] == COMMA else None


def _last_line_end(text: HeldText) -> int:
    end = text.buffer.rfind(b"\n", text.start, text.length) - 1
    while text.buffer[end] in _BLANKS:
        end -= 1
    return end


def _list_cut(text: HeldText, commas: ListCommas) -> tuple[int, int]:
    """(comma, comma) of the last comma between two events in the new text, or (-1, -1) if none."""
    last, scanned = commas.scan(memoryview(text.buffer)[text.searched : text.length])
    comma = -1 if last < 0 else text.searched + last
    text.searched += scanned
    return comma, comma


def _reject_if_not_json(text: HeldText, source: str, events_before: int) -> None:
    """Raises ProfileFormatError if the text so far is not the start of a JSON list of events."""
    head = memoryview(text.buffer)[text.start : text.length]
    try:
        decode_list(head, source, events_before=events_before)
    except msgspec.DecodeError as e:
        if malformed_at(e) is not None:
            raise ProfileFormatError(malformed_message(source, head, e, text.offset(text.start))) from e


def _reject_what_is_not_a_list(text: HeldText, source: str) -> None:
    """Raises ProfileFormatError for a text that does not start with a list: says what it is, from its start."""
    if text.start >= text.length and not text.more():
        raise ProfileFormatError(empty_message(source))
    head = text.head()
    if head[0] not in _JSON_STARTS:  # not JSON from its first byte on: no need to read further
        raise ProfileFormatError(
            f"profile {source!r} is not valid JSON: its text starts {bytes(head[:20])!r}; expected the JSON list "
            "of trace events that onnxruntime writes with enable_profiling=True"
        )
    try:
        decode_list(head, source)
    except msgspec.DecodeError as e:
        raise ProfileFormatError(malformed_message(source, head, e, text.offset(text.start))) from e
    raise AssertionError("a text that is not a list decoded as one")
