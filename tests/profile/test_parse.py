"""Tests of tracker.profile.parse on committed real profiles (ORT 1.16 with fences, ORT 1.32 with memory)."""

from __future__ import annotations

import gzip
import json
import logging
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tracker.base.errors import ProfileFormatError
from tracker.profile import columns as C
from tracker.profile.parse import parse_profile, parse_profile_bytes

FIXTURES = Path(__file__).parents[1] / "fixtures"
OLD = FIXTURES / "profile_ort_1_16_fences.json"
NEW = FIXTURES / "profile_ort_1_32.json"
PROFILES = [pytest.param(OLD, id="ort-1.16-fences"), pytest.param(NEW, id="ort-1.32-memory")]

NODES = {"eye": "EyeLike", "add1": "Add", "mm": "MatMul", "add2": "Add"}
RUNS = 5


def _kernel_events(path: Path) -> list[dict]:
    """The `*_kernel_time` events of a profile, read with the stdlib only."""
    return [e for e in json.loads(path.read_text()) if e["cat"] == "Node" and e["name"].endswith("_kernel_time")]


def _node(event: dict) -> str:
    return event["name"][: -len("_kernel_time")]


def _run_events(path: Path) -> list[dict]:
    return sorted(
        (e for e in json.loads(path.read_text()) if e["cat"] == "Session" and e["name"] == "model_run"),
        key=lambda e: e["ts"],
    )


@pytest.mark.parametrize("path", PROFILES)
def test_both_formats_parse_to_twenty_kernel_calls_five_per_node(path):
    events = parse_profile(path).events
    assert len(events) == 20
    assert events[C.NODE].value_counts().to_dict() == {"eye": 5, "add1": 5, "mm": 5, "add2": 5}
    assert events[C.OP_TYPE].value_counts().to_dict() == {"Add": 10, "EyeLike": 5, "MatMul": 5}
    assert dict(zip(events[C.NODE], events[C.OP_TYPE])) == NODES


def test_fence_events_exist_in_the_old_profile_but_are_not_counted_as_calls():
    raw = json.loads(OLD.read_text())
    fences = [e for e in raw if e["cat"] == "Node" and "_fence_" in e["name"]]
    assert len(fences) == 40  # before + after, 4 nodes, 5 runs
    assert not parse_profile(OLD).events[C.NODE].str.contains("fence").any()


@pytest.mark.parametrize("path", PROFILES)
def test_per_node_total_durations_match_the_sum_of_kernel_time_events(path):
    expected: dict[str, int] = {}
    for e in _kernel_events(path):
        expected[_node(e)] = expected.get(_node(e), 0) + e["dur"]
    totals = parse_profile(path).events.groupby(C.NODE)[C.DUR_US].sum().to_dict()
    assert totals == expected


@pytest.mark.parametrize("path", PROFILES)
def test_every_row_keeps_the_duration_timestamp_and_thread_of_its_event(path):
    events = parse_profile(path).events
    expected = [(_node(e), e["dur"], e["ts"], str(e["tid"])) for e in _kernel_events(path)]
    assert list(zip(events[C.NODE], events[C.DUR_US], events[C.TS_US], events[C.THREAD])) == expected
    assert events[C.DUR_US].dtype == np.int64 and events[C.TS_US].dtype == np.int64


@pytest.mark.parametrize(("path", "fmt"), [(OLD, "fences"), (NEW, "memory")], ids=["ort-1.16", "ort-1.32"])
def test_format_is_detected_from_fences_or_memory_fields(path, fmt):
    profile = parse_profile(path)
    assert profile.format == fmt
    assert profile.truncated is False
    assert profile.source == str(path)


def test_a_profile_without_fences_or_memory_fields_is_plain():
    raw = json.loads(NEW.read_text())
    for e in raw:
        e["args"] = {k: v for k, v in e["args"].items() if not k.startswith("mem_")}
    assert parse_profile_bytes(json.dumps(raw).encode()).format == "plain"


