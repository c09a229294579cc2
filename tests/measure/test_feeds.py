"""Tests of tracker.measure.inputs.feeds: seeded feeds from a model's signature, and checking feeds against it; the
commands refuse feeds that cannot be made (too large for memory, a static size of 0, a negative seed) with one line,
before any run."""

from __future__ import annotations

import pathlib
import warnings
import zipfile

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.commands import assert_one_line_error, run_cli, run_names
from tests.models import make_linear_model
from tracker.base.errors import FeedError
from tracker.measure.inputs.feed_checks import check_feeds, check_indices
from tracker.measure.inputs.feed_files import load_feeds
from tracker.measure.inputs.feeds import feed_rules, make_feeds
from tracker.measure.inputs.model_inputs import (
    DEFAULT_BATCH,
    DEFAULT_SEQUENCE,
    IndexedTable,
    InputSpec,
    default_dim_size,
    index_tables,
    input_specs,
    symbolic_dims,
)


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


def _model(nodes, inputs, outputs, initializers=()) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "feeds", inputs, outputs, initializer=list(initializers))
    result = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    onnx.checker.check_model(result)
    return result


def _identity_model(value: onnx.ValueInfoProto) -> onnx.ModelProto:
    """One input passed through to an output named `out`."""
    out = onnx.ValueInfoProto(name="out", type=value.type)
    return _model([helper.make_node("Identity", [value.name], ["out"])], [value], [out])


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
    [({"features": 2}, "width"), ({"width": 2}, "features"), ({}, "features"), (None, "features")],
    ids=["no-width", "no-features", "empty", "none"],
)
def test_a_symbolic_dim_with_no_size_and_no_default_raises_feed_error_naming_it_and_the_cli_option(dims, missing):
    model = _identity_model(helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "features", "width"]))
    with pytest.raises(FeedError) as info:
        make_feeds(model, dims=dims)
    message = str(info.value)
    assert f"symbolic dim {missing!r} with no size and no default" in message
    assert f"--dim {missing}=" in message
    assert "input 'x'" in message


@pytest.mark.parametrize("int_high", [1, 5, 100])
def test_integer_inputs_are_drawn_from_zero_to_int_high(model, int_high):
    ids = make_feeds(model, dims={"batch": 8, "seq": 64}, int_high=int_high)["input_ids"]
    assert ids.min() >= 0
    assert ids.max() < int_high
    if int_high > 1:
        assert len(np.unique(ids)) == int_high  # 512 draws cover a range this small


def test_bool_inputs_not_named_as_masks_hold_both_values():
    model = _identity_model(helper.make_tensor_value_info("flags", TensorProto.BOOL, [8, 64]))
    flags = make_feeds(model)["flags"]
    assert flags.any() and not flags.all()


def test_a_bool_mask_is_all_true(model):
    assert make_feeds(model, dims={"batch": 8, "seq": 64})["mask"].all()


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


# Valid generated feeds: tables, names, default sizes.

SEQUENCE_INPUTS = ("input_ids", "attention_mask", "token_type_ids", "position_ids")


def _table(name: str, rows: int) -> onnx.TensorProto:
    return numpy_helper.from_array(np.arange(rows * 8, dtype=np.float32).reshape(rows, 8), name)


