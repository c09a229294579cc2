"""The options the `tracker` commands and the study scripts share (`tracker.experiment_args`): sizes given with
`--dim`, each at least 1 but a past length, refused with one line before any run."""

from __future__ import annotations

import pytest

from tests.commands import assert_one_line_error, run_cli, run_names
from tracker.experiment_args import parse_dims


@pytest.mark.parametrize("command", ["profile", "inspect", "optimize"])
def test_a_dim_of_zero_is_refused_naming_it(store_uri, linear_file, capsys, command):
    code, _, err = run_cli(capsys, command, str(linear_file), "--dim", "N=0")
    assert_one_line_error(code, err, "--dim N=0: a dimension must be at least 1")
    assert run_names(store_uri) == []


def test_a_past_length_of_zero_is_a_decoders_first_step_and_stays_allowed():
    assert parse_dims(["batch=1,past_sequence_length=0"]) == {"batch": 1, "past_sequence_length": 0}
    with pytest.raises(ValueError, match="a dimension must be at least 1"):
        parse_dims(["sequence_length=0"])