@pytest.mark.parametrize("path", PROFILES)
def test_kernel_events_are_assigned_to_runs_zero_to_four_four_per_run(path):
    events = parse_profile(path).events
    assert events[C.RUN].value_counts().sort_index().to_dict() == {0: 4, 1: 4, 2: 4, 3: 4, 4: 4}


@pytest.mark.parametrize("path", PROFILES)
def test_each_kernel_event_gets_the_run_whose_model_run_window_holds_it(path):
    windows = [(e["ts"], e["ts"] + e["dur"]) for e in _run_events(path)]
    expected = [next(i for i, (start, end) in enumerate(windows) if start <= e["ts"] <= end) for e in _kernel_events(path)]
    assert parse_profile(path).events[C.RUN].tolist() == expected


@pytest.mark.parametrize("path", PROFILES)
def test_runs_table_holds_one_row_per_model_run_event(path):
    profile = parse_profile(path)
    expected = pd.DataFrame(
        {
            C.RUN: np.arange(RUNS, dtype=np.int64),
            C.TS_US: np.array([e["ts"] for e in _run_events(path)], dtype=np.int64),
            C.DUR_US: np.array([e["dur"] for e in _run_events(path)], dtype=np.int64),
        }
    )
    pd.testing.assert_frame_equal(profile.runs, expected)
    assert profile.run_count == RUNS


@pytest.mark.parametrize("path", PROFILES)
def test_shape_columns_hold_the_type_shapes_of_the_event_as_json(path):
    events = parse_profile(path).events
    for (_, row), e in zip(events.iterrows(), _kernel_events(path)):
        assert json.loads(row[C.INPUT_SHAPES]) == e["args"]["input_type_shape"]
        assert json.loads(row[C.OUTPUT_SHAPES]) == e["args"]["output_type_shape"]
    mm = events[events[C.NODE] == "mm"].iloc[0]
    assert mm[C.INPUT_SHAPES] == '[{"float":[4,100]},{"float":[100,100]}]'
    assert mm[C.OUTPUT_SHAPES] == '[{"float":[4,100]}]'


@pytest.mark.parametrize("path", PROFILES)
def test_size_columns_are_the_integer_values_of_the_string_args(path):
    events = parse_profile(path).events
    for column, arg in [(C.OUTPUT_SIZE, "output_size"), (C.ACTIVATION_SIZE, "activation_size"), (C.PARAMETER_SIZE, "parameter_size")]:
        assert events[column].dtype == np.int64
        assert events[column].tolist() == [int(e["args"][arg]) for e in _kernel_events(path)]
    first = events.groupby(C.NODE).first()
    assert first.loc["eye", C.OUTPUT_SIZE] == 100 * 100 * 4
    assert first.loc["add2", C.PARAMETER_SIZE] == 100 * 4


def test_memory_column_is_missing_for_the_old_profile():
    mem = parse_profile(OLD).events[C.MEM_IN_USE_DELTA]
    assert str(mem.dtype) == "Int64"
    assert mem.isna().all()


def test_memory_column_holds_the_deltas_of_the_new_profile():
    mem = parse_profile(NEW).events[C.MEM_IN_USE_DELTA]
    assert str(mem.dtype) == "Int64"
    assert mem.notna().all()
    assert mem.tolist() == [int(e["args"]["mem_in_use_delta"]) for e in _kernel_events(NEW)]
    assert mem.iloc[0] == 40192  # eye, first run


@pytest.mark.parametrize("path", PROFILES)
def test_columns_are_the_event_columns_in_order(path):
    assert tuple(parse_profile(path).events.columns) == C.EVENT_COLUMNS


@pytest.mark.parametrize("path", PROFILES)
def test_a_gzip_compressed_copy_parses_identically(path, tmp_path):
    packed = tmp_path / (path.name + ".gz")
    packed.write_bytes(gzip.compress(path.read_bytes()))
    plain, compressed = parse_profile(path), parse_profile(packed)
    pd.testing.assert_frame_equal(compressed.events, plain.events)
    pd.testing.assert_frame_equal(compressed.runs, plain.runs)
    assert (compressed.format, compressed.truncated) == (plain.format, plain.truncated)


