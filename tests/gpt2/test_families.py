"""Causal LMs of any family: the known ones (GPT-2, the LLaMA family) and the generic path for the others. A tiny
Gemma 3 folder (a head width that is not hidden / heads, one key/value head, sliding-window layers, tied embeddings)
loads, exports for the forward pass and matches PyTorch; its decode-ready export is refused with the reason; what
is not a causal LM at all is refused in one line naming its architecture."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from tracker.base.errors import ModelError  # noqa: E402
from tracker.gpt2.decode import export_decoder  # noqa: E402
from tracker.gpt2.export import LOGITS_ATOL, export_gpt2, verify_export  # noqa: E402
from tracker.gpt2.families import FAMILIES, check_family, family_support, lm_shape  # noqa: E402
from tracker.gpt2.model import load_lm, seeded_lm  # noqa: E402
from tracker.gpt2.tokens import make_tokens  # noqa: E402

# 2 layers of 4 query heads of 32 over a residual stream of 64 (Gemma 3 270M: 4 heads of 256 over 640), one shared
# key/value head; the first layer sees a window of 16 tokens, longer than the 8 the export traces.
TINY_GEMMA3 = {
    "num_hidden_layers": 2,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "head_dim": 32,
    "vocab_size": 1000,
    "max_position_embeddings": 256,
    "sliding_window": 16,
    "layer_types": ["sliding_attention", "full_attention"],
    "bos_token_id": 2,
    "eos_token_id": 1,
    "pad_token_id": 0,
}
SMALL = {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 1000,
         "max_position_embeddings": 256}


@pytest.fixture(scope="module")
def gemma3_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-gemma3")
    seeded_lm(transformers.Gemma3TextConfig(**TINY_GEMMA3), seed=0).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def gemma3(gemma3_folder):
    return load_lm(model=str(gemma3_folder))


@pytest.fixture(scope="module")
def gemma3_export(gemma3, tmp_path_factory):
    return export_gpt2(gemma3, tmp_path_factory.mktemp("tiny-gemma3-onnx") / "model.onnx")


def test_a_gemma3_folder_loads_on_the_generic_path_and_says_why(gemma3):
    assert type(gemma3.model).__name__ == "Gemma3ForCausalLM" and not gemma3.model.training
    assert gemma3.family == "gemma3_text" and gemma3.pretrained
    assert gemma3.params["lm.family"] == "gemma3_text" and gemma3.params["lm.family_known"] == "false"
    note = gemma3.params["lm.family_note"]
    assert note == family_support(gemma3.config).reason
    assert "gemma3_text" in note and "decode-ready" in note and "attention_fused" in note and "\n" not in note
    assert gemma3.params["lm.attn_implementation"] == "eager"


def test_the_shape_of_a_gemma3_keeps_its_own_head_width(gemma3):
    assert (gemma3.n_layer, gemma3.num_heads, gemma3.kv_heads, gemma3.head_dim) == (2, 4, 1, 32)
    assert (gemma3.hidden_size, gemma3.attention_size, gemma3.max_positions, gemma3.vocab_size) == (64, 128, 256, 1000)
    assert gemma3.tied_embeddings and gemma3.params["lm.tied_embeddings"] == "true"
    assert gemma3.params["lm.head_dim"] == "32" and gemma3.params["lm.kv_heads"] == "1"


@pytest.mark.slow
@pytest.mark.parametrize(("batch", "seq_len"), [(2, 40), (1, 5)], ids=["beyond-the-window", "one-row-short"])
def test_the_forward_export_of_a_gemma3_matches_torch(gemma3, gemma3_export, batch, seq_len):
    assert gemma3_export.input_names == ("input_ids",) and gemma3_export.output_names == ("logits",)
    tokens = make_tokens(batch=batch, seq_len=seq_len, vocab_size=gemma3.vocab_size, seed=seq_len)
    check = verify_export(gemma3, gemma3_export.path, tokens)
    assert check.passed and check.max_abs <= LOGITS_ATOL


def test_a_decode_ready_export_of_an_unknown_family_is_refused_with_the_reason(gemma3, tmp_path):
    with pytest.raises(ModelError) as info:
        export_decoder(gemma3, tmp_path / "decoder.onnx")
    message = str(info.value)
    assert family_support(gemma3.config).reason in message and "\n" not in message
    assert not (tmp_path / "decoder.onnx").exists()


@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_known_families_are_known(family):
    support = family_support(transformers.AutoConfig.for_model(family))
    assert support.family == family and support.known and "every scenario" in support.reason


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        # GPT-2's n_layer, n_head, n_embd, n_positions are read through the names transformers maps them to
        (lambda: transformers.GPT2Config(n_layer=2, n_head=4, n_embd=64, n_positions=128, vocab_size=500),
         ("gpt2", 2, 4, 4, 16, 64, 128, 500, True)),
        (lambda: transformers.Gemma3TextConfig(**TINY_GEMMA3), ("gemma3_text", 2, 4, 1, 32, 64, 256, 1000, True)),
        (lambda: transformers.GPTNeoXConfig(**SMALL, tie_word_embeddings=False),
         ("gpt_neox", 2, 4, 4, 16, 64, 256, 1000, False)),
        (lambda: transformers.Phi3Config(**SMALL, num_key_value_heads=2, tie_word_embeddings=False),
         ("phi3", 2, 4, 2, 16, 64, 256, 1000, False)),
    ],
    ids=["gpt2", "gemma3_text", "gpt_neox", "phi3"],
)
def test_the_shape_of_any_family_is_read_from_its_config(config, expected):
    shape = lm_shape(config())
    assert (shape.family, shape.n_layer, shape.num_heads, shape.kv_heads, shape.head_dim, shape.hidden_size,
            shape.max_positions, shape.vocab_size, shape.tied_embeddings) == expected


def test_a_config_file_of_another_family_builds_a_seeded_model(tmp_path):
    path = tmp_path / "neox.json"
    path.write_text(json.dumps({"model_type": "gpt_neox", **SMALL, "intermediate_size": 128}))
    built = load_lm(config_path=str(path), seed=0)
    assert type(built.model).__name__ == "GPTNeoXForCausalLM" and not built.pretrained
    assert built.params["lm.family_known"] == "false" and built.params["lm.seed"] == "0"


# --- what is not a causal LM at all ------------------------------------------------------------------------------


def test_a_bert_folder_is_refused_in_one_line_naming_its_architecture(tmp_path):
    config = transformers.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=64)
    transformers.BertForMaskedLM(config).save_pretrained(tmp_path / "bert")
    with pytest.raises(ModelError) as info:
        load_lm(model=str(tmp_path / "bert"))
    message = str(info.value)
    assert "bert" in message and "BertForMaskedLM" in message and "is_decoder" in message and "\n" not in message


@pytest.mark.parametrize(
    ("config", "why"),
    [
        (lambda: transformers.T5Config(d_model=32), "AutoModelForCausalLM has no class for t5"),
        (lambda: transformers.BartConfig(d_model=32), "encoder-decoder"),
        # a folder saved from another head would load with an untrained LM head
        (lambda: transformers.GPT2Config(architectures=["GPT2ForSequenceClassification"]),
         "saved as GPT2ForSequenceClassification, not as GPT2LMHeadModel"),
    ],
    ids=["t5-seq2seq", "bart-encoder-decoder", "gpt2-classifier"],
)
def test_a_config_that_is_not_a_causal_lm_is_refused_saying_why(config, why):
    with pytest.raises(ModelError, match=why) as info:
        check_family(config(), where="the config")
    assert "\n" not in str(info.value)



@pytest.mark.slow
def test_the_check_fails_against_a_gemma3_with_other_weights(gemma3_export, tmp_path):
    seeded_lm(transformers.Gemma3TextConfig(**TINY_GEMMA3), seed=1).save_pretrained(tmp_path / "other")
    other = load_lm(model=str(tmp_path / "other"))
    check = verify_export(other, gemma3_export.path, make_tokens(batch=1, seq_len=8, vocab_size=1000, seed=0))
    assert not check.passed and check.max_abs > 10 * check.atol
