"""Tests of tracker.measure.runtimes.reference_runtime on a real in-memory model (EyeLike, Add, MatMul, Add), and
`tracker inspect` naming an op it has no kernel for."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pandas as pd
import pytest
from onnx import numpy_helper

from tests.commands import assert_one_line_error, run_cli
from tests.models import custom_op_model, make_linear_model
from tracker.base.errors import FeedError
from tracker.measure.runtimes.reference_profile import profile_reference
from tracker.measure.runtimes.reference_runtime import evaluate_node, run_reference, time_reference, trace_reference
from tracker.measure.timing.latency import TimingConfig
from tracker.optimize.add_eyelike import AddEyeLike, fuse_add_eyelike
from tracker.profile import columns as C
from tracker.profile.parse import parse_profile

N_FEATURES = 16


@pytest.fixture(scope="module")
def model():
    return make_linear_model(n_features=N_FEATURES, seed=0)


@pytest.fixture(scope="module")
def feeds():
    x = np.random.default_rng(1).standard_normal((4, N_FEATURES)).astype(np.float32)
    return {"X": x}


def _initializer(model, name):
    return next(numpy_helper.to_array(t) for t in model.graph.initializer if t.name == name)


def test_run_reference_computes_the_linear_layer(model, feeds):
    a, b = _initializer(model, "A"), _initializer(model, "B")
    (y,) = run_reference(model, feeds)
    np.testing.assert_allclose(y, feeds["X"] @ (a + np.eye(N_FEATURES, dtype=np.float32)) + b, atol=1e-5)


def test_profile_has_the_event_columns_and_one_row_per_node_and_run(model, feeds):
    table = profile_reference(model, feeds, runs=3).events
    assert tuple(table.columns) == C.EVENT_COLUMNS
    assert len(table) == 3 * len(model.graph.node)
    assert sorted(table[C.RUN].unique()) == [0, 1, 2]
    assert set(table[C.OP_TYPE]) == {"EyeLike", "Add", "MatMul"}
    assert list(table[C.NODE][:4]) == ["eye", "add_eye", "matmul", "add_bias"]
    assert set(table[C.PROVIDER]) == {"ReferenceEvaluator"}


def test_profile_timings_are_positive_float_microseconds_in_increasing_order(model, feeds):
    table = profile_reference(model, feeds, runs=2).events
    assert table[C.DUR_US].dtype == np.float64 and table[C.TS_US].dtype == np.float64
    assert (table[C.DUR_US] > 0).all()
    assert table[C.TS_US].is_monotonic_increasing
    assert table[C.MEM_IN_USE_DELTA].dtype == pd.Int64Dtype()
    assert table[C.MEM_IN_USE_DELTA].isna().all()
    ort_table = parse_profile(Path(__file__).parents[1] / "fixtures" / "profile_ort_1_32.json").events
    kinds = table.dtypes.astype(str).drop([C.DUR_US, C.TS_US])  # µs as floats: the evaluator times in ns
    assert kinds.equals(ort_table.dtypes.astype(str).drop([C.DUR_US, C.TS_US]))


def test_profile_shapes_and_sizes_follow_ort_conventions(model, feeds):
    matmul = profile_reference(model, feeds, runs=1).events.set_index(C.NODE).loc["matmul"]
    assert matmul[C.INPUT_SHAPES] == f'[{{"float":[4,{N_FEATURES}]}},{{"float":[{N_FEATURES},{N_FEATURES}]}}]'
    assert matmul[C.OUTPUT_SHAPES] == f'[{{"float":[4,{N_FEATURES}]}}]'
    assert matmul[C.OUTPUT_SIZE] == 4 * N_FEATURES * 4
    # X and W are computed values; A, read by "eye", is an initializer.
    assert matmul[C.ACTIVATION_SIZE] == (4 + N_FEATURES) * N_FEATURES * 4
    assert matmul[C.PARAMETER_SIZE] == 0


def test_profile_of_a_fused_model_names_the_custom_op_by_its_op_type(model, feeds):
    fused = fuse_add_eyelike(model).model
    table = profile_reference(fused, feeds, new_ops=[AddEyeLike], runs=2).events
    assert set(table[C.OP_TYPE]) == {"AddEyeLike", "MatMul", "Add"}
    assert len(table) == 2 * 3


def test_profile_names_unnamed_nodes_by_op_type_and_index(model, feeds):
    unnamed = type(model)()
    unnamed.CopyFrom(model)
    unnamed.graph.node[2].name = ""
    table = profile_reference(unnamed, feeds, runs=1).events
    assert list(table[C.NODE]) == ["eye", "add_eye", "MatMul_2", "add_bias"]


def test_profile_rejects_zero_runs(model, feeds):
    with pytest.raises(ValueError, match="runs must be >= 1"):
        profile_reference(model, feeds, runs=0)


def test_time_reference_returns_latency_of_the_requested_runs(model, feeds):
    timing = TimingConfig(warmup_runs=1, min_runs=5, min_seconds=0.0, max_runs=5)
    latency = time_reference(model, feeds, timing=timing)
    assert latency.runs == 5
    assert 0 < latency.min_ms <= latency.p50_ms <= latency.max_ms


def test_trace_levels_add_detail(model, feeds):
    traces = {v: trace_reference(model, feeds, verbose=v) for v in (1, 2, 3, 4)}
    # onnx prints a message of level L when L < verbose: level 1 has nothing for top-level nodes.
    assert len(traces[1]) <= len(traces[2]) < len(traces[3]) < len(traces[4])
    assert "MatMul(X, W) -> XW" in traces[2]
    assert " +C A: float32:(16, 16) in [" in traces[3]


@pytest.mark.parametrize("verbose", [0, 5], ids=["zero", "five"])
def test_trace_rejects_levels_outside_one_to_four(model, feeds, verbose):
    with pytest.raises(ValueError, match=r"verbose must be one of \(1, 2, 3, 4\)"):
        trace_reference(model, feeds, verbose=verbose)


def test_evaluate_node_runs_matmul_on_the_inputs_of_a_full_run(model, feeds):
    result = evaluate_node(model, "matmul", feeds, verbose=2)
    w = _initializer(model, "A") + np.eye(N_FEATURES, dtype=np.float32)
    assert result.op_type == "MatMul"
    assert set(result.inputs) == {"X", "W"}
    np.testing.assert_array_equal(result.inputs["W"], w)
    np.testing.assert_array_equal(result.outputs["XW"], feeds["X"] @ w)
    assert "MatMul(X, W) -> XW" in result.trace


def test_evaluate_node_runs_a_custom_op_with_new_ops(model, feeds):
    fused = fuse_add_eyelike(model).model
    result = evaluate_node(fused, "add_eye", feeds, new_ops=[AddEyeLike])
    a = _initializer(model, "A")
    np.testing.assert_array_equal(result.outputs["W"], a + np.eye(N_FEATURES, dtype=np.float32))
    assert result.trace == ""


def test_evaluate_node_names_available_nodes_when_the_name_is_unknown(model, feeds):
    with pytest.raises(ValueError, match=r"no node named 'nope'.*'matmul'"):
        evaluate_node(model, "nope", feeds)


@pytest.mark.parametrize(
    "bad_feeds",
    [{}, {"X": np.zeros((1, N_FEATURES), np.float32), "Z": np.zeros(1, np.float32)}],
    ids=["missing-input", "extra-input"],
)
def test_feeds_that_do_not_match_the_inputs_raise_feed_error(model, bad_feeds):
    with pytest.raises(FeedError, match=r"feeds do not match the model: (missing|unknown) inputs \['[XZ]'\].*model expects X"):
        run_reference(model, bad_feeds)
    with pytest.raises(FeedError):
        profile_reference(model, bad_feeds, runs=1)
    with pytest.raises(FeedError):
        evaluate_node(model, "matmul", bad_feeds)


def test_inspect_of_a_custom_domain_op_names_it_and_what_the_reference_runtime_runs(tmp_path, capsys):
    path = tmp_path / "custom.onnx"
    onnx.save_model(custom_op_model(), str(path))
    code, _, err = run_cli(capsys, "inspect", str(path))
    assert_one_line_error(code, err, "reference runtime", "no kernel for op 'Foo' of domain 'my.domain' (node 'foo')",
                          "'ai.onnx.ml'", "local functions (none)", "new_ops (none)")
