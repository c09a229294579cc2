"""The streamed parse of tracker.profile.parse (chunk by chunk) gives exactly what the whole-text parse gives."""

from __future__ import annotations

import gzip
import importlib
import json
import logging
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest

from tracker.base.errors import ProfileFormatError
from tracker.profile import columns as C
from tracker.profile import parse
from tracker.profile.parse import Profile, iter_profile_chunks, parse_profile

FIXTURES = Path(__file__).parents[1] / "fixtures"
OLD = FIXTURES / "profile_ort_1_16_fences.json"
NEW = FIXTURES / "profile_ort_1_32.json"
PROFILES = [pytest.param(OLD, id="ort-1.16-fences"), pytest.param(NEW, id="ort-1.32-memory")]
# 1 byte: every block is one line, so one event; ~700-byte events make a 2000-byte block hold about three.
BLOCK_BYTES = [pytest.param(1, id="1-byte"), pytest.param(2000, id="2000-bytes"), pytest.param(2**20, id="1-MiB")]
SYNTH_RUNS = 3


def _benchmark_module(name: str):
    """A script of benchmarks/ as a module (they import each other as siblings, as scripts run there do)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(Path(__file__).parents[2] / "benchmarks"))
        return importlib.import_module(name)


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory) -> Path:
    """A GPT-2-like ORT 1.32 profile of 3 runs x 533 kernels (~1.6 MB), in ORT's layout."""
    path = tmp_path_factory.mktemp("synth") / "profile_gpt2_synthetic.json"
    assert _benchmark_module("synth_profile").synthesize_profile(path, runs=SYNTH_RUNS, seed=1) == SYNTH_RUNS * 533
    return path


def _whole(path: Path) -> Profile:
    return parse_profile(path, stream_above_bytes=2**62)  # the whole text, decoded in one go


def _streamed(path: Path, block_bytes: int) -> Profile:
    return parse_profile(path, stream_above_bytes=0, block_bytes=block_bytes)


def assert_same_profile(got: Profile, expected: Profile, *, ignore: list[str] | None = None) -> None:
    pd.testing.assert_frame_equal(got.events.drop(columns=ignore or []), expected.events.drop(columns=ignore or []))
    pd.testing.assert_frame_equal(got.runs, expected.runs)
    assert (got.format, got.truncated) == (expected.format, expected.truncated)


def _as_text(events: pd.DataFrame) -> pd.DataFrame:
    """The table with its categorical columns as plain strings."""
    return events.astype({column: str for column in events.select_dtypes("category").columns})


@pytest.mark.parametrize("block_bytes", BLOCK_BYTES)
@pytest.mark.parametrize("path", PROFILES)
def test_the_streamed_parse_of_a_fixture_equals_the_whole_text_parse(path, block_bytes):
    streamed = _streamed(path, block_bytes)
    assert_same_profile(streamed, _whole(path))
    assert streamed.source == str(path)


@pytest.mark.parametrize("block_bytes", [pytest.param(4096, id="4-KiB"), pytest.param(2**20, id="1-MiB")])
def test_the_streamed_parse_of_a_synthetic_gpt2_profile_equals_the_whole_text_parse(synthetic, block_bytes):
    streamed = _streamed(synthetic, block_bytes)
    assert_same_profile(streamed, _whole(synthetic))
    assert (len(streamed.events), streamed.run_count, streamed.format) == (SYNTH_RUNS * 533, SYNTH_RUNS, "memory")
    assert (streamed.events[C.RUN] >= 0).all()


@pytest.mark.slow
@pytest.mark.parametrize("source", ["ort-1.16-fences", "ort-1.32-memory", "synthetic"])
def test_the_streamed_parse_equals_a_plain_json_load_parse(source, synthetic):
    path = {"ort-1.16-fences": OLD, "ort-1.32-memory": NEW, "synthetic": synthetic}[source]
    events, runs = _benchmark_module("bench_parse").straightforward_parse(path)
    streamed = _streamed(path, 3000)
    pd.testing.assert_frame_equal(streamed.events, events)
    pd.testing.assert_frame_equal(streamed.runs, runs)


