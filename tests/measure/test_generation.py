"""The generation scenario on the tiny GPT-2's decode-ready export: the figures, the A/A check (the model against
itself), a broken model's check, the interleaved decode step, and what is refused before anything runs."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

pytest.importorskip("torch")
pytest.importorskip("transformers")

from tracker.measure.accuracy.lm_diff import LOGITS_FP32, LOGITS_INT8  # noqa: E402
from tracker.measure.costmodel import roofline as R  # noqa: E402
from tracker.measure.costmodel.machine import MachinePeaks  # noqa: E402
from tracker.measure.generation.decoder import DecoderSession  # noqa: E402
from tracker.measure.generation.generation import GenerationConfig, measure_generation  # noqa: E402
from tracker.measure.generation.generation_check import compare_generations  # noqa: E402
from tracker.measure.runtimes.ort_runtime import SessionConfig  # noqa: E402
from tracker.measure.timing.latency import TimingConfig  # noqa: E402
from tracker.measure.timing.speedup import SpeedupConfig  # noqa: E402

# Nearly every test needs the decoder export (a dynamo export: tens of seconds).
pytestmark = pytest.mark.slow

SESSION = SessionConfig()
FAST = GenerationConfig(
    prefill_lens=(8, 32),
    decode_past_lens=(8, 32, 128),
    prompt_len=8,
    new_tokens=16,
    generation_runs=2,
    speedup_past_len=None,
    speedup_prefill_len=None,
    roofline_runs=0,
    timing=TimingConfig(warmup_runs=1, min_runs=3, min_seconds=0.0),
)


@pytest.fixture(scope="module")
def tiny_decoder(tiny_gpt2_decoder):
    return tiny_gpt2_decoder


@pytest.fixture(scope="module")
def measured(tiny_decoder):
    return measure_generation(tiny_decoder.path, session=SESSION, config=FAST, max_positions=tiny_decoder.max_positions)


def with_perturbed_lm_head(path, *, std: float, seed: int = 0) -> onnx.ModelProto:
    """The model with seeded noise added to its logits: the lm_head given a random bias."""
    model = onnx.load(str(path))
    vocab = model.graph.output[0].type.tensor_type.shape.dim[-1].dim_value
    for node in model.graph.node:
        node.output[:] = ["logits_raw" if o == "logits" else o for o in node.output]
    noise = np.random.default_rng(seed).normal(0.0, std, vocab).astype(np.float32)
    model.graph.initializer.append(numpy_helper.from_array(noise, "lm_head_noise"))
    model.graph.node.append(helper.make_node("Add", ["logits_raw", "lm_head_noise"], ["logits"], name="lm_head_noise"))
    return model


def test_every_figure_is_named_and_positive(measured):
    metrics = measured.metrics()
    expected = {"gen.prefill.s8.p50_ms", "gen.prefill.s32.p50_ms", "gen.decode.past8.p50_ms",
                "gen.decode.past32.p50_ms", "gen.decode.past128.p50_ms", "gen.ttft_ms", "gen.tokens_per_s",
                "gen.decode_tokens_per_s"}
    assert set(metrics) == expected
    assert all(np.isfinite(v) and v > 0 for v in metrics.values()), metrics


def test_the_figures_are_ordered_as_they_must_be(measured):
    for latency in (*measured.prefill.values(), *measured.decode.values()):
        assert latency.runs >= FAST.timing.min_runs
        assert 0 < latency.min_ms <= latency.p50_ms <= latency.p90_ms <= latency.max_ms
    # the first token is part of each generation, so its median cannot exceed the whole generation's
    assert measured.ttft_ms <= 1e3 * FAST.new_tokens / measured.tokens_per_s
    assert measured.generation.tokens.shape == (1, FAST.new_tokens)
    assert measured.generation.tokens.min() >= 0 and measured.generation.tokens.max() < 1000


def test_the_model_against_itself_agrees_on_every_token_with_no_divergence(tiny_decoder, measured):
    again = measure_generation(tiny_decoder.path, session=SESSION, config=FAST, reference=measured.generation)
    diff = compare_generations(measured.generation, again.generation, along=again.along_reference,
                               tolerance=LOGITS_FP32)
    assert diff.token_agreement == 1.0
    assert diff.first_divergence == FAST.new_tokens
    assert diff.first_step_kl == pytest.approx(0.0, abs=1e-12)
    assert diff.first_step_max_abs == pytest.approx(0.0, abs=1e-6)
    # Fed the first generation's tokens, the same model gives the same logits at every step: the fp32 check passes.
    assert len(again.along_reference) == FAST.new_tokens
    assert diff.passed and diff.along.top1_agreement == 1.0 and diff.along.kl_divergence < 1e-9
    assert diff.metrics()["gen.diff.passed"] == 1.0 and diff.params()["gen.diff.tolerance"] == "fp32"


def test_a_perturbed_lm_head_disagrees_with_the_baseline(tiny_decoder, measured):
    broken = with_perturbed_lm_head(tiny_decoder.path, std=1.0)
    result = measure_generation(broken, session=SESSION, config=FAST, reference=measured.generation)
    diff = compare_generations(measured.generation, result.generation, along=result.along_reference,
                               tolerance=LOGITS_INT8)
    assert diff.token_agreement < 1.0
    assert diff.first_divergence < FAST.new_tokens
    assert diff.first_step_kl > 1e-2
    assert diff.metrics()["gen.token_agreement"] == diff.token_agreement
    # Noise of std 1 on every logit is beyond even the int8 bounds, at every step of the baseline's text.
    assert diff.passed is False and diff.along.kl_divergence > LOGITS_INT8.max_kl


def test_small_noise_passes_the_int8_bounds_and_fails_the_fp32_ones(tiny_decoder, measured):
    """The check's bounds are the precision's: noise of std 0.01 on the logits is an int8-sized error."""
    slightly = with_perturbed_lm_head(tiny_decoder.path, std=0.01)
    result = measure_generation(slightly, session=SESSION, config=FAST, reference=measured.generation)
    check = {t.name: compare_generations(measured.generation, result.generation, along=result.along_reference,
                                         tolerance=t).passed for t in (LOGITS_FP32, LOGITS_INT8)}
    assert check == {"fp32": False, "int8": True}


def test_each_phase_is_timed_interleaved_against_a_baseline(tiny_decoder):
    config = GenerationConfig(prefill_lens=(8, 16), decode_past_lens=(32,), prompt_len=4, new_tokens=4,
                              generation_runs=1, speedup_past_len=32, speedup_prefill_len=16, roofline_runs=0,
                              timing=FAST.timing)
    quick = SpeedupConfig(rounds=4, max_rounds=4, seconds=0.0, round_seconds=0.0, min_pairs=3, block_ms=2.0)
    result = measure_generation(tiny_decoder.path, session=SESSION, config=config, baseline=tiny_decoder.path,
                                speedup=quick)
    assert set(result.speedups) == {"prefill", "decode"}
    assert all(s.rounds == 4 for s in result.speedups.values())
    metrics = result.metrics()
    for prefix in ("gen.decode.past32.", "gen.prefill.s16."):
        assert metrics[prefix + "speedup_ci_low"] <= metrics[prefix + "speedup"] <= metrics[prefix + "speedup_ci_high"]
    assert "gen.prefill.s8.speedup" not in metrics  # only the chosen length is timed against the baseline


def test_each_phase_is_costed_against_the_roofs_and_decode_has_the_lower_intensity(tiny_decoder):
    """The prompt pass multiplies 64 tokens by each weight, a decode step one: its matrix products move as many
    bytes for 1/64 of the FLOPs. The FLOPs of the decode step are one token's."""
    machine = MachinePeaks(peak_gflops=100.0, bandwidth_gbps=10.0, threads=1)
    config = GenerationConfig(prefill_lens=(64,), decode_past_lens=(64,), prompt_len=4, new_tokens=2,
                              generation_runs=1, speedup_past_len=None, speedup_prefill_len=None, roofline_runs=3,
                              timing=FAST.timing)
    result = measure_generation(tiny_decoder.path, session=SESSION, config=config, machine=machine)
    prefill, decode = result.rooflines["prefill"], result.rooflines["decode"]
    assert prefill.tokens_per_run == 64 and decode.tokens_per_run == 1
    assert decode.matmuls[R.INTENSITY] < prefill.matmuls[R.INTENSITY] / 8
    assert decode.gflop_per_run < prefill.gflop_per_run / 16
    metrics = result.metrics()
    assert metrics["gen.decode.past64.roofline.matmuls.pct_peak"] > 0
    assert metrics["gen.prefill.s64.roofline.memory_bound"] in (0.0, 1.0)


