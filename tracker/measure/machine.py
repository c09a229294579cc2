"""The machine's measured limits: peak fp32 FLOP/s (a large GEMM in ONNX Runtime) and memory bandwidth (a large
copy), the two roofs of a roofline."""

from __future__ import annotations

import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from tracker.measure.ort_runtime import SessionConfig, make_session

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class MachinePeaks:
    """What the machine reached on two kernels made to reach its limits (an empirical roofline's ceilings,
    not the datasheet's).

    Attributes:
        peak_gflops: fp32 GFLOP/s of the best of `gemm_runs` runs of an n x n x n MatMul in ONNX Runtime.
        bandwidth_gbps: GB/s (1e9 bytes) of the best of `copy_runs` copies of `copy_mb` MiB, bytes read plus
            bytes written.
        threads: ONNX Runtime intra-op threads of the GEMM; the copy is timed on 1 thread and on as many.
        gemm_size: n of the GEMM.
        gemm_runs: timed runs of the GEMM (after two warm-up runs).
        copy_mb: MiB copied per run.
        copy_runs: timed copies (after one warm-up copy that maps the pages).
        seconds: wall time of the whole measurement.
    """

    peak_gflops: float
    bandwidth_gbps: float
    threads: int
    gemm_size: int = 1024
    gemm_runs: int = 12
    copy_mb: int = 256
    copy_runs: int = 5
    seconds: float = 0.0

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
        return {"machine.peak_gflops": self.peak_gflops, "machine.bandwidth_gbps": self.bandwidth_gbps,
                "machine.ridge_flop_per_byte": self.ridge_flop_per_byte, "machine.seconds": self.seconds}

    def params(self) -> dict[str, str]:
        """How the peaks were measured, as `machine.*` params of the study run."""
        n = self.gemm_size
        return {
            "machine.gemm": f"onnxruntime MatMul fp32 {n}x{n}x{n}, best of {self.gemm_runs}",
            "machine.copy": (f"numpy copy of {self.copy_mb} MiB, read + write bytes, best of {self.copy_runs} "
                             f"on 1 and on {self.threads} threads"),
            "machine.threads": str(self.threads),
        }


def measure_machine(
    *, threads: int | None = None, gemm_size: int = 1024, gemm_runs: int = 12, copy_mb: int = 256, copy_runs: int = 5
) -> MachinePeaks:
    """Measures the machine's peak fp32 FLOP/s and memory bandwidth (~0.5-1 s on 2 cores).

    Args:
        threads: ONNX Runtime intra-op threads, as the study's sessions use (default: the core count, as
            `SessionConfig`'s); the copy is timed on one thread and split across as many, the best counts.
        gemm_size: n of the n x n x n fp32 MatMul (2 n^3 FLOPs per run; its weight is an initializer, so
            ONNX Runtime pre-packs it as it does a model's weights).
        gemm_runs: timed GEMM runs; the best counts.
        copy_mb: MiB per copy: far above any cache, so the copy runs at memory speed.
        copy_runs: timed copies; the best counts.

    Raises:
        ValueError: a size or count below 1.
    """
    threads = threads or os.cpu_count() or 1
    for name, value in (("threads", threads), ("gemm_size", gemm_size), ("gemm_runs", gemm_runs),
                        ("copy_mb", copy_mb), ("copy_runs", copy_runs)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    start = time.perf_counter()
    gflops = _gemm_gflops(gemm_size, gemm_runs, threads)
    gbps = _copy_gbps(copy_mb * 2**20, copy_runs, threads)
    peaks = MachinePeaks(peak_gflops=gflops, bandwidth_gbps=gbps, threads=threads, gemm_size=gemm_size,
                         gemm_runs=gemm_runs, copy_mb=copy_mb, copy_runs=copy_runs,
                         seconds=time.perf_counter() - start)
    logger.info("machine: %.1f GFLOP/s fp32 (MatMul %d), %.1f GB/s (copy), %d threads, measured in %.2f s",
                gflops, gemm_size, gbps, threads, peaks.seconds)
    return peaks


def gemm_model(n: int):
    """An ONNX model `Y = X @ W`, X an n x n input and W an n x n fp32 initializer."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weight = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["X", "W"], ["Y"], name="gemm")], "gemm",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [n, n])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [n, n])],
        initializer=[numpy_helper.from_array(weight, "W")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=onnx.IR_VERSION)


def _gemm_gflops(n: int, runs: int, threads: int) -> float:
    session = make_session(gemm_model(n), SessionConfig(intra_op_num_threads=threads))
    feeds = {"X": np.random.default_rng(1).standard_normal((n, n), dtype=np.float32)}
    for _ in range(2):  # kernel selection, thread pool start, first touch of the output
        session.run(None, feeds)
    best = min(_seconds(lambda: session.run(None, feeds)) for _ in range(runs))
    return 2.0 * n**3 / best / 1e9


def _copy_gbps(nbytes: int, runs: int, threads: int) -> float:
    source = np.full(nbytes // 4, 1.0, dtype=np.float32)  # written, so its pages are real, not the zero page
    target = np.empty_like(source)
    np.copyto(target, source)  # maps the target's pages
    best = float("inf")
    # One thread, and the sessions' count: one core may pull the most on a small machine (or when another
    # process holds a core), several cores on a large one.
    for count in sorted({1, threads}):
        bounds = np.linspace(0, source.size, count + 1).astype(int)
        chunks = [(target[a:b], source[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]
        with ThreadPoolExecutor(max_workers=count) as pool:  # numpy copies without the GIL: chunks go at once
            best = min(best, *(_seconds(lambda: list(pool.map(lambda pair: np.copyto(*pair), chunks)))
                               for _ in range(runs)))
    return 2.0 * source.nbytes / best / 1e9


def _seconds(work) -> float:
    start = time.perf_counter()
    work()
    return time.perf_counter() - start