@pytest.fixture(scope="module")
def encoder() -> onnx.ModelProto:
    """A BERT-like embedding: (word[Cast(input_ids)] + types[token_type_ids] + positions[position_ids]) * mask.

    Words: a 99-row initializer reached through a Cast; token types: a 2-row Constant reached through an
    Identity; positions: a 64-row initializer; the mask is cast to float and unsqueezed. All [batch, sequence].
    """
    nodes = [
        helper.make_node("Cast", ["input_ids"], ["ids32"], to=TensorProto.INT32),
        helper.make_node("Gather", ["word", "ids32"], ["w"], name="gather_word"),
        helper.make_node("Constant", [], ["types"], value=_table("types_value", 2)),
        helper.make_node("Identity", ["token_type_ids"], ["type_ids"]),
        helper.make_node("Gather", ["types", "type_ids"], ["t"], name="gather_type"),
        helper.make_node("Gather", ["positions", "position_ids"], ["p"], name="gather_position"),
        helper.make_node("Cast", ["attention_mask"], ["mask_float"], to=TensorProto.FLOAT),
        helper.make_node("Constant", [], ["last_axis"], value=numpy_helper.from_array(np.array([-1]), "axis")),
        helper.make_node("Unsqueeze", ["mask_float", "last_axis"], ["m"]),
        helper.make_node("Add", ["w", "t"], ["wt"]),
        helper.make_node("Add", ["wt", "p"], ["wtp"]),
        helper.make_node("Mul", ["wtp", "m"], ["hidden"]),
    ]
    inputs = [helper.make_tensor_value_info(name, TensorProto.INT64, ["batch", "sequence"]) for name in SEQUENCE_INPUTS]
    outputs = [helper.make_tensor_value_info("hidden", TensorProto.FLOAT, ["batch", "sequence", 8])]
    return _model(nodes, inputs, outputs, [_table("word", 99), _table("positions", 64)])


def _run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def test_index_tables_follow_casts_and_identities_to_initializers_and_constants(encoder):
    assert index_tables(encoder) == {
        "input_ids": IndexedTable("word", 99, "gather_word"),
        "token_type_ids": IndexedTable("types", 2, "gather_type"),
        "position_ids": IndexedTable("positions", 64, "gather_position"),
    }


def test_onnx_runtime_runs_the_generated_feeds_of_an_encoder(encoder):
    feeds = make_feeds(encoder, dims={"batch": 2, "sequence": 16})
    (hidden,) = _run(encoder, feeds)
    assert hidden.shape == (2, 16, 8)


def test_integers_drawn_from_zero_to_100_crash_onnx_runtime_on_the_two_row_table(encoder):
    """The old generator's values: what the table rule prevents."""
    feeds = make_feeds(encoder, dims={"batch": 2, "sequence": 16})
    feeds["token_type_ids"] = np.random.default_rng(0).integers(0, 100, size=(2, 16))
    with pytest.raises(Exception, match="out of data bounds"):
        _run(encoder, feeds)


@pytest.mark.parametrize("int_high", [5, 100, 1000])
def test_token_ids_are_drawn_inside_their_table_whatever_int_high(encoder, int_high):
    ids = make_feeds(encoder, dims={"batch": 4, "sequence": 64}, int_high=int_high)["input_ids"]
    assert ids.min() >= 0 and ids.max() < 99
    assert len(np.unique(ids)) > 50  # drawn over the whole table, not [0, int_high)


def test_masks_are_ones_token_types_zeros_and_positions_an_arange(encoder):
    feeds = make_feeds(encoder, dims={"batch": 3, "sequence": 5})
    np.testing.assert_array_equal(feeds["attention_mask"], np.ones((3, 5), np.int64))
    np.testing.assert_array_equal(feeds["token_type_ids"], np.zeros((3, 5), np.int64))
    np.testing.assert_array_equal(feeds["position_ids"], np.tile(np.arange(5), (3, 1)))
    assert all(feeds[name].dtype == np.int64 for name in SEQUENCE_INPUTS)


@pytest.mark.parametrize(
    ("name", "dtype", "expected"),
    [
        ("attention_mask", TensorProto.FLOAT, 1),
        ("input_mask", TensorProto.INT32, 1),
        ("Attention_Mask", TensorProto.BOOL, True),
        ("token_type_ids", TensorProto.INT32, 0),
        ("segment_ids", TensorProto.INT64, 0),
    ],
    ids=["float-attention-mask", "input-mask", "bool-mask-any-case", "token-type-ids", "segment-ids"],
)
def test_name_rules_apply_to_any_numeric_dtype(name, dtype, expected):
    value = make_feeds(_identity_model(helper.make_tensor_value_info(name, dtype, [2, 3])))[name]
    assert value.dtype == helper.tensor_dtype_to_np_dtype(dtype)
    assert (value == expected).all()


