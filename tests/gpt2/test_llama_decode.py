"""LLaMA-family models through the generation study's loader and exporters: a tiny LLaMA folder (GQA, RoPE, RMSNorm)
loaded offline, exported ready to decode and checked against PyTorch's own greedy decoding; and the folders and
lengths the study refuses, each with one line before any work."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from tests.gpt2.tiny_llama import TINY_LLAMA, save_tiny_llama  # noqa: E402
from tracker.base.errors import ModelError  # noqa: E402
from tracker.gpt2.decode import DECODE_ATOL, export_decoder, verify_decoder  # noqa: E402
from tracker.gpt2.export import LOGITS_ATOL, export_gpt2, verify_export  # noqa: E402
from tracker.gpt2.families import FAMILIES, lm_shape  # noqa: E402
from tracker.gpt2.model import lm_config, load_lm  # noqa: E402
from tracker.gpt2.tokens import make_tokens  # noqa: E402
from tracker.measure.generation.decoder import DecoderSession  # noqa: E402
from tracker.measure.runtimes.ort_runtime import SessionConfig  # noqa: E402

HEAD_DIM = TINY_LLAMA["hidden_size"] // TINY_LLAMA["num_attention_heads"]
KV_HEADS = TINY_LLAMA["num_key_value_heads"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return save_tiny_llama(tmp_path_factory.mktemp("tiny-llama"), seed=0)


@pytest.fixture(scope="module")
def llama(folder):
    return load_lm(model=str(folder))


@pytest.fixture(scope="module")
def exported(llama, tmp_path_factory):
    return export_decoder(llama, tmp_path_factory.mktemp("tiny-llama-decoder") / "decoder.onnx")


def _tokens(batch: int, seq_len: int, seed: int = 0) -> np.ndarray:
    return make_tokens(batch=batch, seq_len=seq_len, vocab_size=TINY_LLAMA["vocab_size"], seed=seed)


def test_a_saved_llama_folder_loads_with_its_grouped_query_shape(llama, folder):
    assert type(llama.model).__name__ == "LlamaForCausalLM" and not llama.model.training
    assert llama.family == "llama" and llama.pretrained and llama.source == f"local:{folder}"
    assert (llama.n_layer, llama.num_heads, llama.kv_heads, llama.head_dim) == (2, 4, KV_HEADS, HEAD_DIM)
    assert (llama.hidden_size, llama.max_positions, llama.vocab_size) == (64, 256, 1000)
    assert llama.params["lm.family"] == "llama" and llama.params["lm.kv_heads"] == "2"
    assert not any(key.startswith("gpt2.") for key in llama.params)


@pytest.mark.slow
@pytest.mark.parametrize(("batch", "prompt_len"), [(1, 8), (2, 5)], ids=["batch1-prompt8", "batch2-prompt5"])
def test_the_llama_decode_export_matches_torch_over_16_greedy_steps(llama, exported, batch, prompt_len):
    check = verify_decoder(llama, exported.path, _tokens(batch, prompt_len, seed=batch), steps=16)
    assert check.torch_tokens.shape == check.onnx_tokens.shape == (batch, 16)
    np.testing.assert_array_equal(check.onnx_tokens, check.torch_tokens)
    assert check.max_abs <= DECODE_ATOL and check.passed


@pytest.mark.slow
def test_the_llama_decode_export_carries_a_cache_of_its_key_value_heads(exported):
    assert (exported.n_layer, exported.num_heads, exported.kv_heads, exported.head_dim) == (2, 4, KV_HEADS, HEAD_DIM)
    onnx.checker.check_model(onnx.load(str(exported.path)), full_check=True)
    decoder = DecoderSession.open(exported.path, SessionConfig())
    assert (decoder.num_heads, decoder.head_dim) == (KV_HEADS, HEAD_DIM)
    _, past = decoder.prefill(_tokens(1, 6))
    assert past["past_key_values.1.value"].shape == (1, KV_HEADS, 6, HEAD_DIM)


@pytest.mark.slow
def test_the_check_fails_against_a_llama_with_other_weights(exported, tmp_path):
    other = load_lm(model=str(save_tiny_llama(tmp_path / "other", seed=1)))
    check = verify_decoder(other, exported.path, _tokens(1, 8), steps=4)
    assert not check.passed and check.max_abs > 10 * DECODE_ATOL


@pytest.mark.slow
def test_the_forward_export_of_a_llama_matches_torch(llama, tmp_path):
    result = export_gpt2(llama, tmp_path / "model.onnx", exporter="dynamo")
    check = verify_export(llama, result.path, _tokens(2, 16))
    assert result.input_names == ("input_ids",) and check.passed and check.max_abs <= LOGITS_ATOL


def test_a_llama_config_file_builds_a_seeded_llama(tmp_path):
    path = tmp_path / "llama.json"
    path.write_text(json.dumps({"model_type": "llama", **TINY_LLAMA}))
    built = load_lm(config_path=str(path), seed=0)
    assert built.family == "llama" and not built.pretrained and built.params["lm.seed"] == "0"
    same = load_lm(config_path=str(path), seed=0).model.state_dict()
    assert all(torch.equal(value, same[name]) for name, value in built.model.state_dict().items())
    norm = built.model.model.norm.weight
    assert not torch.all(norm == 1.0), "RMSNorm weights get seeded noise, as trained ones have"


# --- what the study refuses before any work ----------------------------------------------------------------------


@pytest.fixture
def bert_folder(tmp_path):
    from transformers import BertConfig, BertForMaskedLM

    config = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=64)
    BertForMaskedLM(config).save_pretrained(tmp_path / "bert")
    return tmp_path / "bert"


def test_a_bert_folder_is_refused_naming_its_architecture_and_the_supported_ones(bert_folder):
    with pytest.raises(ModelError) as info:
        load_lm(model=str(bert_folder))
    message = str(info.value)
    assert "bert" in message and "BertForMaskedLM" in message and "\n" not in message
    assert all(family in message for family in FAMILIES)


@pytest.mark.parametrize("what", ["empty-folder", "missing-folder"])
def test_a_folder_without_a_config_is_refused_as_offline(tmp_path, what):
    folder = tmp_path if what == "empty-folder" else tmp_path / "missing"
    with pytest.raises(ModelError, match="config.json"):
        lm_config(model=str(folder))


def test_a_config_file_of_an_unsupported_family_is_refused(tmp_path):
    path = tmp_path / "t5.json"
    path.write_text(json.dumps({"model_type": "t5", "d_model": 32}))
    with pytest.raises(ModelError, match="t5.*supported: gpt2"):
        load_lm(config_path=str(path))


def test_the_config_alone_gives_the_shape_the_study_checks(tmp_path):
    folder = save_tiny_llama(tmp_path, weights=False)  # no weights: nothing but config.json is read
    shape = lm_shape(lm_config(model=str(folder)))
    assert (shape.family, shape.kv_heads, shape.head_dim, shape.max_positions) == ("llama", 2, HEAD_DIM, 256)
