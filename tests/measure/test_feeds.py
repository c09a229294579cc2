"""Tests of tracker.measure.feeds: seeded feeds from a model's signature, and checking feeds against it."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from tracker.errors import FeedError
from tracker.measure.feeds import InputSpec, check_feeds, input_specs, make_feeds
from tracker.optimize.add_eyelike import make_linear_model


@pytest.fixture(scope="module")
def model() -> onnx.ModelProto:
    """input_ids int64 [batch, seq], mask bool [batch, seq], scale float [3], bias float [3] (has a default)."""
    inputs = [
        helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
        helper.make_tensor_value_info("mask", TensorProto.BOOL, ["batch", "seq"]),
        helper.make_tensor_value_info("scale", TensorProto.FLOAT, [3]),
        helper.make_tensor_value_info("bias", TensorProto.FLOAT, [3]),
    ]
    outputs = [
        helper.make_tensor_value_info("ids_out", TensorProto.INT64, ["batch", "seq"]),
        helper.make_tensor_value_info("mask_out", TensorProto.BOOL, ["batch", "seq"]),
        helper.make_tensor_value_info("scaled", TensorProto.FLOAT, [3]),
    ]
    nodes = [
        helper.make_node("Identity", ["input_ids"], ["ids_out"]),
        helper.make_node("Identity", ["mask"], ["mask_out"]),
        helper.make_node("Add", ["scale", "bias"], ["scaled"]),
    ]
    bias = onnx.numpy_helper.from_array(np.zeros(3, np.float32), "bias")
    graph = helper.make_graph(nodes, "feeds", inputs, outputs, initializer=[bias])
    result = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    onnx.checker.check_model(result)
    return result


def test_input_specs_list_the_inputs_to_feed_without_initializers(model):
    assert input_specs(model) == [
        InputSpec("input_ids", np.dtype(np.int64), ("batch", "seq")),
        InputSpec("mask", np.dtype(bool), ("batch", "seq")),
        InputSpec("scale", np.dtype(np.float32), (3,)),
    ]


def test_make_feeds_uses_the_given_sizes_of_symbolic_dims(model):
    feeds = make_feeds(model, dims={"batch": 2, "seq": 7})
    assert set(feeds) == {"input_ids", "mask", "scale"}
    assert feeds["input_ids"].shape == (2, 7) and feeds["input_ids"].dtype == np.int64
    assert feeds["mask"].shape == (2, 7) and feeds["mask"].dtype == np.bool_
    assert feeds["scale"].shape == (3,) and feeds["scale"].dtype == np.float32
    check_feeds(model, feeds)


def test_make_feeds_for_the_linear_model_gives_x_of_the_requested_batch():
    feeds = make_feeds(make_linear_model(n_features=10), dims={"N": 4})
    assert list(feeds) == ["X"]
    assert feeds["X"].shape == (4, 10) and feeds["X"].dtype == np.float32


@pytest.mark.parametrize(
    ("dims", "missing"),
    [({"batch": 2}, "seq"), ({"seq": 2}, "batch"), ({}, "batch"), (None, "batch")],
    ids=["no-seq", "no-batch", "empty", "none"],
)
def test_a_missing_symbolic_dim_raises_feed_error_naming_it_and_the_cli_option(model, dims, missing):
    with pytest.raises(FeedError) as info:
        make_feeds(model, dims=dims)
    message = str(info.value)
    assert f"symbolic dim {missing!r}" in message
    assert f"--dim {missing}=" in message
    assert "'input_ids'" in message


@pytest.mark.parametrize("int_high", [1, 5, 100])
def test_integer_inputs_are_drawn_from_zero_to_int_high(model, int_high):
    ids = make_feeds(model, dims={"batch": 8, "seq": 64}, int_high=int_high)["input_ids"]
    assert ids.min() >= 0
    assert ids.max() < int_high
    if int_high > 1:
        assert len(np.unique(ids)) == int_high  # 512 draws cover a range this small


def test_bool_inputs_hold_both_values(model):
    mask = make_feeds(model, dims={"batch": 8, "seq": 64})["mask"]
    assert mask.any() and not mask.all()


def test_the_same_seed_gives_the_same_feeds(model):
    first = make_feeds(model, dims={"batch": 2, "seq": 5}, seed=42)
    second = make_feeds(model, dims={"batch": 2, "seq": 5}, seed=42)
    for name in first:
        np.testing.assert_array_equal(first[name], second[name])


def test_a_different_seed_gives_different_feeds(model):
    first = make_feeds(model, dims={"batch": 2, "seq": 5}, seed=0)
    second = make_feeds(model, dims={"batch": 2, "seq": 5}, seed=1)
    assert not np.array_equal(first["scale"], second["scale"])
    assert not np.array_equal(first["input_ids"], second["input_ids"])


def test_check_feeds_accepts_feeds_with_the_optional_initializer_input(model):
    feeds = make_feeds(model, dims={"batch": 1, "seq": 3})
    check_feeds(model, {**feeds, "bias": np.ones(3, np.float32)})


def _good(model):
    return make_feeds(model, dims={"batch": 2, "seq": 4})


BAD_FEEDS = [
    pytest.param(lambda f: {k: v for k, v in f.items() if k != "mask"}, r"missing inputs \['mask'\]", id="missing-input"),
    pytest.param(lambda f: {**f, "token_ids": f["input_ids"]}, r"unknown inputs \['token_ids'\]", id="unknown-input"),
    pytest.param(
        lambda f: {**{k: v for k, v in f.items() if k != "input_ids"}, "ids": f["input_ids"]},
        r"missing inputs \['input_ids'\]; unknown inputs \['ids'\]",
        id="wrong-name",
    ),
    pytest.param(
        lambda f: {**f, "input_ids": f["input_ids"].astype(np.int32)},
        r"'input_ids' has dtype int32, expected int64",
        id="int32-instead-of-int64",
    ),
    pytest.param(
        lambda f: {**f, "scale": f["scale"].astype(np.float64)},
        r"'scale' has dtype float64, expected float32",
        id="float64-instead-of-float32",
    ),
    pytest.param(
        lambda f: {**f, "input_ids": f["input_ids"][0]},
        r"'input_ids' has rank 1 \(shape \(4,\)\), expected rank 2 \('batch', 'seq'\)",
        id="rank-too-low",
    ),
    pytest.param(
        lambda f: {**f, "scale": f["scale"][None, :]},
        r"'scale' has rank 2 \(shape \(1, 3\)\), expected rank 1 \(3,\)",
        id="rank-too-high",
    ),
    pytest.param(
        lambda f: {**f, "scale": np.zeros(4, np.float32)},
        r"'scale' has size 4 on axis 0, expected 3 \(3,\)",
        id="wrong-fixed-dim",
    ),
]


@pytest.mark.parametrize(("change", "problem"), BAD_FEEDS)
def test_check_feeds_rejects_feeds_naming_the_input_and_the_expected_signature(model, change, problem):
    with pytest.raises(FeedError, match=problem) as info:
        check_feeds(model, change(_good(model)))
    message = str(info.value)
    assert message.startswith("feeds do not match the model: ")
    assert "model expects input_ids: int64['batch', 'seq'], mask: bool['batch', 'seq'], scale: float32[3]" in message


def test_check_feeds_names_every_problem_at_once(model):
    feeds = _good(model)
    bad = {"input_ids": feeds["input_ids"].astype(np.int32), "scale": np.zeros(5, np.float32)}
    with pytest.raises(FeedError) as info:
        check_feeds(model, bad)
    message = str(info.value)
    assert "missing inputs ['mask']" in message
    assert "'input_ids' has dtype int32" in message
    assert "'scale' has size 5 on axis 0" in message


def test_symbolic_dims_accept_any_size(model):
    check_feeds(model, make_feeds(model, dims={"batch": 3, "seq": 11}))
    check_feeds(model, make_feeds(model, dims={"batch": 1, "seq": 1}))


def test_feed_error_is_a_value_error(model):
    with pytest.raises(ValueError):
        check_feeds(model, {})
