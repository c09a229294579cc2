import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from onnx import TensorProto, helper, numpy_helper

from tracker.measure import roofline as R
from tracker.measure.machine import MachinePeaks, gemm_model, measure_machine
from tracker.measure.ort_runtime import SessionConfig, profile_ort
from tracker.profile import columns as C
from tracker.profile.parse import parse_profile

FIXTURES = Path(__file__).parents[1] / "fixtures"


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
    cost = R.kernel_cost(op_type, shapes(*inputs), shapes(*outputs))

    assert cost.flops == flops
    assert op_type in R.COVERED_OPS


def test_the_bytes_of_a_call_are_every_input_and_output_at_its_element_size():
    cost = R.kernel_cost("MatMul", shapes(f32(2, 3, 4), f32(4, 5)), shapes(f32(2, 3, 5)))
    assert cost.bytes == (24 + 20 + 30) * 4

    cast = R.kernel_cost("Cast", shapes(("float16", [10])), shapes(("int64", [10])))
    assert (cast.flops, cast.bytes) == (0.0, 10 * 2 + 10 * 8)


def test_an_embedding_lookup_reads_the_rows_it_returns_not_the_whole_table():
    cost = R.kernel_cost("Gather", shapes(f32(50257, 768), ("int64", [1, 32])), shapes(f32(1, 32, 768)))

    assert cost.flops == 0
    assert cost.bytes == 2 * 32 * 768 * 4 + 32 * 8


def test_a_4_bit_matmul_reads_its_packed_weights_and_scales_once():
    n, k, bits, block = 32, 64, 4, 32
    weights = ("uint8", [n, k // block, block * bits // 8])
    scales = f32(n * k // block)
    cost = R.kernel_cost("MatMulNBits", shapes(f32(1, 8, k), weights, scales), shapes(f32(1, 8, n)))

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
    cost = R.kernel_cost(op_type, shapes(*inputs), shapes(*outputs))
    listed = R.kernel_cost("Identity", shapes(*inputs), shapes(*outputs)).bytes

    assert cost.flops == flops
    assert cost.bytes == listed + weight_bytes


def test_a_convolution_finds_its_weight_after_the_scales_and_no_scale_is_taken_for_a_bias():
    x, w, y = ("uint8", [1, 3, 8, 8]), ("int8", [4, 3, 3, 3]), ("uint8", [1, 4, 6, 6])
    scalars = [f32(), ("uint8", [])]
    per_channel = [f32(4), ("int8", [4])]
    without_bias = shapes(x, *scalars, w, *per_channel, *scalars)
    with_bias = shapes(x, *scalars, w, *per_channel, *scalars, ("int32", [4]))

    assert R.kernel_cost("QLinearConv", without_bias, shapes(y)).flops == 2 * 4 * 6 * 6 * 27
    assert R.kernel_cost("QLinearConv", with_bias, shapes(y)).flops == 2 * 4 * 6 * 6 * 27 + 4 * 6 * 6


def test_an_unknown_op_has_no_flops_but_its_bytes_still_count():
    cost = R.kernel_cost("TopK", shapes(f32(4, 10), ("int64", [1])), shapes(f32(4, 3), ("int64", [4, 3])))

    assert cost.flops is None
    assert cost.bytes == 160 + 8 + 48 + 96
    assert "TopK" not in R.COVERED_OPS


def test_a_call_missing_an_input_its_formula_needs_is_not_covered():
    assert R.kernel_cost("Conv", shapes(f32(1, 3, 8, 8)), shapes(f32(1, 4, 6, 6))).flops is None


def test_shapes_that_are_not_ort_shape_lists_are_refused_with_what_was_expected():
    with pytest.raises(ValueError, match="expected shapes like"):
        R.parse_shapes("[1, 2]")
    assert R.parse_shapes("") == [] and R.parse_shapes(None) == []
    assert math.isnan(R.kernel_cost("Add", "not json", "[]").bytes)


def mlp(n_in: int = 100, n_out: int = 50):
    """Y = MatMul(X, W) + b, with W [n_in, n_out] and b [n_out] as initializers."""
    rng = np.random.default_rng(0)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["X", "W"], ["H"], name="mm"), helper.make_node("Add", ["H", "b"], ["Y"], name="add")],
        "mlp", [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", n_in])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", n_out])],
        initializer=[numpy_helper.from_array(rng.standard_normal((n_in, n_out), dtype=np.float32), "W"),
                     numpy_helper.from_array(rng.standard_normal(n_out, dtype=np.float32), "b")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_real_profile_gives_the_matmul_the_flops_and_bytes_of_the_model_shapes(tmp_path):
    rows, n_in, n_out, runs = 4, 100, 50, 5
    feeds = {"X": np.ones((rows, n_in), dtype=np.float32)}
    profiled = profile_ort(mlp(n_in, n_out), feeds, runs=runs, workdir=tmp_path,
                           config=SessionConfig(graph_optimization_level="disable", intra_op_num_threads=1))
    events = parse_profile(profiled.profile_path).events

    roofline = R.build_roofline(events, skip_runs=1)
    table = roofline.table.set_index(R.OP_TYPE)

    matmul_flops = 2 * rows * n_out * n_in
    assert table.loc["MatMul", R.GFLOP_PER_RUN] * 1e9 == pytest.approx(matmul_flops)
    assert table.loc["MatMul", R.CALLS_PER_RUN] == 1
    assert table.loc["MatMul", R.MB_PER_RUN] * 1e6 == pytest.approx((rows * n_in + n_in * n_out + rows * n_out) * 4)
    assert table.loc["MatMul", R.INTENSITY] == pytest.approx(matmul_flops / ((rows * n_in + n_in * n_out + rows * n_out) * 4))
    assert roofline.gflop_per_run * 1e9 == pytest.approx(matmul_flops + rows * n_out)
    assert roofline.covered_time_pct == 100.0
    assert table[R.ROOF_GFLOPS].isna().all()  # no machine, no roof


def quantized(model, kind: str, folder: Path):
    import onnx

    if kind == "fp32":
        return model
    path = folder / "model.onnx"
    onnx.save(model, str(path))
    if kind == "int8_dynamic":
        from onnxruntime.quantization import QuantType, quantize_dynamic

        quantize_dynamic(str(path), str(folder / "q.onnx"), weight_type=QuantType.QInt8)
        return onnx.load(str(folder / "q.onnx"))
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    quantizer = MatMulNBitsQuantizer(model, block_size=32, is_symmetric=True)
    quantizer.process()
    return quantizer.model.model


@pytest.mark.parametrize(
    ("kind", "op_type", "weight_bytes"),
    [
        pytest.param("fp32", "MatMul", 64 * 32 * 4, id="fp32 MatMul"),
        pytest.param("int8_dynamic", "DynamicQuantizeMatMul", 64 * 32 + 4 + 1, id="int8 DynamicQuantizeMatMul"),
        pytest.param("int4", "MatMulNBits", 64 * 32 / 2 + 32 * 2 * 4, id="int4 MatMulNBits block 32"),
    ],
)
def test_a_real_profile_counts_the_weights_onnx_runtime_packed_out_of_its_inputs(tmp_path, kind, op_type, weight_bytes):
    rows, n_in, n_out = 4, 64, 32
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["X", "W"], ["Y"], name="mm")], "mm",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [rows, n_in])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [rows, n_out])],
        initializer=[numpy_helper.from_array(np.random.default_rng(0).standard_normal((n_in, n_out), dtype=np.float32), "W")],
    )
    model = quantized(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), kind, tmp_path)
    feeds = {"X": np.ones((rows, n_in), dtype=np.float32)}
    profiled = profile_ort(model, feeds, runs=2, workdir=tmp_path / "profile",
                           config=SessionConfig(intra_op_num_threads=1))
    table = R.build_roofline(parse_profile(profiled.profile_path).events).table.set_index(R.OP_TYPE)

    assert table.loc[op_type, R.GFLOP_PER_RUN] * 1e9 == pytest.approx(2 * rows * n_out * n_in)
    assert table.loc[op_type, R.MB_PER_RUN] * 1e6 == pytest.approx((rows * n_in + rows * n_out) * 4 + weight_bytes)