def test_position_ids_of_rank_one_are_an_arange():
    model = _identity_model(helper.make_tensor_value_info("position_ids", TensorProto.INT64, ["sequence"]))
    np.testing.assert_array_equal(make_feeds(model, dims={"sequence": 4})["position_ids"], np.arange(4))


def test_positions_beyond_the_position_table_are_a_feed_error_naming_the_dim_to_lower(encoder):
    with pytest.raises(FeedError) as info:
        make_feeds(encoder)  # the default sequence, 128, is longer than the 64-row table
    message = str(info.value)
    assert "input 'position_ids'" in message and "up to 127" in message
    assert "'positions', a table of 64 rows" in message and "--dim sequence=64" in message


def test_the_smallest_of_several_tables_bounds_an_input():
    nodes = [
        helper.make_node("Gather", ["big", "ids"], ["a"], name="gather_big"),
        helper.make_node("Unsqueeze", ["ids", "zero"], ["ids_2d"]),
        helper.make_node("Gather", ["small", "ids_2d"], ["b"], name="gather_small"),
    ]
    inputs = [helper.make_tensor_value_info("ids", TensorProto.INT64, [256])]
    outputs = [helper.make_tensor_value_info("a", TensorProto.FLOAT, [256, 4]),
               helper.make_tensor_value_info("b", TensorProto.FLOAT, [1, 256, 4])]
    model = _model(nodes, inputs, outputs, [_table("big", 99), _table("small", 7),
                                            numpy_helper.from_array(np.array([0]), "zero")])
    assert index_tables(model) == {"ids": IndexedTable("small", 7, "gather_small")}
    ids = make_feeds(model)["ids"]
    assert ids.max() == 6 and ids.min() == 0
    _run(model, make_feeds(model))


def test_a_gather_on_another_axis_bounds_by_that_axis():
    nodes = [helper.make_node("Gather", ["table", "ids"], ["out"], name="g", axis=-1)]
    inputs = [helper.make_tensor_value_info("ids", TensorProto.INT64, [64])]
    outputs = [helper.make_tensor_value_info("out", TensorProto.FLOAT, [9, 64])]
    model = _model(nodes, inputs, outputs, [numpy_helper.from_array(np.ones((9, 5), np.float32), "table")])
    assert index_tables(model)["ids"].rows == 5
    _run(model, make_feeds(model))


def test_an_input_that_only_feeds_a_gathers_data_indexes_no_table():
    nodes = [helper.make_node("Gather", ["x", "idx"], ["out"])]
    inputs = [helper.make_tensor_value_info("x", TensorProto.INT64, [4])]
    outputs = [helper.make_tensor_value_info("out", TensorProto.INT64, [2])]
    model = _model(nodes, inputs, outputs, [numpy_helper.from_array(np.array([0, 1]), "idx")])
    assert index_tables(model) == {}


def test_an_input_indexing_a_table_of_zero_rows_is_a_feed_error_naming_it():
    nodes = [helper.make_node("Gather", ["empty", "ids"], ["out"], name="g")]
    inputs = [helper.make_tensor_value_info("ids", TensorProto.INT64, [3])]
    outputs = [helper.make_tensor_value_info("out", TensorProto.FLOAT, [3, 4])]
    model = _model(nodes, inputs, outputs, [numpy_helper.from_array(np.zeros((0, 4), np.float32), "empty")])
    with pytest.raises(FeedError, match=r"input 'ids' indexes 'empty', a table of 0 rows \(Gather 'g'\)"):
        make_feeds(model)


