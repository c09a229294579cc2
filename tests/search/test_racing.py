"""Racing: a candidate's speed screen stops as soon as it cannot win (its upper bound below the
baseline or the leader's lower bound), on real sessions; a candidate as fast as the baseline (an A/A) is never
dropped against the baseline."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tracker.measure.attempt import Attempt
from tracker.measure.runtimes.ort_runtime import SessionConfig
from tracker.optimize import Candidate
from tracker.search.screen import SHORT_SCREEN, screen_speed

SIZE = 64


def _chain(path: Path, products: int) -> Path:
    """X [8, 64] through `products` MatMuls by 64x64 weights: the time grows with `products`."""
    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array((rng.standard_normal((SIZE, SIZE)) / 8).astype(np.float32), f"w{i}")
               for i in range(products)]
    names = ["X", *(f"h{i}" for i in range(products - 1)), "Y"]
    nodes = [helper.make_node("MatMul", [names[i], f"w{i}"], [names[i + 1]]) for i in range(products)]
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [8, SIZE])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [8, SIZE])], weights)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("racing")
    return {"baseline": _chain(folder / "one.onnx", 1), "same": _chain(folder / "same.onnx", 1),
            "slow": _chain(folder / "forty.onnx", 40)}


FEEDS = {"X": np.random.default_rng(1).standard_normal((8, SIZE)).astype(np.float32)}


def _screen(models, name: str, must_beat: float | None):
    candidate = Candidate(path=models[name], applied=True, fusions={}, fully_optimized=None, precision="fp32")
    baseline = Attempt(name="baseline", model=models["baseline"])
    return screen_speed(candidate, baseline, FEEDS, session=SessionConfig(), must_beat=must_beat)


def test_a_far_slower_candidate_is_dropped_after_its_first_round(models):
    found, raced_out = _screen(models, "slow", must_beat=1.0)

    assert found.rounds == 1 < SHORT_SCREEN.rounds, "fewer rounds than the fixed screen"
    assert found.ci_high < 1.0 and found.speedup < 0.3
    assert raced_out == (f"dropped after {found.pairs} pairs (upper bound {found.ci_high:.2f}x < 1.0 (the "
                         "baseline))")


def test_a_candidate_below_the_leaders_lower_bound_is_dropped_naming_the_leader(models):
    found, raced_out = _screen(models, "same", must_beat=3.0)

    assert found.rounds == 1
    assert raced_out is not None and raced_out.endswith("< the leader's 3.00x)")


def test_a_a_the_baseline_against_itself_runs_every_round_and_is_not_dropped(models):
    found, raced_out = _screen(models, "same", must_beat=1.0)

    assert raced_out is None
    assert found.rounds >= SHORT_SCREEN.rounds
    # Two sessions of one model may differ by ~1-2 % (FACTS): no verdict either way, as test_verdicts' A/A asks.
    assert found.interval_verdict in ("same", "inconclusive"), found


def test_without_a_bar_the_screen_runs_its_rounds(models):
    found, raced_out = _screen(models, "slow", must_beat=None)

    assert raced_out is None and found.rounds >= SHORT_SCREEN.rounds
