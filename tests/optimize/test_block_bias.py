"""int4 blocks whose mean rounding error is added back (`block_bias`), and float zero points: both against a weight
whose exact answer is known (a Q4_1 grid: `scale * q + min` per block of 32, a float minimum), in real ONNX Runtime
sessions."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

from tracker.optimize import Context, ModelInfo, get_entry
from tracker.optimize.quantize.block_bias import add_corrections, quantize_blocks_int, quantize_matmuls_corrected
from tracker.optimize.quantize.float_zero_points import quantize_matmuls

N = 24


def _q4_1_weight(k: int, seed: int = 0) -> np.ndarray:
    """A [k, N] weight on a GGUF Q4_1 grid: each block of 32 along K is `scale * q + min`, q in 0..15 spanning the
    whole range, with a float minimum that is not a whole number of steps."""
    rng = np.random.default_rng(seed)
    blocks = -(-k // 32)
    scale = rng.uniform(0.01, 0.05, size=(blocks, 1, N))
    minimum = -rng.uniform(0.2, 0.5, size=(blocks, 1, N))
    levels = rng.integers(0, 16, size=(blocks, 32, N))
    levels[:, 0, :], levels[:, 1, :] = 0, 15
    return (scale * levels + minimum).reshape(blocks * 32, N)[:k].astype(np.float32)


def _matmul_model(weight: np.ndarray) -> onnx.ModelProto:
    k = weight.shape[0]
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="proj")], "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["batch", "seq", k])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["batch", "seq", N])],
        [numpy_helper.from_array(weight, "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def _inputs(k: int) -> np.ndarray:
    # Inputs with a mean away from 0, so that a block's shared error adds up rather than cancels.
    return np.random.default_rng(1).normal(0.5, 1.0, size=(2, 3, k)).astype(np.float32)


def _corrected(weight: np.ndarray, *, block_bias: bool) -> onnx.ModelProto:
    model = _matmul_model(weight)
    corrections = quantize_matmuls_corrected(model, block_size=32, accuracy_level=0)
    assert [n.op_type for n in model.graph.node] == ["MatMulNBits"]
    if block_bias:
        assert add_corrections(model, corrections, 32) == 1
    onnx.checker.check_model(model)
    return model


@pytest.mark.parametrize("k", [64, 80])  # 80: the last block padded
def test_the_correction_makes_int4_exact_on_a_q4_1_grid_and_the_integer_zero_point_alone_is_not(k):
    weight = _q4_1_weight(k)
    x = _inputs(k)
    exact = x @ weight
    corrected = np.abs(_run(_corrected(weight, block_bias=True), x) - exact).max()
    plain = np.abs(_run(_corrected(weight, block_bias=False), x) - exact).max()
    assert corrected < 1e-4 * np.abs(exact).max()
    assert plain > 100 * corrected  # the rounded zero point's shift, the same on every weight of a block


def test_float_zero_points_are_exact_on_a_q4_1_grid():
    weight = _q4_1_weight(64)
    model = _matmul_model(weight)
    assert quantize_matmuls(model, block_size=32, accuracy_level=0) == 1
    x = _inputs(64)
    assert np.abs(_run(model, x) - x @ weight).max() < 1e-4 * np.abs(x @ weight).max()


def test_on_ordinary_weights_the_correction_lowers_the_error():
    weight = np.random.default_rng(2).normal(0.0, 0.05, size=(128, N)).astype(np.float32)
    x = _inputs(128)
    exact = x @ weight
    corrected = np.abs(_run(_corrected(weight, block_bias=True), x) - exact).mean()
    plain = np.abs(_run(_corrected(weight, block_bias=False), x) - exact).mean()
    assert corrected < plain


def test_one_block_sum_serves_the_products_that_read_the_same_input():
    weight = _q4_1_weight(64)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["y1"], name="q"), helper.make_node("MatMul", ["x", "w2"], ["y2"], name="k")],
        "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["batch", "seq", 64])],
        [helper.make_tensor_value_info(y, onnx.TensorProto.FLOAT, ["batch", "seq", N]) for y in ("y1", "y2")],
        [numpy_helper.from_array(weight, "w1"), numpy_helper.from_array(weight[::-1].copy(), "w2")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    add_corrections(model, quantize_matmuls_corrected(model, block_size=32, accuracy_level=0), 32)
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("MatMulNBits") == 2 and ops.count("MatMul") == 3  # one block sum, two corrections
    x = _inputs(64)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    y1, y2 = session.run(None, {"x": x})
    assert np.allclose(y1, x @ weight, atol=1e-3) and np.allclose(y2, x @ weight[::-1], atol=1e-3)


def test_the_levels_and_zero_points_are_4_bit_and_packed_two_to_a_byte():
    packed, scales, zeros, mean_error = quantize_blocks_int(_q4_1_weight(96), 32)
    assert packed.shape == (N, 3, 16) and packed.dtype == np.uint8
    assert scales.shape == (N * 3,)
    assert zeros.shape == (N * 2,)  # three blocks: two bytes per column, the last half-byte padding
    assert mean_error.shape == (3, N)
    with pytest.raises(ValueError, match=r"\[K, N\]"):
        quantize_blocks_int(np.zeros(8, dtype=np.float32), 32)


def test_the_entry_takes_block_bias_on_asymmetric_4_bit_blocks_only(tmp_path):
    weight = _q4_1_weight(64)
    source = tmp_path / "model.onnx"
    onnx.save(_matmul_model(weight), str(source))
    entry = get_entry("int4_block32:symmetric=false:block_bias=true:accuracy_level=0")
    candidate = entry(source, tmp_path / "out", Context(info=ModelInfo(num_heads=1, hidden_size=64)))
    assert any("mean rounding error added back" in note for note in candidate.notes)
    x = _inputs(64)
    session = ort.InferenceSession(str(candidate.path), providers=["CPUExecutionProvider"])
    assert np.abs(session.run(None, {"x": x})[0] - x @ weight).max() < 1e-4 * np.abs(x @ weight).max()
    with pytest.raises(ValueError, match="symmetric=false"):
        get_entry("int4_block32:block_bias=true")
