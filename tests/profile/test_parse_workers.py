"""parse_profile with worker processes (each reads a stretch of the file) gives what one process gives."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import pytest
from test_parse_fast import (
    BAD,
    LAYOUTS,
    OLD,
    PROFILES,
    SYNTH_RUNS,
    assert_same_profile,
    cuts_at,
    synthetic,  # noqa: F401 (a fixture)
)

from tracker.base.errors import ProfileFormatError
from tracker.profile import columns as C
from tracker.profile import parse
from tracker.profile.parse import parse_profile
from tracker.profile.stream import event_commas, iter_mapped_batches

# Most tests here start worker processes (`python -m tracker.profile.worker`).
pytestmark = pytest.mark.subprocess

ONE_PROCESS_LOG = "in one stream"


def _in_one_process(path: Path):
    return parse_profile(path, stream_above_bytes=0, workers=1)


def _with_workers(path: Path, workers: int, block_bytes: int = 4096):
    return parse_profile(path, stream_above_bytes=0, block_bytes=block_bytes, workers=workers)


@pytest.mark.parametrize("workers", [2, 3])
def test_workers_parse_a_synthetic_gpt2_profile_as_one_process_does(synthetic, workers, caplog):  # noqa: F811
    with caplog.at_level(logging.DEBUG, logger="tracker.profile.parse"):
        parsed = _with_workers(synthetic, workers)
    assert not [r for r in caplog.records if ONE_PROCESS_LOG in r.getMessage()]  # the stretches were used
    assert_same_profile(parsed, _in_one_process(synthetic))
    assert (len(parsed.events), parsed.run_count) == (SYNTH_RUNS * 533, SYNTH_RUNS)


@pytest.mark.parametrize("path", PROFILES)
def test_workers_parse_the_fixtures_of_old_and_new_ort_as_one_process_does(path):
    for workers in (2, 4):
        assert_same_profile(_with_workers(path, workers, block_bytes=700), _in_one_process(path))


def test_the_stretches_are_cut_at_commas_between_events(synthetic):  # noqa: F811
    data = synthetic.read_bytes()
    size = len(data)
    commas = event_commas(synthetic, [size // 3, 2 * size // 3])
    assert len(commas) == 2 and size // 3 <= commas[0] < 2 * size // 3 <= commas[1]
    for comma in commas:
        assert data[comma : comma + 1] == b","
        json.loads(b"[" + data[comma + 1 :].rstrip().removesuffix(b"]") + b"]")  # whole events after it
    assert event_commas(synthetic, [size - 10]) == []  # no event starts after the last one


def test_a_stretch_decodes_as_the_events_between_its_commas_and_the_file_is_left_unchanged(synthetic):  # noqa: F811
    data = synthetic.read_bytes()
    first, second = event_commas(synthetic, [len(data) // 3, 2 * len(data) // 3])
    batches = iter_mapped_batches(synthetic, "synthetic", 4096, start=first + 1, stop=second)
    names = [(event.name, event.ts) for events, truncated in batches for event in events if not truncated]
    expected = json.loads(b"[" + data[first + 1 : second] + b"]")
    assert len(names) > 100 and names == [(event["name"], event["ts"]) for event in expected]
    assert synthetic.read_bytes() == data  # the brackets were written into a private copy of its pages


# Cuts in the last stretch: at line 1200 of 1608 (3 runs x 535 events and the two session events).
LATE_CUTS = cuts_at(1200)


@pytest.mark.parametrize("cut", list(LATE_CUTS))
def test_a_truncated_file_read_by_workers_recovers_the_same_complete_events(cut, synthetic, tmp_path):  # noqa: F811
    data = synthetic.read_bytes()
    path = tmp_path / "truncated.json"
    path.write_bytes(data[: LATE_CUTS[cut](data)])
    expected = _in_one_process(path)
    assert expected.truncated
    assert_same_profile(_with_workers(path, 2), expected)


def test_a_file_cut_just_after_the_start_of_the_last_stretch_is_read_by_one_process(
    synthetic,  # noqa: F811
    tmp_path,
    monkeypatch,
    caplog,
):
    data = synthetic.read_bytes()
    last_comma = data.rindex(b"},\n{") + 1
    path = tmp_path / "truncated.json"
    path.write_bytes(data[: last_comma + 30])  # the last stretch would hold no complete event
    monkeypatch.setattr(parse, "event_commas", lambda path, wanted: [last_comma])
    with caplog.at_level(logging.DEBUG, logger="tracker.profile.parse"):
        parsed = _with_workers(path, 2)
    assert any(ONE_PROCESS_LOG in r.getMessage() for r in caplog.records)
    expected = _in_one_process(path)
    assert expected.truncated
    assert_same_profile(parsed, expected)


@pytest.mark.parametrize("layout", ["pretty-printed", "all-on-one-line", "crlf-line-ends"])
def test_a_file_in_another_layout_is_read_by_one_process_if_its_stretches_are_not_event_lists(layout, tmp_path):
    relaid = tmp_path / "relaid.json"
    relaid.write_text(LAYOUTS[layout](json.loads(OLD.read_text())))
    assert_same_profile(_with_workers(relaid, 3, block_bytes=500), _in_one_process(relaid))


@pytest.mark.parametrize(("data", "message"), BAD)
def test_what_is_not_a_profile_raises_the_same_error_with_workers(data, message, tmp_path):
    path = tmp_path / "bad.json"
    path.write_bytes(data)
    with pytest.raises(ProfileFormatError, match=message):
        _with_workers(path, 2)


def test_a_foreign_list_of_objects_cut_into_stretches_raises_what_one_process_raises(tmp_path):
    path = tmp_path / "foreign.json"
    path.write_text("[\n" + ",\n".join(json.dumps({"id": i, "value": {"x": i}}) for i in range(2000)) + "\n]\n")
    with pytest.raises(ProfileFormatError) as one:
        _in_one_process(path)
    with pytest.raises(ProfileFormatError) as two:
        _with_workers(path, 2)
    assert str(two.value) == str(one.value) and "not an ONNX Runtime profile" in str(one.value)


def test_a_worker_that_cannot_start_leaves_the_file_to_this_process(synthetic, monkeypatch, caplog):  # noqa: F811
    monkeypatch.setattr(sys, "executable", "/bin/false")  # the worker exits at once, with status 1
    with caplog.at_level(logging.DEBUG, logger="tracker.profile.parse"):
        parsed = _with_workers(synthetic, 2)
    assert any(ONE_PROCESS_LOG in r.getMessage() and "exited with 1" in r.getMessage() for r in caplog.records)
    assert_same_profile(parsed, _in_one_process(synthetic))


def test_by_default_a_small_file_is_read_by_one_process_and_a_large_one_by_workers(synthetic, monkeypatch):  # noqa: F811
    started = []

    class CountingWorker(parse.Worker):
        def __init__(self, *args):
            started.append(args)
            super().__init__(*args)

    monkeypatch.setattr(parse, "Worker", CountingWorker)
    monkeypatch.setattr(parse.os, "sched_getaffinity", lambda pid: {0, 1})
    parse_profile(synthetic, stream_above_bytes=0)
    assert started == []
    monkeypatch.setattr(parse, "WORKER_BYTES", synthetic.stat().st_size // 2)
    monkeypatch.setattr(parse, "_WORKER_START_BYTES", 0)
    assert len(parse_profile(synthetic, stream_above_bytes=0).events) == SYNTH_RUNS * 533
    assert len(started) == 1  # two CPUs: this process and one worker


def test_gzip_files_are_read_by_one_process(synthetic, tmp_path, monkeypatch):  # noqa: F811
    import gzip

    packed = tmp_path / "synthetic.json.gz"
    packed.write_bytes(gzip.compress(synthetic.read_bytes()))
    monkeypatch.setattr(parse, "Worker", None)  # calling it would fail
    parsed = parse_profile(packed, workers=3)
    assert_same_profile(parsed, _in_one_process(synthetic))
    assert parsed.events[C.RUN].max() == SYNTH_RUNS - 1


def test_workers_must_be_at_least_one(synthetic):  # noqa: F811
    with pytest.raises(ValueError, match="workers must be at least 1"):
        parse_profile(synthetic, stream_above_bytes=0, workers=0)


def test_a_worker_that_cannot_be_started_at_all_leaves_the_file_to_this_process(synthetic, monkeypatch, caplog):  # noqa: F811
    monkeypatch.setattr(sys, "executable", "/nonexistent/python")  # Popen raises FileNotFoundError
    with caplog.at_level(logging.DEBUG, logger="tracker.profile.parse"):
        parsed = _with_workers(synthetic, 3)
    assert any("could not start a worker" in r.getMessage() for r in caplog.records)
    assert_same_profile(parsed, _in_one_process(synthetic))