@pytest.mark.parametrize("fixture", ["profile_ort_1_32.json", "profile_ort_1_16_fences.json"],
                         ids=["ort_1_32", "ort_1_16_fences"])
def test_the_committed_profiles_count_the_matmul_of_their_model_once_per_call(fixture):
    events = parse_profile(FIXTURES / fixture).events
    roofline = R.build_roofline(events)
    table = roofline.table.set_index(R.OP_TYPE)

    # Their model: X [4, 100] @ (A + EyeLike(A)) [100, 100], every run.
    assert table.loc["MatMul", R.GFLOP_PER_RUN] * 1e9 == pytest.approx(2 * 4 * 100 * 100)
    assert table.loc["MatMul", R.CALLS_PER_RUN] == 1  # an old profile's fence events are not calls


def synthetic_events(n_ops: int) -> pd.DataFrame:
    rows = [{C.OP_TYPE: f"Op{i:02d}" if i else "MatMul", C.NODE: f"n{i}", C.PROVIDER: "CPUExecutionProvider", C.RUN: 0,
             C.DUR_US: 100 - i, C.TS_US: i, C.THREAD: "1",
             C.INPUT_SHAPES: shapes(f32(8, 8), f32(8, 8)) if i == 0 else shapes(f32(8)),
             C.OUTPUT_SHAPES: shapes(f32(8, 8)) if i == 0 else shapes(f32(8)),
             C.OUTPUT_SIZE: 0, C.ACTIVATION_SIZE: 0, C.PARAMETER_SIZE: 0, C.MEM_IN_USE_DELTA: pd.NA}
            for i in range(n_ops)]
    return pd.DataFrame(rows, columns=list(C.EVENT_COLUMNS))


