"""The common test of the registry: every entry, under every runtime it runs in, on the first small model it
applies to, writes a model that passes the checker, leaves its source alone, and gives outputs within the
tolerance of its precision."""

from __future__ import annotations

from dataclasses import replace

import onnx
import pytest

from tests.models import make_linear_model
from tests.optimize.conftest import SMALL_MODELS
from tracker.measure.attempt import Attempt
from tracker.measure.runtimes.ort_runtime import SessionConfig
from tracker.measure.runtimes.runtime import get_runtime
from tracker.optimize import KINDS, REGISTRY, Context, EntryError, applicable, apply, get_entry

CASES = [pytest.param(name, runtime, id=f"{name}-{runtime}")
         for name, entry in REGISTRY.items() for runtime in entry.runtimes]


def _first_model_it_applies_to(small_models, name: str, runtime: str) -> str:
    reasons = {}
    for model in SMALL_MODELS:
        source = small_models(model)
        graph = onnx.load_model(str(source.path), load_external_data=False)
        # As a study does: calibrating entries are given its inputs.
        context = Context(info=source.info, runtime=runtime, feeds=source.feeds[0])
        reasons[model] = REGISTRY[name].why_not(graph, context)
        if reasons[model] is None:
            return model
    pytest.fail(f"{name} applies to none of the small models ({reasons}): add one it applies to in conftest.py")


def _outputs(path, runtime: str, feeds, *, session: SessionConfig = SessionConfig(), new_ops=()):
    attempt = Attempt(name="check", model=path, runtime=runtime, session=session, new_ops=new_ops)
    runtime_ = get_runtime(runtime)
    run = runtime_.runner(attempt, attempt.load() if runtime_.needs_weights else None)
    return run(feeds)


@pytest.mark.parametrize(("name", "runtime"), CASES)
def test_every_entry_writes_a_checked_model_within_its_tolerance_and_leaves_its_source_alone(
    small_models, runs, name, runtime
):
    model = _first_model_it_applies_to(small_models, name, runtime)
    run = runs(name, model, runtime)
    candidate = run.result

    onnx.checker.check_model(str(candidate.path))  # by path: external data is checked where it lies
    assert run.digest_after == run.digest_before, "the entry changed its source"
    if REGISTRY[name].kind == "session":
        assert candidate.path == run.source.path and candidate.session, "a session entry runs its source, resettled"
    else:
        assert candidate.path.parent == run.target_dir, "an entry writes only under its target folder"

    tolerance = run.source.tolerances[candidate.precision]
    session = replace(SessionConfig(intra_op_num_threads=2), **candidate.session)
    for feeds in run.source.feeds:
        expected = _outputs(run.source.path, runtime, feeds)
        got = _outputs(candidate.path, runtime, feeds, session=session, new_ops=candidate.new_ops)
        diff = tolerance.compare(expected, got)
        assert diff.passed, f"{name} on {model}: {diff.metrics()} outside {tolerance}"


@pytest.mark.parametrize("name", list(REGISTRY))
def test_every_entry_says_what_it_is(name):
    entry = REGISTRY[name]
    assert entry.name == name and entry.kind in KINDS and entry.summary
    assert entry.runtimes and set(entry.runtimes) <= {"onnxruntime", "reference"}


def test_on_a_model_without_attention_only_the_session_entries_and_the_fusion_apply():
    reasons = applicable(make_linear_model(n_features=8), Context())
    applies = {name for name, reason in reasons.items() if reason is None}
    assert applies == {name for name, entry in REGISTRY.items() if entry.kind == "session"} | {"add_eyelike"}
    assert "no attention" in reasons["ort_opt_basic"]


def test_an_entry_under_a_runtime_it_does_not_run_in_says_so():
    reason = REGISTRY["ort_opt_disabled"].why_not(make_linear_model(n_features=8), Context(runtime="reference"))
    assert reason == "runs under onnxruntime, not reference"


def test_get_entry_rejects_an_unknown_name_and_lists_the_known_ones(tmp_path):
    with pytest.raises(ValueError, match="unknown optimization 'turbo'; registered: ort_opt_disabled, .*add_eyelike"):
        get_entry("turbo")
    with pytest.raises(ValueError, match="unknown optimization"):
        apply("turbo", tmp_path / "model.onnx", tmp_path)


def test_a_transformer_entry_on_a_model_it_does_not_apply_to_says_why_before_making_anything(small_models, tmp_path):
    source = small_models("linear_eyelike")
    with pytest.raises(EntryError, match="ort_opt_basic does not apply to this model: no attention"):
        apply("ort_opt_basic", source.path, tmp_path, Context())
