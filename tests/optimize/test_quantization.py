"""int8 static (QDQ, calibrated on the feeds), int4 weight-only (MatMulNBits) and the session-option entries,
on a small MLP and on the tiny GPT-2, in real ONNX Runtime sessions."""

from __future__ import annotations

import logging
import sys
from dataclasses import replace

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from tests.models import make_linear_model
from tests.optimize.conftest import make_mlp
from tracker.measure.runtimes.ort_runtime import SessionConfig
from tracker.optimize import REGISTRY, Context, apply
from tracker.optimize.base import float_weights
from tracker.optimize.quantize.int4 import _quiet_quantizer
from tracker.optimize.quantize.int8_static import calibration_samples, model_bytes

STATIC = ["int8_static_minmax", "int8_static_percentile"]
INT4 = {"int4_block32": 32, "int4_block128": 128}


def _outputs(path, feeds):
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)


def _ops(path) -> list[onnx.NodeProto]:
    return list(onnx.load_model(str(path), load_external_data=False).graph.node)


def _lm_feeds() -> dict[str, np.ndarray]:
    # 128 positions: top-1 agreement on the random-weight tiny GPT-2 (tiny logit gaps) is too noisy on fewer.
    return {"input_ids": np.random.default_rng(100).integers(0, 1000, (4, 32), dtype=np.int64)}


@pytest.mark.parametrize("name", STATIC)
def test_int8_static_puts_every_weighted_node_of_the_mlp_between_qdq_pairs_and_stays_within_int8(runs, name):
    run = runs(name, "mlp")
    candidate = run.result
    ops = [node.op_type for node in _ops(candidate.path)]

    assert candidate.applied and candidate.precision == "int8"
    assert ops.count("QuantizeLinear") >= 3 and ops.count("DequantizeLinear") >= 6
    assert candidate.params["quantization.quantized_nodes"] == "3"  # fc1 (MatMul), fc2 (Gemm), fc3 (MatMul)
    assert candidate.params["quantization.calibration"] == name.rsplit("_", 1)[1]
    assert candidate.params["quantization.calibration_samples"] == "8"  # the 8 rows of the first feeds
    assert "batch of 8 rows split along axis 0" in " ".join(candidate.notes)
    assert sorted(p.name for p in run.target_dir.iterdir()) == [f"{name}.onnx"], "intermediates are removed"
    for feeds in run.source.feeds:
        diff = run.source.tolerances["int8"].compare(_outputs(run.source.path, feeds), _outputs(candidate.path, feeds))
        assert diff.passed and 0 < diff.max_abs < 0.1, diff.metrics()  # changed by quantization, not broken


@pytest.mark.parametrize("name", STATIC)
def test_int8_static_on_the_tiny_gpt2_quantizes_every_linear_layer_and_keeps_its_logits_within_int8(runs, name):
    run = runs(name, "gpt2_dynamo")
    # 8 Gemm (4 per layer), 4 attention MatMuls, and lm_head, tied to the embedding through a Transpose
    # that the pre-processing folds into a weight.
    assert run.result.params["quantization.quantized_nodes"] == "13"
    assert run.result.params["quantization.calibration_samples"] == "2"
    feeds = _lm_feeds()
    diff = run.source.tolerances["int8"].compare(_outputs(run.source.path, feeds), _outputs(run.result.path, feeds))
    assert diff.passed, diff.metrics()


@pytest.mark.parametrize("name", STATIC)
def test_int8_static_without_feeds_does_not_apply_and_refuses_to_run(small_models, tmp_path, name):
    source = small_models("mlp")
    reason = REGISTRY[name].why_not(make_mlp(), Context())
    assert reason == "static quantization calibrates on the study's inputs, and none were given (Context.feeds is None)"
    with pytest.raises(ValueError, match=f"{name} does not apply to this model: static quantization calibrates"):
        apply(name, source.path, tmp_path, Context())
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("name", [*STATIC, *INT4])
def test_quantizers_do_not_apply_to_a_model_whose_matmul_weight_is_computed(name):
    # The AddEyeLike model's MatMul weight is A + EyeLike(A): no initializer to quantize.
    context = Context(feeds={"X": np.zeros((2, 64), np.float32)})
    reason = REGISTRY[name].why_not(make_linear_model(n_features=64), context)
    assert reason is not None and "weight initializer" in reason


@pytest.mark.parametrize("name", list(INT4))
def test_int4_makes_every_mlp_weight_a_matmulnbits_of_its_block_size_and_stays_within_int4(runs, name):
    run = runs(name, "mlp")
    candidate = run.result
    block_size = INT4[name]
    nbits = [node for node in _ops(candidate.path) if node.op_type == "MatMulNBits"]
    attributes = [{a.name: a.i for a in node.attribute} for node in nbits]

    assert candidate.applied and candidate.precision == "int4" and candidate.fusions == {"MatMulNBits": 3}
    # fc1 (MatMul, K=256), fc2 (Gemm with transB, rewritten as MatMul + Add), fc3 (K=48, padded).
    assert sorted(a["K"] for a in attributes) == [48, 128, 256]
    assert {(a["bits"], a["block_size"], a["accuracy_level"]) for a in attributes} == {(4, block_size, 4)}
    assert not float_weights(onnx.load_model(str(candidate.path)), ("MatMul", "Gemm")), "a float weight is left"
    assert candidate.params["quantization.quantized_matmuls"] == "3"
    assert candidate.params["quantization.block_size"] == str(block_size)
    assert model_bytes(candidate.path) * 4 < model_bytes(run.source.path)
    assert any("x smaller" in note for note in candidate.notes)
    for feeds in run.source.feeds:
        diff = run.source.tolerances["int4"].compare(_outputs(run.source.path, feeds), _outputs(candidate.path, feeds))
        assert diff.passed and diff.max_abs > 0, diff.metrics()