def test_a_damaged_gzip_file_raises_profile_format_error(tmp_path):
    packed = bytearray(gzip.compress(NEW.read_bytes()))
    packed[20:60] = b"\x00" * 40  # corrupt the deflate stream, keep the gzip header
    path = tmp_path / "damaged.json.gz"
    path.write_bytes(bytes(packed))
    with pytest.raises(ProfileFormatError, match="damaged gzip"):
        parse_profile(path)


def test_a_gzip_file_cut_short_raises_profile_format_error(tmp_path):
    path = tmp_path / "cut.json.gz"
    path.write_bytes(gzip.compress(NEW.read_bytes())[:200])
    with pytest.raises(ProfileFormatError, match="damaged gzip"):
        parse_profile(path)


# --- truncated files --------------------------------------------------------------------------


def _complete_events_before(data: bytes, cut: int) -> list[dict]:
    """The events whose whole text lies in data[:cut]; the fixtures hold one event per line."""
    complete, offset = [], 0
    for line in data.splitlines(keepends=True):
        text = line.rstrip(b",\r\n")
        if text.startswith(b"{") and offset + len(text) <= cut:
            complete.append(json.loads(text))
        offset += len(line)
    return complete


def _event_end(data: bytes, index: int) -> int:
    """Byte offset just after the closing brace of the index-th event (0-based)."""
    lines = data.splitlines(keepends=True)
    start = sum(len(line) for line in lines[: index + 1])  # line 0 is "["
    return start + len(lines[index + 1].rstrip(b",\r\n"))


def _cut_points(data: bytes) -> dict[str, int]:
    mid_event = _event_end(data, 12) + 40  # 40 bytes into the 14th event
    return {
        "mid-event": mid_event,
        "inside-a-nested-args-object": data.index(b'"output_type_shape"', _event_end(data, 9)) + 25,
        "right-after-a-complete-event": _event_end(data, 9),
        "after-the-comma-of-an-event": _event_end(data, 9) + 1,
        "after-the-newline-of-an-event": _event_end(data, 9) + 2,
        "without-the-closing-bracket": data.rstrip().rindex(b"]"),
    }


CUTS = [
    pytest.param(path, kind, id=f"{pid}-{kind}")
    for path, pid in [(OLD, "ort-1.16"), (NEW, "ort-1.32")]
    for kind in [
        "mid-event",
        "inside-a-nested-args-object",
        "right-after-a-complete-event",
        "after-the-comma-of-an-event",
        "after-the-newline-of-an-event",
        "without-the-closing-bracket",
    ]
]


@pytest.mark.parametrize(("path", "kind"), CUTS)
def test_a_truncated_profile_recovers_exactly_the_complete_events_before_the_cut(path, kind, tmp_path, caplog):
    data = path.read_bytes()
    cut = _cut_points(data)[kind]
    truncated = tmp_path / "truncated.json"
    truncated.write_bytes(data[:cut])
    expected = _complete_events_before(data, cut)
    kernels = [e for e in expected if e["cat"] == "Node" and e["name"].endswith("_kernel_time")]
    runs = sorted((e["ts"], e["dur"]) for e in expected if e["name"] == "model_run")
    assert kernels, "the cut must leave some kernel events"

    with caplog.at_level(logging.WARNING, logger="tracker.profile.parse"):
        profile = parse_profile(truncated)

    assert profile.truncated is True
    assert list(zip(profile.events[C.NODE], profile.events[C.TS_US], profile.events[C.DUR_US])) == [
        (_node(e), e["ts"], e["dur"]) for e in kernels
    ]
    assert list(zip(profile.runs[C.TS_US], profile.runs[C.DUR_US])) == runs
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and r.name == "tracker.profile.parse"]
    assert len(warnings) == 1
    assert "truncated" in warnings[0].getMessage()
    assert f"{len(expected)} complete events" in warnings[0].getMessage()


