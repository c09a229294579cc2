"""Tests of tracker.gpt2 on the tiny GPT-2: loading offline, tokens, both exporters, and the export check."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from tracker.base.errors import FeedError, ModelError  # noqa: E402
from tracker.gpt2.export import EXPORTERS, ExportResult, export_gpt2, verify_export  # noqa: E402
from tracker.gpt2.model import SIZES, LoadedGPT2, load_gpt2  # noqa: E402
from tracker.gpt2.tokens import feeds_for, make_tokens, tokenize  # noqa: E402
from tracker.measure.runtimes.ort_runtime import SessionConfig, make_session  # noqa: E402


@pytest.fixture(scope="module")
def tiny() -> LoadedGPT2:
    return load_gpt2(size="tiny", seed=0)


@pytest.fixture(scope="module", params=EXPORTERS)
def exported(request, tiny_gpt2_export) -> ExportResult:
    return tiny_gpt2_export(request.param)  # of `load_gpt2(size="tiny", seed=0)`, as `tiny`


def _tokens(batch: int, seq_len: int, seed: int = 0) -> np.ndarray:
    return make_tokens(batch=batch, seq_len=seq_len, vocab_size=SIZES["tiny"]["vocab_size"], seed=seed)


def _bias_and_norm_params(loaded: LoadedGPT2) -> dict[str, torch.Tensor]:
    return {
        name: param
        for name, param in loaded.model.named_parameters()
        if name.endswith("bias") or ".ln_" in name or "ln_f" in name
    }


# --- export ---------------------------------------------------------------------------------------


@pytest.mark.slow
def test_both_exporters_write_a_model_that_passes_the_onnx_checker(exported):
    onnx.checker.check_model(str(exported.path), full_check=True)
    assert exported.node_count > 0
    assert exported.seconds > 0


@pytest.mark.slow
def test_the_export_takes_int64_input_ids_and_gives_logits_with_dynamic_batch_and_seq(exported):
    model = onnx.load(str(exported.path))
    assert exported.input_names == ("input_ids",)
    assert exported.output_names == ("logits",)
    (ids,) = model.graph.input
    (logits,) = model.graph.output
    assert ids.type.tensor_type.elem_type == onnx.TensorProto.INT64
    ids_dims = [d.dim_param or d.dim_value for d in ids.type.tensor_type.shape.dim]
    logits_dims = [d.dim_param or d.dim_value for d in logits.type.tensor_type.shape.dim]
    assert all(isinstance(d, str) for d in ids_dims), ids_dims
    assert all(isinstance(d, str) for d in logits_dims[:2]) and logits_dims[2] == SIZES["tiny"]["vocab_size"]


@pytest.mark.slow
def test_the_export_records_the_default_opset_of_its_exporter(exported):
    model = onnx.load(str(exported.path), load_external_data=False)
    opset = {o.domain: o.version for o in model.opset_import}[""]
    assert opset == exported.opset == {"dynamo": 20, "torchscript": 17}[exported.exporter]


@pytest.mark.slow
@pytest.mark.parametrize(("batch", "seq_len"), [(1, 5), (3, 17)], ids=["batch1-seq5", "batch3-seq17"])
def test_the_export_runs_and_matches_torch_at_other_batch_sizes_and_lengths(exported, tiny, batch, seq_len):
    tokens = _tokens(batch, seq_len, seed=batch)
    session = make_session(exported.path, SessionConfig())
    (logits,) = session.run(None, feeds_for(tokens, exported.input_names))
    assert logits.shape == (batch, seq_len, tiny.vocab_size)
    assert verify_export(tiny, exported.path, tokens).passed


@pytest.mark.slow
def test_verify_export_passes_for_both_exporters(exported, tiny):
    check = verify_export(tiny, exported.path, _tokens(2, 8))
    assert check.passed
    assert check.max_abs < check.atol == 1e-4


@pytest.mark.slow
def test_verify_export_reports_a_mismatch_without_raising(exported):
    other = load_gpt2(size="tiny", seed=1)
    check = verify_export(other, exported.path, _tokens(1, 8))
    assert not check.passed
    assert check.max_abs > check.atol


def test_an_unknown_exporter_raises_value_error_listing_the_exporters(tiny, tmp_path):
    with pytest.raises(ValueError, match="dynamo.*torchscript"):
        export_gpt2(tiny, tmp_path / "m.onnx", exporter="jit")


# --- loading ---------------------------------------------------------------------------------------


def test_biases_and_layernorm_are_not_exactly_zero_or_one(tiny):
    params = _bias_and_norm_params(tiny)
    assert len(params) == 4 * SIZES["tiny"]["n_layer"] + 4 * SIZES["tiny"]["n_layer"] + 2
    for name, param in params.items():
        exact = 1.0 if name.endswith("weight") else 0.0
        assert not torch.any(param == exact), name
        assert float((param.detach() - exact).abs().max()) < 0.2, name


def test_the_same_seed_gives_identical_weights_and_another_seed_different_ones(tiny):
    same = load_gpt2(size="tiny", seed=0).model.state_dict()
    other = load_gpt2(size="tiny", seed=1).model.state_dict()
    for name, value in tiny.model.state_dict().items():
        assert torch.equal(value, same[name]), name
        assert not torch.equal(value, other[name]), name


def test_a_built_model_is_in_eval_mode_and_says_where_it_came_from(tiny):
    assert not tiny.model.training
    assert not tiny.pretrained
    assert tiny.source == "config:tiny"
    assert (tiny.num_heads, tiny.hidden_size, tiny.vocab_size) == (4, 64, 1000)
    assert tiny.params["gpt2.size"] == "tiny" and tiny.params["gpt2.seed"] == "0"
    assert all(isinstance(v, str) for v in tiny.params.values())


def test_a_config_file_builds_the_same_model_as_its_size(tiny, tmp_path):
    path = tmp_path / "config.json"
    tiny.config.to_json_file(path)
    loaded = load_gpt2(config_path=str(path), seed=0)
    assert loaded.source == f"config-file:{path}"
    for name, value in tiny.model.state_dict().items():
        assert torch.equal(value, loaded.model.state_dict()[name]), name


def test_from_pretrained_on_a_saved_directory_gives_the_same_logits(tmp_path):
    original = load_gpt2(size="tiny", seed=3)
    original.model.save_pretrained(tmp_path)
    loaded = load_gpt2(model=str(tmp_path))
    assert loaded.pretrained and loaded.source == f"local:{tmp_path}"
    assert not loaded.model.training
    ids = torch.from_numpy(_tokens(2, 8))
    with torch.no_grad():
        want = original.model(input_ids=ids, use_cache=False).logits
        got = loaded.model(input_ids=ids, use_cache=False).logits
    assert torch.equal(want, got)


def test_an_unavailable_model_name_raises_model_error_mentioning_offline():
    with pytest.raises(ModelError, match="offline") as info:
        load_gpt2(model="definitely-not-a-local-model")
    assert "definitely-not-a-local-model" in str(info.value)


def test_an_unknown_size_raises_value_error_listing_the_sizes():
    with pytest.raises(ValueError, match="small.*tiny|tiny.*small"):
        load_gpt2(size="huge")


# --- tokens ----------------------------------------------------------------------------------------


def test_make_tokens_is_reproducible_and_within_the_vocabulary():
    a = make_tokens(batch=3, seq_len=50, vocab_size=7, seed=5)
    assert a.dtype == np.int64 and a.shape == (3, 50)
    assert np.array_equal(a, make_tokens(batch=3, seq_len=50, vocab_size=7, seed=5))
    assert not np.array_equal(a, make_tokens(batch=3, seq_len=50, vocab_size=7, seed=6))
    assert a.min() >= 0 and a.max() < 7


def test_feeds_for_adds_an_all_ones_attention_mask_only_when_the_model_takes_one():
    tokens = _tokens(2, 4)
    assert set(feeds_for(tokens, ["input_ids"])) == {"input_ids"}
    feeds = feeds_for(tokens, ["input_ids", "attention_mask"])
    assert np.array_equal(feeds["attention_mask"], np.ones((2, 4), dtype=np.int64))


def test_feeds_for_refuses_inputs_it_cannot_fill():
    with pytest.raises(FeedError, match="past_key_values.0.key"):
        feeds_for(_tokens(1, 4), ["input_ids", "past_key_values.0.key"])


def test_tokenize_returns_none_when_no_tokenizer_is_available(tmp_path):
    assert tokenize("hello", tokenizer_path="definitely-not-a-local-model", seq_len=8) is None
    assert tokenize("hello", tokenizer_path=str(tmp_path), seq_len=8) is None


def test_tokenize_with_a_local_tokenizer_fills_exactly_seq_len(tmp_path):
    from transformers import GPT2Tokenizer
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    vocab = {c: i for i, c in enumerate(bytes_to_unicode().values())}
    vocab["he"], vocab["<|endoftext|>"] = len(vocab), len(vocab) + 1
    GPT2Tokenizer(vocab=vocab, merges=[("h", "e")]).save_pretrained(tmp_path)
    tokens = tokenize("hello", tokenizer_path=str(tmp_path), seq_len=10)
    assert tokens.dtype == np.int64 and tokens.shape == (1, 10)
    assert tokens[0, :4].tolist() == [vocab["he"], vocab["l"], vocab["l"], vocab["o"]]
    assert tokens[0, 4:8].tolist() == tokens[0, :4].tolist()