@pytest.mark.parametrize("name", list(INT4))
def test_int4_on_the_tiny_gpt2_quantizes_every_linear_layer_and_the_tied_lm_head(runs, name):
    run = runs(name, "gpt2_dynamo")
    nbits = [node for node in _ops(run.result.path) if node.op_type == "MatMulNBits"]
    assert len(nbits) == 9  # 8 Gemm and lm_head, read through a Transpose of the embedding in the source
    assert {a.i for node in nbits for a in node.attribute if a.name == "block_size"} == {INT4[name]}
    feeds = _lm_feeds()
    diff = run.source.tolerances["int4"].compare(_outputs(run.source.path, feeds), _outputs(run.result.path, feeds))
    assert diff.passed, diff.metrics()


def test_a_batch_is_split_into_row_samples_when_every_input_has_a_free_first_dim():
    feeds = {"X": np.arange(8 * 256, dtype=np.float32).reshape(8, 256)}
    samples, note = calibration_samples(make_mlp(), feeds)
    assert [s["X"].shape for s in samples] == [(1, 256)] * 8
    np.testing.assert_array_equal(np.concatenate([s["X"] for s in samples]), feeds["X"])
    assert note == "calibrated on 8 samples: the feeds' batch of 8 rows split along axis 0"

    chunks, note = calibration_samples(make_mlp(), feeds, max_samples=3)
    assert [s["X"].shape[0] for s in chunks] == [3, 3, 2] and "3 samples" in note


def test_a_batch_with_a_fixed_first_dim_or_of_one_row_is_one_sample():
    fixed = make_mlp()
    fixed.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 8
    feeds = {"X": np.zeros((8, 256), np.float32)}
    samples, note = calibration_samples(fixed, feeds)
    assert len(samples) == 1 and samples[0]["X"].shape == (8, 256) and "as one sample" in note
    samples, _ = calibration_samples(make_mlp(), {"X": np.zeros((1, 256), np.float32)})
    assert len(samples) == 1


def test_the_quantizer_import_leaves_the_root_logger_as_it_was(monkeypatch):
    # `matmul_nbits_quantizer` calls logging.basicConfig(level=INFO) when imported into a process whose root
    # logger has no handler: re-import it into such a process.
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    monkeypatch.delitem(sys.modules, "onnxruntime.quantization.matmul_nbits_quantizer", raising=False)
    root.handlers.clear()  # the same list: pytest's own capture handler is removed from it after the test
    root.setLevel(logging.WARNING)
    try:
        with _quiet_quantizer():
            pass
        assert root.handlers == [] and root.level == logging.WARNING
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


def test_ort_threads_1_runs_its_source_with_one_intra_op_thread(runs):
    run = runs("ort_threads_1", "linear_eyelike")
    assert run.result.path == run.source.path and REGISTRY["ort_threads_1"].kind == "session"
    assert replace(SessionConfig(), **run.result.session).intra_op_num_threads == 1


def test_of_the_quantization_entries_only_int4_block32_is_among_the_gpt2_study_defaults():
    """Weight-only int4 is what a memory-bound decode step gains from; static int8 needs calibration data, and
    block 128 only repeats block 32 with a coarser scale."""
    from tracker.studies.gpt2 import DEFAULT_ATTEMPTS

    assert {*STATIC, *INT4} & set(DEFAULT_ATTEMPTS) == {"int4_block32"}
    assert {REGISTRY[name].kind for name in [*STATIC, *INT4]} == {"quantization"}


@pytest.mark.parametrize("name", ["int8_static_minmax", "int4_block32"])
def test_a_source_with_external_weights_is_pre_processed_with_them(tmp_path, caplog, name):
    # quant_pre_process once logged "Model Optimization Failed!" and went on unoptimized when the source's
    # weights were in a side file: ORT's optimized copy pointed at a data file that was not beside it.
    source = tmp_path / "source" / "mlp.onnx"
    source.parent.mkdir()
    onnx.save_model(make_mlp(), str(source), save_as_external_data=True, location="mlp.onnx.data",
                    size_threshold=0)
    feeds = {"X": np.random.default_rng(0).standard_normal((8, 256)).astype(np.float32)}
    with caplog.at_level(logging.ERROR):
        candidate = apply(name, source, tmp_path / "out", Context(feeds=feeds))
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], [r.getMessage() for r in caplog.records]
    assert candidate.applied
    np.testing.assert_allclose(_outputs(candidate.path, feeds)[0], _outputs(source, feeds)[0], atol=0.5)
