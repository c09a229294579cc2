"""A new model against the champion (`tracker.measure.champion`): which interfaces are the same, and the gate's rule
on real ONNX Runtime sessions (the command's cases are in tests/cli/test_check.py)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from tests.conftest import FAST_SPEEDUP
from tests.models import make_linear_model
from tracker.base.errors import ModelError
from tracker.base.vocabulary import Verdict
from tracker.measure.attempt import Attempt
from tracker.measure.champion import check_same_interface, measure_against_champion


def _with_input_dims(model: onnx.ModelProto, *dims: int | str) -> onnx.ModelProto:
    changed = onnx.ModelProto()
    changed.CopyFrom(model)
    shape = changed.graph.input[0].type.tensor_type.shape
    for dim, value in zip(shape.dim, dims):
        dim.Clear()
        if isinstance(value, int):
            dim.dim_value = value
        else:
            dim.dim_param = value
    return changed


def test_symbolic_dims_of_other_names_are_the_same_interface():
    model = make_linear_model(n_features=8)

    check_same_interface(_with_input_dims(model, "batch", 8), model)


@pytest.mark.parametrize(("dims", "said"), [
    pytest.param((1, 8), "input 'X' has shape [1, 8], the champion's [N, 8]", id="a fixed size against a symbol"),
    pytest.param(("N", 9), "input 'X' has shape [N, 9], the champion's [N, 8]", id="another fixed size"),
])
def test_a_fixed_size_that_differs_is_named(dims, said):
    model = make_linear_model(n_features=8)

    with pytest.raises(ModelError, match=r"differ from the champion's: " + said.replace("[", r"\[")):
        check_same_interface(_with_input_dims(model, *dims), model)


def test_outputs_of_other_names_differ():
    model = make_linear_model(n_features=8)
    renamed = onnx.ModelProto()
    renamed.CopyFrom(model)
    renamed.graph.output[0].name = "Z"
    renamed.graph.node[-1].output[0] = "Z"

    with pytest.raises(ModelError, match=r"outputs \['Z'\] against the champion's \['Y'\]"):
        check_same_interface(renamed, model)


def test_the_champion_against_itself_passes_and_other_weights_are_rejected():
    feeds = {"X": np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)}
    champion = Attempt("champion", make_linear_model(n_features=8))

    same = measure_against_champion(Attempt("model", make_linear_model(n_features=8)), champion, feeds,
                                    config=FAST_SPEEDUP)
    other = measure_against_champion(Attempt("model", make_linear_model(n_features=8, seed=1)), champion, feeds,
                                     config=FAST_SPEEDUP)

    assert same.diff.passed and same.verdict != Verdict.REJECTED and same.speedup.rounds == FAST_SPEEDUP.rounds
    assert (other.passed, other.verdict) == (False, Verdict.REJECTED)
    assert other.failure().startswith("verdict rejected: the accuracy check against the champion failed")
    assert other.figures()["accuracy"]["figures"]["diff.max_abs"] > 1e-2