@pytest.mark.parametrize("path", PROFILES)
def test_tiny_chunks_hold_whole_events_and_add_up_to_the_whole_parse(path):
    whole = _whole(path)
    chunks = list(iter_profile_chunks(path, chunk_bytes=2000))
    shortest_line = min(len(line) for line in path.read_bytes().splitlines() if line.startswith(b"{"))
    assert len(chunks) > 5
    sizes = [c.trace_events for c in chunks]
    assert min(sizes) >= 1 and max(sizes) <= 2000 // shortest_line + 1
    assert sum(c.trace_events for c in chunks) == len(json.loads(path.read_text()))
    events = _as_text(pd.concat([c.events for c in chunks], ignore_index=True))  # each chunk has its categories
    assert (events[C.RUN] == -1).all()  # runs are numbered only once all are read
    pd.testing.assert_frame_equal(events.drop(columns=C.RUN), _as_text(whole.events).drop(columns=C.RUN))
    runs = pd.concat([c.runs for c in chunks], ignore_index=True).sort_values(C.TS_US, ignore_index=True)
    pd.testing.assert_frame_equal(runs, whole.runs[[C.TS_US, C.DUR_US]])
    assert not any(c.truncated for c in chunks)


def test_a_chunk_of_several_blocks_holds_them_all(synthetic):
    chunks = list(iter_profile_chunks(synthetic, chunk_bytes=2 * 2**20))  # two 1 MiB blocks: the whole file
    whole = _whole(synthetic)
    assert len(chunks) == 1 and chunks[0].trace_events == 2 + SYNTH_RUNS * 535
    pd.testing.assert_frame_equal(chunks[0].events.drop(columns=C.RUN), whole.events.drop(columns=C.RUN))


def test_kernel_calls_are_numbered_by_the_model_run_written_after_them_in_a_later_chunk():
    # In ORT's files a run's model_run event follows its kernel events; with one event per chunk, no chunk
    # holds both.
    events = _streamed(NEW, 1).events
    assert events[C.RUN].tolist() == [run for run in range(5) for _ in range(4)]


@pytest.mark.parametrize("block_bytes", BLOCK_BYTES)
@pytest.mark.parametrize("path", PROFILES)
def test_a_gzip_file_is_streamed_and_parses_as_its_plain_text(path, block_bytes, tmp_path, monkeypatch):
    packed = tmp_path / (path.name + ".gz")
    packed.write_bytes(gzip.compress(path.read_bytes()))
    expected = _whole(path)

    def no_whole_decompression(data):
        raise AssertionError("the gzip file was decompressed whole")

    monkeypatch.setattr(gzip, "decompress", no_whole_decompression)
    assert_same_profile(parse_profile(packed, block_bytes=block_bytes), expected)


def test_a_gzip_synthetic_profile_streams_to_the_same_chunks_as_its_plain_text(synthetic, tmp_path):
    packed = tmp_path / "synthetic.json.gz"
    packed.write_bytes(gzip.compress(synthetic.read_bytes()))
    plain = iter_profile_chunks(synthetic, chunk_bytes=2**16)
    pairs = list(zip(plain, iter_profile_chunks(packed, chunk_bytes=2**16), strict=True))
    assert len(pairs) > 10
    for a, b in pairs:
        pd.testing.assert_frame_equal(a.events, b.events)
        pd.testing.assert_frame_equal(a.runs, b.runs)


def test_a_damaged_gzip_file_raises_profile_format_error_when_streamed(tmp_path):
    packed = bytearray(gzip.compress(NEW.read_bytes()))
    packed[20:60] = b"\x00" * 40
    path = tmp_path / "damaged.json.gz"
    path.write_bytes(bytes(packed))
    with pytest.raises(ProfileFormatError, match="damaged gzip"):
        list(iter_profile_chunks(path, chunk_bytes=100))


# --- truncated files --------------------------------------------------------------------------


def _line_end(data: bytes, line: int) -> int:
    """Offset just after the last byte of a line, its newline excluded (line 0 is "[")."""
    return sum(len(text) for text in data.splitlines(keepends=True)[: line + 1]) - 1


def cuts_at(line: int, *, mid_event_line: int | None = None) -> dict[str, Callable[[bytes], int]]:
    """Where to cut a file's text: 300 bytes before the end of `mid_event_line` (default `line`), around the
    end of `line`, or just before the closing bracket."""
    mid_event_line = line if mid_event_line is None else mid_event_line
    return {
        "mid-event": lambda data: _line_end(data, mid_event_line) - 300,
        "right-after-an-event": lambda data: _line_end(data, line) - 1,
        "after-its-comma": lambda data: _line_end(data, line),
        "after-its-newline": lambda data: _line_end(data, line) + 1,
        "without-the-closing-bracket": lambda data: data.rstrip().rindex(b"]"),
    }


