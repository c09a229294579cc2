"""A language model's quality on real text: perplexity against a hand-computed value, the comparison with a baseline,
and the bounds table loaded and applied."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from tracker.measure.accuracy.text_quality import (
    BOUNDS_FILE,
    QualityBound,
    TextScores,
    compare_scores,
    load_bounds,
    matching_prefixes,
)
from tracker.measure.generation.text_scoring import TextCheck, TextSet, score_forward
from tracker.measure.runtimes.ort_runtime import SessionConfig

VOCAB = 5


def bigram_model(table: np.ndarray):
    """An LM whose logits at each position are the row of `table` for the token there: [batch, seq] -> [batch, seq,
    vocab] (a Gather), so its perplexity can be computed by hand."""
    node = helper.make_node("Gather", ["table", "input_ids"], ["logits"], axis=0)
    graph = helper.make_graph(
        [node], "bigram", [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "seq", VOCAB])],
        [numpy_helper.from_array(table.astype(np.float32), "table")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def table(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(VOCAB, VOCAB)) * 2


TEXT = TextSet(eval_ids=np.array([[0, 1, 2, 3, 4], [4, 4, 1, 0, 2]], dtype=np.int64),
               prompt_ids=np.array([[1, 2], [3, 0]], dtype=np.int64), new_tokens=3)


def test_perplexity_equals_the_hand_computed_value_on_a_bigram_model(tmp_path):
    logits = table(0)
    scores = score_forward(bigram_model(logits), SessionConfig(), TEXT, tmp_path)
    nll = []
    for row in TEXT.eval_ids:
        chunk = []
        for prev, nxt in zip(row[:-1], row[1:], strict=True):
            z = logits[prev].astype(np.float32).astype(np.float64)
            chunk.append(math.log(sum(math.exp(v) for v in z)) - z[nxt])
        nll.append(sum(chunk) / len(chunk))
    assert scores.chunk_nll == pytest.approx(nll, rel=1e-6)
    assert scores.perplexity == pytest.approx(math.exp(sum(nll) / len(nll)), rel=1e-6)
    # greedy: each new token is the argmax of the row of the token before it
    expected = []
    for prompt in TEXT.prompt_ids:
        token, out = prompt[-1], []
        for _ in range(3):
            token = int(np.argmax(logits[token].astype(np.float32)))
            out.append(token)
        expected.append(out)
    assert scores.greedy.tolist() == expected


def test_a_model_against_itself_keeps_every_figure(tmp_path):
    check = TextCheck(TEXT, load_bounds())
    own = check.measure(bigram_model(table(0)), SessionConfig(), precision="fp32", workdir=tmp_path / "a",
                        reference=True)
    again = check.measure(bigram_model(table(0)), SessionConfig(), precision="fp32", workdir=tmp_path / "b")
    for quality in (own, again):
        assert quality.ppl_increase == pytest.approx(0.0, abs=1e-9)
        assert quality.top1_agreement == 1.0 and quality.greedy_prefix == 1.0 and quality.greedy_exact == 1.0
        assert quality.kl_divergence == pytest.approx(0.0, abs=1e-9)
        assert quality.passed is True


def test_an_attempt_is_scored_only_after_its_reference(tmp_path):
    check = TextCheck(TEXT, load_bounds())
    with pytest.raises(ValueError, match="baseline"):
        check.measure(bigram_model(table(0)), SessionConfig(), precision="int4", workdir=tmp_path)


def scores(nll: list[float], logprobs: np.ndarray, greedy: list[list[int]]) -> TextScores:
    return TextScores(np.asarray(nll), logprobs, np.asarray(greedy, dtype=np.int64))


def flat_logprobs(chunks: int, positions: int, top: int) -> np.ndarray:
    """Log-probabilities that put 0.9 on token `top` at every position."""
    p = np.full((chunks, positions, VOCAB), 0.1 / (VOCAB - 1))
    p[..., top] = 0.9
    return np.log(p)


BOUND = QualityBound("int4", max_ppl_increase=0.10, min_top1=0.8, min_greedy_prefix=0.5)


@pytest.mark.parametrize(("increase", "passed"), [(0.05, True), (0.15, False)], ids=["+5 % passes", "+15 % fails"])
def test_the_perplexity_bound_decides_on_the_increase(increase, passed):
    base = scores([2.0, 2.2, 1.8], flat_logprobs(3, 4, 1), [[1, 2, 3]])
    worse = scores([v + math.log1p(increase) for v in (2.0, 2.2, 1.8)], flat_logprobs(3, 4, 1), [[1, 2, 3]])
    quality = compare_scores(base, worse, BOUND)
    assert quality.ppl_increase == pytest.approx(increase)
    assert quality.ppl_increase_low == pytest.approx(increase) == pytest.approx(quality.ppl_increase_high)
    assert quality.passed is passed
    assert ("perplexity" in quality.params()["quality.failed"]) is not passed


@pytest.mark.parametrize(("increase", "margin"), [(0.0, 1.0), (0.05, 0.5), (0.15, -0.5)])
def test_the_margin_is_the_share_of_the_bounds_room_left_negative_exactly_when_it_fails(increase, margin):
    base = scores([2.0, 2.2, 1.8], flat_logprobs(3, 4, 1), [[1, 2, 3]])
    worse = scores([v + math.log1p(increase) for v in (2.0, 2.2, 1.8)], flat_logprobs(3, 4, 1), [[1, 2, 3]])
    quality = compare_scores(base, worse, BOUND)
    assert quality.margin == pytest.approx(margin)  # top-1 and greedy are the baseline's: perplexity decides
    assert (quality.margin >= 0) is quality.passed


def test_the_interval_of_the_increase_comes_from_the_chunks_and_holds_the_point_estimate():
    base = scores([2.0, 2.0, 2.0, 2.0], flat_logprobs(4, 2, 0), [[0]])
    attempt = scores([2.02, 2.10, 2.05, 2.07], flat_logprobs(4, 2, 0), [[0]])
    quality = compare_scores(base, attempt, None)
    assert quality.ppl_increase_low < quality.ppl_increase < quality.ppl_increase_high
    assert quality.ppl_increase == pytest.approx(math.exp(0.06) - 1)
    assert quality.passed is None and "quality.passed" not in quality.metrics()


def test_top1_kl_and_greedy_agreement_are_measured_against_the_baseline():
    base = scores([2.0], flat_logprobs(1, 4, 1), [[1, 2, 3, 4], [0, 0, 0, 0]])
    other = flat_logprobs(1, 4, 1)
    other[0, :2] = flat_logprobs(1, 2, 3)[0]  # the first two positions now favour token 3
    attempt = scores([2.0], other, [[1, 2, 0, 4], [0, 0, 0, 0]])
    quality = compare_scores(base, attempt, BOUND)
    assert quality.top1_agreement == 0.5
    expected_kl = 0.5 * (0.9 * math.log(0.9 / 0.025) + 0.025 * math.log(0.025 / 0.9))
    assert quality.kl_divergence == pytest.approx(expected_kl)
    assert quality.greedy_prefix == pytest.approx((2 / 4 + 4 / 4) / 2)
    assert quality.greedy_exact == 0.5
    assert quality.passed is False and "top-1" in quality.failures[0]


def test_matching_prefixes_count_the_tokens_before_the_first_difference():
    base = np.array([[1, 2, 3], [1, 2, 3], [1, 2, 3]])
    other = np.array([[1, 2, 3], [9, 2, 3], [1, 2, 9]])
    assert matching_prefixes(base, other).tolist() == [3, 0, 2]


def test_the_bounds_table_has_every_precision_and_tightens_with_it():
    bounds = load_bounds()
    assert list(bounds) == ["fp32", "fp16", "int8", "int4"]
    increases = [bounds[p].max_ppl_increase for p in bounds]
    assert increases == sorted(increases)
    assert all(bounds[p].basis for p in bounds)


def test_a_users_perplexity_bound_replaces_every_precisions():
    bounds = load_bounds(max_ppl_increase=0.25)
    assert {b.max_ppl_increase for b in bounds.values()} == {0.25}
    assert bounds["int4"].min_top1 == load_bounds()["int4"].min_top1


@pytest.mark.parametrize("text", ["[int4]\nmax_ppl_increase = 0.1\n", "not = [toml", ""],
                         ids=["a missing field", "not TOML", "empty"])
def test_a_malformed_bounds_table_is_a_one_line_error_naming_the_file(tmp_path, text):
    path = tmp_path / "bounds.toml"
    path.write_text(text)
    with pytest.raises(ValueError, match="bounds") as error:
        load_bounds(path)
    assert "\n" not in str(error.value)


def test_the_bounds_table_ships_beside_its_reader():
    assert BOUNDS_FILE.is_file() and BOUNDS_FILE.parent == Path(__file__).parents[2] / "tracker/measure/accuracy"
