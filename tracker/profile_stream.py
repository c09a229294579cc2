"""Decodes the trace events of an ONNX Runtime profile from its JSON text: whole, or batch by batch from a stream."""

from __future__ import annotations

import gzip
import itertools
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
_COMMA, _CLOSE, _BLANKS = ord(","), ord("]"), b" \t\r\n"
_LIST_START = re.compile(rb"[ \t\r\n]*\[")  # matched in place: lstrip() would copy the whole text


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


def decode_events(
    text: bytes | bytearray, source: str, *, events_before: int = 0
) -> tuple[list[AnyEvent], bool]:
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


def iter_blocks(path: Path, block_bytes: int) -> Iterator[bytes]:
    """The text of a profile file (decompressed if it is gzip), `block_bytes` at a time."""
    if block_bytes < 1:
        raise ValueError(f"block_bytes must be at least 1, got {block_bytes}")
    with path.open("rb") as file:
        is_gzip = file.read(2) == _GZIP_MAGIC
        file.seek(0)
        stream = gzip.GzipFile(fileobj=file, mode="rb") if is_gzip else file
        while True:
            try:
                block = stream.read(block_bytes)
            except (OSError, EOFError, zlib.error) as e:  # a corrupt deflate stream raises zlib.error
                if not is_gzip:
                    raise
                raise ProfileFormatError(f"profile {str(path)!r} is a damaged gzip file: {e}") from e
            if not block:
                return
            yield block


def iter_event_batches(blocks: Iterable[bytes], source: str) -> Iterator[tuple[list[AnyEvent], bool]]:
    """Decodes a JSON list of trace events from consecutive blocks of its text, about one batch per block.

    ORT writes one event per line: each block is cut after its last newline and the lines before the cut are
    decoded as one list, so the whole text is never in memory. Cutting at newlines is right for any layout: a
    raw newline never occurs inside a JSON string, and no proper prefix of an object is an object, so lines that
    decode as a list of objects end between two events. When a cut falls inside an event (a pretty-printed
    file), the rest of the text is decoded in one go, as a whole file would be.

    Yields:
        (events, truncated): truncated is True only in the last batch, when the list was cut short.

    Raises:
        ProfileFormatError: as `decode_events`, or the text is empty.
    """
    blocks = iter(blocks)
    first = next((block for block in blocks if not block.isspace()), b"")
    start = len(first) - len(first.lstrip())
    if first[start : start + 1] != b"[":  # empty, or not a list: let the whole-text decoder say what it is
        if not first:
            raise ProfileFormatError(empty_message(source))
        yield decode_events(first + b"".join(blocks), source)
        return
    text = bytearray(b"[")  # the list's bracket, then the text after the events decoded so far
    events_before = 0
    for block in itertools.chain([memoryview(first)[start + 1 :]], blocks):
        searched = len(text)
        text += block
        cut = text.rfind(b"\n", searched)
        if cut < 0:
            continue
        end = cut - 1
        while text[end] in _BLANKS:
            end -= 1
        if end == 0:  # nothing but the bracket so far
            continue
        if text[end] != _COMMA:  # the end of the list, or lines that are not one event each
            break
        text[end] = _CLOSE
        try:
            events = _decode_list(memoryview(text)[: end + 1])
        except msgspec.ValidationError as e:
            raise ProfileFormatError(_foreign_message(source, e)) from e
        except msgspec.DecodeError:  # the cut fell inside an event
            text[end] = _COMMA
            break
        yield events, False
        events_before += len(events)
        # A new buffer: the events' msgspec.Raw fields still point into the old one.
        text = bytearray(b"[") + memoryview(text)[cut + 1 :]
    for block in blocks:
        text += block
    yield decode_events(text, source, events_before=events_before)
