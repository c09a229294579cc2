"""A default is written once, in a config dataclass's field: MLproject's parameters, the CLI's options and the
study scripts' options all agree with it."""

from __future__ import annotations

import argparse
import copy
import dataclasses
import inspect
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import tracker.experiment_args as experiment_args
from experiments import fusion as fusion_script
from experiments import gpt2 as gpt2_script
from experiments import main as main_script
from tracker.cli import build_parser
from tracker.measure.attempt import MeasureConfig
from tracker.measure.generation.generation import GenerationConfig
from tracker.measure.runtimes.ort_runtime import SessionConfig
from tracker.measure.timing.latency import TimingConfig
from tracker.measure.timing.speedup import SpeedupConfig
from tracker.studies import linreg as linreg_study
from tracker.studies.gpt2 import GPT2StudyConfig, TextConfig
from tracker.studies.own_plan import OwnModelConfig

ROOT = Path(__file__).resolve().parents[2]
ENTRY_POINTS = yaml.safe_load((ROOT / "MLproject").read_text())["entry_points"]


@dataclasses.dataclass(frozen=True)
class Source:
    """Where a parameter's default is written: a dataclass field, a function's parameter or a module's constant.
    `none` is how the option spells None ("" for "not given", "all" for every attempt)."""

    owner: object
    name: str
    none: str = ""

    def value(self) -> object:
        if dataclasses.is_dataclass(self.owner):
            (found,) = [f for f in dataclasses.fields(self.owner) if f.name == self.name]
            return found.default_factory() if found.default is dataclasses.MISSING else found.default
        if inspect.isfunction(self.owner):
            return inspect.signature(self.owner).parameters[self.name].default
        return getattr(self.owner, self.name)

    def text(self) -> str:
        """The default as an option's text: (8, 32) -> "8,32", False -> "false", None -> `none`."""
        return as_text(self.value(), none=self.none)


def as_text(value: object, *, none: str = "") -> str:
    if value is None:
        return none
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (tuple, list, dict)):
        return ",".join(str(v) for v in value)
    return str(value)


MEASURE = {
    "profile_runs": Source(MeasureConfig, "profile_runs"),
    "skip_runs": Source(MeasureConfig, "skip_runs"),
    "min_runs": Source(TimingConfig, "min_runs"),
    "min_seconds": Source(TimingConfig, "min_seconds"),
    "speedup_rounds": Source(SpeedupConfig, "rounds"),
    "speedup_seconds": Source(SpeedupConfig, "seconds"),
    "threads": Source(experiment_args, "CORE_COUNT_THREADS"),  # SessionConfig's own default: the core count
}
GPT2 = {
    "model": Source(GPT2StudyConfig, "model"),
    "size": Source(GPT2StudyConfig, "size"),
    "exporter": Source(GPT2StudyConfig, "exporter"),
    "seq_lens": Source(GPT2StudyConfig, "seq_lens"),
    "headline_seq": Source(GPT2StudyConfig, "headline_seq"),
    "attempts": Source(GPT2StudyConfig, "attempts", none="all"),
    "scenarios": Source(GPT2StudyConfig, "scenarios"),
    "gen_prefill_lens": Source(GenerationConfig, "prefill_lens"),
    "gen_past_lens": Source(GenerationConfig, "decode_past_lens"),
    "seed": Source(GPT2StudyConfig, "seed"),
    "cluster": Source(GPT2StudyConfig, "cluster"),
    "search": Source(GPT2StudyConfig, "search"),
    "budget": Source(GPT2StudyConfig, "budget_s"),
}
TEXT = {"text": Source(TextConfig, "path"), "max_ppl_increase": Source(TextConfig, "max_ppl_increase")}
# The lm study: the gpt2 study's options but its size and cluster (a real model, measured here).
LM = {name: source for name, source in GPT2.items() if name not in ("size", "cluster")}
OPTIMIZE = {
    "feeds": Source(OwnModelConfig, "feeds"),
    "task": Source(OwnModelConfig, "task"),
    "attempts": Source(OwnModelConfig, "attempts"),
    "skip": Source(OwnModelConfig, "skip"),
    "dims": Source(OwnModelConfig, "dims"),
    "config": Source(OwnModelConfig, "config_json"),
    "seed": Source(OwnModelConfig, "seed"),
    "search": Source(OwnModelConfig, "search"),
    "budget": Source(OwnModelConfig, "budget_s"),
    "fresh": Source(OwnModelConfig, "fresh"),
    "cluster": Source(OwnModelConfig, "cluster"),
    "tokenizer": Source(OwnModelConfig, "tokenizer"),
    "text": Source(OwnModelConfig, "text"),
    "max_ppl_increase": Source(OwnModelConfig, "max_ppl_increase"),
    "register": Source(OwnModelConfig, "register"),
}
# Each entry point's parameters -> where their defaults are written. A new parameter must be added here.
SOURCES = {
    "main": {**MEASURE, **GPT2, "studies": Source(main_script, "STUDIES")},
    "linreg": {**MEASURE, "cluster": Source(linreg_study.run, "cluster"), "register": Source(linreg_study.run, "register")},
    "fusion": {**MEASURE, "seed": Source(fusion_script.fusion.run, "seed"),
               "cluster": Source(fusion_script.fusion.run, "cluster"),
               "register": Source(fusion_script.fusion.run, "register")},
    "gpt2": {**MEASURE, **GPT2, **TEXT},
    "lm": {**MEASURE, **LM, **TEXT},
    "optimize": {**MEASURE, **OPTIMIZE},
}
PARAMETERS = [(entry, name) for entry, spec in ENTRY_POINTS.items() for name, param in spec["parameters"].items()
              if "default" in param]  # optimize's `model` has none: it is required


