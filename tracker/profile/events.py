"""What an ONNX Runtime trace event is, and how a piece of JSON text becomes a list of events or a clear error."""

from __future__ import annotations

import re
from typing import Annotated, ClassVar

import msgspec

from tracker.base.errors import ProfileFormatError

# How many candidate cut points to try when recovering the complete events of a truncated file.
_MAX_RECOVERY_TRIES = 64
_LIST_START = re.compile(rb"[ \t\r\n]*\[")  # matched in place: lstrip() would copy the whole text

# Times and durations are microseconds. Bounded so that the table's int64 columns hold them, and a start plus a
# duration too: 2**53 - 1 is also the largest integer every JSON reader (a double) holds exactly, 285 years.
MAX_MICROSECONDS = 2**53 - 1
Microseconds = Annotated[int, msgspec.Meta(ge=0, le=MAX_MICROSECONDS)]
Timestamp = Annotated[int, msgspec.Meta(ge=-MAX_MICROSECONDS, le=MAX_MICROSECONDS)]
Int64 = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]
_EXPECTED = {
    "dur": f"a duration of 0 to {MAX_MICROSECONDS} microseconds",
    "ts": f"a timestamp of -{MAX_MICROSECONDS} to {MAX_MICROSECONDS} microseconds",
}


class Args(msgspec.Struct, gc=False):
    # Fields we do not keep (thread_scheduling_stats, node_index, mem_* but one) are skipped by the decoder
    # without being materialized. Numbers are strings in every ORT release ("40000"): the decoder is not strict,
    # so it turns them into ints itself.
    op_name: str = ""
    provider: str = ""
    input_type_shape: msgspec.Raw = msgspec.Raw(b"[]")
    output_type_shape: msgspec.Raw = msgspec.Raw(b"[]")
    output_size: Int64 = 0
    activation_size: Int64 = 0
    parameter_size: Int64 = 0
    mem_in_use_delta: Int64 | None = None


# gc=False (inherited by the events below): the cyclic GC need not track half a million objects that hold no
# containers and so make no cycles.
class _Span(msgspec.Struct, gc=False):
    """What every trace event has: a name, a start and a duration."""

    name: str
    ts: Timestamp
    dur: Microseconds = 0


class _ThreadSpan(_Span):
    """A span on a thread, with the args ORT writes on Node events."""

    tid: int | str = 0
    args: Args = msgspec.field(default_factory=Args)


class Event(_ThreadSpan, kw_only=True):
    """A trace event of any category."""

    cat: str


# ORT writes events of these two categories. Decoding them as a tagged union spares a string per event and the
# args of Session events; a list that holds anything else is decoded again as `Event`s (foreign JSON fails there).
class NodeEvent(_ThreadSpan, tag_field="cat", tag="Node"):
    cat: ClassVar[str] = "Node"


class SessionEvent(_Span, tag_field="cat", tag="Session"):
    cat: ClassVar[str] = "Session"


AnyEvent = Event | NodeEvent | SessionEvent
_ort_decoder: msgspec.json.Decoder[list[AnyEvent]] = msgspec.json.Decoder(list[NodeEvent | SessionEvent], strict=False)
_any_decoder: msgspec.json.Decoder[list[AnyEvent]] = msgspec.json.Decoder(list[Event], strict=False)
_OUT_OF_RANGE = re.compile(r"Expected `int` [<>]= .* - at `\$\[(\d+)\]\.(.+)`")
_ERROR_BYTE = re.compile(r"\(byte (\d+)\)")
_NON_FINITE = re.compile(rb'(?:"((?:[^"\\]|\\.)*)"[ \t\r\n]*:[ \t\r\n]*)?(-?(?:NaN|Infinity))')
_NAME_FIELD = re.compile(rb'"name"[ \t\r\n]*:[ \t\r\n]*"((?:[^"\\]|\\.)*)"')


def decode_list(text: bytes | bytearray | memoryview, source: str, *, events_before: int = 0) -> list[AnyEvent]:
    """Decodes a JSON list of trace events.

    Raises:
        msgspec.DecodeError: the text is not JSON, or a JSON list cut short (`malformed_at` tells which).
        ProfileFormatError: JSON that is not a list of trace events, or has a number out of range, or nests
            deeper than Python can decode.
    """
    try:
        try:
            return _ort_decoder.decode(text)
        except msgspec.ValidationError:
            return _any_decoder.decode(text)
    except msgspec.ValidationError as e:
        out_of_range = _OUT_OF_RANGE.match(str(e))
        if out_of_range is None:
            raise ProfileFormatError(_foreign_message(source, e)) from e
        index, field = int(out_of_range.group(1)), out_of_range.group(2)
        name, value = _event_field(text, index, field)
        raise ProfileFormatError(
            f"profile {source!r}: trace event {events_before + index} ({name}) has {field} {value}; expected "
            f"{_EXPECTED.get(field, 'an integer that fits in 64 bits')}"
        ) from e
    except RecursionError as e:  # msgspec's decoder recurses into nested lists and objects, even those it skips
        raise ProfileFormatError(
            f"profile {source!r} nests lists or objects too deeply to decode (beyond Python's recursion limit), "
            f"in trace event {events_before} or a later one; expected trace events nested a few levels deep, as "
            "onnxruntime writes them"
        ) from e


