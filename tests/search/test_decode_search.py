"""The decode search: a causal LM's decode chains searched for the fastest decode step at the
scenario's past that passes the generation check, on the tiny GPT-2's decode-ready export and real sessions."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest

from tracker.measure.accuracy.lm_diff import LOGITS_FP32, LOGITS_TOLERANCES
from tracker.measure.attempt import Attempt, AttemptResult
from tracker.measure.generation.decoder import DecoderSession
from tracker.measure.generation.generation import GenerationConfig
from tracker.measure.runtimes.ort_runtime import SessionConfig
from tracker.optimize import Candidate, ModelInfo, get_entry
from tracker.outcome import Failed, Measured, Outcome, Pending
from tracker.search import SearchConfig
from tracker.search.decode import (
    DECODE_SCREEN,
    DecodeSetup,
    DecodeSpace,
    DecodeTarget,
    added_rounding,
    default_weights,
    screen_decode,
    step_bytes,
)
from tracker.search.decode_search import DecodeSearch
from tracker.search.result import Proposal, Row, SearchResult, Strategy, full_measurement

PAST = 32
# The tiny GPT-2: 2 layers of 4 heads of 16, 64 wide, 1000 tokens; per layer c_attn 64x192, c_proj 64x64, c_fc 64x256,
# c_proj 256x64 (Gemm), and the tied lm_head 1000x64 (through a Transpose).
LAYER_WEIGHTS = 64 * 192 + 64 * 64 + 64 * 256 + 256 * 64
LM_HEAD = 1000 * 64
KV_PER_POSITION = 2 * 2 * 4 * 16  # layers x (key, value) x heads x head_dim


@pytest.fixture(scope="module")
def target(tiny_gpt2_decoder) -> DecodeTarget:
    session = SessionConfig(intra_op_num_threads=1)
    decoder = DecoderSession.open(str(tiny_gpt2_decoder.path), session)
    prompt = np.random.default_rng(0).integers(0, 1000, size=(1, 8), dtype=np.int64)
    config = GenerationConfig(prefill_lens=(8,), decode_past_lens=(PAST,), prompt_len=8, new_tokens=8,
                              speedup_past_len=PAST, speedup_prefill_len=8)
    setup = DecodeSetup(tiny_gpt2_decoder.path, config, session, LOGITS_TOLERANCES,
                        info=ModelInfo(num_heads=4, hidden_size=64))
    return DecodeTarget(setup, decoder.greedy(prompt, 8))


def _graph(tiny_gpt2_decoder) -> onnx.ModelProto:
    return onnx.load_model(str(tiny_gpt2_decoder.path), load_external_data=False)


def _steps(spec: str):
    return get_entry(spec).steps


def test_the_bytes_a_step_reads_by_hand(tiny_gpt2_decoder):
    model, weights = _graph(tiny_gpt2_decoder), 2 * LAYER_WEIGHTS + LM_HEAD
    kv = KV_PER_POSITION * PAST

    def count(steps):
        return step_bytes(model, steps, past_len=PAST, vocab=1000)

    assert count(()) == weights * 4 + kv * 4 * 2  # fp32 weights and cache, the present copied out
    assert count(_steps("attention_fused+io_binding")) == weights * 4 + kv * 4
    int4 = 0.5 + 4 / 32  # 4 bits and an fp32 scale per block of 32
    assert count(_steps("attention_fused+int4_block32+io_binding")) == pytest.approx(weights * int4 + kv * 4)
    assert count(_steps("attention_fused+int4_block32:symmetric=false:block_size=128+kv_int8")) == pytest.approx(
        weights * (0.5 + 4 / 128 + 0.5 / 128) + kv * 1 * 2)  # a 4-bit zero point per block; an int8 cache
    assert count(_steps("attention_fused+int4_block32:lm_head=int8+io_binding")) == pytest.approx(
        2 * LAYER_WEIGHTS * int4 + LM_HEAD * (1 + 4 / 32) + kv * 4)


def test_the_space_combines_weights_cache_and_settings_and_ranks_added_rounding():
    graphs = DecodeSpace().graphs()
    assert len(graphs) == len(default_weights()) * 2  # each weights with an fp32 and an int8 KV cache
    assert all(len(candidates) == 3 for _, candidates in graphs)
    names = {c.name for _, candidates in graphs for c in candidates}
    assert "attention_fused+shared_kv+int4_block32+kv_int8+io_binding+ort_threads_1" in names
    assert "attention_fused+shared_kv" in names  # fp32 weights, numpy feeds
    plain = get_entry("attention_fused+shared_kv+int4_block32:accuracy_level=0")
    key, added = added_rounding(plain)
    assert added == frozenset()
    assert added_rounding(get_entry("attention_fused+shared_kv+int4_block32+kv_int8")) == (
        key, frozenset({"int8 activations", "an int8 KV cache"}))
    assert added_rounding(get_entry("attention_fused+shared_kv+int4_block32:block_size=128"))[0] != key
    with pytest.raises(ValueError, match="rewrite the model"):
        DecodeSpace(weights=("fp32",), kv_cache=("io_binding",)).graphs()


def test_a_decode_screen_races_out_a_candidate_that_cannot_beat_the_leader_and_reads_an_aa_near_one(target):
    same = Candidate(path=target.setup.decoder, applied=True, fusions={}, fully_optimized=None, precision="fp32")

    found, raced_out = screen_decode(same, target, must_beat=3.0)

    assert found.rounds < DECODE_SCREEN.rounds, "stopped before the fixed rounds"
    assert 0.7 < found.speedup < 1.4, "the baseline against itself"
    assert raced_out == f"dropped after {found.pairs} pairs (upper bound {found.ci_high:.2f}x < the leader's 3.00x)"


@pytest.mark.slow
def test_the_search_checks_each_graph_once_screens_its_settings_and_hands_the_leaders_on(target, tmp_path):
    space = DecodeSpace(weights=("int4_block32:accuracy_level=0", "fp32"), sessions=("", "io_binding"))

    result, sent = _drive(DecodeSearch(target, workdir=tmp_path, space=space, config=SearchConfig(max_full=2)))

    rows = {r.name: r for r in result.rows}
    assert len(rows) == 2 * 2 * 2  # weights x cache x settings
    # the group of fewest bytes first (int4), the least rounding first in it (the fp32 cache), then the int8 cache;
    # each graph's settings by their bytes (IO binding first)
    assert [r.name for r in result.rows[:4]] == ["attention_fused+shared_kv+int4_block32.acc-0+io_binding",
                                                 "attention_fused+shared_kv+int4_block32.acc-0",
                                                 "attention_fused+shared_kv+int4_block32.acc-0+kv_int8+io_binding",
                                                 "attention_fused+shared_kv+int4_block32.acc-0+kv_int8"]
    assert all(r.passed and r.diff["gen.token_agreement"] >= 0 for r in rows.values())
    assert all(r.screen_speedup is not None for r in rows.values())
    assert {r.precision for r in rows.values()} == {"int4", "fp32"}
    assert 1 <= len(sent) <= 2 and all(tags == {"tracker.search.stage": "speed_screen"} for _, tags in sent)
    best = max((r for r in rows.values() if not r.reason.startswith("decode screen: dropped")),
               key=lambda r: r.screen_speedup)
    assert sent[0][0] == best.name, "the screen's best is measured in full first"
    assert {name for name, _ in sent} == {r.name for r in rows.values() if r.status == "timed"}
    assert not list(tmp_path.glob("made/*")), "each graph's files go once its settings are screened"


def test_a_graph_that_fails_the_check_spares_those_that_only_add_rounding_to_it(target, tmp_path):
    tolerances = {**LOGITS_TOLERANCES, "int4": replace(LOGITS_FP32, name="int4")}
    strict = replace(target, setup=replace(target.setup, tolerances=tolerances))
    space = DecodeSpace(weights=("int4_block32:accuracy_level=0", "int4_block32", "int4_block32:block_size=128"),
                        sessions=("io_binding",))

    result, sent = _drive(DecodeSearch(strict, workdir=tmp_path, space=space))

    rows = {r.name: r for r in result.rows}
    failed = "attention_fused+shared_kv+int4_block32.acc-0"
    assert rows[failed + "+io_binding"].passed is False
    assert "generation check failed: along the baseline's tokens" in rows[failed + "+io_binding"].reason
    for lossier in ("attention_fused+shared_kv+int4_block32.acc-0+kv_int8+io_binding",
                    "attention_fused+shared_kv+int4_block32+io_binding",
                    "attention_fused+shared_kv+int4_block32+kv_int8+io_binding"):
        assert rows[lossier].status == "screened" and rows[lossier].passed is None  # screened out, not left over
        assert rows[lossier].reason == f"not tried: {failed} failed the generation check, and this only adds " \
                                       "rounding to it"
    # block 128 is other weights: checked (and failed) on its own
    assert rows["attention_fused+shared_kv+int4_block32.b-128+io_binding"].passed is False
    assert sent == [] and result.counts()["timed"] == 0
    assert result.coverage_line().endswith("the budget reached every one")


def test_a_budget_that_cannot_cover_a_graph_leaves_every_row_with_the_reason(target, tmp_path):
    space = DecodeSpace(weights=("fp32",), sessions=("",))

    result, _ = _drive(DecodeSearch(target, workdir=tmp_path, space=space, config=SearchConfig(budget_s=1.0),
                                    full_attempt_s=0.5))

    assert [r.status for r in result.rows] == ["skipped", "skipped"]
    assert all(r.reason == "not tried: the budget was kept for the leaders" for r in result.rows)
    assert "the budget did not reach fp32 (2 of 2)" in result.coverage_line()


def test_a_leaders_row_says_what_its_full_measurement_gave_back():
    rows = [Row(name, name, "quantization", stage="speed_screen") for name in ("a", "b", "c")]
    outcomes = [Measured(AttemptResult(attempt=Attempt(name="a", model=Path("a.onnx")))), Pending("b", 3),
                Failed("c", "the node went away")]

    measured = [full_measurement(row, outcome) for row, outcome in zip(rows, outcomes)]

    assert [(r.stage, r.status) for r in measured] == [("full", "timed"), ("full", "timed"), ("full", "failed")]
    assert measured[2].reason == "its full measurement failed: the node went away"
    assert [(r.stage, r.status) for r in rows] == [("speed_screen", "screened")] * 3  # a row is never changed


def _drive(search: Strategy, answer: Callable[[Proposal], Outcome] = lambda p: Pending(p.entry.name, 0),
           ) -> tuple[SearchResult, list[tuple[str, dict[str, str]]]]:
    """Runs `search` as a study would, each proposal answered by `answer` (default: sent to a cluster): its result,
    and the proposals with their tags in order."""
    sent = []
    for proposal in search.proposals():
        sent.append((proposal.entry.name, dict(proposal.tags)))
        search.record(proposal, answer(proposal))
    return search.result(), sent
