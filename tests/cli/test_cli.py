"""Tests of the `tracker summarize` and `tracker inspect` commands through `tracker.cli.main`, and of the options'
old spellings."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import onnx
import pytest

from tests.models import make_linear_model
from tracker.cli import build_parser, main
from tracker.profile import columns as C
from tracker.profile.aggregate import summarize
from tracker.profile.parse import parse_profile

FIXTURES = Path(__file__).parents[1] / "fixtures"
OLD = FIXTURES / "profile_ort_1_16_fences.json"
NEW = FIXTURES / "profile_ort_1_32.json"
N_FEATURES = 8


@pytest.fixture
def model_path(tmp_path) -> Path:
    path = tmp_path / "linear.onnx"
    onnx.save_model(make_linear_model(n_features=N_FEATURES, seed=0), str(path))
    return path


def _summarize_json(capsys, *args: str) -> dict:
    assert main(["summarize", *args, "--json"]) == 0
    out = capsys.readouterr().out
    return json.loads(out)


@pytest.mark.parametrize(
    ("path", "fmt"), [(OLD, "fences"), (NEW, "memory")], ids=["ort-1.16-fences", "ort-1.32-memory"]
)
def test_summarize_json_reports_the_profile_and_one_row_per_op(capsys, path, fmt):
    report = _summarize_json(capsys, str(path))
    assert {k: report[k] for k in ("format", "truncated", "runs", "skip_runs", "by")} == {
        "format": fmt, "truncated": False, "runs": 5, "skip_runs": 0, "by": "op",
    }
    rows = {row[C.KEY]: row for row in report["rows"]}
    assert {k: r[C.CALLS] for k, r in rows.items()} == {"Add": 10, "EyeLike": 5, "MatMul": 5}
    expected = parse_profile(path).events.groupby(C.OP_TYPE)[C.DUR_US].sum().to_dict()
    assert {k: r[C.TOTAL_US] for k, r in rows.items()} == expected
    assert sum(r[C.PCT] for r in rows.values()) == pytest.approx(100.0)
    assert list(report["rows"][0]) == list(C.SUMMARY_COLUMNS)


def test_summarize_json_by_node_with_skipped_runs_and_top(capsys):
    report = _summarize_json(capsys, str(NEW), "--by", "node", "--skip-runs", "1", "--top", "2")
    assert (report["by"], report["skip_runs"]) == ("node", 1)
    expected = summarize(parse_profile(NEW).events, by="node", skip_runs=1)
    rows = report["rows"]
    assert len(rows) == 3
    assert [r[C.KEY] for r in rows[:2]] == expected[C.KEY].tolist()[:2]
    assert rows[2][C.KEY] == "(other) x2"
    assert sum(r[C.TOTAL_US] for r in rows) == expected[C.TOTAL_US].sum()
    assert sum(r[C.CALLS] for r in rows) == 16  # 4 nodes x 4 runs kept
    assert rows[2][C.RUN_MIN_US] is None  # NaN spread of the folded row is JSON null


def test_summarize_by_provider_gives_one_row(capsys):
    report = _summarize_json(capsys, str(OLD), "--by", "provider")
    assert [(r[C.KEY], r[C.CALLS]) for r in report["rows"]] == [("CPUExecutionProvider", 20)]


def test_summarize_reads_a_gzip_profile(capsys, tmp_path):
    packed = tmp_path / "profile.json.gz"
    packed.write_bytes(gzip.compress(NEW.read_bytes()))
    assert _summarize_json(capsys, str(packed))["rows"] == _summarize_json(capsys, str(NEW))["rows"]


def test_summarize_as_text_prints_a_header_and_a_table(capsys):
    assert main(["summarize", str(OLD), "--skip-runs", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"{OLD}: 5 runs, format fences; by op, 1 run(s) skipped"
    assert lines[1].split() == ["key", "total_us", "calls", "pct", "us_per_run", "mean_us"]
    assert sorted(line.split()[0] for line in lines[2:]) == ["Add", "EyeLike", "MatMul"]


def test_summarize_marks_a_truncated_profile(capsys, tmp_path):
    cut = tmp_path / "cut.json"
    cut.write_bytes(NEW.read_bytes()[:6000])
    assert main(["summarize", str(cut)]) == 0
    assert "TRUNCATED" in capsys.readouterr().out.splitlines()[0]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        pytest.param(b"garbage garbage", "is not valid JSON", id="garbage"),
        pytest.param(b"", "is empty", id="empty"),
        pytest.param(b'{"a": 1}', "not an ONNX Runtime profile", id="foreign-json"),
        pytest.param(b"\x1f\x8b\x08\x00" + b"\x00" * 40, "damaged gzip", id="damaged-gzip"),
    ],
)
def test_summarize_of_a_bad_profile_exits_2_with_a_clear_message(capsys, tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    assert main(["summarize", str(path), "--json"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("error: ")
    assert message in captured.err
    assert "Traceback" not in captured.err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(["--skip-runs", "5"], "skip_runs=5 leaves no run: the profile holds 5 run(s)", id="skip-all-runs"),
        pytest.param(["--skip-runs", "-1"], "skip_runs must be >= 0", id="negative-skip"),
        pytest.param(["--top", "0"], "top must be >= 1", id="top-zero"),
        pytest.param(["--workers", "0"], "workers must be at least 1", id="no-workers"),
    ],
)
def test_summarize_with_bad_options_exits_2_naming_the_problem(capsys, args, message):
    assert main(["summarize", str(NEW), *args]) == 2
    assert message in capsys.readouterr().err


def test_summarize_of_a_missing_file_exits_2(capsys, tmp_path):
    assert main(["summarize", str(tmp_path / "nope.json")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_inspect_prints_one_line_per_node(capsys, model_path):
    assert main(["inspect", str(model_path), "--verbose", "2", "--dim", "N=4"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == ["EyeLike(A) -> I", "Add(A, I) -> W", "MatMul(X, W) -> XW", "Add(XW, B) -> Y"]


def test_inspect_a_node_prints_its_inputs_and_outputs(capsys, model_path):
    assert main(["inspect", str(model_path), "--verbose", "2", "--dim", "N=4", "--node", "matmul"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0] == "MatMul(X, W) -> XW"
    assert f"input X: float32[4, {N_FEATURES}]" in lines
    assert f"input W: float32[{N_FEATURES}, {N_FEATURES}]" in lines
    assert f"output XW: float32[4, {N_FEATURES}]" in lines
    assert out.index("input X:") < out.index("output XW:")


def test_inspect_with_a_different_dim_changes_the_batch(capsys, model_path):
    assert main(["inspect", str(model_path), "--dim", "N=3", "--node", "add_bias"]) == 0
    assert f"output Y: float32[3, {N_FEATURES}]" in capsys.readouterr().out.splitlines()


def test_inspect_without_the_symbolic_dim_runs_a_batch_of_one(capsys, model_path):
    # "N" reads as a batch dim: it gets the default batch size, 1.
    assert main(["inspect", str(model_path), "--node", "add_bias"]) == 0
    assert f"output Y: float32[1, {N_FEATURES}]" in capsys.readouterr().out.splitlines()


def test_inspect_with_a_dim_the_model_does_not_have_exits_2_naming_its_dims(capsys, model_path):
    assert main(["inspect", str(model_path), "--dim", "seq=3"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "dims ['seq'] that no input has; the model's symbolic dims are ['N']" in captured.err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(["--dim", "N"], "--dim expects NAME=SIZE with an integer size, got 'N'", id="dim-without-size"),
        pytest.param(["--dim", "N=four"], "--dim expects NAME=SIZE", id="dim-not-an-integer"),
        pytest.param(["--dim", "N=4", "--node", "nope"], "model has no node named 'nope'", id="unknown-node"),
    ],
)
def test_inspect_with_bad_options_exits_2_naming_the_problem(capsys, model_path, args, message):
    assert main(["inspect", str(model_path), *args]) == 2
    assert message in capsys.readouterr().err


def test_inspect_of_a_file_that_is_not_a_model_exits_2(capsys, tmp_path):
    path = tmp_path / "model.onnx"
    path.write_text("hello")
    assert main(["inspect", str(path), "--dim", "N=4"]) == 2
    assert "ONNX model" in capsys.readouterr().err


def test_summarize_with_workers_gives_what_one_process_gives(capsys, tmp_path):
    # Copies of the fixture's events make a file long enough (5.6 MB) to be streamed in three stretches.
    lines = NEW.read_text().splitlines()
    events = [line.rstrip(",") for line in lines[1:-1]]
    path = tmp_path / "long.json"
    path.write_text("[\n" + ",\n".join(events * 500) + "\n]\n")
    one = _summarize_json(capsys, str(path), "--workers", "1")
    three = _summarize_json(capsys, str(path), "--workers", "3")
    assert path.stat().st_size > 4 * 2**20
    assert three == one and one["runs"] == 2500


@pytest.mark.parametrize(("command", "old", "new", "values"), [
    (["profile", "model.onnx"], "--runs", "--profile-runs", ["4"]),
    (["compare"], "--runs", "--run-ids", ["0123456789abcdef", "fedcba9876543210"]),
], ids=["profile-runs", "compare-run-ids"])
def test_an_old_spelling_parses_as_the_new_one_after_one_line_and_is_not_in_the_help(capsys, command, old, new, values):
    parsed_old = build_parser().parse_args([*command, old, *values])
    said = capsys.readouterr().err
    parsed_new = build_parser().parse_args([*command, new, *values])

    assert parsed_old == parsed_new
    assert said == (f"tracker: {old} is deprecated for 'tracker {command[0]}': use {new} (the old spelling goes in "
                    "the next release)\n")
    assert capsys.readouterr().err == ""  # the new spelling says nothing
    with pytest.raises(SystemExit):
        main([command[0], "--help"])
    shown = capsys.readouterr().out
    assert new in shown and f"{old} " not in shown and f"{old}\n" not in shown
