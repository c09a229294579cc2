"""Decoding through IO binding (`BoundDecoder`) against the numpy decode loop, on the tiny GPT-2 decode export and its
int4 quantization: the same tokens bit for bit, the same logits, and a past that the buffers cannot hold refused."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

pytest.importorskip("torch")

from tracker.gpt2.model import SIZES  # noqa: E402
from tracker.gpt2.tokens import make_tokens  # noqa: E402
from tracker.measure.generation.binding import BoundDecoder  # noqa: E402
from tracker.measure.generation.decoder import DecoderSession  # noqa: E402
from tracker.measure.runtimes.ort_runtime import SessionConfig  # noqa: E402
from tracker.optimize import REGISTRY, Context, ModelInfo  # noqa: E402

pytestmark = pytest.mark.slow  # the tiny decoder is a dynamo export (tens of seconds, shared by the session)

VOCAB = SIZES["tiny"]["vocab_size"]
STEPS = 16


@pytest.fixture(scope="module")
def int4_decoder(tiny_gpt2_decoder, tmp_path_factory):
    path = tiny_gpt2_decoder.path
    info = ModelInfo(num_heads=SIZES["tiny"]["n_head"], hidden_size=SIZES["tiny"]["n_embd"])
    made = REGISTRY["int4_block32"](path, tmp_path_factory.mktemp("int4"), Context(info=info),
                                    graph=onnx.load(str(path), load_external_data=False))
    return made.path


@pytest.mark.parametrize("which", ["fp32", "int4"])
@pytest.mark.parametrize("batch", [1, 2])
def test_io_binding_makes_the_same_tokens_bit_for_bit_as_the_numpy_loop(which, batch, tiny_gpt2_decoder,
                                                                        int4_decoder):
    path = tiny_gpt2_decoder.path if which == "fp32" else int4_decoder
    decoder = DecoderSession.open(path, SessionConfig())
    prompt = make_tokens(batch=batch, seq_len=12, vocab_size=VOCAB, seed=3)
    plain = decoder.greedy(prompt, STEPS)
    bound = BoundDecoder(decoder, batch=batch, capacity=12 + STEPS).greedy(prompt, STEPS)
    np.testing.assert_array_equal(bound.tokens, plain.tokens)
    for mine, theirs in zip(bound.step_logits, plain.step_logits, strict=True):
        np.testing.assert_array_equal(mine, theirs)


def test_a_timed_step_is_the_same_step_every_call_and_leaves_the_past_where_it_was(tiny_gpt2_decoder):
    decoder = DecoderSession.open(tiny_gpt2_decoder.path, SessionConfig())
    tokens = make_tokens(batch=1, seq_len=41, vocab_size=VOCAB, seed=5)
    bound = BoundDecoder(decoder, batch=1, capacity=64)
    run = bound.step_runner(tokens, 40)
    first, second = run().copy(), run().copy()
    np.testing.assert_array_equal(first, second)
    assert bound.past_len == 40
    plain_logits, _ = decoder.step(tokens[:, 40:], decoder.prefill(tokens[:, :40])[1])
    np.testing.assert_array_equal(first, plain_logits)


def test_a_step_past_the_buffers_capacity_is_refused_before_it_runs(tiny_gpt2_decoder):
    bound = BoundDecoder(DecoderSession.open(tiny_gpt2_decoder.path, SessionConfig()), batch=1, capacity=8)
    bound.prefill(make_tokens(batch=1, seq_len=6, vocab_size=VOCAB, seed=0))
    with pytest.raises(ValueError, match="exceed the buffers' capacity 8"):
        bound.step(make_tokens(batch=1, seq_len=3, vocab_size=VOCAB, seed=1))
    with pytest.raises(ValueError, match="batch 1"):
        bound.step(make_tokens(batch=2, seq_len=1, vocab_size=VOCAB, seed=1))


def test_the_generation_scenario_decodes_through_io_binding_when_the_session_says_so(tiny_gpt2_decoder):
    from dataclasses import replace

    from tracker.measure.generation.generation import GenerationConfig, measure_generation
    from tracker.measure.timing.latency import TimingConfig
    from tracker.measure.timing.speedup import SpeedupConfig

    config = GenerationConfig(prefill_lens=(8,), decode_past_lens=(32,), prompt_len=4, new_tokens=8,
                              generation_runs=1, speedup_past_len=32, speedup_prefill_len=None, roofline_runs=3,
                              timing=TimingConfig(warmup_runs=1, min_runs=3, min_seconds=0.0))
    quick = SpeedupConfig(rounds=4, max_rounds=4, seconds=0.0, round_seconds=0.0, min_pairs=3, block_ms=2.0)
    path = tiny_gpt2_decoder.path
    plain = measure_generation(path, session=SessionConfig(), config=config)
    bound = measure_generation(path, session=replace(SessionConfig(), decode_io_binding=True), config=config,
                               baseline=path, speedup=quick, reference=plain.generation)
    assert bound.io_binding and not plain.io_binding
    np.testing.assert_array_equal(bound.generation.tokens, plain.generation.tokens)
    for mine, theirs in zip(bound.along_reference, plain.generation.step_logits, strict=True):
        np.testing.assert_array_equal(mine, theirs)
    metrics = bound.metrics()
    prefix = "gen.decode.past32."
    # the tokens per second a user quotes and the verdict's interval are one measurement
    assert metrics[prefix + "tokens_per_s"] == pytest.approx(
        metrics[prefix + "baseline_tokens_per_s"] * metrics[prefix + "speedup"])
    assert metrics[prefix + "tokens_per_s_ci_low"] <= metrics[prefix + "tokens_per_s"] <= \
        metrics[prefix + "tokens_per_s_ci_high"]
    assert bound.decode_split is not None  # the profiled steps ran through the binding, one run per step