def _event_field(text: bytes | bytearray | memoryview, index: int, field: str) -> tuple[str, str]:
    """The name of the `index`th event of a list and the text of one of its fields, as well as they can be read."""
    try:
        value = msgspec.json.decode(text, type=list[msgspec.Raw])[index]
        name = msgspec.json.decode(value, type=dict[str, msgspec.Raw]).get("name", b'"?"')
        for key in field.split("."):
            value = msgspec.json.decode(value, type=dict[str, msgspec.Raw])[key]
        return bytes(name).decode(errors="replace"), bytes(value).decode(errors="replace")
    except (msgspec.MsgspecError, RecursionError, IndexError, KeyError):
        return "name unknown", "out of range"


def malformed_at(error: msgspec.DecodeError) -> int | None:
    """Where the text is not JSON, or None if the error is only that it ended too soon."""
    found = _ERROR_BYTE.search(str(error))
    return None if found is None else int(found.group(1))


def malformed_message(
    source: str, text: bytes | bytearray | memoryview, error: msgspec.DecodeError, offset: int
) -> str:
    """Says where the text stops being JSON (`offset`: where `text` starts in the profile's text)."""
    at = malformed_at(error)
    if at is None:
        return (
            f"profile {source!r} is not valid JSON ({error}); expected the JSON list of trace events that "
            "onnxruntime writes with enable_profiling=True"
        )
    before = max(0, at - 300)
    window = bytes(text[before : at + 300])
    for match in _NON_FINITE.finditer(window, 0, at - before + len(b"-Infinity")):
        if match.start(2) <= at - before < match.end(2):
            event = window[window.rfind(b"{", 0, match.start()) + 1 :]
            event = event[: min(i for i in (event.find(b"{"), event.find(b"}"), len(event)) if i >= 0)]
            name = _NAME_FIELD.search(event)
            where = f"trace event {name.group(1).decode(errors='replace')!r}" if name else "a trace event"
            field = match.group(1).decode(errors="replace") if match.group(1) is not None else "a value"
            return (
                f"profile {source!r}: {where} has {field} {match.group(2).decode()} (byte {offset + at} of its JSON "
                "text); expected a number: JSON has no NaN or Infinity, and onnxruntime never writes them"
            )
    return (
        f"profile {source!r} is not valid JSON: byte {offset + at} of its text starts {window[at - before :][:20]!r} "
        f"({error}); expected the JSON list of trace events that onnxruntime writes with enable_profiling=True"
    )


def empty_message(source: str) -> str:
    return f"profile {source!r} is empty; expected a JSON list of trace events"


def decode_events(
    text: bytes | bytearray | memoryview, source: str, *, events_before: int = 0, offset: int = 0
) -> tuple[list[AnyEvent], bool]:
    """Decodes a JSON list of trace events; a list cut short gives its complete events and True.

    Args:
        text: the JSON text.
        source: the file it came from, for messages.
        events_before: events already read before `text`, which then starts between two events of a longer
            list: a tail holding no complete event is the cut end of that list, not garbage.
        offset: where `text` starts in the profile's text, for messages.

    Raises:
        ProfileFormatError: the text is not JSON (and not a cut list), or JSON that is not a list of events.
    """
    try:
        return decode_list(text, source, events_before=events_before), False
    except msgspec.DecodeError as e:
        if malformed_at(e) is not None:  # not JSON before its end: not a list cut short
            raise ProfileFormatError(malformed_message(source, text, e, offset)) from e
        events = _recover_truncated(text, source, events_before)
        if events is None and events_before:
            events = []
        if events is None:
            raise ProfileFormatError(malformed_message(source, text, e, offset)) from e
        return events, True


def _foreign_message(source: str, error: Exception) -> str:
    return (
        f"{source!r} is JSON but not an ONNX Runtime profile ({error}); expected a list of trace "
        'events like {"cat": "Node", "name": "..._kernel_time", "ts": 0, "dur": 0, "args": {...}}'
    )


def _recover_truncated(text: bytes | bytearray | memoryview, source: str, events_before: int) -> list[AnyEvent] | None:
    """Returns the complete events before the cut of a truncated list, or None if it is not one."""
    if not _LIST_START.match(text):
        return None
    if isinstance(text, memoryview):  # no rfind; a rare path, so the copy is cheap overall
        text = bytes(text)
    end = len(text)
    for _ in range(_MAX_RECOVERY_TRIES):
        end = text.rfind(b"}", 0, end)
        if end < 0:
            return None
        try:
            events = decode_list(bytes(text[: end + 1]) + b"]", source, events_before=events_before)
        except ProfileFormatError:
            return None
        except msgspec.DecodeError:
            continue
        return events
    return None
