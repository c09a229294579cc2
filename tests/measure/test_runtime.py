"""Tests of tracker.measure.runtimes.runtime: the map from runtime names, and each runtime behind the protocol on a
real model (tests/conftest.py's `model` and `feeds`; real ONNX Runtime sessions, the real ReferenceEvaluator)."""

from __future__ import annotations

import numpy as np
import pytest

from tracker.measure.attempt import Attempt
from tracker.measure.runtimes.ort_runtime import SessionConfig
from tracker.measure.runtimes.runtime import RUNTIMES, OrtRuntime, ReferenceRuntime, get_runtime
from tracker.optimize.add_eyelike import AddEyeLike
from tracker.profile.parse import parse_profile


def _attempt(model, name: str) -> Attempt:
    return Attempt(name, model, runtime=name, session=SessionConfig(intra_op_num_threads=1))


def test_the_runtimes_are_named_as_the_runs_show_them():
    assert list(RUNTIMES) == ["onnxruntime", "reference"]
    assert all(runtime.name == name for name, runtime in RUNTIMES.items())
    assert isinstance(get_runtime("onnxruntime"), OrtRuntime)
    assert isinstance(get_runtime("reference"), ReferenceRuntime)


@pytest.mark.parametrize("name", ["ort", "ReferenceEvaluator", ""], ids=["abbreviation", "evaluator class", "empty"])
def test_an_unknown_runtime_name_is_refused_with_the_names_there_are(model, name):
    with pytest.raises(ValueError, match=r"runtime must be one of \('onnxruntime', 'reference'\)"):
        get_runtime(name)
    with pytest.raises(ValueError, match="runtime must be one of"):
        Attempt("a", model, runtime=name)


def test_new_ops_are_refused_by_onnxruntime_and_taken_by_the_reference_runtime(model):
    with pytest.raises(ValueError, match="new_ops only apply to runtime='reference'"):
        Attempt("a", model, new_ops=(AddEyeLike,))
    assert Attempt("a", model, runtime="reference", new_ops=(AddEyeLike,)).new_ops == (AddEyeLike,)


def test_each_runtime_reports_its_own_params(model):
    assert get_runtime("onnxruntime").params(_attempt(model, "onnxruntime")) == SessionConfig(
        intra_op_num_threads=1).params()
    assert get_runtime("reference").params(_attempt(model, "reference")) == {"reference.new_ops": "none"}
    with_kernel = Attempt("a", model, runtime="reference", new_ops=(AddEyeLike,))
    assert get_runtime("reference").params(with_kernel) == {"reference.new_ops": "tracker.fusions:AddEyeLike"}


@pytest.mark.parametrize("stop_spinning", [False, True], ids=["spinning", "stop spinning"])
def test_both_runtimes_compute_the_same_outputs(model, feeds, stop_spinning):
    runners = {name: get_runtime(name).runner(_attempt(model, name), model, stop_spinning_after_run=stop_spinning)
               for name in RUNTIMES}
    outputs = {name: run(feeds) for name, run in runners.items()}
    assert outputs["onnxruntime"][0].shape == feeds["X"].shape
    np.testing.assert_allclose(outputs["onnxruntime"][0], outputs["reference"][0], rtol=1e-5, atol=1e-5)


def test_the_reference_runtime_needs_the_loaded_model(model):
    assert get_runtime("reference").needs_weights and not get_runtime("onnxruntime").needs_weights
    with pytest.raises(ValueError, match="model=None"):
        get_runtime("reference").runner(_attempt(model, "reference"), None)


def test_onnxruntime_profiles_to_a_file_and_has_no_value_trace(model, feeds, tmp_path):
    runtime, attempt = get_runtime("onnxruntime"), _attempt(model, "onnxruntime")
    profiled = runtime.profile(attempt, model, feeds, runs=3, workdir=tmp_path)
    assert profiled.profile is None and profiled.profile_path.parent == tmp_path
    assert len(profiled.latency.samples_ms) == 3
    assert parse_profile(profiled.profile_path).run_count == 3
    assert runtime.trace(attempt, model, feeds, (1, 2)) == {}


def test_the_reference_runtime_profiles_in_memory_and_traces_each_level(model, feeds, tmp_path):
    runtime, attempt = get_runtime("reference"), _attempt(model, "reference")
    profiled = runtime.profile(attempt, model, feeds, runs=3, workdir=tmp_path)
    assert profiled.profile_path is None and profiled.optimized_model_path is None
    assert profiled.profile.run_count == 3 and len(profiled.latency.samples_ms) == 3
    assert not any(tmp_path.iterdir())  # nothing written
    traces = runtime.trace(attempt, model, feeds, (2, 3))
    assert sorted(traces) == [2, 3]
    assert "MatMul" in traces[2] and len(traces[3]) > len(traces[2])
