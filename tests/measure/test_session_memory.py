"""An attempt's session, measured in both runtimes: the time to make it, its first (cold) run, and the memory it
holds, checked on a model whose weights have a known size."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tracker.base.memory import MIB, rss_growth
from tracker.measure.attempt import Attempt, MeasureConfig
from tracker.measure.measurement import measure_attempt
from tracker.measure.timing.latency import TimingConfig

TABLE_BYTES = 100_000_000  # 25,000 x 1,000 float32
ONCE = MeasureConfig(profile_runs=1, skip_runs=0, timing=TimingConfig(warmup_runs=0, min_runs=1, min_seconds=0.0),
                     trace_levels=())


def table_model(rows: int, columns: int = 1000) -> onnx.ModelProto:
    """Y = Gather(W, i): a float32 table W of rows x columns, one row out. What a session of it holds is the
    table; ONNX Runtime cannot fold it away (the index is an input), and the outputs are 4 KB."""
    table = np.random.default_rng(0).standard_normal((rows, columns), dtype=np.float32)
    graph = helper.make_graph(
        [helper.make_node("Gather", ["W", "i"], ["Y"])], "table",
        [helper.make_tensor_value_info("i", TensorProto.INT64, [1])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, columns])],
        [numpy_helper.from_array(table, "W")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


FEEDS = {"i": np.array([3], dtype=np.int64)}


@pytest.fixture(scope="module")
def table_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("table") / "table.onnx"
    onnx.save_model(table_model(TABLE_BYTES // 4000), str(path))
    return path


@pytest.mark.slow
@pytest.mark.parametrize(
    ("runtime", "in_memory", "copies"),
    [
        ("onnxruntime", False, 1.0),
        ("reference", False, 1.0),
        # onnxruntime's Python session keeps the serialized model it was made from (`_model_bytes`): the table twice
        ("onnxruntime", True, 2.0),
    ],
    ids=["onnxruntime-from-a-file", "reference-evaluator", "onnxruntime-from-memory-keeps-the-bytes-too"],
)
def test_the_session_of_a_model_with_a_100_mb_table_holds_about_100_mb(table_file, tmp_path, runtime, in_memory,
                                                                        copies):
    model = onnx.load(str(table_file)) if in_memory else table_file
    result = measure_attempt(Attempt(name="table", model=model, runtime=runtime), FEEDS, config=ONCE,
                             workdir=tmp_path)
    held = result.session_bytes / (copies * TABLE_BYTES)
    # Measured: 100.2 MB (onnxruntime), 100.0 MB (reference); 200.1 MB from memory.
    assert 0.95 <= held <= 1.1, f"{result.session_bytes / MIB:.1f} MiB for {copies} x {TABLE_BYTES / MIB:.1f} MiB"
    assert result.session_create_ms > 0 and result.first_run_ms > 0


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.parametrize("runtime", ["onnxruntime", "reference"])
def test_a_session_without_weights_holds_next_to_nothing_even_as_the_first_of_its_process(runtime):
    # A fresh process: its first session would otherwise be charged with importing and starting the runtime
    # (~30 MiB for ONNX Runtime), which `warm_up` pays before measuring.
    code = f"""
import json, numpy as np
from tracker.measure.attempt import Attempt, MeasureConfig
from tracker.measure.measurement import measure_attempt
from tracker.measure.timing.latency import TimingConfig
from tracker.studies.fusion import make_linear_model
config = MeasureConfig(profile_runs=1, skip_runs=0, timing=TimingConfig(warmup_runs=0, min_runs=1, min_seconds=0.0),
                       trace_levels=())
feeds = {{"X": np.ones((2, 8), dtype=np.float32)}}
result = measure_attempt(Attempt(name="tiny", model=make_linear_model(n_features=8), runtime={runtime!r}), feeds,
                         config=config, workdir=".")
print(json.dumps([result.session_bytes, result.session_create_ms, result.first_run_ms]))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    session_bytes, create_ms, first_run_ms = json.loads(done.stdout.splitlines()[-1])
    assert abs(session_bytes) < 3 * MIB, f"{session_bytes / MIB:.1f} MiB for a model of 8x8 weights"
    assert create_ms > 0 and first_run_ms > 0


@pytest.mark.slow
def test_rss_growth_sees_what_a_block_keeps_and_not_what_it_frees():
    with rss_growth() as kept:
        table = np.ones(50 * MIB // 8)  # 50 MiB, touched
    with rss_growth() as freed:
        np.ones(50 * MIB // 8)  # made and dropped inside the block
    assert 0.95 <= kept.bytes / (50 * MIB) <= 1.1
    assert abs(freed.bytes) < 5 * MIB
    del table
