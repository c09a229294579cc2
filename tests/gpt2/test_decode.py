"""The decode-ready GPT-2 export on the tiny config: its signature, its past of length 0, and its check against
PyTorch over a prompt and greedy steps (which must also be able to fail)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from tracker.gpt2.decode import DECODE_ATOL, DecoderExport, export_decoder, verify_decoder  # noqa: E402
from tracker.gpt2.model import SIZES, LoadedGPT2, load_gpt2  # noqa: E402
from tracker.gpt2.tokens import make_tokens  # noqa: E402
from tracker.measure.generation.decoder import DecoderSession, past_names  # noqa: E402
from tracker.measure.runtimes.ort_runtime import SessionConfig  # noqa: E402

# Nearly every test needs the decoder export (a dynamo export: tens of seconds).
pytestmark = pytest.mark.slow

TINY = SIZES["tiny"]
HEAD_DIM = TINY["n_embd"] // TINY["n_head"]


@pytest.fixture(scope="module")
def tiny() -> LoadedGPT2:
    return load_gpt2(size="tiny", seed=0)


@pytest.fixture(scope="module")
def exported(tiny_gpt2_decoder) -> DecoderExport:
    return tiny_gpt2_decoder  # `export_decoder` of `load_gpt2(size="tiny", seed=0)`, as `tiny`


@pytest.fixture(scope="module")
def decoder(exported) -> DecoderSession:
    return DecoderSession.open(exported.path, SessionConfig())


def _tokens(batch: int, seq_len: int, seed: int = 0) -> np.ndarray:
    return make_tokens(batch=batch, seq_len=seq_len, vocab_size=TINY["vocab_size"], seed=seed)


def _dims(value_info) -> list:
    return [d.dim_param or d.dim_value for d in value_info.type.tensor_type.shape.dim]


def test_the_export_takes_ids_and_a_past_per_layer_and_gives_logits_and_a_present_per_layer(exported):
    model = onnx.load(str(exported.path))
    onnx.checker.check_model(model, full_check=True)
    pasts = past_names(TINY["n_layer"])
    assert exported.input_names == ("input_ids", *pasts)
    assert exported.output_names == ("logits", *(p.replace("past_key_values.", "present.") for p in pasts))
    assert (exported.n_layer, exported.num_heads, exported.head_dim) == (TINY["n_layer"], TINY["n_head"], HEAD_DIM)
    inputs = {i.name: i for i in model.graph.input}
    batch, heads, past, head_dim = _dims(inputs["past_key_values.1.value"])
    assert isinstance(batch, str) and isinstance(past, str), "batch and past length are dynamic"
    assert (heads, head_dim) == (TINY["n_head"], HEAD_DIM)
    assert all(isinstance(d, str) for d in _dims(inputs["input_ids"]))


@pytest.mark.parametrize(("batch", "prompt_len"), [(1, 8), (2, 5)], ids=["batch1-prompt8", "batch2-prompt5"])
def test_onnx_matches_torch_over_a_prompt_and_16_greedy_steps(tiny, exported, batch, prompt_len):
    check = verify_decoder(tiny, exported.path, _tokens(batch, prompt_len, seed=batch), steps=16)
    assert check.steps == 16 and len(check.max_abs_by_step) == 16
    assert check.torch_tokens.shape == check.onnx_tokens.shape == (batch, 16)
    assert check.tokens_match
    assert check.max_abs <= DECODE_ATOL == check.atol
    assert check.passed


def test_the_check_fails_against_a_model_with_other_weights(exported):
    other = load_gpt2(size="tiny", seed=1)
    check = verify_decoder(other, exported.path, _tokens(1, 8), steps=4)
    assert not check.passed
    assert check.max_abs > 100 * DECODE_ATOL


def test_a_prompt_pass_then_one_token_steps_give_the_logits_of_one_pass_over_all_tokens(decoder):
    tokens = _tokens(2, 12, seed=3)
    full, present = decoder.prefill(tokens)
    assert full.shape == (2, 12, TINY["vocab_size"])
    assert present["past_key_values.0.key"].shape == (2, TINY["n_head"], 12, HEAD_DIM)
    logits, past = decoder.prefill(tokens[:, :9])
    stepped = [logits]
    for i in range(9, 12):
        logits, past = decoder.step(tokens[:, i : i + 1], past)
        stepped.append(logits)
    np.testing.assert_allclose(np.concatenate(stepped, axis=1), full, atol=1e-4)
    for name, value in past.items():
        np.testing.assert_allclose(value, present[name], atol=1e-5)


def test_the_greedy_generation_of_the_session_makes_the_tokens_torch_makes(tiny, decoder):
    from tracker.gpt2.decode import torch_greedy

    prompt = _tokens(1, 6, seed=4)
    generation = decoder.greedy(prompt, 10)
    torch_tokens, _ = torch_greedy(tiny, prompt, 10)
    np.testing.assert_array_equal(generation.tokens, torch_tokens)
    assert len(generation.step_logits) == 10
    assert 0 < generation.first_token_s <= generation.total_s


@pytest.mark.parametrize(("seq", "past"), [(1, 3), (5, 0), (300, 3)], ids=["seq1", "past0", "too-long"])
def test_the_export_refuses_example_lengths_it_cannot_generalize_from(tiny, tmp_path, seq, past):
    with pytest.raises(ValueError, match="example lengths"):
        export_decoder(tiny, tmp_path / "x.onnx", example_seq_len=seq, example_past_len=past)
    assert not (tmp_path / "x.onnx").exists()


def test_verify_refuses_a_prompt_and_steps_longer_than_the_positions(tiny, exported):
    with pytest.raises(ValueError, match="positions"):
        verify_decoder(tiny, exported.path, _tokens(1, TINY["n_positions"] - 4), steps=8)
