"""ONNX Runtime session options other than the graph level: the same model file, other threading.

`ort_threads_1` runs every kernel on one thread: against the study's threads it shows what intra-op
parallelism buys on this model (little for a µs-scale model, whose runs are dominated by overhead), and its
latency is what one core of a loaded server gives. `ort_parallel` runs independent branches of the graph at
once (ORT_PARALLEL, two inter-op threads): it pays off on graphs with parallel branches and costs
scheduling elsewhere.
"""

from __future__ import annotations

from pathlib import Path

from tracker.optimize.base import Candidate, Context, Entry


def one_thread(source: Path, target_dir: Path, context: Context) -> Candidate:
    """The source model, run with one intra-op thread."""
    return Candidate(path=Path(source), applied=True, fusions={}, fully_optimized=None, precision="fp32",
                     notes=("one intra-op thread (intra_op_num_threads=1)",),
                     session={"intra_op_num_threads": 1})


THREADS_1 = Entry("ort_threads_1", "session", "ORT with one intra-op thread (intra_op_num_threads=1)", one_thread)


def parallel(source: Path, target_dir: Path, context: Context) -> Candidate:
    """The source model, run with ORT's parallel executor on two inter-op threads."""
    return Candidate(path=Path(source), applied=True, fusions={}, fully_optimized=None, precision="fp32",
                     notes=("independent branches at once (execution_mode=parallel, inter_op_num_threads=2)",),
                     session={"execution_mode": "parallel", "inter_op_num_threads": 2})


PARALLEL = Entry("ort_parallel", "session", "ORT's parallel executor (ORT_PARALLEL, two inter-op threads)", parallel)
