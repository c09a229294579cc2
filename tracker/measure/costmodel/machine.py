"""The machine's measured limits: peak fp32 FLOP/s (a large GEMM in ONNX Runtime) and memory bandwidth (the best of
a large copy, a large sum and a matrix-vector product over a large weight in ONNX Runtime), the two roofs of a
roofline."""

from __future__ import annotations

import functools
import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from tracker.measure.runtimes.ort_runtime import SessionConfig, make_session

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class MachinePeaks:
    """What the machine reached on two kernels made to reach its limits (an empirical roofline's ceilings,
    not the datasheet's).

    Attributes:
        peak_gflops: fp32 GFLOP/s of the best of `gemm_runs` runs of an n x n x n MatMul in ONNX Runtime.
        bandwidth_gbps: the memory roof, GB/s (1e9 bytes): the largest of `copy_gbps`, `read_gbps` and
            `gemv_gbps`. A kernel that mostly reads (a decode step's matrix-vector products read their weights once
            and write little) streams faster than a copy, whose writes cost a read of their lines too; numpy's sum
            is bound by its additions on a core or two; ONNX Runtime's own matrix-vector product is the kernel a
            decode step runs.
        threads: ONNX Runtime intra-op threads of the GEMM; the copy and the sum are timed on 1 thread and on as
            many.
        gemm_size: n of the GEMM.
        gemm_runs: timed runs of the GEMM (after two warm-up runs): at least the runs asked for, and as many more
            as `GEMM_MIN_SECONDS` takes.
        copy_mb: MiB copied per run.
        copy_runs: timed copies and sums (after one warm-up copy that maps the pages).
        seconds: wall time of the whole measurement.
        copy_gbps: the best copy of `copy_mb` MiB, bytes read plus bytes written; None when not measured apart.
        read_gbps: the best float32 sum of `copy_mb` MiB, bytes read; None when not measured apart.
        gemv_gbps: the best fp32 matrix-vector product in ONNX Runtime over a weight of `copy_mb` MiB, the
            weight's bytes; None when not measured apart.
    """

    peak_gflops: float
    bandwidth_gbps: float
    threads: int
    gemm_size: int = 1024
    gemm_runs: int = 12
    copy_mb: int = 256
    copy_runs: int = 5
    seconds: float = 0.0
    copy_gbps: float | None = None
    read_gbps: float | None = None
    gemv_gbps: float | None = None

    def __post_init__(self) -> None:
        if not (self.peak_gflops > 0 and self.bandwidth_gbps > 0):
            raise ValueError(f"peaks must be > 0, got {self.peak_gflops} GFLOP/s and {self.bandwidth_gbps} GB/s")

    @property
    def ridge_flop_per_byte(self) -> float:
        """The arithmetic intensity where the two roofs meet: below it a kernel is bound by memory."""
        return self.peak_gflops / self.bandwidth_gbps

    def roof_gflops(self, intensity):
        """The attainable GFLOP/s at an arithmetic intensity (FLOP/byte): min(peak, bandwidth x intensity).
        Works on a number or an array."""
        return np.minimum(self.peak_gflops, self.bandwidth_gbps * np.asarray(intensity, dtype=float))

    def metrics(self) -> dict[str, float]:
        """`machine.*` metrics of the study run."""
        metrics = {"machine.peak_gflops": self.peak_gflops, "machine.bandwidth_gbps": self.bandwidth_gbps,
                   "machine.ridge_flop_per_byte": self.ridge_flop_per_byte, "machine.seconds": self.seconds}
        for key, value in (("machine.copy_gbps", self.copy_gbps), ("machine.read_gbps", self.read_gbps),
                           ("machine.gemv_gbps", self.gemv_gbps)):
            if value is not None:
                metrics[key] = value
        return metrics

    def params(self) -> dict[str, str]:
        """How the peaks were measured, as `machine.*` params of the study run."""
        n = self.gemm_size
        return {
            "machine.gemm": f"onnxruntime MatMul fp32 {n}x{n}x{n}, best of {self.gemm_runs}",
            "machine.bandwidth": (f"the best of a numpy copy (read + write bytes) and a numpy float32 sum (read bytes) "
                                  f"of {self.copy_mb} MiB, each best of {self.copy_runs} on 1 and on {self.threads} "
                                  f"threads, and an onnxruntime fp32 MatMul of one row by a {self.copy_mb} MiB "
                                  f"weight, best of {self.copy_runs}"),
            "machine.threads": str(self.threads),
        }


