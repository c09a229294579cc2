"""Where a decode step's time goes, on the tiny GPT-2's decode-ready export (and int4/int8 versions of it): each runtime
node in its part, the lm_head's share growing with the vocabulary, a known host cost landing in the KV cache I/O,
and the split logged by the generation scenario."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from tracker.measure.costmodel.step_split import Part, classify_nodes  # noqa: E402
from tracker.measure.generation.decode_split import numpy_step, profile_steps  # noqa: E402
from tracker.measure.generation.decoder import DecoderSession  # noqa: E402
from tracker.measure.generation.generation import GenerationConfig, measure_generation  # noqa: E402
from tracker.measure.runtimes.ort_runtime import SessionConfig  # noqa: E402
from tracker.measure.timing.latency import TimingConfig  # noqa: E402

pytestmark = pytest.mark.slow  # the decoder exports take seconds each

SESSION = SessionConfig()
PAST = 32
RUNS = 12
PARTS_OF = {"layer": Part.LAYER_MATMULS, "lm_head": Part.LM_HEAD}


@pytest.fixture(scope="module")
def wide_vocab_decoder(tmp_path_factory):
    """The tiny GPT-2 with a 16x larger vocabulary (16,000 tokens): the same layers, a 16x larger lm_head."""
    from transformers import GPT2Config

    from tracker.gpt2.decode import export_decoder
    from tracker.gpt2.model import SIZES, load_gpt2

    folder = tmp_path_factory.mktemp("tiny-gpt2-wide-vocab")
    config = folder / "config.json"
    GPT2Config(**{**SIZES["tiny"], "vocab_size": 16_000}).to_json_file(str(config))
    return export_decoder(load_gpt2(config_path=str(config), seed=0), folder / "decoder.onnx")


@pytest.fixture(scope="module")
def quantized(tiny_gpt2_decoder, tmp_path_factory):
    """The tiny decoder through the registry's int4 and int8 entries: name -> model path."""
    from tracker.optimize import REGISTRY, Context, ModelInfo

    folder = tmp_path_factory.mktemp("tiny-gpt2-decoder-quantized")
    context = Context(info=ModelInfo(num_heads=tiny_gpt2_decoder.num_heads, hidden_size=64))
    graph = onnx.load(str(tiny_gpt2_decoder.path), load_external_data=False)
    return {name: REGISTRY[name](tiny_gpt2_decoder.path, folder / name, context, graph=graph).path
            for name in ("int4_block32", "int8_dynamic")}


def decode_feeds(path, past: int = PAST) -> dict[str, np.ndarray]:
    decoder = DecoderSession.open(path, SESSION)
    vocab = decoder.session.get_outputs()[0].shape[-1]
    return decoder.phase_feeds(np.random.default_rng(0).integers(0, vocab, (1, past + 1), dtype=np.int64), past)


def profiled(path, tmp_path, bind=None):
    return profile_steps(path, SESSION, bind or numpy_step(decode_feeds(path)), runs=RUNS, workdir=tmp_path)


@pytest.mark.parametrize("attempt", ["baseline", "int4_block32", "int8_dynamic"])
def test_each_runtime_node_of_the_tiny_decoder_lands_in_its_part(tiny_gpt2_decoder, quantized, attempt, tmp_path):
    path = tiny_gpt2_decoder.path if attempt == "baseline" else quantized[attempt]
    steps = profiled(path, tmp_path)
    parts = classify_nodes(steps.graph)
    by_op: dict[str, set[Part]] = {}
    for node in steps.graph.node:
        by_op.setdefault(node.op_type, set()).add(parts[node.name])
    (lm_head,) = [n for n in steps.graph.node if "logits" in n.output]
    assert parts[lm_head.name] == Part.LM_HEAD
    assert {n.op_type for n in steps.graph.node if parts[n.name] == Part.LM_HEAD} == {lm_head.op_type}
    weighted = {"baseline": "Gemm", "int4_block32": "MatMulNBits", "int8_dynamic": "DynamicQuantizeMatMul"}[attempt]
    assert by_op[weighted] == {Part.LAYER_MATMULS} or by_op[weighted] == {Part.LAYER_MATMULS, Part.LM_HEAD}
    assert by_op["Softmax"] == {Part.ATTENTION} and Part.ATTENTION in by_op["FusedMatMul"]
    assert sum(parts[n.name] == Part.KV_IO for n in steps.graph.node) == 2 * tiny_gpt2_decoder.n_layer
    for op in ("FastGelu", "Gather"):
        assert by_op[op] == {Part.OTHER}
    # every profiled kernel is a node of the runtime graph, which is kept without its weights
    assert set(steps.profile.events["node_name"].astype(str)) <= set(parts)
    assert (tmp_path / "ort_optimized_model.onnx").is_file()
    assert not (tmp_path / "ort_optimized_model.weights.bin").exists()