CUTS = cuts_at(10, mid_event_line=14)


@pytest.mark.parametrize("cut", list(CUTS))
@pytest.mark.parametrize("source", ["fixture", "synthetic"])
def test_a_truncated_file_recovers_the_same_complete_events_streamed(source, cut, synthetic, tmp_path, caplog):
    data = (NEW if source == "fixture" else synthetic).read_bytes()
    path = tmp_path / "truncated.json"
    path.write_bytes(data[: CUTS[cut](data)])
    with caplog.at_level(logging.WARNING, logger="tracker.profile.parse"):
        whole = _whole(path)
        streamed = _streamed(path, 700)
    assert_same_profile(streamed, whole)
    assert whole.truncated is True
    messages = [r.getMessage() for r in caplog.records if r.name == "tracker.profile.parse"]
    assert len(messages) == 2 and messages[0] == messages[1] and "truncated" in messages[0]


def test_a_truncated_file_ends_its_chunks_with_a_truncated_one(tmp_path, caplog):
    data = NEW.read_bytes()
    path = tmp_path / "truncated.json"
    path.write_bytes(data[: CUTS["mid-event"](data)])
    with caplog.at_level(logging.WARNING, logger="tracker.profile.parse"):
        chunks = list(iter_profile_chunks(path, chunk_bytes=1))
    assert [c.truncated for c in chunks] == [False] * (len(chunks) - 1) + [True]
    assert f"{sum(c.trace_events for c in chunks)} complete events" in caplog.records[-1].getMessage()


# --- other layouts ------------------------------------------------------------------------------

LAYOUTS = {
    "all-on-one-line": lambda events: json.dumps(events, separators=(",", ":")),
    "pretty-printed": lambda events: json.dumps(events, indent=2),
    "crlf-line-ends": lambda events: "[\r\n" + ",\r\n".join(json.dumps(e) for e in events) + "\r\n]\r\n",
    "commas-at-line-starts": lambda events: "[\n" + "\n,".join(json.dumps(e) for e in events) + "\n]",
    "blank-lines": lambda events: "\n\n[\n\n" + ",\n\n".join(json.dumps(e) for e in events) + "\n\n]\n\n",
}


@pytest.mark.slow
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("path", PROFILES)
def test_a_profile_in_another_layout_parses_the_same_streamed(path, layout, tmp_path):
    relaid = tmp_path / "relaid.json"
    relaid.write_text(LAYOUTS[layout](json.loads(path.read_text())))
    expected = _whole(relaid)  # json.dumps spaces the shapes differently: '[{"float": [4, 100]}]'
    assert_same_profile(expected, _whole(path), ignore=[C.INPUT_SHAPES, C.OUTPUT_SHAPES])
    for block_bytes in (1, 1000, 2**20):
        assert_same_profile(_streamed(relaid, block_bytes), expected)


def test_calls_that_change_thread_shape_or_size_from_run_to_run_keep_their_own_values(synthetic, tmp_path):
    # Each node's calls repeat from run to run in the synthetic file; make run 2 differ, after run 1 was seen.
    lines = synthetic.read_text().split("\n")
    run_2 = slice(2 + 2 * 535, 2 + 3 * 535)
    changes = {'"tid" :2019': '"tid" :7', "[1,32,768]": "[1,31,768]", '"output_size" : "98304"': '"output_size" : "1"'}
    for i in range(len(lines))[run_2]:
        for old, new in changes.items():
            lines[i] = lines[i].replace(old, new)
    changed = tmp_path / "changed.json"
    changed.write_text("\n".join(lines))
    streamed = _streamed(changed, 4096)
    assert_same_profile(streamed, _whole(changed))
    by_run = streamed.events.groupby(C.RUN)
    assert by_run[C.THREAD].unique().map(list).tolist() == [["2019"], ["2019"], ["7"]]
    changed_shapes = by_run[C.INPUT_SHAPES].apply(lambda shapes: shapes.str.contains(r"\[1,31,768\]").any())
    assert changed_shapes.tolist() == [False, False, True]
    assert by_run[C.OUTPUT_SIZE].apply(lambda sizes: (sizes == 1).any()).tolist() == [False, False, True]


