"""`shared_kv` on a narrow 12-layer GPT-2 decode export fused by `attention_fused`: GroupQueryAttention in every layer
(reading q/k/v packed), the same tokens as the source over 16 greedy steps through numpy (a past of its own length) and
through IO binding (past and present in one buffer), and a model with nothing to rewrite left as it is."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

pytest.importorskip("torch")

from tracker.gpt2.model import SIZES  # noqa: E402
from tracker.gpt2.tokens import make_tokens  # noqa: E402
from tracker.measure.generation.binding import BoundDecoder  # noqa: E402
from tracker.measure.generation.decoder import DecoderSession  # noqa: E402
from tracker.measure.runtimes.ort_runtime import SessionConfig  # noqa: E402
from tracker.optimize import FORWARD_ENTRIES, Context, ModelInfo, get_entry  # noqa: E402

pytestmark = pytest.mark.slow  # the tiny decoder is a dynamo export (shared by the session)

TINY = SIZES["tiny"]
# onnxscript 0.7.2 fuses the attention of every layer of a 12-layer decode export, but only one layer of the tiny
# 2-layer one (its first layer reads the batch from a past's shape): a narrow 12-layer model, so every layer fuses.
NARROW = {**TINY, "n_layer": 12}
INFO = ModelInfo(num_heads=NARROW["n_head"], hidden_size=NARROW["n_embd"])
STEPS = 16


def _make(spec: str, source, tmp_path):
    return get_entry(spec)(source, tmp_path, Context(info=INFO), graph=onnx.load(str(source), load_external_data=False))


@pytest.fixture(scope="module")
def narrow_decoder(tmp_path_factory):
    from tracker.gpt2.decode import export_decoder
    from tracker.gpt2.model import load_gpt2

    folder = tmp_path_factory.mktemp("narrow")
    (folder / "config.json").write_text(json.dumps({"model_type": "gpt2", **NARROW}))
    return export_decoder(load_gpt2(config_path=str(folder / "config.json")), folder / "decoder.onnx").path


@pytest.fixture(scope="module")
def shared(narrow_decoder, tmp_path_factory):
    return _make("attention_fused+shared_kv", narrow_decoder, tmp_path_factory.mktemp("shared"))


def test_every_attention_with_a_past_becomes_group_query_attention_reading_packed_qkv(shared):
    nodes = onnx.load(str(shared.path), load_external_data=False).graph.node
    ops = [n.op_type for n in nodes]
    assert ops.count("GroupQueryAttention") == NARROW["n_layer"]
    assert "MultiHeadAttention" not in ops
    # GPT-2's c_attn product goes to the attention packed: the Split into query, key and value is gone
    assert "Split" not in ops
    assert all(n.input[1] == n.input[2] == "" for n in nodes if n.op_type == "GroupQueryAttention")
    assert shared.applied and shared.fusions["GroupQueryAttention"] == NARROW["n_layer"]


@pytest.mark.parametrize("batch", [1, 2])
def test_it_decodes_the_sources_tokens_through_numpy_and_through_one_shared_buffer(batch, shared, narrow_decoder):
    prompt = make_tokens(batch=batch, seq_len=10, vocab_size=TINY["vocab_size"], seed=7)
    source = DecoderSession.open(narrow_decoder, SessionConfig()).greedy(prompt, STEPS)
    decoder = DecoderSession.open(shared.path, SessionConfig())
    plain = decoder.greedy(prompt, STEPS)
    bound = BoundDecoder(decoder, batch=batch, capacity=10 + STEPS)
    assert bound.shared
    through_buffer = bound.greedy(prompt, STEPS)
    np.testing.assert_array_equal(plain.tokens, source.tokens)
    np.testing.assert_array_equal(through_buffer.tokens, source.tokens)
    for mine, theirs in zip(through_buffer.step_logits, plain.step_logits, strict=True):
        np.testing.assert_array_equal(mine, theirs)  # the same kernel on the same positions, bit for bit
    worst = max(float(np.abs(a - b).max()) for a, b in zip(plain.step_logits, source.step_logits, strict=True))
    assert worst < 1e-3


@pytest.mark.parametrize("spec", ["shared_kv", "attention_fused+shared_kv"])
def test_a_model_without_every_attention_fused_is_left_as_it_is(spec, tiny_gpt2_decoder, tmp_path):
    candidate = _make(spec, tiny_gpt2_decoder.path, tmp_path)  # unfused; fused in one layer of two
    assert not candidate.applied
    assert "fuse attention first" in candidate.notes[-1]
    assert "shared_kv" not in FORWARD_ENTRIES  # forward-only studies and searches leave it out


# kv_int8 on the cache shared_kv made: int8 keys and values inside GroupQueryAttention, static scales calibrated on a
# prompt pass of the float model.
CALIBRATION = make_tokens(batch=2, seq_len=24, vocab_size=TINY["vocab_size"], seed=3)


@pytest.fixture(scope="module")
def int8_cache(shared, tmp_path_factory):
    source = shared.path
    context = Context(info=INFO, feeds={"input_ids": CALIBRATION})
    return get_entry("kv_int8")(source, tmp_path_factory.mktemp("kv8"), context,
                                graph=onnx.load(str(source), load_external_data=False))


def _scales(path) -> dict[str, np.ndarray]:
    model = onnx.load(str(path), load_external_data=False)
    return {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer if t.name.endswith(".scale")}


def test_kv_int8_keeps_every_cache_in_int8_with_a_scale_per_head_and_channel(int8_cache):
    model = onnx.load(str(int8_cache.path), load_external_data=False)
    caches = [v for v in [*model.graph.input, *model.graph.output] if v.name.startswith(("past_key", "present."))]
    assert len(caches) == 4 * NARROW["n_layer"]
    assert all(v.type.tensor_type.elem_type == onnx.TensorProto.INT8 for v in caches)
    heads, head_size = NARROW["n_head"], NARROW["n_embd"] // NARROW["n_head"]
    for node in (n for n in model.graph.node if n.op_type == "GroupQueryAttention"):
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        assert attrs["k_quant_type"] == attrs["v_quant_type"] == b"PER_CHANNEL" and attrs["kv_cache_bit_width"] == 8
        assert node.input[12] == f"{node.input[3]}.scale" and node.input[13] == f"{node.input[4]}.scale"
    scales = _scales(int8_cache.path)
    assert len(scales) == 2 * NARROW["n_layer"]
    assert all(s.shape == (1, heads, 1, head_size) and (s > 0).all() and np.isfinite(s).all() for s in scales.values())
    assert int8_cache.applied and int8_cache.precision == "int8"


def test_kv_int8_scales_are_the_calibration_prompts_largest_magnitude_with_the_margin(int8_cache, shared):
    from tracker.optimize.quantize.kv_cache import MARGIN

    _, presents = DecoderSession.open(shared.path, SessionConfig()).prefill(CALIBRATION)
    scales = _scales(int8_cache.path)
    for past in ("past_key_values.0.key", "past_key_values.11.value"):
        expected = np.abs(presents[past]).max(axis=(0, 2)) * MARGIN / 127
        np.testing.assert_allclose(scales[f"{past}.scale"][0, :, 0, :], expected, rtol=1e-6)


def test_kv_int8_stores_each_value_within_half_a_step_of_the_float_cache(int8_cache, shared):
    _, floats = DecoderSession.open(shared.path, SessionConfig()).prefill(CALIBRATION)
    _, ints = DecoderSession.open(int8_cache.path, SessionConfig()).prefill(CALIBRATION)
    scales = _scales(int8_cache.path)
    # the first layer's: later layers' keys and values already differ, through attention over a quantized cache
    for past in ("past_key_values.0.key", "past_key_values.0.value"):
        assert ints[past].dtype == np.int8
        scale = scales[f"{past}.scale"]
        error = np.abs(ints[past].astype(np.float32) * scale - floats[past])
        assert (error <= scale / 2 + 1e-6).all()


@pytest.mark.parametrize("batch", [1, 2])
def test_kv_int8_decodes_the_same_through_numpy_and_one_shared_buffer_close_to_the_float_cache(
        batch, int8_cache, shared):
    prompt = make_tokens(batch=batch, seq_len=10, vocab_size=TINY["vocab_size"], seed=7)
    floats = DecoderSession.open(shared.path, SessionConfig()).greedy(prompt, STEPS)
    decoder = DecoderSession.open(int8_cache.path, SessionConfig())
    plain = decoder.greedy(prompt, STEPS)
    through_buffer = BoundDecoder(decoder, batch=batch, capacity=10 + STEPS).greedy(prompt, STEPS)
    np.testing.assert_array_equal(through_buffer.tokens, plain.tokens)
    for mine, theirs in zip(through_buffer.step_logits, plain.step_logits, strict=True):
        np.testing.assert_array_equal(mine, theirs)
    worst = max(float(np.abs(a - b).max()) for a, b in zip(plain.step_logits, floats.step_logits, strict=True))
    assert 0 < worst < 0.05  # quantized: not the float cache's logits, but near them
    assert (plain.tokens == floats.tokens).mean() >= 0.9


def test_kv_int8_per_tensor_gives_one_scale_per_cache(shared, tmp_path):
    candidate = _make("kv_int8:per_channel=false", shared.path, tmp_path)
    assert all(s.shape == (1,) for s in _scales(candidate.path).values())


def test_kv_int8_leaves_a_model_without_a_cached_group_query_attention_as_it_is(narrow_decoder, tmp_path):
    candidate = _make("kv_int8", narrow_decoder, tmp_path)
    assert not candidate.applied and "shared_kv" in candidate.notes[-1]