def measure_machine(
    *, threads: int | None = None, gemm_size: int = 1024, gemm_runs: int = 12, copy_mb: int = 256, copy_runs: int = 5
) -> MachinePeaks:
    """Measures the machine's peak fp32 FLOP/s and memory bandwidth (~1 s on 2 cores).

    Args:
        threads: ONNX Runtime intra-op threads, as the study's sessions use (default: the core count, as
            `SessionConfig`'s); the copy and the sum are timed on one thread and split across as many, the best
            counts.
        gemm_size: n of the n x n x n fp32 MatMul (2 n^3 FLOPs per run; its weight is an initializer, so
            ONNX Runtime pre-packs it as it does a model's weights).
        gemm_runs: timed GEMM runs; the best counts.
        copy_mb: MiB per copy and per sum: far above any cache, so they run at memory speed.
        copy_runs: timed copies and sums; the best counts.

    Raises:
        ValueError: a size or count below 1.
    """
    threads = threads or os.cpu_count() or 1
    for name, value in (("threads", threads), ("gemm_size", gemm_size), ("gemm_runs", gemm_runs),
                        ("copy_mb", copy_mb), ("copy_runs", copy_runs)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    start = time.perf_counter()
    gflops, gemm_runs = _gemm_gflops(gemm_size, gemm_runs, threads)
    copy_gbps, read_gbps = _memory_gbps(copy_mb * 2**20, copy_runs, threads)
    gemv_gbps = _gemv_gbps(copy_mb * 2**20, copy_runs, threads)
    peaks = MachinePeaks(peak_gflops=gflops, bandwidth_gbps=max(copy_gbps, read_gbps, gemv_gbps), threads=threads,
                         gemm_size=gemm_size, gemm_runs=gemm_runs, copy_mb=copy_mb, copy_runs=copy_runs,
                         seconds=time.perf_counter() - start, copy_gbps=copy_gbps, read_gbps=read_gbps,
                         gemv_gbps=gemv_gbps)
    logger.info("machine: %.1f GFLOP/s fp32 (MatMul %d), %.1f GB/s copy, %.1f GB/s sum, %.1f GB/s MatMul of one row, "
                "%d threads, measured in %.2f s", gflops, gemm_size, copy_gbps, read_gbps, gemv_gbps, threads,
                peaks.seconds)
    return peaks


def memory_gbps(*, threads: int | None = None, mb: int = 64, runs: int = 3) -> float:
    """The memory bandwidth now, in GB/s: the better of a copy and a sum of `mb` MiB, the best of `runs` (a probe of a
    tenth of a second on 2 cores). A shared machine's bandwidth moves, and a memory-bound step's ratio to another
    moves with it: a study reads this beside each attempt's generation.

    Raises:
        ValueError: a size or count below 1.
    """
    threads = threads or os.cpu_count() or 1
    if min(threads, mb, runs) < 1:
        raise ValueError(f"threads, mb and runs must be >= 1, got {threads}, {mb} and {runs}")
    return max(_memory_gbps(mb * 2**20, runs, threads))


def gemm_model(n: int, *, rows: int | None = None, cols: int | None = None, random: bool = True):
    """An ONNX model `Y = X @ W`: X [rows, n] an input, W [n, cols] an fp32 initializer (rows and cols default to n;
    `random` False fills W with ones, which costs no time to make and runs as fast)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rows, cols = rows or n, cols or n
    weight = (np.random.default_rng(0).standard_normal((n, cols), dtype=np.float32) if random
              else np.ones((n, cols), dtype=np.float32))
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["X", "W"], ["Y"], name="gemm")], "gemm",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [rows, n])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [rows, cols])],
        initializer=[numpy_helper.from_array(weight, "W")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=onnx.IR_VERSION)


GEMV_K = 4096  # the weight's rows in the bandwidth's matrix-vector product; its columns make up the size


# The GEMM's runs span at least this long: 12 runs of ~6 ms once fell in a moment this VM's cores ran at half speed
# (a 177 GFLOP/s peak, then 356 GFLOP/s in the next seconds), and every share of peak after it was doubled.
GEMM_MIN_SECONDS = 0.5


def _gemm_gflops(n: int, runs: int, threads: int) -> tuple[float, int]:
    """(the best run's GFLOP/s, the runs timed)."""
    session = make_session(gemm_model(n), SessionConfig(intra_op_num_threads=threads))
    feeds = {"X": np.random.default_rng(1).standard_normal((n, n), dtype=np.float32)}
    for _ in range(2):  # kernel selection, thread pool start, first touch of the output
        session.run(None, feeds)
    best, timed = _best_seconds(lambda: session.run(None, feeds), runs=runs, min_seconds=GEMM_MIN_SECONDS)
    return 2.0 * n**3 / best / 1e9, timed


def _gemv_cols(nbytes: int) -> int:
    return max(1, nbytes // 4 // GEMV_K)


def gemv_model(nbytes: int):
    """`gemm_model` of one row by a weight of `nbytes` bytes (GEMV_K rows): the memory roof's kernel."""
    return gemm_model(GEMV_K, rows=1, cols=_gemv_cols(nbytes), random=False)


def _gemv_gbps(nbytes: int, runs: int, threads: int) -> float:
    # the session holds its own (pre-packed) copy of the weight; the model's goes when this call returns
    session = make_session(gemv_model(nbytes), SessionConfig(intra_op_num_threads=threads))
    feeds = {"X": np.ones((1, GEMV_K), dtype=np.float32)}
    session.run(None, feeds)
    best, _ = _best_seconds(lambda: session.run(None, feeds), runs=runs)
    return 4 * GEMV_K * _gemv_cols(nbytes) / best / 1e9


def _memory_gbps(nbytes: int, runs: int, threads: int) -> tuple[float, float]:
    """(copy GB/s counting bytes read and written, sum GB/s counting bytes read), each the best run."""
    source = np.full(nbytes // 4, 1.0, dtype=np.float32)  # written, so its pages are real, not the zero page
    target = np.empty_like(source)
    np.copyto(target, source)  # maps the target's pages
    copy = read = float("inf")
    # One thread, and the sessions' count: one core may pull the most on a small machine (or when another
    # process holds a core), several cores on a large one.
    for count in sorted({1, threads}):
        bounds = np.linspace(0, source.size, count + 1).astype(int)
        parts = list(zip(bounds[:-1], bounds[1:]))
        with ThreadPoolExecutor(max_workers=count) as pool:  # numpy copies and sums without the GIL: chunks go at once
            copy = min(copy, _best_seconds(lambda parts=parts: list(pool.map(
                lambda p: np.copyto(target[p[0]:p[1]], source[p[0]:p[1]]), parts)), runs=runs)[0])
            read = min(read, _best_seconds(lambda parts=parts: list(pool.map(lambda p: source[p[0]:p[1]].sum(), parts)),
                                           runs=runs)[0])
    return 2.0 * source.nbytes / copy / 1e9, source.nbytes / read / 1e9


def _best_seconds(work, *, runs: int, min_seconds: float = 0.0) -> tuple[float, int]:
    """(the fastest of the runs of `work`, the runs made): at least `runs`, and as many more as `min_seconds`
    of runs take."""
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < runs or time.perf_counter() - start < min_seconds:
        begin = time.perf_counter()
        work()
        times.append(time.perf_counter() - begin)
    return min(times), len(times)


@functools.cache  # the machine's kernels do not change within a process: measured once (three studies of `-e main`)
def kernel_speedups(*, n: int = 768, rows: int = 128, threads: int | None = None,
                    min_seconds: float = 0.2) -> dict[str, float]:
    """How much faster ONNX Runtime runs a quantized `rows` x `n` x `n` product here than the fp32 one, as the
    quantizers make it: "int8" (dynamic, per-tensor: the activation quantized each call, `DynamicQuantizeLinear` +
    `MatMulInteger`, which ORT fuses) and "int4" (`MatMulNBits` in blocks of 32 at accuracy level 4: int8 compute).
    The cost model's int8 and int4 throughputs on this machine's instruction sets, measured (~1 s), not assumed.
    The weights' values do not matter to the time, so they are random bytes."""
    return time_against_fp32({"int8": _int8_model(n, rows), "int4": _int4_model(n, rows)}, n=n, rows=rows,
                             threads=threads, min_seconds=min_seconds)


def time_against_fp32(models: dict, *, n: int, rows: int, threads: int | None = None,
                      min_seconds: float = 0.2) -> dict[str, float]:
    """Each of `models` (taking X [rows, n]) against the fp32 `gemm_model(n, rows=rows)`: its best run's speed-up."""
    threads = threads or os.cpu_count() or 1
    feeds = {"X": np.random.default_rng(1).standard_normal((rows, n), dtype=np.float32)}
    seconds = {}
    for name, model in (("fp32 reference", gemm_model(n, rows=rows)), *models.items()):
        session = make_session(model, SessionConfig(intra_op_num_threads=threads))
        session.run(None, feeds)
        seconds[name], _ = _best_seconds(lambda s=session: s.run(None, feeds), runs=5, min_seconds=min_seconds)
    return {name: seconds["fp32 reference"] / seconds[name] for name in models}


def _int8_model(n: int, rows: int):
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.integers(-127, 128, (n, n), dtype=np.int8), "Wq"),
               numpy_helper.from_array(np.array(0.01, dtype=np.float32), "Ws")]
    nodes = [helper.make_node("DynamicQuantizeLinear", ["X"], ["Xq", "Xs", "Xzp"]),
             helper.make_node("MatMulInteger", ["Xq", "Wq", "Xzp"], ["Yi"]),
             helper.make_node("Cast", ["Yi"], ["Yf"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["Xs", "Ws"], ["S"]), helper.make_node("Mul", ["Yf", "S"], ["Y"])]
    graph = helper.make_graph(nodes, "int8", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [rows, n])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [rows, n])], weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=onnx.IR_VERSION)


def _int4_model(n: int, rows: int, block: int = 32):
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    blocks = n // block
    weights = [numpy_helper.from_array(rng.integers(0, 256, (n, blocks, block // 2), dtype=np.uint8), "B"),
               numpy_helper.from_array(np.full((n, blocks), 0.01, dtype=np.float32), "scales")]
    node = helper.make_node("MatMulNBits", ["X", "B", "scales"], ["Y"], domain="com.microsoft", K=n, N=n, bits=4,
                            block_size=block, accuracy_level=4)
    graph = helper.make_graph([node], "int4", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [rows, n])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [rows, n])], weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)],
                             ir_version=onnx.IR_VERSION)