def test_the_share_of_peak_is_taken_against_the_roof_at_the_op_intensity():
    machine = MachinePeaks(peak_gflops=100.0, bandwidth_gbps=10.0, threads=2)
    table = R.build_roofline(synthetic_events(1), machine=machine).table.set_index(R.OP_TYPE)
    row = table.loc["MatMul"]

    flops, nbytes = 2 * 8 * 8 * 8, 3 * 64 * 4
    assert row[R.INTENSITY] == pytest.approx(flops / nbytes)  # 1.33 FLOP/byte: below the ridge at 10
    assert row[R.GFLOPS] == pytest.approx(flops / 100 / 1e3)
    assert row[R.ROOF_GFLOPS] == pytest.approx(10.0 * flops / nbytes)
    assert row[R.PCT_PEAK] == pytest.approx(100 * row[R.GFLOPS] / (10.0 * flops / nbytes))
    assert row[R.BOUND] == "memory"


def test_metrics_name_the_model_and_at_most_the_top_op_types():
    machine = MachinePeaks(peak_gflops=100.0, bandwidth_gbps=10.0, threads=2)
    roofline = R.build_roofline(synthetic_events(12), machine=machine, tokens_per_run=4)
    metrics = roofline.metrics()

    per_op = {k.rsplit(".", 1)[0] for k in metrics if k.count(".") == 2}
    assert len(per_op) == R.TOP_OPS
    assert {"roofline.MatMul.gflops", "roofline.MatMul.gbps", "roofline.MatMul.intensity",
            "roofline.MatMul.pct_peak"} <= set(metrics)
    assert "roofline.Op01.gflops" not in metrics and "roofline.Op01.gbps" in metrics  # not covered: bytes only
    assert metrics["roofline.model_gflop_per_token"] == pytest.approx(metrics["roofline.model_gflop_per_run"] / 4)
    no_machine = R.build_roofline(synthetic_events(1)).metrics()
    assert "roofline.MatMul.pct_peak" not in no_machine and "roofline.model_gflop_per_token" not in no_machine


@pytest.mark.parametrize(
    ("feeds", "tokens"),
    [
        pytest.param({"input_ids": np.zeros((2, 7), np.int64), "attention_mask": np.ones((2, 9), np.int64)}, 14,
                     id="input_ids before a longer mask"),
        pytest.param({"ids": np.zeros((3, 5), np.int32)}, 15, id="the first 2-D integer feed"),
        pytest.param({"X": np.zeros((3, 5), np.float32)}, None, id="no token input"),
    ],
)
def test_tokens_per_run_are_batch_times_sequence_of_the_token_input(feeds, tokens):
    assert R.count_tokens(feeds) == tokens


def test_the_roof_is_the_bandwidth_slope_below_the_ridge_and_the_peak_above():
    machine = MachinePeaks(peak_gflops=200.0, bandwidth_gbps=20.0, threads=2)
    assert machine.ridge_flop_per_byte == 10.0
    np.testing.assert_allclose(machine.roof_gflops([1.0, 10.0, 50.0]), [20.0, 200.0, 200.0])
    with pytest.raises(ValueError, match="peaks must be > 0"):
        MachinePeaks(peak_gflops=0.0, bandwidth_gbps=1.0, threads=1)


def test_the_machine_measures_plausible_peaks_and_its_own_gemm_stays_under_them(tmp_path):
    threads = SessionConfig().intra_op_num_threads
    machine = measure_machine(threads=threads)

    assert 1.0 < machine.peak_gflops < 1e5
    assert 0.5 < machine.bandwidth_gbps < 1e4
    assert machine.seconds < 10
    assert set(machine.metrics()) == {"machine.peak_gflops", "machine.bandwidth_gbps", "machine.ridge_flop_per_byte",
                                      "machine.seconds"}
    # A/A: the same GEMM, profiled as an attempt is, cannot beat the peak it defines (beyond the noise).
    n = machine.gemm_size
    feeds = {"X": np.ones((n, n), dtype=np.float32)}
    profiled = profile_ort(gemm_model(n), feeds, runs=6, workdir=tmp_path,
                           config=SessionConfig(intra_op_num_threads=threads))
    table = R.build_roofline(parse_profile(profiled.profile_path).events, machine=machine, skip_runs=1).table
    row = table.set_index(R.OP_TYPE).loc["MatMul"]
    assert row[R.GFLOP_PER_RUN] == pytest.approx(2 * n**3 / 1e9)
    assert 0 < row[R.GFLOPS] <= 1.1 * machine.peak_gflops
    assert row[R.BOUND] == "compute"
