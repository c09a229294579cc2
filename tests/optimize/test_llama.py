"""A LLaMA-architecture decoder (grouped-query attention 8/2 heads, rotary positions, RMSNorm), built offline from a
config and exported with the dynamo exporter: detected as llama, fused by onnxscript, quantized by content."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from tracker.measure.accuracy.lm_diff import LOGITS_TOLERANCES
from tracker.optimize import REGISTRY, Context, applicable, apply
from tracker.optimize.model_info import detect_from_graph

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

# Every test needs the LLaMA export (a dynamo export: tens of seconds).
pytestmark = pytest.mark.slow

LAYERS, HEADS, KV_HEADS, HIDDEN, VOCAB = 2, 8, 2, 64, 1000


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """(the exported file, its feeds)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=128, num_hidden_layers=LAYERS,
                         num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, max_position_embeddings=128,
                         tie_word_embeddings=False)
    model = LlamaForCausalLM(config).eval()

    class Logits(torch.nn.Module):
        def forward(self, input_ids):
            return model(input_ids=input_ids, use_cache=False).logits

    ids = torch.randint(0, VOCAB, (2, 16))  # batch 2: an example dim of 1 would be exported as a constant
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(Logits(), (ids,), dynamo=True, input_names=["input_ids"], output_names=["logits"],
                                    dynamic_shapes={"input_ids": {0: torch.export.Dim("batch"),
                                                                  1: torch.export.Dim("seq", max=128)}})
    path = tmp_path_factory.mktemp("llama") / "llama.onnx"
    program.save(str(path))
    feeds = {"input_ids": np.random.default_rng(0).integers(0, VOCAB, (2, 12), dtype=np.int64)}
    return path, feeds


def _logits(path, feeds):
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)


def test_a_llama_decoder_is_detected_with_its_query_heads_and_rmsnorm_width(llama):
    graph = onnx.load_model(str(llama[0]), load_external_data=False)
    detection = detect_from_graph(graph)
    assert (detection.info.model_type, detection.info.num_heads, detection.info.hidden_size) == ("llama", HEADS, HIDDEN)


def test_ort_optimizer_entries_say_why_they_skip_llama_while_onnxscript_and_int8_apply(llama):
    reasons = applicable(onnx.load_model(str(llama[0]), load_external_data=False), Context())
    for name in ("ort_opt_basic", "ort_opt_extended", "ort_opt_fp16"):
        assert "has no fusions for llama models" in reasons[name], reasons[name]
    assert reasons["attention_fused"] is None and reasons["int8_dynamic"] is None and reasons["int4_block32"] is None


def test_onnxscript_fuses_attention_and_rmsnorm_in_every_layer_and_the_logits_stay(llama, tmp_path):
    path, feeds = llama
    candidate = apply("attention_fused", path, tmp_path, Context())
    assert candidate.applied
    assert candidate.fusions["MultiHeadAttention"] + candidate.fusions["GroupQueryAttention"] == LAYERS
    assert candidate.fusions["SkipSimplifiedLayerNormalization"] + candidate.fusions["SimplifiedLayerNormalization"] \
        == 2 * LAYERS + 1, candidate.fusions  # two RMSNorms a layer and the final one
    assert any("rotary_embedding=" in note for note in candidate.notes), candidate.notes
    diff = LOGITS_TOLERANCES["fp32"].compare(_logits(path, feeds), _logits(candidate.path, feeds))
    assert diff.passed, diff.metrics()


def test_int8_dynamic_quantizes_every_matmul_weight_of_a_llama_decoder(llama, tmp_path):
    path, feeds = llama
    candidate = apply("int8_dynamic", path, tmp_path, Context())
    weights = 7 * LAYERS + 1  # q, k, v, o, gate, up, down per layer, and lm_head
    assert candidate.params["quantization.quantized_matmuls"] == str(weights)
    assert candidate.params["quantization.pre_process"] == "quant_pre_process"
    logits = _logits(candidate.path, feeds)[0]
    assert logits.shape == (2, 12, VOCAB) and np.isfinite(logits).all()
    assert REGISTRY["int8_dynamic"].kind == "transform"
