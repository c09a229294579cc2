"""`tracker optimize` on what users bring and what it must say about it: a scikit-learn classifier
converted with skl2onnx's defaults (ZipMap probabilities: a sequence of maps), and studies with nothing to judge
(the baseline failed, or every attempt did), which must exit 1 with a one-line reason."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.studies.test_optimize import FAST
from tracker.cli import main
from tracker.measure.attempt import Attempt, AttemptResult
from tracker.studies.own import study_failure

# Each test runs a whole study.
pytestmark = pytest.mark.slow


@pytest.fixture
def optimize(store, monkeypatch, capsys, tmp_path):
    """`tracker optimize MODEL ARGS` in this process, on the test's sqlite store: (exit code, stdout, stderr, runs
    by name). The machine's roofs are not measured (6 s that these tests do not look at)."""
    import tracker.study.study

    monkeypatch.setattr(tracker.study.study, "measure_machine_or_none", lambda: None)
    monkeypatch.setenv("TRACKER_OUTBOX", str(tmp_path / "outbox"))
    logger = logging.getLogger("tracker")
    monkeypatch.setattr(logger, "level", logger.level)  # main() sets INFO; put it back after the test

    def run(model: Path, *args: str):
        code = main(["optimize", str(model), "--experiment", "own", *FAST, *args])
        out, err = capsys.readouterr()
        experiment = store.get_experiment_by_name("own")
        runs = {r.info.run_name: r for r in store.search_runs([experiment.experiment_id])} if experiment else {}
        return code, out, err, runs

    return run


@pytest.fixture(scope="module")
def forest(tmp_path_factory) -> Path:
    """A random forest on iris, converted as a user would: `to_onnx` with no options, so zipmap is on."""
    from skl2onnx import to_onnx
    from sklearn.datasets import load_iris
    from sklearn.ensemble import RandomForestClassifier

    X, y = load_iris(return_X_y=True)
    X = X.astype(np.float32)
    model = to_onnx(RandomForestClassifier(n_estimators=4, max_depth=3, random_state=0).fit(X, y), X[:1],
                    target_opset=18)
    assert model.graph.output[1].type.HasField("sequence_type")  # the ZipMap output
    folder = tmp_path_factory.mktemp("forest")
    onnx.save_model(model, str(folder / "rf.onnx"))
    np.savez(folder / "X.npz", **{model.graph.input[0].name: X[::10]})
    return folder / "rf.onnx"


def test_a_default_skl2onnx_forest_is_measured_and_judged_by_label_and_class_probability(optimize, forest):
    code, out, err, runs = optimize(forest, "--task", "classification", "--feeds", str(forest.parent / "X.npz"),
                                    "--attempts", "ort_opt_disabled")
    assert "sequence of dict" not in out + err
    for name in ("baseline", "ort_opt_disabled"):
        data = runs[name].data
        assert data.tags["tracker.status"] == "ok", data.tags.get("tracker.error")
        assert data.metrics["diff.top1_agreement"] == 1.0 and data.metrics["diff.max_prob_diff"] == 0.0
        assert data.params["diff.task"] == "classification"
    # Needs the store's fix of issue 22 item 1 (a ZipMap output has no MLflow signature: logged without one);
    # before it, the run was kept in the outbox as if the store were down, and the command exited 2.
    assert code == 0, err[-3000:]
    assert {r.info.status for r in runs.values()} == {"FINISHED"}


@pytest.fixture(scope="module")
def broken_reshape(tmp_path_factory) -> Path:
    """A model that loads and passes the checker but fails on every run: X [N, 4] reshaped to [3, 5]."""
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 4])
    y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, [3, 5])
    shape = numpy_helper.from_array(np.array([3, 5], np.int64), "shape")
    graph = helper.make_graph([helper.make_node("Reshape", ["X", "shape"], ["Y"])], "reshape", [x], [y], [shape])
    path = tmp_path_factory.mktemp("broken") / "broken.onnx"
    onnx.save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), str(path))
    return path


def test_a_failed_baseline_exits_1_saying_why_and_runs_nothing_it_could_not_judge(optimize, broken_reshape):
    code, out, err, runs = optimize(broken_reshape, "--dim", "N=2", "--attempts", "ort_opt_disabled,ort_threads_1")
    assert code == 1, err[-3000:]
    assert "Traceback" not in err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, err[-3000:]
    assert errors[0].startswith("error: the baseline attempt failed (Fail: [ONNXRuntimeError]")
    assert "cannot be reshaped" in errors[0] and "no attempt can be judged" in errors[0]
    assert set(runs) == {"broken", "baseline"}  # the study and its baseline, logged; nothing judged against it
    assert runs["baseline"].info.status == "FAILED"
    assert "baseline" in out  # the comparison is printed first


def _result(name: str, error: str | None = None) -> AttemptResult:
    model = helper.make_model(helper.make_graph([], "empty", [], []))
    return AttemptResult(attempt=Attempt(name=name, model=model), error=error)


@pytest.mark.parametrize(("results", "failures", "expected"), [
    pytest.param([_result("baseline"), _result("a")], {}, None, id="all measured"),
    pytest.param([_result("baseline"), _result("a", "E: x"), _result("b")], {}, None, id="one of two failed"),
    pytest.param([_result("baseline")], {}, None, id="only the baseline"),
    pytest.param([_result("baseline"), _result("a", "E: x")], {"b": "OptimizerError: y"},
                 "every attempt failed (2 of 2; a: E: x); see the status column above", id="every attempt failed"),
    pytest.param([_result("baseline", "Fail: z\nmore")], {}, "the baseline attempt failed (Fail: z more); no "
                 "attempt can be judged, so none was run", id="the baseline failed"),
])
def test_the_study_failure_names_what_left_nothing_to_judge(results, failures, expected):
    assert study_failure(results, failures) == expected
