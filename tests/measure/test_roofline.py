import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from onnx import TensorProto, helper, numpy_helper

from tracker.measure.costmodel import roofline as R
from tracker.measure.costmodel.machine import MachinePeaks, gemm_model, measure_machine, memory_gbps
from tracker.measure.runtimes.ort_runtime import SessionConfig, profile_ort
from tracker.profile import columns as C
from tracker.profile.parse import parse_profile

FIXTURES = Path(__file__).parents[1] / "fixtures"



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


# ORT's shape lists of the synthetic calls: an 8 x 8 MatMul, and elementwise ops on 8 floats.
MATMUL_8x8_INPUTS, MATMUL_8x8_OUTPUT = '[{"float":[8,8]},{"float":[8,8]}]', '[{"float":[8,8]}]'
VECTOR_8 = '[{"float":[8]}]'


def synthetic_events(n_ops: int) -> pd.DataFrame:
    rows = [{C.OP_TYPE: f"Op{i:02d}" if i else "MatMul", C.NODE: f"n{i}", C.PROVIDER: "CPUExecutionProvider", C.RUN: 0,
             C.DUR_US: 100 - i, C.TS_US: i, C.THREAD: "1",
             C.INPUT_SHAPES: MATMUL_8x8_INPUTS if i == 0 else VECTOR_8,
             C.OUTPUT_SHAPES: MATMUL_8x8_OUTPUT if i == 0 else VECTOR_8,
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

    per_op = {k.rsplit(".", 1)[0] for k in metrics if k.count(".") == 2} - {f"roofline.{R.MATMULS}"}
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


@pytest.mark.slow
@pytest.mark.timing
def test_the_machine_measures_plausible_peaks_and_its_own_gemm_stays_under_them(tmp_path):
    threads = SessionConfig().intra_op_num_threads
    machine = measure_machine(threads=threads)

    assert 1.0 < machine.peak_gflops < 1e5
    assert 0.5 < machine.bandwidth_gbps < 1e4
    assert machine.seconds < 10
    assert set(machine.metrics()) == {"machine.peak_gflops", "machine.bandwidth_gbps", "machine.ridge_flop_per_byte",
                                      "machine.seconds", "machine.copy_gbps", "machine.read_gbps", "machine.gemv_gbps"}
    assert machine.bandwidth_gbps == max(machine.copy_gbps, machine.read_gbps, machine.gemv_gbps)
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


@pytest.mark.slow
@pytest.mark.timing
def test_the_bandwidth_kernel_profiled_as_an_attempt_streams_its_weight_no_faster_than_the_roof(tmp_path):
    """A/A of the memory roof: the roof's own matrix-vector product (a decode step's kernel, one row times a
    weight as large as the copy), profiled as an attempt is, reads its weight once: bound by memory, its bytes the
    weight's (which ORT pre-packs out of the profile, counted back), and beyond the noise no faster than the roof."""
    from tracker.measure.costmodel.machine import gemv_model

    threads = SessionConfig().intra_op_num_threads
    machine = measure_machine(threads=threads, copy_mb=64)
    model = gemv_model(64 * 2**20)
    k, n = model.graph.initializer[0].dims
    profiled = profile_ort(model, {"X": np.ones((1, k), dtype=np.float32)}, runs=8, workdir=tmp_path,
                           config=SessionConfig(intra_op_num_threads=threads), save_optimized_model=False)
    row = R.build_roofline(parse_profile(profiled.profile_path).events, machine=machine, skip_runs=1).matmuls
    assert row[R.MB_PER_RUN] == pytest.approx(4 * (k * n + k + n) / 1e6)
    assert row[R.BOUND] == "memory"
    assert 0 < row[R.PCT_PEAK] <= 110, (row[R.GBPS], machine.copy_gbps, machine.read_gbps, machine.gemv_gbps)


def test_the_matrix_products_of_every_kind_are_one_row_and_decide_nothing_else():
    """MatMul and FusedMatMul calls together: FLOPs, time and bytes add up, so the row's GFLOP/s is their sum over
    their time; the model is bound by memory when most of its time is below the ridge."""
    events = synthetic_events(3)
    fused = events.iloc[[0]].assign(**{C.OP_TYPE: "FusedMatMul", C.NODE: "fused", C.DUR_US: 300})
    events = pd.concat([events, fused], ignore_index=True)
    machine = MachinePeaks(peak_gflops=100.0, bandwidth_gbps=10.0, threads=2)  # ridge at 10 FLOP per byte
    roofline = R.build_roofline(events, machine=machine)

    flops, nbytes = 2 * 8 * 8 * 8, 3 * 64 * 4  # one 8 x 8 x 8 product, A, B and Y in float32
    row = roofline.matmuls
    assert row[R.US_PER_RUN] == 100 + 300 and row[R.CALLS_PER_RUN] == 2
    assert row[R.GFLOPS] == pytest.approx(2 * flops / 400 / 1e3)
    assert row[R.INTENSITY] == pytest.approx(flops / nbytes) and row[R.BOUND] == "memory"
    assert row[R.TIME_PCT] == pytest.approx(100 * 400 / (400 + 99 + 98))
    metrics = roofline.metrics()
    assert metrics["roofline.matmuls.gflops"] == pytest.approx(row[R.GFLOPS])
    assert metrics["roofline.matmuls.pct_peak"] == pytest.approx(100 * row[R.GFLOPS] / (10.0 * flops / nbytes))
    assert roofline.bound == "memory" and metrics["roofline.memory_bound"] == 1.0
    assert roofline.flop_per_byte == pytest.approx(1e3 * roofline.gflop_per_run / roofline.mb_per_run)
    # Faster than the bandwidth allows at this intensity would be a compute-bound model on a 1000x wider bus.
    wide = R.build_roofline(events, machine=MachinePeaks(peak_gflops=100.0, bandwidth_gbps=1e4, threads=2))
    assert wide.bound == "compute" and wide.metrics()["roofline.memory_bound"] == 0.0
    assert R.build_roofline(synthetic_events(3).iloc[1:]).matmuls is None  # no product, no row


def test_the_bandwidth_probe_reads_a_plausible_figure_and_refuses_an_empty_copy():
    start = time.perf_counter()
    probe = memory_gbps(threads=SessionConfig().intra_op_num_threads)
    assert 0.5 < probe < 1e4
    assert time.perf_counter() - start < 5  # a probe beside each attempt, not a second machine measurement
    with pytest.raises(ValueError, match="mb"):
        memory_gbps(mb=0)


def test_the_machine_is_measured_by_the_first_study_of_a_process_and_a_failure_is_tried_again(monkeypatch):
    import tracker.pipeline as pipeline

    calls = []

    def measured(*, threads):
        calls.append(threads)
        if len(calls) == 1:
            raise RuntimeError("a busy machine")
        return MachinePeaks(peak_gflops=100.0, bandwidth_gbps=10.0, threads=threads, gemm_size=8, gemm_runs=1,
                            copy_mb=1, copy_runs=1, seconds=0.1, copy_gbps=10.0, read_gbps=9.0, gemv_gbps=8.0)

    monkeypatch.setattr(pipeline, "_MACHINES", {})
    monkeypatch.setattr(pipeline, "measure_machine", measured)
    assert pipeline.measure_machine_or_none() is None  # the failure costs this study its roofs only
    first = pipeline.measure_machine_or_none()
    assert first is not None and pipeline.measure_machine_or_none() is first
    assert calls == [SessionConfig().intra_op_num_threads] * 2
