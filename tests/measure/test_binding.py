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
