"""`tracker compare` against a real sqlite MLflow store: the table, the report, the --require gate, and a report path
that cannot be written refused before any run is read."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from mlflow import MlflowClient

from tests.commands import assert_one_line_error, run_cli
from tests.conftest import FAST_SPEEDUP, isolate_mlflow, new_sqlite_store
from tests.models import make_linear_model
from tracker import EXACT, MeasureConfig, SessionConfig, Study, TimingConfig
from tracker.cli import main
from tracker.optimize.add_eyelike import WRONG_ADD_EYELIKE, fuse_add_eyelike

# Nearly every test reads the module's study (`store`), which takes tens of seconds to log.
pytestmark = pytest.mark.slow

FAST = MeasureConfig(profile_runs=3, speedup=FAST_SPEEDUP,
                     timing=TimingConfig(warmup_runs=1, min_runs=3, min_seconds=0.0),
                     trace_levels=(1,))
ATTEMPTS = ["baseline", "ort_opt_disabled", "reference_baseline", "reference_fused_wrong", "broken"]


@dataclass(frozen=True)
class Store:
    uri: str
    study_run_id: str
    run_ids: dict[str, str]


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Store:
    """A study "cmp" in experiment "compare": two ORT attempts, a reference-runtime baseline, a fusion
    with a wrong kernel that its exact check rejects, and an attempt whose model file is garbage."""
    folder, uri, _ = new_sqlite_store(tmp_path_factory, "compare")
    model = make_linear_model(n_features=8)
    garbage = folder / "garbage.onnx"
    garbage.write_bytes(b"not a protobuf \x00\xff" * 10)
    feeds = {"X": np.random.default_rng(0).standard_normal((2, 8)).astype(np.float32)}
    with pytest.MonkeyPatch.context() as mp:
        isolate_mlflow(mp)
        with Study("cmp", feeds=feeds, experiment="compare", config=FAST, tracking_uri=uri, log_models=False) as s:
            s.attempt("baseline", model)
            s.attempt("ort_opt_disabled", model, session=SessionConfig(graph_optimization_level="disable"))
            s.attempt("reference_baseline", model, runtime="reference", tolerance=EXACT)
            s.attempt("reference_fused_wrong", fuse_add_eyelike(model).model, runtime="reference",
                      new_ops=(WRONG_ADD_EYELIKE,), tolerance=EXACT)
            s.attempt("broken", garbage)
    return Store(uri, s.run.info.run_id, {r.attempt.name: r.run_id for r in s.results})


@pytest.fixture
def tracking(store, monkeypatch) -> Store:
    isolate_mlflow(monkeypatch)  # the command points MLflow at the store
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store.uri)
    return store


def compare(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["compare", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_compare_prints_one_row_per_attempt_and_stars_the_best(tracking, capsys):
    code, out, _ = compare(capsys, "--experiment", "compare", "--study", "cmp")
    assert code == 0
    header, *lines = out.splitlines()
    notes = [line for line in lines if line.startswith("note: ")]
    lines = lines[:len(lines) - len(notes)]
    assert header.startswith(f"Study cmp (run {tracking.study_run_id}): 5 attempts, best: ")
    assert "verdict" in lines[0] and "speedup" in lines[0] and "interval" in lines[0]
    rows = {line.split()[1] if line.startswith("*") else line.split()[0]: line for line in lines[1:]}
    assert list(rows) == ATTEMPTS
    assert "rejected" in rows["reference_fused_wrong"] and "FAILED" in rows["reference_fused_wrong"]
    assert "failed: ModelError" in rows["broken"]
    assert sum(line.startswith("*") for line in lines) == 1
    inconclusive = [name for name, line in rows.items() if " inconclusive " in line]
    assert [n.split(":")[1].strip() for n in notes if "could detect" in n] == inconclusive


@pytest.mark.parametrize(
    ("required", "code", "reason"),
    [
        (["baseline"], 0, "passed (verdict baseline)"),
        (["ort_opt_disabled"], 0, "passed (verdict "),  # slower or inconclusive still passes
        (["baseline", "reference_fused_wrong"], 1, "was rejected: its accuracy check failed"),
        (["broken"], 1, "broken failed: ModelError"),
        (["no_such_attempt"], 1, "no attempt named 'no_such_attempt'"),
    ],
    ids=["baseline-passes", "a-slower-attempt-passes", "rejected-fails", "crashed-fails", "missing-fails"],
)
def test_require_sets_the_exit_code(tracking, capsys, required, code, reason):
    args = [a for name in required for a in ("--require", name)]
    got, out, _ = compare(capsys, "--study-run", tracking.study_run_id, *args)
    assert got == code
    assert reason in out
    assert ("FAIL:" in out) == (code == 1)


def test_json_output_holds_the_attempts_and_each_requirement(tracking, capsys):
    code, out, _ = compare(capsys, "--study-run", tracking.study_run_id, "--json", "--require", "baseline",
                           "--require", "reference_fused_wrong")
    assert code == 1
    data = json.loads(out)
    assert [a["attempt"] for a in data["attempts"]] == ATTEMPTS
    by_name = {a["attempt"]: a for a in data["attempts"]}
    assert by_name["reference_fused_wrong"]["verdict"] == "rejected"
    assert by_name["baseline"]["speedup"] == 1.0 and by_name["baseline"]["node_count"] == 4
    assert by_name["broken"]["status"] == "failed" and by_name["broken"]["p50_ms"] is None
    assert [(q["name"], q["passed"]) for q in data["require"]] == [("baseline", True), ("reference_fused_wrong", False)]
    assert data["passed"] is False and data["study_run_id"] == tracking.study_run_id


def test_html_report_from_the_store_shows_every_attempt_offline(tracking, capsys, tmp_path):
    path = tmp_path / "out" / "report.html"
    code, out, _ = compare(capsys, "--experiment", "compare", "--study", "cmp", "--html", str(path))
    assert code == 0 and f"report written to {path}" in out
    page = path.read_text(encoding="utf-8")
    assert '<script src="http' not in page
    for name in ATTEMPTS:
        assert name in page
    # the per-op and graph tables come from each run's logged tables/ops_by_op.json and graph_diff.json
    assert "Time per op type" in page and "tracker.fusions:AddEyeLike" in page


def test_run_ids_compares_the_given_attempt_runs_in_the_given_order(tracking, capsys):
    ids = [tracking.run_ids["ort_opt_disabled"], tracking.run_ids["baseline"]]
    code, out, _ = compare(capsys, "--run-ids", *ids, "--require", "baseline")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].startswith("Study cmp: 2 attempts")
    assert [line.lstrip("* ").split()[0] for line in lines[2:4]] == ["ort_opt_disabled", "baseline"]


def test_the_old_spelling_runs_compares_as_run_ids_does_after_one_line_naming_it(tracking, capsys):
    ids = [tracking.run_ids["ort_opt_disabled"], tracking.run_ids["baseline"]]
    code, out, err = compare(capsys, "--run-ids", *ids, "--json")
    old_code, old_out, old_err = compare(capsys, "--runs", *ids, "--json")
    assert old_code == code == 0
    assert json.loads(old_out) == json.loads(out)
    assert old_err.splitlines() == ["tracker: --runs is deprecated for 'tracker compare': use --run-ids (the old "
                                    "spelling goes in the next release)", *err.splitlines()]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--experiment", "compare", "--study", "nope"], "has no run of study 'nope'"),
        (["--experiment", "nope", "--study", "cmp"], "no experiment named 'nope'"),
        (["--run-ids", "0123456789abcdef"], "no run '0123456789abcdef'"),
        (["--study", "cmp"], "--study and --experiment go together"),
    ],
    ids=["unknown-study", "unknown-experiment", "unknown-run", "study-without-experiment"],
)
def test_runs_that_cannot_be_read_exit_2_with_a_message(tracking, capsys, args, message):
    code, _, err = compare(capsys, *args)
    assert code == 2
    assert message in err


def test_a_run_without_attempts_names_its_nested_studies(tracking, capsys, tmp_path):
    client = MlflowClient(tracking.uri)
    experiment = client.get_experiment_by_name("compare").experiment_id
    project = client.create_run(experiment, run_name="main")
    client.create_run(experiment, run_name="linreg", tags={"mlflow.parentRunId": project.info.run_id,
                                                            "tracker.role": "study"})
    code, _, err = compare(capsys, "--study-run", project.info.run_id)
    assert code == 2
    assert "no attempt runs" in err and "['linreg']" in err


def test_the_study_runs_attempts_table_holds_the_rows_compare_reads_back(tracking, capsys, tmp_path):
    client = MlflowClient(tracking.uri)
    path = client.download_artifacts(tracking.study_run_id, "report/attempts.json", str(tmp_path))
    logged = json.loads(Path(path).read_text())
    logged = [dict(zip(logged["columns"], row)) for row in logged["data"]]
    code, out, _ = compare(capsys, "--study-run", tracking.study_run_id, "--json")
    assert code == 0
    read_back = json.loads(out)["attempts"]
    assert [r["attempt"] for r in logged] == ATTEMPTS
    for mine, theirs in zip(logged, read_back):
        assert mine.keys() == theirs.keys()
        for key, value in mine.items():
            assert theirs[key] == (pytest.approx(value) if isinstance(value, float) else value), (mine["attempt"], key)
    assert not client.list_artifacts(tracking.study_run_id, "study"), "one attempts table: the report's"


def test_help_says_what_passing_means(capsys):
    with pytest.raises(SystemExit):
        main(["compare", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "its accuracy check passed" in text and "'worse', 'same' and 'inconclusive' attempts pass" in text


def test_a_study_run_id_alone_compares_that_study_as_study_run_does(tracking, capsys):
    code, out, _ = compare(capsys, tracking.study_run_id, "--json", "--require", "baseline")
    old_code, old_out, _ = compare(capsys, "--study-run", tracking.study_run_id, "--json", "--require", "baseline")
    assert code == old_code == 0
    assert json.loads(out) == json.loads(old_out)
    assert [a["attempt"] for a in json.loads(out)["attempts"]] == ATTEMPTS


def test_a_run_id_with_another_choice_of_runs_is_refused(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["compare", "0123456789abcdef", "--run-ids", "fedcba9876543210"])
    assert exit_.value.code == 2
    assert "argument --run-ids: not allowed with argument RUN_ID" in capsys.readouterr().err


def test_compare_html_where_no_folder_can_be_made_fails_before_reading_runs(store_uri, tmp_path, capsys):
    (tmp_path / "results").write_text("a file, where the report wants a folder")
    path = tmp_path / "results" / "report.html"
    code, _, err = run_cli(capsys, "compare", "--run-ids", "0123456789abcdef", "--html", str(path))
    assert_one_line_error(code, err, repr(str(path)), f"{str(tmp_path / 'results')!r} is a file, not a folder")
    assert not (tmp_path / "mlflow.db").exists()  # the store was not opened
