"""Tests of the registry's model transforms on tiny GPT-2, exported both ways: what each one fuses or quantizes."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from tests.optimize.conftest import EXPORTERS, N_LAYER, VOCAB, gpt2_feeds
from tracker.optimize import FORWARD_ENTRIES, REGISTRY, ModelInfo
from tracker.optimize.model_files import prepare_output

SEQ_LENS = (3, 11)
# The forward transforms, as the GPT-2 study runs them (`shared_kv` changes only a decode-ready model: test_shared_kv).
TRANSFORMS = [name for name, entry in REGISTRY.items() if entry.kind == "transform" and name in FORWARD_ENTRIES]
# fp32 variants differ by float noise (~2e-7 here); fp16 by ~4e-4 on the tiny model. int8 logits move by ~5e-2
# and are judged by their argmax instead.
ATOL = {"fp32": 1e-3, "fp16": 1e-2}
MIN_TOP1_AGREEMENT = 0.8
EXPECTED_PRECISION = {
    "ort_opt_basic": "fp32",
    "ort_opt_fp16": "fp16",
    "ort_opt_extended": "fp32",
    "attention_fused": "fp32",
    "int8_dynamic": "int8",
}


def _session(path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


@pytest.fixture(scope="module")
def gpt2_runs(runs):
    return lambda name, exporter: runs(name, f"gpt2_{exporter}")


@pytest.fixture(scope="module")
def baselines(small_models) -> dict[tuple[str, int], np.ndarray]:
    return {
        (exporter, seq): _session(small_models(f"gpt2_{exporter}").path).run(None, gpt2_feeds(seq))[0]
        for exporter in EXPORTERS
        for seq in SEQ_LENS
    }


CASES = [pytest.param(name, exporter, id=f"{name}-{exporter}") for name in TRANSFORMS for exporter in EXPORTERS]


@pytest.mark.parametrize(("name", "exporter"), CASES)
def test_every_transform_writes_a_checked_model_and_leaves_the_source_alone(gpt2_runs, name, exporter):
    run = gpt2_runs(name, exporter)
    assert run.result.path.is_file()
    assert run.result.path.parent == run.target_dir
    onnx.checker.check_model(str(run.result.path))  # by path: external data is checked where it lies
    assert run.digest_after == run.digest_before


@pytest.mark.parametrize(("name", "exporter"), CASES)
def test_every_transform_reports_well_formed_counts(gpt2_runs, name, exporter):
    result = gpt2_runs(name, exporter).result
    assert result.precision == EXPECTED_PRECISION[name]
    assert all(isinstance(k, str) and type(v) is int and v >= 0 for k, v in result.fusions.items())
    assert result.fully_optimized in (True, False, None)
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in result.params.items())
    assert all(isinstance(note, str) and note for note in result.notes)
    if not result.applied:
        assert result.notes, "an attempt that did nothing must say why"


@pytest.mark.parametrize(("name", "exporter"), CASES)
def test_every_transform_runs_in_ort_cpu_close_to_the_baseline(gpt2_runs, baselines, name, exporter):
    result = gpt2_runs(name, exporter).result
    session = _session(result.path)
    for seq in SEQ_LENS:
        expected = baselines[exporter, seq]
        (logits,) = session.run(None, gpt2_feeds(seq))
        assert logits.dtype == np.float32 and logits.shape == expected.shape == (2, seq, VOCAB)
        if result.precision == "int8":
            agreement = float(np.mean(logits.argmax(-1) == expected.argmax(-1)))
            assert agreement >= MIN_TOP1_AGREEMENT, f"seq {seq}: top-1 agreement {agreement:.2f}"
        else:
            np.testing.assert_allclose(logits, expected, rtol=0, atol=ATOL[result.precision], err_msg=f"seq {seq}")


def test_the_transforms_are_listed_in_the_order_the_gpt2_study_runs_them():
    assert TRANSFORMS == ["ort_opt_basic", "ort_opt_fp16", "ort_opt_extended", "attention_fused", "int8_dynamic"]


def test_an_output_never_overwrites_its_source(small_models):
    source = small_models("gpt2_dynamo").path
    with pytest.raises(ValueError, match="overwrite"):
        prepare_output(source, source.parent, source.stem)


def test_model_info_rejects_heads_that_do_not_divide_the_hidden_size():
    with pytest.raises(ValueError, match="multiple of num_heads"):
        ModelInfo(num_heads=5, hidden_size=64)


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_ort_optimizer_fuses_layer_norms_and_gelu_but_not_attention(gpt2_runs, exporter):
    result = gpt2_runs("ort_opt_basic", exporter).result
    assert result.applied
    assert result.fusions["SkipLayerNormalization"] == 2 * N_LAYER
    assert result.fusions["FastGelu"] + result.fusions["BiasGelu"] == N_LAYER
    # FACTS: ORT's gpt2 fusion does not match transformers 5.x attention; if this starts failing, it does.
    assert result.fusions["Attention"] + result.fusions["MultiHeadAttention"] == 0
    assert result.fully_optimized is False


def test_extended_level_fuses_what_basic_fuses(gpt2_runs):
    basic, extended = gpt2_runs("ort_opt_basic", "dynamo").result, gpt2_runs("ort_opt_extended", "dynamo").result
    assert extended.params["optimizer.opt_level"] == "2"
    assert extended.fusions == basic.fusions


def test_attention_fusion_fuses_one_multi_head_attention_per_layer_on_the_dynamo_export(gpt2_runs):
    result = gpt2_runs("attention_fused", "dynamo").result
    assert result.applied
    assert result.fusions["MultiHeadAttention"] + result.fusions["Attention"] == N_LAYER
    graph = onnx.load(str(result.path), load_external_data=False).graph
    assert sum(n.op_type == "MultiHeadAttention" and n.domain == "com.microsoft" for n in graph.node) == N_LAYER


def test_attention_fusion_reports_not_applied_on_the_torchscript_export(gpt2_runs):
    run = gpt2_runs("attention_fused", "torchscript")
    assert not run.result.applied
    assert any("no attention fused" in note for note in run.result.notes)
    assert run.result.fusions["MultiHeadAttention"] == 0


def test_int8_quantizes_every_matmul_weight_of_the_optimized_graph(gpt2_runs):
    result = gpt2_runs("int8_dynamic", "dynamo").result
    # 4 per layer (c_attn, c_proj, c_fc, mlp c_proj) plus the untied lm_head.
    assert result.params["quantization.quantized_matmuls"] == str(4 * N_LAYER + 1)
    assert any("opt_level 1" in note for note in result.notes)
