"""Profiles made to break the parser: bounded memory, one-line errors, no wrong answers."""

from __future__ import annotations

import gzip
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tracker.cli import main
from tracker.profile import columns as C
from tracker.profile.parse import parse_profile

FIXTURE = Path(__file__).parents[1] / "fixtures" / "profile_ort_1_32.json"
# Parses argv[1] and prints how much its peak resident memory grew from what the imports left.
_PEAK_CHILD = """
import sys
from tracker.base.errors import ProfileFormatError
from tracker.base.memory import peak_rss_bytes
from tracker.profile.parse import parse_profile
before = peak_rss_bytes()
try:
    outcome = f"{len(parse_profile(sys.argv[1]).events)} rows"
except ProfileFormatError as e:
    outcome = f"error: {e}"
print(peak_rss_bytes() - before, outcome)
"""


def _lines() -> list[str]:
    """The events of the ORT 1.32 fixture, one JSON text each, as ORT wrote them."""
    return [line.rstrip(",") for line in FIXTURE.read_text().splitlines() if line.startswith("{")]


def _profile_text(lines: list[str], *, one_line: bool = False) -> str:
    return "[" + ",".join(lines) + "]" if one_line else "[\n" + ",\n".join(lines) + "\n]\n"


def _with(lines: list[str], index: int, old: str, new: str) -> list[str]:
    assert old in lines[index]
    return [*lines[:index], lines[index].replace(old, new, 1), *lines[index + 1 :]]


def _peak_growth(path: Path) -> tuple[int, str]:
    """Parses `path` in a fresh interpreter: how much its peak RSS grew (bytes), and the rows or the error."""
    done = subprocess.run([sys.executable, "-c", _PEAK_CHILD, str(path)], capture_output=True, text=True, check=True)
    grown, outcome = done.stdout.strip().split(" ", 1)
    return int(grown), outcome


def _summarize_fails(capsys, path: Path) -> str:
    """Runs `tracker summarize` on `path`, checks it exits 2 with one line, and returns that line."""
    assert main(["summarize", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err
    return err


# --- 8. memory is bounded by the table, not the text --------------------------------------------


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads the peak RSS from /proc")
def test_a_one_line_gzip_profile_needs_no_more_memory_than_the_same_events_one_per_line(tmp_path):
    lines = _lines() * 1500  # ~48 MB of text, ~3 MB of gzip
    peaks = {}
    for layout in ("one-per-line", "one-line"):
        path = tmp_path / f"{layout}.json.gz"
        path.write_bytes(gzip.compress(_profile_text(lines, one_line=layout == "one-line").encode(), 1))
        peaks[layout] = _peak_growth(path)
    assert peaks["one-line"][1] == peaks["one-per-line"][1] == f"{1500 * 20} rows"
    text_bytes = len(_profile_text(lines))
    # Before the fix the one-line text was held whole, twice, with all its events: ~8x the one-per-line growth.
    assert peaks["one-line"][0] < 1.5 * peaks["one-per-line"][0] + text_bytes // 8, (peaks, text_bytes)


@pytest.mark.subprocess
@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads the peak RSS from /proc")
@pytest.mark.parametrize("start", [b"", b"[\n"], ids=["nul-bytes", "a-bracket-then-nul-bytes"])
def test_a_2_gib_file_of_nul_bytes_is_rejected_without_being_read_into_memory(start, tmp_path):
    path = tmp_path / "zeros.json"
    path.write_bytes(start)
    os.truncate(path, 2 * 2**30)  # sparse: no disk
    grown, outcome = _peak_growth(path)
    assert grown < 64 * 2**20, f"peak RSS grew by {grown / 2**20:.0f} MiB to reject a 2 GiB file"
    assert outcome.startswith("error: ") and "is not valid JSON" in outcome and "\\x00" in outcome


# --- 9. one-line errors, not tracebacks -----------------------------------------------------------


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        pytest.param('"dur" :98,', f'"dur" :{2**64},', f"has dur {2**64}; expected a duration of 0 to", id="dur"),
        pytest.param('"ts" :6347,', f'"ts" :{2**63},', f"has ts {2**63}; expected a timestamp of", id="ts"),
    ],
)
def test_a_duration_or_timestamp_beyond_64_bits_is_an_error_naming_the_event(old, new, message, capsys, tmp_path):
    path = tmp_path / "huge.json"
    path.write_text(_profile_text(_with(_lines(), 2, old, new)))
    err = _summarize_fails(capsys, path)
    assert 'trace event 2 ("eye_kernel_time")' in err and message in err


def test_an_event_with_a_list_nested_200000_deep_is_an_error_not_a_recursion_error(capsys, tmp_path):
    deep = '"thread_scheduling_stats" : ' + "[" * 200_000 + "]" * 200_000
    path = tmp_path / "deep.json"
    path.write_text(_profile_text(_with(_lines(), 2, '"thread_scheduling_stats" : ""', deep)))
    assert "nests lists or objects too deeply to decode" in _summarize_fails(capsys, path)


# --- 10. wrong answers ----------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity"])
def test_nan_or_infinity_as_a_duration_is_invalid_not_truncated(value, capsys, tmp_path):
    # Past the first 1 MiB block of a streamed file (>= 4 MiB), where it used to end the read as a cut list.
    lines = _lines() * 400
    lines = _with(lines, len(lines) // 2, '"dur" :', f'"dur" :{value},"was" :')
    path = tmp_path / "nan.json"
    path.write_text(_profile_text(lines))
    assert path.stat().st_size > 4 * 2**20
    err = _summarize_fails(capsys, path)
    assert f"has dur {value} (byte " in err and "expected a number: JSON has no NaN or Infinity" in err


def test_a_negative_duration_is_an_error_naming_the_event(capsys, tmp_path):
    path = tmp_path / "negative.json"
    path.write_text(_profile_text(_with(_lines(), 2, '"dur" :98,', '"dur" :-98,')))
    err = _summarize_fails(capsys, path)
    assert 'trace event 2 ("eye_kernel_time") has dur -98; expected a duration of 0 to' in err


def test_kernels_that_all_took_zero_microseconds_get_a_share_of_zero_not_nan(capsys, tmp_path):
    events = json.loads(FIXTURE.read_text())
    for event in events:
        if event["cat"] == "Node":
            event["dur"] = 0
    path = tmp_path / "zero.json"
    path.write_text(json.dumps(events))
    assert main(["summarize", str(path), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert len(rows) == 3 and all(row[C.PCT] == 0.0 for row in rows)
    assert not any(math.isnan(value) for value in parse_profile(path).events[C.DUR_US])


def test_a_profile_without_kernel_events_prints_a_sentence_not_an_empty_dataframe(capsys, tmp_path):
    path = tmp_path / "sessions-only.json"
    path.write_text(_profile_text([line for line in _lines() if '"cat" : "Session"' in line]))
    assert main(["summarize", str(path)]) == 0
    out = capsys.readouterr().out
    assert "Empty DataFrame" not in out
    assert "No kernel events were found: the profile holds no Node events named '<node>_kernel_time'" in out