def drifted(entry_points: dict) -> list[str]:
    """The parameters whose MLproject default is not the one their source holds, as "entry.name: A != B"."""
    found = []
    for entry, spec in entry_points.items():
        for name, param in spec["parameters"].items():
            if "default" not in param:
                continue
            written, expected = param["default"], SOURCES[entry][name].text()
            if param["type"] in ("int", "float"):
                same = float(written) == float(expected)
            else:
                same = as_text(written) == expected
            if not same:
                found.append(f"{entry}.{name}: {written!r} != {expected!r}")
    return found


@pytest.mark.parametrize("entry, name", PARAMETERS, ids=[f"{e}.{n}" for e, n in PARAMETERS])
def test_an_mlproject_parameter_defaults_to_its_dataclass_field(entry, name):
    assert name in SOURCES[entry], f"MLproject's {entry}.{name} has no source in SOURCES: add where it is written"
    assert not drifted({entry: {"parameters": {name: ENTRY_POINTS[entry]["parameters"][name]}}})


def test_every_entry_point_is_checked():
    assert set(ENTRY_POINTS) == set(SOURCES)


@pytest.mark.parametrize("entry, name, written", [
    pytest.param("linreg", "profile_runs", 21, id="a number"),
    pytest.param("gpt2", "seq_lens", "8,32", id="a list"),
    pytest.param("optimize", "task", "lm", id="a word"),
    pytest.param("optimize", "search", "true", id="a flag"),
    pytest.param("main", "min_seconds", 2.0, id="a float"),
])
def test_a_default_changed_in_mlproject_alone_is_caught(entry, name, written):
    changed = copy.deepcopy(ENTRY_POINTS)
    changed[entry]["parameters"][name]["default"] = written

    assert [line.split(":")[0] for line in drifted(changed)] == [f"{entry}.{name}"]


def _optimize_defaults() -> dict[str, object]:
    args = vars(build_parser().parse_args(["optimize", "model.onnx"]))
    return {**args, "dims": args["dim"]}


def _gpt2_defaults() -> dict[str, object]:
    parser = argparse.ArgumentParser()
    experiment_args.add_measure_args(parser)
    gpt2_script.add_gpt2_args(parser)
    return vars(parser.parse_args([]))


@pytest.mark.parametrize("entry, parsed", [
    pytest.param("optimize", _optimize_defaults, id="tracker optimize"),
    pytest.param("gpt2", _gpt2_defaults, id="experiments.gpt2"),
])
def test_the_command_lines_default_to_the_same_fields(entry, parsed):
    defaults = parsed()

    assert {name: as_text(defaults[name], none=source.none) for name, source in SOURCES[entry].items()} == {
        name: source.text() for name, source in SOURCES[entry].items()}


def test_tracker_profile_defaults_to_the_measure_and_session_fields():
    args = build_parser().parse_args(["profile", "model.onnx"])

    assert (args.profile_runs, args.min_seconds, args.seed) == (MeasureConfig.profile_runs, TimingConfig.min_seconds,
                                                        OwnModelConfig.seed)
    assert args.opt_level == SessionConfig.graph_optimization_level


def test_tracker_check_defaults_to_the_speedup_and_own_model_fields():
    args = build_parser().parse_args(["check", "model.onnx", "--against", "models:/m@champion"])

    assert (args.speedup_rounds, args.speedup_seconds) == (SpeedupConfig.rounds, SpeedupConfig.seconds)
    assert (args.task, args.seed) == (OwnModelConfig.task, OwnModelConfig.seed)


def test_a_default_read_from_a_field_can_still_be_set_by_a_script():
    parser = argparse.ArgumentParser()
    experiment_args.add_measure_args(parser)
    parser.set_defaults(profile_runs=MeasureConfig.profile_runs + 1)

    assert parser.parse_args([]).profile_runs == MeasureConfig.profile_runs + 1
    assert parser.parse_args(["--profile-runs", "3"]).profile_runs == 3


def test_parsing_one_command_does_not_import_the_modules_of_another_commands_defaults():
    code = ("import sys; from tracker.cli import build_parser; build_parser().parse_args(['summarize', 'profile.json']); "
            "print(sorted(m for m in ('tracker.measure.attempt', 'tracker.studies.own', 'tracker.studies.own_plan', 'onnx') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)

    assert done.stdout.strip() == "[]"


def test_a_field_without_a_plain_default_cannot_be_an_option_default():
    with pytest.raises(TypeError, match="MeasureConfig.timing has no plain default"):
        experiment_args.field_default(MeasureConfig, "timing")
    with pytest.raises(TypeError, match="MeasureConfig has no field 'runs'; its fields are profile_runs, "):
        experiment_args.field_default(MeasureConfig, "runs")