def test_an_input_that_is_not_a_tensor_is_a_feed_error_naming_its_type():
    value = helper.make_tensor_sequence_value_info("pieces", TensorProto.FLOAT, None)
    out = helper.make_tensor_value_info("n", TensorProto.INT64, [])
    model = _model([helper.make_node("SequenceLength", ["pieces"], ["n"])], [value], [out])
    with pytest.raises(FeedError, match="input 'pieces' is of type sequence_type, not a tensor"):
        make_feeds(model)


def test_an_input_of_a_dtype_that_cannot_be_generated_is_a_feed_error_naming_it():
    model = _identity_model(helper.make_tensor_value_info("z", TensorProto.COMPLEX64, [2]))
    with pytest.raises(FeedError, match="cannot generate input 'z' of dtype complex64"):
        make_feeds(model)


def test_feed_rules_say_how_each_input_is_made(encoder, model):
    assert feed_rules(encoder) == {
        "input_ids": "integers in [0, 99) (indices into 'word', 99 rows, Gather 'gather_word')",
        "attention_mask": "ones (a mask: the name contains 'mask')",
        "token_type_ids": "zeros (token types: one segment)",
        "position_ids": "arange over the last axis (position ids)",
    }
    assert feed_rules(model, int_high=7) == {
        "input_ids": "integers in [0, 7)",
        "mask": "ones (a mask: the name contains 'mask')",
        "scale": "standard normal",
    }


@pytest.mark.parametrize(
    ("name", "size"),
    [
        *[pytest.param(n, DEFAULT_BATCH, id=n)
          for n in ("batch", "batch_size", "N", "?0", "dynamic_batch", "BatchSize")],
        *[pytest.param(n, DEFAULT_SEQUENCE, id=n) for n in ("seq", "sequence", "sequence_length", "seq_len",
                                                            "past_sequence_length", "max_seq_len")],
        *[pytest.param(n, None, id=n) for n in ("s0", "features", "?1", "past_sequence_length + 1", "height")],
    ],
)
def test_default_dim_sizes_follow_the_name(name, size):
    assert default_dim_size(name) == size


def test_symbolic_dims_list_each_dim_once_with_its_size_the_callers_winning():
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "sequence", "hidden"]),
              helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, "sequence"])]
    nodes = [helper.make_node("Identity", ["x"], ["x_out"]), helper.make_node("Identity", ["y"], ["y_out"])]
    outputs = [onnx.ValueInfoProto(name=f"{v.name}_out", type=v.type) for v in inputs]
    model = _model(nodes, inputs, outputs)
    assert symbolic_dims(model) == {"batch": 1, "sequence": 128, "hidden": None, "?0": 1}
    assert symbolic_dims(model, dims={"sequence": 4, "hidden": 6}) == {"batch": 1, "sequence": 4, "hidden": 6, "?0": 1}
    feeds = make_feeds(model, dims={"hidden": 6})
    assert feeds["x"].shape == (1, 128, 6) and feeds["y"].shape == (1, 128)


def test_the_linear_models_batch_n_defaults_to_one():
    assert make_feeds(make_linear_model(n_features=10))["X"].shape == (1, 10)


def test_a_size_for_a_dim_the_model_does_not_have_is_a_feed_error_listing_its_dims(encoder):
    with pytest.raises(FeedError, match=r"dims \['seq'\] that no input has; the model's symbolic dims are "
                                        r"\['batch', 'sequence'\]"):
        make_feeds(encoder, dims={"seq": 16})


def test_a_negative_size_is_a_feed_error(encoder):
    with pytest.raises(FeedError, match="symbolic dim 'sequence' has size -1; expected a size >= 0"):
        make_feeds(encoder, dims={"sequence": -1})


# A tiny BERT exported by torch (dynamo): the encoder of the issue, without a download.

