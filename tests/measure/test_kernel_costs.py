"""The cost model: FLOPs and bytes of one kernel call, on hand-computed shapes."""

import json
import math

import pytest

from tracker.measure.costmodel import kernel_costs as K


def shapes(*tensors: tuple[str, list[int]]) -> str:
    """ORT's compact shape list, e.g. shapes(("float", [4, 100])) -> '[{"float":[4,100]}]'."""
    return json.dumps([{dtype: shape} for dtype, shape in tensors], separators=(",", ":"))


def f32(*shape: int) -> tuple[str, list[int]]:
    """A float32 tensor; no dimension is a scalar."""
    return ("float", list(shape))


# (op type, inputs, outputs, FLOPs computed by hand)
FLOP_CASES = [
    pytest.param("MatMul", [f32(2, 3, 4), f32(4, 5)], [f32(2, 3, 5)], 2 * 2 * 3 * 5 * 4, id="MatMul batch x 2-D"),
    pytest.param("MatMul", [f32(4), f32(4, 5)], [f32(5)], 2 * 5 * 4, id="MatMul 1-D A"),
    pytest.param("MatMul", [f32(2, 1, 3, 4), f32(5, 4, 6)], [f32(2, 5, 3, 6)], 2 * (2 * 5 * 3 * 6) * 4,
                 id="MatMul broadcast batch"),
    pytest.param("FusedMatMul", [f32(3, 4), f32(4, 5)], [f32(3, 5)], 2 * 3 * 5 * 4, id="FusedMatMul"),
    pytest.param("FusedMatMul", [f32(4, 3), f32(4, 5)], [f32(3, 5)], 2 * 3 * 5 * 4, id="FusedMatMul transA"),
    pytest.param("Gemm", [f32(3, 4), f32(4, 5), f32(5)], [f32(3, 5)], 2 * 3 * 5 * 4 + 3 * 5, id="Gemm with C"),
    pytest.param("Gemm", [f32(4, 3), f32(5, 4)], [f32(3, 5)], 2 * 3 * 5 * 4, id="Gemm transA transB no C"),
    pytest.param("MatMulNBits", [f32(1, 8, 64), ("uint8", [32, 2, 16]), f32(64)], [f32(1, 8, 32)],
                 2 * 8 * 32 * 64, id="MatMulNBits 4 bits block 32"),
    pytest.param("MatMulInteger", [("uint8", [2, 8]), ("int8", [8, 4]), ("uint8", []), ("int8", [])],
                 [("int32", [2, 4])], 2 * 2 * 4 * 8, id="MatMulInteger"),
    pytest.param("DynamicQuantizeMatMul", [f32(2, 3, 8), ("int8", [8, 4]), f32(1), ("int8", [1])], [f32(2, 3, 4)],
                 2 * 2 * 3 * 4 * 8, id="DynamicQuantizeMatMul"),
    # B=2, S=8, hidden 16 (e.g. 4 heads of 4): projection 2 B S D_in 3D, QK^T + AV 4 B H S S head_dim
    pytest.param("Attention", [f32(2, 8, 16), f32(16, 48), f32(48)], [f32(2, 8, 16)],
                 2 * 2 * 8 * 16 * 48 + 4 * 2 * 4 * 8 * 8 * 4, id="Attention"),
    pytest.param("Attention", [f32(2, 3, 16), f32(16, 48), f32(48), ("int32", [2, 8]), f32(2, 2, 4, 5, 4)],
                 [f32(2, 3, 16), f32(2, 2, 4, 8, 4)], 2 * 2 * 3 * 16 * 48 + 4 * 2 * 4 * 3 * 8 * 4,
                 id="Attention with past"),
    pytest.param("MultiHeadAttention", [f32(2, 8, 16), f32(2, 10, 16), f32(2, 10, 16)], [f32(2, 8, 16)],
                 4 * 2 * 4 * 8 * 10 * 4, id="MultiHeadAttention cross"),
    pytest.param("MultiHeadAttention", [f32(1, 1, 16), f32(1, 1, 16), f32(1, 1, 16), f32(1, 4, 7, 4), f32(1, 4, 7, 4)],
                 [f32(1, 1, 16), f32(1, 4, 8, 4), f32(1, 4, 8, 4)], 4 * 1 * 4 * 1 * 8 * 4,
                 id="MultiHeadAttention decode with past"),
    pytest.param("MultiHeadAttention", [f32(2, 8, 4, 3, 4)], [f32(2, 8, 16)], 4 * 2 * 4 * 8 * 8 * 4,
                 id="MultiHeadAttention packed QKV"),
    pytest.param("GroupQueryAttention", [f32(1, 4, 32), f32(1, 4, 8), f32(1, 4, 8), f32(1, 2, 6, 4), f32(1, 2, 6, 4),
                                         ("int32", [1]), ("int32", [1])],
                 [f32(1, 4, 32), f32(1, 2, 10, 4), f32(1, 2, 10, 4)], 4 * 1 * 8 * 4 * 10 * 4,
                 id="GroupQueryAttention 8 query heads on 2 kv heads"),
    pytest.param("Conv", [f32(1, 3, 8, 8), f32(4, 3, 3, 3), f32(4)], [f32(1, 4, 6, 6)],
                 2 * 1 * 4 * 6 * 6 * 3 * 3 * 3 + 4 * 6 * 6, id="Conv with bias"),
    pytest.param("Conv", [f32(1, 4, 8, 8), f32(4, 2, 3, 3)], [f32(1, 4, 6, 6)], 2 * 1 * 4 * 6 * 6 * (4 // 2) * 3 * 3,
                 id="Conv 2 groups"),
    pytest.param("ConvTranspose", [f32(1, 2, 4, 4), f32(2, 3, 3, 3)], [f32(1, 3, 6, 6)], 2 * (2 * 4 * 4) * 3 * 3 * 3,
                 id="ConvTranspose"),
    pytest.param("LayerNormalization", [f32(2, 4, 8), f32(8), f32(8)], [f32(2, 4, 8)], 5 * 64, id="LayerNormalization"),
    pytest.param("SkipLayerNormalization", [f32(2, 4, 8), f32(2, 4, 8), f32(8), f32(8)], [f32(2, 4, 8)], 6 * 64,
                 id="SkipLayerNormalization"),
    pytest.param("SimplifiedLayerNormalization", [f32(2, 4, 8), f32(8)], [f32(2, 4, 8)], 4 * 64,
                 id="SimplifiedLayerNormalization"),
    pytest.param("Softmax", [f32(2, 3)], [f32(2, 3)], 5 * 6, id="Softmax"),
    pytest.param("Add", [f32(2, 3), f32(3)], [f32(2, 3)], 6, id="Add broadcast"),
    pytest.param("Relu", [f32(5, 7)], [f32(5, 7)], 35, id="Relu"),
    pytest.param("FastGelu", [f32(2, 8), f32(8)], [f32(2, 8)], 2 * 16, id="FastGelu with bias"),
    pytest.param("BiasGelu", [f32(2, 8), f32(8)], [f32(2, 8)], 2 * 16, id="BiasGelu"),
    pytest.param("Sum", [f32(4), f32(4), f32(4)], [f32(4)], 2 * 4, id="Sum of 3"),
    pytest.param("ReduceMean", [f32(4, 6)], [f32(4, 1)], 24, id="ReduceMean"),
    pytest.param("Reshape", [f32(4, 6), ("int64", [2])], [f32(6, 4)], 0, id="Reshape moves data only"),
    pytest.param("LinearRegressor", [f32(111, 10)], [f32(111, 1)], 2 * 111 * 10 + 111, id="LinearRegressor"),
]


@pytest.mark.parametrize(("op_type", "inputs", "outputs", "flops"), FLOP_CASES)
def test_the_flops_of_a_kernel_call_are_those_computed_by_hand(op_type, inputs, outputs, flops):
    cost = K.kernel_cost(op_type, shapes(*inputs), shapes(*outputs))

    assert cost.flops == flops
    assert op_type in K.COVERED_OPS


def test_the_bytes_of_a_call_are_every_input_and_output_at_its_element_size():
    cost = K.kernel_cost("MatMul", shapes(f32(2, 3, 4), f32(4, 5)), shapes(f32(2, 3, 5)))
    assert cost.bytes == (24 + 20 + 30) * 4

    cast = K.kernel_cost("Cast", shapes(("float16", [10])), shapes(("int64", [10])))
    assert (cast.flops, cast.bytes) == (0.0, 10 * 2 + 10 * 8)


def test_an_embedding_lookup_reads_the_rows_it_returns_not_the_whole_table():
    cost = K.kernel_cost("Gather", shapes(f32(50257, 768), ("int64", [1, 32])), shapes(f32(1, 32, 768)))

    assert cost.flops == 0
    assert cost.bytes == 2 * 32 * 768 * 4 + 32 * 8


def test_a_4_bit_matmul_reads_its_packed_weights_and_scales_once():
    n, k, bits, block = 32, 64, 4, 32
    weights = ("uint8", [n, k // block, block * bits // 8])
    scales = f32(n * k // block)
    cost = K.kernel_cost("MatMulNBits", shapes(f32(1, 8, k), weights, scales), shapes(f32(1, 8, n)))

    assert cost.bytes == 8 * k * 4 + n * k * bits / 8 + (n * k // block) * 4 + 8 * n * 4


# ONNX Runtime 1.32 leaves pre-packed constant weights out of a call's inputs (as its profiles list them):
# (op type, inputs as listed, outputs, FLOPs, bytes of the weight the formula adds back)
PREPACKED_CASES = [
    pytest.param("MatMul", [f32(4, 64)], [f32(4, 32)], 2 * 4 * 32 * 64, 64 * 32 * 4, id="MatMul"),
    pytest.param("Gemm", [f32(4, 64), f32(32)], [f32(4, 32)], 2 * 4 * 32 * 64 + 4 * 32, 64 * 32 * 4,
                 id="Gemm with its bias C listed"),
    pytest.param("DynamicQuantizeMatMul", [f32(4, 64), f32(), ("int8", [])], [f32(4, 32)], 2 * 4 * 32 * 64, 64 * 32,
                 id="DynamicQuantizeMatMul"),
    pytest.param("MatMulInteger", [("uint8", [4, 64]), ("uint8", []), ("int8", [])], [("int32", [4, 32])],
                 2 * 4 * 32 * 64, 64 * 32, id="MatMulInteger"),
    pytest.param("MatMulNBits", [f32(4, 64), f32(32, 2)], [f32(4, 32)], 2 * 4 * 32 * 64, 32 * 64 * 4 / 8,
                 id="MatMulNBits, 4 bits assumed"),
    pytest.param("Attention", [f32(1, 8, 16), f32(48)], [f32(1, 8, 16)], 2 * 8 * 16 * 48 + 4 * 2 * 8 * 8 * 8,
                 16 * 48 * 4, id="Attention, its bias listed"),
]


@pytest.mark.parametrize(("op_type", "inputs", "outputs", "flops", "weight_bytes"), PREPACKED_CASES)
def test_a_weight_the_profile_leaves_out_is_counted_from_the_shapes_it_lists(op_type, inputs, outputs, flops,
                                                                           weight_bytes):
    cost = K.kernel_cost(op_type, shapes(*inputs), shapes(*outputs))
    listed = K.kernel_cost("Identity", shapes(*inputs), shapes(*outputs)).bytes

    assert cost.flops == flops
    assert cost.bytes == listed + weight_bytes


def test_a_convolution_finds_its_weight_after_the_scales_and_no_scale_is_taken_for_a_bias():
    x, w, y = ("uint8", [1, 3, 8, 8]), ("int8", [4, 3, 3, 3]), ("uint8", [1, 4, 6, 6])
    scalars = [f32(), ("uint8", [])]
    per_channel = [f32(4), ("int8", [4])]
    without_bias = shapes(x, *scalars, w, *per_channel, *scalars)
    with_bias = shapes(x, *scalars, w, *per_channel, *scalars, ("int32", [4]))

    assert K.kernel_cost("QLinearConv", without_bias, shapes(y)).flops == 2 * 4 * 6 * 6 * 27
    assert K.kernel_cost("QLinearConv", with_bias, shapes(y)).flops == 2 * 4 * 6 * 6 * 27 + 4 * 6 * 6


def test_an_unknown_op_has_no_flops_but_its_bytes_still_count():
    cost = K.kernel_cost("TopK", shapes(f32(4, 10), ("int64", [1])), shapes(f32(4, 3), ("int64", [4, 3])))

    assert cost.flops is None
    assert cost.bytes == 160 + 8 + 48 + 96
    assert "TopK" not in K.COVERED_OPS


def test_a_call_missing_an_input_its_formula_needs_is_not_covered():
    assert K.kernel_cost("Conv", shapes(f32(1, 3, 8, 8)), shapes(f32(1, 4, 6, 6))).flops is None


def test_shapes_that_are_not_ort_shape_lists_are_refused_with_what_was_expected():
    with pytest.raises(ValueError, match="expected shapes like"):
        K.parse_shapes("[1, 2]")
    assert K.parse_shapes("") == [] and K.parse_shapes(None) == []
    assert math.isnan(K.kernel_cost("Add", "not json", "[]").bytes)