def test_kernel_events_of_a_run_cut_before_its_model_run_event_are_outside_any_run(tmp_path):
    data = NEW.read_bytes()
    # Events 0-1 are session events; 2-5 run 0's kernels; 6-7 its Execute and model_run; 8-11 run 1's kernels.
    truncated = tmp_path / "truncated.json"
    truncated.write_bytes(data[: _event_end(data, 11)])
    profile = parse_profile(truncated)
    assert profile.run_count == 1
    assert profile.events[C.RUN].tolist() == [0, 0, 0, 0, -1, -1, -1, -1]


def test_a_complete_profile_logs_no_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="tracker.profile.parse"):
        parse_profile(NEW)
    assert not [r for r in caplog.records if r.name == "tracker.profile.parse"]


# --- not a profile ----------------------------------------------------------------------------

NOT_JSON = [
    pytest.param(b"this is not a profile at all\n", id="text"),
    pytest.param(bytes(np.random.default_rng(0).integers(32, 256, 512, dtype=np.uint8)), id="binary"),
    pytest.param(b"\x00\x01\x02\xff\xfe[{}]", id="binary-with-a-bracket-inside"),
    pytest.param(b"[\n{\"cat\" : \"Session\",", id="a-list-with-no-complete-event"),
    pytest.param(b"<html><body>404</body></html>", id="html"),
]


@pytest.mark.parametrize("data", NOT_JSON)
def test_garbage_raises_profile_format_error_saying_json_was_expected(data, tmp_path):
    path = tmp_path / "garbage.json"
    path.write_bytes(data)
    with pytest.raises(ProfileFormatError, match=r"not valid JSON.*expected the JSON list of trace events"):
        parse_profile(path)


@pytest.mark.parametrize("data", [b"", b"   \n\t\r\n  "], ids=["empty", "whitespace-only"])
def test_an_empty_file_raises_profile_format_error_saying_it_is_empty(data, tmp_path):
    path = tmp_path / "empty.json"
    path.write_bytes(data)
    with pytest.raises(ProfileFormatError, match=r"is empty; expected a JSON list of trace events"):
        parse_profile(path)


CHROME_TRACE = [
    {"cat": "gpu_op", "name": "volta_sgemm", "ph": "X", "ts": 10, "dur": 5, "pid": 1, "tid": 1, "args": {}},
    {"cat": "cpu_op", "name": "aten::mm", "ph": "X", "ts": 9, "dur": 8, "pid": 1, "tid": 1, "args": {}},
]

FOREIGN = [
    pytest.param({"a": 1}, r"not an ONNX Runtime profile.*expected a list of trace events", id="an-object"),
    pytest.param([1, 2], r"not an ONNX Runtime profile.*expected a list of trace events", id="a-list-of-numbers"),
    pytest.param(
        [{"x": 1, "y": "z"}, {"x": 2}],
        r"not an ONNX Runtime profile.*expected a list of trace events",
        id="objects-without-cat-or-name",
    ),
    pytest.param(
        {"traceEvents": CHROME_TRACE},
        r"not an ONNX Runtime profile.*expected a list of trace events",
        id="chrome-trace-object-form",
    ),
    pytest.param(CHROME_TRACE, r"none of category 'Session' or 'Node'; it is not an ONNX Runtime profile", id="chrome-trace-other-categories"),
    pytest.param([], r"0 trace events but none of category 'Session' or 'Node'", id="an-empty-list"),
    pytest.param("a string", r"not an ONNX Runtime profile.*expected a list of trace events", id="a-string"),
]


@pytest.mark.parametrize(("document", "message"), FOREIGN)
def test_foreign_json_raises_profile_format_error_saying_what_was_expected(document, message, tmp_path):
    path = tmp_path / "foreign.json"
    path.write_text(json.dumps(document))
    with pytest.raises(ProfileFormatError, match=message):
        parse_profile(path)


@pytest.mark.parametrize("name", ["missing.json", "a-directory"], ids=["missing-file", "directory"])
def test_a_path_that_is_not_a_file_raises_profile_format_error(name, tmp_path):
    (tmp_path / "a-directory").mkdir()
    with pytest.raises(ProfileFormatError, match=r"does not exist or is not a file"):
        parse_profile(tmp_path / name)


def test_profile_format_error_is_a_value_error():
    with pytest.raises(ValueError):
        parse_profile_bytes(b"nonsense")