@pytest.fixture(scope="module")
def bert(tmp_path_factory) -> onnx.ModelProto:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=37, type_vocab_size=2, max_position_embeddings=64)
    module = transformers.BertModel(config).eval()
    ids = torch.zeros((2, 8), dtype=torch.long)
    names = ["input_ids", "attention_mask", "token_type_ids"]
    path = tmp_path_factory.mktemp("bert") / "bert.onnx"
    axes = {0: torch.export.Dim("batch"), 1: torch.export.Dim("sequence")}
    with warnings.catch_warnings():  # the exporter's notes on shared dim names and its own deprecations
        warnings.simplefilter("ignore")
        program = torch.onnx.export(module, (ids, torch.ones_like(ids), torch.zeros_like(ids)), input_names=names,
                                    output_names=["last_hidden_state", "pooler_output"], dynamo=True,
                                    dynamic_shapes={name: axes for name in names})
    program.save(str(path))
    return onnx.load(str(path))


@pytest.mark.slow
def test_a_dynamo_export_of_bert_indexes_its_word_and_token_type_tables(bert):
    tables = index_tables(bert)
    assert {name: t.rows for name, t in tables.items()} == {"input_ids": 99, "token_type_ids": 2}
    assert symbolic_dims(bert) == {"batch": DEFAULT_BATCH, "sequence": DEFAULT_SEQUENCE}


@pytest.mark.slow
def test_onnx_runtime_runs_the_generated_feeds_of_a_bert_export(bert):
    feeds = make_feeds(bert, dims={"batch": 2, "sequence": 32})
    hidden, pooled = _run(bert, feeds)
    assert hidden.shape == (2, 32, 32) and pooled.shape == (2, 32)
    assert np.isfinite(hidden).all()


@pytest.mark.slow
def test_the_old_generators_token_types_crash_onnx_runtime_on_a_bert_export(bert):
    feeds = make_feeds(bert, dims={"batch": 2, "sequence": 32})
    feeds["token_type_ids"] = np.random.default_rng(0).integers(0, 100, size=(2, 32))
    with pytest.raises(Exception, match="out of data bounds"):
        _run(bert, feeds)


# Feeds from files.

def test_feeds_saved_with_savez_load_by_name_and_run(encoder, tmp_path):
    feeds = make_feeds(encoder, dims={"batch": 2, "sequence": 8}, seed=3)
    np.savez(tmp_path / "feeds.npz", **feeds)
    loaded = load_feeds(tmp_path / "feeds.npz", encoder)
    assert list(loaded) == list(feeds)
    for name in feeds:
        np.testing.assert_array_equal(loaded[name], feeds[name])
    _run(encoder, loaded)


def test_a_single_npy_array_feeds_a_model_of_one_input(tmp_path):
    x = np.ones((3, 10), np.float32)
    np.save(tmp_path / "x.npy", x)
    loaded = load_feeds(str(tmp_path / "x.npy"), make_linear_model(n_features=10))
    assert list(loaded) == ["X"]
    np.testing.assert_array_equal(loaded["X"], x)


def test_a_single_npy_array_for_a_model_of_several_inputs_is_an_error_listing_them(encoder, tmp_path):
    np.save(tmp_path / "ids.npy", np.zeros((1, 4), np.int64))
    with pytest.raises(FeedError) as info:
        load_feeds(tmp_path / "ids.npy", encoder)
    message = str(info.value)
    assert repr(str(tmp_path / "ids.npy")) in message
    assert f"the model has 4 inputs {list(SEQUENCE_INPUTS)}" in message and "numpy.savez" in message


class _Touch:
    """Unpickling this creates a file: proof that a loader ran code from the file."""

    def __init__(self, marker: pathlib.Path):
        self.marker = marker

    def __reduce__(self):
        return pathlib.Path.touch, (self.marker,)


def _write_npz_member(path: pathlib.Path, name: str, content: bytes) -> None:
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(name, content)