# --- not a profile ----------------------------------------------------------------------------

BAD = [
    pytest.param(b"", r"is empty; expected a JSON list of trace events", id="empty"),
    pytest.param(b"  \n \r\n\t ", r"is empty; expected a JSON list of trace events", id="whitespace-only"),
    pytest.param(b"this is not a profile\n", r"not valid JSON.*expected the JSON list of trace events", id="text"),
    pytest.param(b'[\n{"cat" : "Session",', r"not valid JSON", id="a-list-with-no-complete-event"),
    pytest.param(b'{"a": 1}', r"not an ONNX Runtime profile.*expected a list of trace events", id="an-object"),
    pytest.param(b"[1,\n2]", r"not an ONNX Runtime profile", id="a-list-of-numbers"),
    pytest.param(b"[\n]", r"0 trace events but none of category 'Session' or 'Node'", id="an-empty-list"),
    pytest.param(
        b'[{"cat": "gpu_op", "name": "k", "ts": 1},\n{"cat": "cpu_op", "name": "mm", "ts": 2}]',
        r"holds 2 trace events but none of category 'Session' or 'Node'",
        id="other-categories",
    ),
]


@pytest.mark.parametrize(("data", "message"), BAD)
def test_what_is_not_a_profile_raises_the_same_error_streamed(data, message, tmp_path):
    path = tmp_path / "bad.json"
    path.write_bytes(data)
    for read in (_whole, lambda p: _streamed(p, 1), lambda p: _streamed(p, 2**20)):
        with pytest.raises(ProfileFormatError, match=message):
            read(path)


def test_events_of_other_categories_among_ort_events_are_skipped_streamed(tmp_path):
    lines = NEW.read_text().split("\n")
    api_event = '{"cat" : "Api","pid" :2166,"tid" :2166,"dur" :3,"ts" :6400,"ph" : "X","name" :"OrtRun","args" : {}},'
    lines.insert(5, api_event)
    path = tmp_path / "with_api.json"
    path.write_text("\n".join(lines))
    for block_bytes in (1, 500, 2**20):
        assert_same_profile(_streamed(path, block_bytes), _whole(NEW))


def test_a_small_file_is_read_whole_and_a_large_one_streamed(monkeypatch):
    def read_whole(path):
        raise AssertionError("read whole")

    monkeypatch.setattr(parse, "read_profile_bytes", read_whole)
    assert len(parse_profile(NEW, stream_above_bytes=NEW.stat().st_size).events) == 20
    with pytest.raises(AssertionError, match="read whole"):
        parse_profile(NEW, stream_above_bytes=NEW.stat().st_size + 1)


# --- the table's string columns ------------------------------------------------------------------


def test_string_columns_are_categoricals_of_the_values_rows_hold_in_lexical_order():
    events = _whole(OLD).events  # ORT 1.16: fence events share the kernels' node names, with other suffixes
    for column in (C.OP_TYPE, C.NODE, C.PROVIDER, C.THREAD, C.INPUT_SHAPES, C.OUTPUT_SHAPES):
        categories = list(events[column].cat.categories)
        assert categories == sorted(set(events[column].astype(str))), column
    assert not any("fence" in name or name.endswith("_kernel_time") for name in events[C.NODE].cat.categories)
    by_name = events.sort_values(C.NODE, kind="stable")[C.NODE].astype(str).tolist()
    assert by_name == sorted(events[C.NODE].astype(str))  # sorting by the column sorts by its text


def test_a_thread_id_written_as_a_number_and_as_a_string_is_one_category(tmp_path):
    lines = NEW.read_text().split("\n")
    kernel_lines = [i for i, line in enumerate(lines) if "_kernel_time" in line]
    lines[kernel_lines[0]] = lines[kernel_lines[0]].replace('"tid" :2166', '"tid" :"2166"')
    assert lines[kernel_lines[0]] != NEW.read_text().split("\n")[kernel_lines[0]]
    path = tmp_path / "mixed_tid.json"
    path.write_text("\n".join(lines))
    events = _whole(path).events
    assert list(events[C.THREAD].cat.categories) == ["2166"] and (events[C.THREAD] == "2166").all()
