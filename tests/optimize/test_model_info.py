"""A Hugging Face config.json given with `--config` (`tracker.optimize.model_info`): one a reader would choke on
(nested too deep, a FIFO, a device, too large) is refused with one line before any run; a `model_type` that is not a
string is the reason no transformer info is read, shown in the plan."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.commands import assert_one_line_error, run_cli, run_names
from tracker.optimize.model_info import MAX_CONFIG_BYTES


def test_a_config_nested_too_deep_is_a_one_line_error_naming_the_file(store_uri, linear_file, tmp_path, capsys):
    config = tmp_path / "config.json"
    config.write_text('{"model_type": ' + "[" * 100_000 + "]" * 100_000 + "}")
    code, _, err = run_cli(capsys, "optimize", str(linear_file), "--config", str(config), "--dim", "N=2", "--dry-run")
    assert_one_line_error(code, err, f"config_json must be a readable Hugging Face config.json, got {config}",
                          "nested too deeply")


def test_a_config_that_is_a_fifo_or_a_device_is_refused_without_reading_it(store_uri, linear_file, tmp_path, capsys):
    fifo = tmp_path / "config.json"
    os.mkfifo(fifo)  # opened, it would block the plan (--dry-run included) until a writer came
    for config, mode in ((fifo, "prw"), (Path("/dev/zero"), "crw")):  # /dev/zero would be read until memory ran out
        code, _, err = run_cli(capsys, "optimize", str(linear_file), "--config", str(config), "--dim", "N=2",
                               "--dry-run")
        assert_one_line_error(code, err, f"config_json: {config} must be a regular file (a Hugging Face "
                                         f"config.json), got {mode}")
    assert run_names(store_uri) == []


def test_a_config_larger_than_any_hugging_face_config_is_refused_with_its_size(store_uri, linear_file, tmp_path,
                                                                               capsys):
    config = tmp_path / "config.json"
    config.write_text('{"model_type": "bert", "pad": "' + "x" * MAX_CONFIG_BYTES + '"}')
    code, _, err = run_cli(capsys, "optimize", str(linear_file), "--config", str(config), "--dim", "N=2", "--dry-run")
    assert_one_line_error(code, err, f"config_json: {config} has {config.stat().st_size} bytes, more than a Hugging "
                                     f"Face config.json holds (at most {MAX_CONFIG_BYTES} are read)")


@pytest.mark.parametrize("model_type", [["bert"], {"name": "bert"}, 3])
def test_a_model_type_that_is_not_a_string_is_the_reason_no_transformer_info_is_read(linear_file, tmp_path, capsys,
                                                                                       model_type):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": model_type, "num_attention_heads": 2, "hidden_size": 8}))
    code, out, err = run_cli(capsys, "optimize", str(linear_file), "--config", str(config), "--dim", "N=2", "--dry-run")
    assert code == 0 and "Traceback" not in err, err
    assert f"no transformer info: {config}: model_type must be a string (e.g. \"bert\"), got {model_type!r}" in out