BAD_FILES = [
    pytest.param(lambda p: None, "does not exist", id="missing"),
    pytest.param(lambda p: p.mkdir(), "is not a file", id="a-folder"),
    pytest.param(lambda p: p.write_text("input_ids: 1 2 3"), "is neither a .npz archive nor a .npy array", id="text"),
    pytest.param(lambda p: p.write_bytes(b"PK\x03\x04 broken"), "cannot read feeds file", id="corrupt-zip"),
    pytest.param(lambda p: p.write_bytes(np.lib.format.MAGIC_PREFIX + b"\x01\x00garbage"), "cannot read feeds file",
                 id="corrupt-npy"),
    pytest.param(lambda p: _write_npz_member(p, "X.npy", np.lib.format.MAGIC_PREFIX + b"\x01\x00garbage"),
                 "cannot read array 'X'", id="corrupt-npz-member"),
    pytest.param(lambda p: _write_npz_member(p, "X.npy", b"1 2 3"), "member 'X' of feeds file",
                 id="npz-member-not-npy"),
    pytest.param(lambda p: np.save(p, np.array([_Touch(p.with_name("ran"))], dtype=object), allow_pickle=True),
                 "object arrays are refused", id="npy-of-objects"),
    pytest.param(lambda p: np.savez(p, X=np.array([_Touch(p.with_name("ran"))], dtype=object)),
                 "object arrays are refused", id="npz-of-objects"),
]


@pytest.mark.parametrize(("write", "problem"), BAD_FILES)
def test_a_bad_feeds_file_is_a_feed_error_naming_it_and_what_was_expected(tmp_path, write, problem):
    path = tmp_path / "feeds.npz"
    write(path)
    if path.with_suffix(".npz.npy").exists():  # np.save appends .npy
        path.with_suffix(".npz.npy").rename(path)
    with pytest.raises(FeedError) as info:
        load_feeds(path, make_linear_model(n_features=10))
    message = str(info.value)
    assert repr(str(path)) in message and problem in message
    assert ".npz" in message and ".npy" in message or "object arrays" in message
    assert not (tmp_path / "ran").exists()  # nothing was unpickled


def test_feeds_from_a_file_that_do_not_match_the_model_name_the_file_and_the_mismatch(encoder, tmp_path):
    feeds = make_feeds(encoder, dims={"batch": 1, "sequence": 4})
    np.savez(tmp_path / "feeds.npz", **{**feeds, "input_ids": feeds["input_ids"].astype(np.int32)})
    with pytest.raises(FeedError) as info:
        load_feeds(tmp_path / "feeds.npz", encoder)
    message = str(info.value)
    assert message.startswith(f"feeds file {str(tmp_path / 'feeds.npz')!r}: feeds do not match the model")
    assert "'input_ids' has dtype int32, expected int64" in message


def test_feeds_from_a_file_outside_their_tables_name_the_input_its_range_and_the_table_size(encoder, tmp_path):
    feeds = make_feeds(encoder, dims={"batch": 1, "sequence": 4})
    feeds["token_type_ids"] = np.array([[0, 1, 5, 1]])
    feeds["input_ids"] = np.array([[-100, 3, 4, 5]])
    np.savez(tmp_path / "feeds.npz", **feeds)
    with pytest.raises(FeedError) as info:
        load_feeds(tmp_path / "feeds.npz", encoder)
    message = str(info.value)
    assert "'token_type_ids' holds values in [0, 5] but indexes 'types', a table of 2 rows" in message
    assert "'input_ids' holds values in [-100, 5] but indexes 'word', a table of 99 rows" in message
    assert "expected values in [0, 2)" in message and "expected values in [0, 99)" in message
    with pytest.raises(Exception, match="out of data bounds"):  # what the check saves the user from
        _run(encoder, feeds)


def test_check_indices_accepts_the_negative_indices_onnx_runtime_accepts(encoder):
    feeds = make_feeds(encoder, dims={"batch": 1, "sequence": 4})
    feeds["token_type_ids"] = np.array([[-2, -1, 0, 1]])
    check_indices(encoder, feeds)
    _run(encoder, feeds)