@pytest.mark.timing
def test_the_lm_head_share_grows_with_the_vocabulary_and_the_parts_add_up(tiny_gpt2_decoder, wide_vocab_decoder,
                                                                          tmp_path):
    small = profiled(tiny_gpt2_decoder.path, tmp_path / "small")
    wide = profiled(wide_vocab_decoder.path, tmp_path / "wide")
    small_split, wide_split = small.split(), wide.split()
    # 16x the lm_head's weight, the same layers
    assert wide_split.lm_head_ms > 4 * small_split.lm_head_ms
    assert wide_split.share(Part.LM_HEAD) > 2 * small_split.share(Part.LM_HEAD)
    for steps, split in ((small, small_split), (wide, wide_split)):
        # the parts add up to the step exactly (each step splits exactly), to float rounding
        assert sum(split.part_ms(p) for p in Part) == pytest.approx(split.step_ms, rel=1e-9)
        # the step is the mean of the middle half of the steps' wall times (the first dropped)
        ranked = sorted(steps.wall_ms[1:])
        assert ranked[len(ranked) // 4] <= split.step_ms <= ranked[-(-3 * len(ranked) // 4) - 1]
        # each step's wall time holds its model_run: the two are paired step by step
        model_run_ms = steps.profile.runs["dur_us"].to_numpy() / 1e3
        assert (np.asarray(steps.wall_ms) >= model_run_ms).all()
        assert split.kv_host_ms > 0 and split.kv_concat_ms > 0 and split.attention_ms > 0


@pytest.mark.timing
def test_a_known_host_cost_lands_in_the_kv_cache_io(tiny_gpt2_decoder, tmp_path):
    """A runner that sleeps 5 ms before each step: the host's part grows by at least that, the kernels' do not."""
    import time

    feeds = decode_feeds(tiny_gpt2_decoder.path)

    def sleepy(session):
        def run():
            time.sleep(0.005)
            return session.run(None, feeds)
        return run

    plain = profiled(tiny_gpt2_decoder.path, tmp_path / "plain").split()
    slow = profiled(tiny_gpt2_decoder.path, tmp_path / "slow", bind=sleepy).split()
    assert plain.kv_host_ms < 5.0 <= slow.kv_host_ms
    assert slow.kv_io_ms - plain.kv_io_ms > 4.0
    assert slow.kv_io_ms - slow.kv_host_ms == pytest.approx(slow.kv_concat_ms)


def test_a_runner_that_runs_the_session_twice_per_step_is_refused(tiny_gpt2_decoder, tmp_path):
    feeds = decode_feeds(tiny_gpt2_decoder.path)

    def twice(session):
        return lambda: (session.run(None, feeds), session.run(None, feeds))

    with pytest.raises(ValueError, match="exactly once per call"):
        profile_steps(tiny_gpt2_decoder.path, SESSION, twice, runs=3, workdir=tmp_path)


def test_the_generation_scenario_logs_the_decode_split_at_its_length(tiny_gpt2_decoder):
    config = GenerationConfig(prefill_lens=(8,), decode_past_lens=(8, PAST), prompt_len=4, new_tokens=2,
                              generation_runs=1, speedup_past_len=None, speedup_prefill_len=None, roofline_runs=4,
                              timing=TimingConfig(warmup_runs=1, min_runs=3, min_seconds=0.0))
    result = measure_generation(tiny_gpt2_decoder.path, session=SESSION, config=config)
    assert result.decode_split is not None
    metrics = result.metrics()
    split_keys = {k for k in metrics if ".split." in k}
    expected = {f"gen.decode.past{PAST}.split.{part}_{unit}" for part in Part for unit in ("ms", "share")}
    assert expected <= split_keys
    assert all(k.startswith(f"gen.decode.past{PAST}.split.") for k in split_keys)
    parts_ms = sum(metrics[f"gen.decode.past{PAST}.split.{part}_ms"] for part in Part)
    assert parts_ms == pytest.approx(metrics[f"gen.decode.past{PAST}.split.step_ms"], rel=1e-9)
