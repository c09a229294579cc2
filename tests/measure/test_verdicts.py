"""The speed-up measurement against cases whose answer is known, on real models and real sessions.

A/A: the baseline's own file timed against itself must never be "better" or "worse", and its interval
must hold 1 (95 % of the time: checked over repeats). Known change: the same graph computed twice must
be "worse", near the ratio that isolated runs of each give. `benchmarks/bench_speedup.py` runs the same
checks with more repeats and prints the rates.
"""

from __future__ import annotations

import dataclasses
import statistics
from pathlib import Path

import numpy as np
import onnx
import pytest
from calibration import with_extra_work  # benchmarks/calibration.py (pytest pythonpath)

from tracker.measure.attempt import Attempt
from tracker.measure.measurement import time_against
from tracker.measure.runtimes.ort_runtime import SessionConfig, make_session
from tracker.measure.timing.latency import TimingConfig, time_runs
from tracker.measure.timing.speedup import SpeedupConfig

CONFIG = SpeedupConfig(seconds=1.0)

MODELS = ("linreg", "fusion", "gpt2-tiny")


def _linreg() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    from skl2onnx import to_onnx
    from sklearn.datasets import load_diabetes
    from sklearn.linear_model import LinearRegression

    X, y = load_diabetes(return_X_y=True)
    model = to_onnx(LinearRegression().fit(X[:300], y[:300]), X[:1].astype(np.float32), target_opset=18)
    return model, {model.graph.input[0].name: X[300:].astype(np.float32)}


def _fusion() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    from tests.models import make_linear_model

    feeds = {"X": np.random.default_rng(0).standard_normal((4, 100)).astype(np.float32)}
    return make_linear_model(n_features=100), feeds


def _gpt2_tiny() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    from tracker.gpt2.model import load_gpt2
    from tracker.gpt2.tokens import make_tokens

    loaded = load_gpt2(size="tiny", seed=0)
    return loaded, {"input_ids": make_tokens(batch=1, seq_len=16, vocab_size=loaded.vocab_size, seed=0)}


@pytest.fixture(scope="module", params=MODELS)
def case(request, tmp_path_factory) -> tuple[Path, dict[str, np.ndarray]]:
    """A study model saved to a file, and its feeds."""
    if request.param == "gpt2-tiny":
        _, feeds = _gpt2_tiny()
        return request.getfixturevalue("tiny_gpt2_export")("dynamo").path, feeds  # the same model, shared
    folder = tmp_path_factory.mktemp(request.param)
    model, feeds = _linreg() if request.param == "linreg" else _fusion()
    onnx.save(model, str(folder / "model.onnx"))
    return folder / "model.onnx", feeds


def _isolated_ratio(baseline: Attempt, attempt: Attempt, feeds: dict[str, np.ndarray], blocks: int = 3) -> float:
    """The baseline's p50 over the attempt's, each timed alone in long runs: the median of `blocks` such
    ratios, taken in alternating order, so one burst of machine noise cannot decide it."""
    sessions = [make_session(a.model, a.session, stop_spinning_after_run=True) for a in (baseline, attempt)]
    config = TimingConfig(min_runs=30, min_seconds=0.5)

    def p50(session) -> float:
        return time_runs(lambda: session.run(None, feeds), config).p50_ms

    ratios = []
    for block in range(blocks):
        first, second = (0, 1) if block % 2 == 0 else (1, 0)
        times = {first: p50(sessions[first]), second: p50(sessions[second])}
        ratios.append(times[0] / times[1])
    return statistics.median(ratios)


def _baseline(path: Path) -> Attempt:
    return Attempt("baseline", path, session=SessionConfig(intra_op_num_threads=2))


@pytest.mark.slow
@pytest.mark.timing
def test_an_aa_pair_is_never_better_or_worse_and_its_interval_holds_1(case):
    path, feeds = case
    baseline = _baseline(path)
    same = dataclasses.replace(baseline, name="same_file")
    results = [time_against(same, baseline, feeds, CONFIG) for _ in range(8)]
    assert {r.interval_verdict for r in results} <= {"same", "inconclusive"}, [(r.speedup, r.ci_low, r.ci_high) for r in results]
    covered = sum(r.ci_low <= 1.0 <= r.ci_high for r in results)
    assert covered >= 6, [(r.ci_low, r.ci_high) for r in results]  # P(< 6 of 8) = 0.6 % at 95 % coverage
    assert all(r.ci_high > r.ci_low for r in results)  # no zero-width interval from timer ties
    assert all(r.mde >= 0.02 and r.rounds >= CONFIG.rounds and r.rounds % 2 == 0 for r in results)


@pytest.mark.slow
@pytest.mark.timing
def test_the_same_graph_computed_twice_is_worse_near_the_isolated_ratio(case, tmp_path):
    path, feeds = case
    slower = tmp_path / "extra_work.onnx"
    onnx.save(with_extra_work(onnx.load(str(path)), copies=1), str(slower))
    baseline, attempt = _baseline(path), Attempt("extra_work", slower, session=SessionConfig(intra_op_num_threads=2))
    results = [time_against(attempt, baseline, feeds, CONFIG) for _ in range(3)]
    assert {r.interval_verdict for r in results} == {"worse"}
    true_ratio = _isolated_ratio(baseline, attempt, feeds)
    assert true_ratio < 0.95  # the extra work is real...
    assert statistics.median(r.speedup for r in results) == pytest.approx(true_ratio, rel=0.15)  # ...and measured


@pytest.mark.slow
def test_extra_work_keeps_the_outputs_and_leaves_the_input_model_alone(case):
    path, feeds = case
    model = onnx.load(str(path))
    before = model.SerializeToString()
    slower = with_extra_work(model, copies=2)
    assert model.SerializeToString() == before
    onnx.checker.check_model(slower)
    inputs = len(model.graph.input)
    assert len(slower.graph.node) == 3 * len(model.graph.node) + 2 * inputs + 2 * len(model.graph.output)
    base = make_session(model, SessionConfig()).run(None, feeds)
    extra = make_session(slower, SessionConfig()).run(None, feeds)
    for a, b in zip(base, extra):
        np.testing.assert_array_equal(a, b)


def test_extra_work_refuses_what_it_cannot_copy():
    with pytest.raises(ValueError, match="copies must be >= 1"):
        with_extra_work(_fusion()[0], copies=0)