def test_tables_are_found_in_a_model_read_without_its_external_data(encoder, tmp_path):
    """Only the tables' dims are read, which the graph keeps when the weights live in a data file."""
    path = tmp_path / "encoder.onnx"
    copy = onnx.ModelProto()
    copy.CopyFrom(encoder)  # saving with external data changes the proto it is given
    onnx.save_model(copy, str(path), save_as_external_data=True, location="encoder.data", size_threshold=0)
    bare = onnx.load(str(path), load_external_data=False)
    assert index_tables(bare) == index_tables(encoder)
    assert make_feeds(bare, dims={"sequence": 8})["input_ids"].max() < 99


def _static_model(name: str, shape: list) -> onnx.ModelProto:
    x = helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)
    graph = helper.make_graph([helper.make_node("Relu", [name], ["y"])], "static", [x], [y])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize(("shape", "size"), [([2, 0], 0), ([-3, 4], -3)])
def test_a_static_size_of_zero_or_below_is_a_feed_error_naming_the_input(shape, size):
    # a 0 gave empty feeds and empty outputs, which every accuracy check passed ("passed (max 0)")
    with pytest.raises(FeedError, match=rf"input 'x' declares axis \d of size {size} \(shape \[{shape[0]}, "
                                        rf"{shape[1]}\]\): expected a size of at least 1"):
        make_feeds(_static_model("x", shape))


def test_a_static_past_of_zero_is_a_decoders_first_step_and_stays_allowed():
    feeds = make_feeds(_static_model("past_key_values.0.key", [1, 2, 0, 4]))
    assert feeds["past_key_values.0.key"].shape == (1, 2, 0, 4)


@pytest.mark.parametrize("seed", [-1, 1.5, True])
def test_a_seed_that_numpy_cannot_take_is_a_feed_error_naming_the_option(model, seed):
    with pytest.raises(FeedError, match=rf"the feeds' seed must be an integer >= 0 .*got {seed!r} \(CLI: --seed\)"):
        make_feeds(model, seed=seed)


@pytest.mark.parametrize("command", ["inspect", "profile"])
def test_feeds_too_large_for_memory_are_refused_before_allocating(store_uri, tmp_path, capsys, command):
    path = tmp_path / "linear.onnx"
    onnx.save_model(make_linear_model(n_features=8), str(path))
    code, _, err = run_cli(capsys, command, str(path), "--dim", "N=99999999999")
    assert_one_line_error(code, err, "would take 2.9 TiB", "X: float32[99999999999, 8]", "more than the limit of",
                          "a quarter of the memory available now", "--dim")
    assert run_names(store_uri) == []


def test_a_negative_seed_is_a_one_line_error_naming_the_option(store_uri, linear_file, capsys):
    for command in ("profile", "optimize"):
        code, _, err = run_cli(capsys, command, str(linear_file), "--dim", "N=2", "--seed", "-1")
        assert_one_line_error(code, err, "the feeds' seed must be an integer >= 0", "got -1 (CLI: --seed)")
    assert run_names(store_uri) == []


def test_a_models_own_static_zero_is_refused_like_a_dim_of_zero(store_uri, tmp_path, capsys):
    x = onnx.helper.make_tensor_value_info("features", onnx.TensorProto.FLOAT, [0, 4])
    y = onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [0, 4])
    graph = onnx.helper.make_graph([onnx.helper.make_node("Relu", ["features"], ["y"])], "g", [x], [y])
    path = tmp_path / "empty.onnx"
    onnx.save_model(onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)]), str(path))
    for args in (["optimize", str(path), "--dry-run"], ["profile", str(path)]):
        code, _, err = run_cli(capsys, *args)
        assert_one_line_error(code, err, "input 'features' declares axis 0 of size 0", "expected a size of at least 1")
    assert run_names(store_uri) == []