def test_lengths_beyond_the_position_table_are_refused_before_anything_runs(tiny_decoder):
    config = GenerationConfig(decode_past_lens=(32, 512), speedup_past_len=None)
    with pytest.raises(ValueError, match="256 positions.*past plus one token"):
        measure_generation(tiny_decoder.path, session=SESSION, config=config, max_positions=256)


def test_a_forward_only_model_is_not_decode_ready():
    ids = helper.make_tensor_value_info("input_ids", onnx.TensorProto.INT64, ["batch", "seq"])
    logits = helper.make_tensor_value_info("logits", onnx.TensorProto.INT64, ["batch", "seq"])
    graph = helper.make_graph([helper.make_node("Identity", ["input_ids"], ["logits"])], "g", [ids], [logits])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(ValueError, match="decode-ready"):
        DecoderSession.open(model, SESSION)


@pytest.mark.parametrize(
    "kwargs",
    [
        pytest.param({"prefill_lens": ()}, id="no-prefill"),
        pytest.param({"decode_past_lens": (0,)}, id="past-0"),
        pytest.param({"new_tokens": 0}, id="no-new-tokens"),
        pytest.param({"speedup_past_len": 64}, id="speedup-past-not-timed"),
        pytest.param({"speedup_prefill_len": 64}, id="speedup-prompt-not-timed"),
        pytest.param({"roofline_runs": 1}, id="one-profiled-run-is-all-warm-up"),
    ],
)
def test_the_config_refuses_what_it_cannot_measure(kwargs):
    with pytest.raises(ValueError):
        GenerationConfig(**kwargs)
