"""Command-line options every study script shares (they mirror the MLproject parameters), with their defaults read
from the config dataclasses' fields."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tracker.measure.timing.latency import TimingConfig
from tracker.measure.timing.speedup import MIN_ROUNDS, SpeedupConfig

if TYPE_CHECKING:  # imported where used: `tracker` (the CLI) parses these options and must start fast
    from tracker.measure.attempt import MeasureConfig
    from tracker.measure.runtimes.ort_runtime import SessionConfig

DEFAULT_EXPERIMENT = "onnx-optimization"
# --threads 0 leaves SessionConfig's own default (the core count, known only on the machine that runs).
CORE_COUNT_THREADS = 0


def add_measure_args(parser: argparse.ArgumentParser) -> None:
    """Adds --profile-runs, --skip-runs, --min-runs, --min-seconds, --speedup-rounds, --speedup-seconds,
    --threads, --experiment; each defaults to its `MeasureConfig`, `TimingConfig` or `SpeedupConfig` field."""
    parser.add_argument("--profile-runs", type=_positive_int, action=FieldDefault, field=(measure_class, "profile_runs"),
                        help="runs of the profiled session")
    parser.add_argument("--skip-runs", type=_non_negative_int, action=FieldDefault, field=(measure_class, "skip_runs"),
                        help="warm-up runs left out of per-op tables")
    parser.add_argument("--min-runs", type=_positive_int, default=field_default(TimingConfig, "min_runs"),
                        help="latency: at least this many runs")
    parser.add_argument("--min-seconds", type=_non_negative_float, default=field_default(TimingConfig, "min_seconds"),
                        help="latency: at least this long")
    add_speedup_args(parser)
    parser.add_argument("--threads", type=_non_negative_int, default=CORE_COUNT_THREADS,
                        help="ORT intra-op threads (0: core count)")
    parser.add_argument(
        "--experiment", default=DEFAULT_EXPERIMENT,
        help="MLflow experiment (ignored under `mlflow run`, which sets its own)",
    )


def add_speedup_args(parser: argparse.ArgumentParser, *, against: str = "the baseline") -> None:
    """Adds --speedup-rounds and --speedup-seconds (what `speedup_config` reads), each defaulting to its
    `SpeedupConfig` field; `against` names what the model is timed against in their help."""
    parser.add_argument("--speedup-rounds", type=_rounds, default=field_default(SpeedupConfig, "rounds"),
                        help=f"speed-up: rounds of fresh sessions timed against {against} (>= {MIN_ROUNDS})")
    parser.add_argument("--speedup-seconds", type=_non_negative_float, default=field_default(SpeedupConfig, "seconds"),
                        help="speed-up: seconds per attempt, sessions included; more rounds while they last")


def add_text_args(parser: argparse.ArgumentParser) -> None:
    """Adds --tokenizer, --text, --max-ppl-increase: the real text a language model is judged on beyond its logits.
    Each defaults to not given ("", None); `tracker.studies.own_plan.OwnModelConfig` checks how they go together."""
    parser.add_argument("--tokenizer", default="", metavar="FOLDER",
                        help="with --task lm: the model's Hugging Face tokenizer folder (save_pretrained); the LM is "
                             "then judged on real text (perplexity, top-1 along the text, greedy prompts) within "
                             "each precision's bound, not only on its logits (default: logits only, same function)")
    parser.add_argument("--text", default="", metavar="FILE",
                        help="with --tokenizer: a UTF-8 text file to judge on (default: the standard library's "
                             "documentation, pydoc_data)")
    parser.add_argument("--max-ppl-increase", type=_optional_number, default=None, metavar="X",
                        help="with --tokenizer: the largest perplexity increase any attempt may show on the text "
                             "(0.05 is +5 %%); default: each precision's bound (tracker/measure/accuracy/lm_bounds.toml)")


def add_register_arg(parser: argparse.ArgumentParser) -> None:
    """`--register NAME`: the study's best passing attempt becomes a new version of a registered model."""
    parser.add_argument("--register", default="", metavar="NAME",
                        help="make the best passing attempt a new version of the registered model NAME (alias "
                             "candidate); alias champion moves to it only if it measures better than the champion, "
                             "timed against it here, and passes the accuracy check against its outputs")


def field_default(cls: type, name: str) -> object:
    """The default of the dataclass `cls`'s field `name`: an option's default is written there, and only there.

    Raises:
        TypeError: `cls` has no such field, or it has no plain default (a `default_factory` makes each value).
    """
    known = {f.name: f for f in dataclasses.fields(cls)}
    if name not in known:
        raise TypeError(f"{cls.__name__} has no field {name!r}; its fields are {', '.join(known)}")
    if known[name].default is dataclasses.MISSING:
        raise TypeError(f"{cls.__name__}.{name} has no plain default to give an option")
    return known[name].default


class FieldDefault(argparse.Action):
    """Stores an option's value, as argparse's `store` does; its default is `field_default` of a class that is
    imported only when argparse first asks for the default.

    Parsing one subcommand never asks for another's defaults, so `tracker summarize` does not import onnx and
    pandas (seconds) to learn that `optimize --profile-runs` defaults to `MeasureConfig.profile_runs`.
    `field` is (a function returning the class, the field's name).
    """

    _default: object  # set by `default`'s setter, which argparse's __init__ calls

    def __init__(self, option_strings: list[str], dest: str, *, field: tuple[Callable[[], type], str],
                 **kwargs) -> None:
        self.field = field
        super().__init__(option_strings, dest, **kwargs)

    @property
    def default(self) -> object:
        if self._default is None:
            load, name = self.field
            self._default = field_default(load(), name)
        return self._default

    @default.setter
    def default(self, value: object) -> None:  # argparse's None, or `set_defaults(...)` overriding the field
        self._default = value

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        setattr(namespace, self.dest, values)


class DeprecatedAlias(argparse.Action):
    """An option's old spelling, kept for one release: it says on stderr, in one line, which spelling replaces it,
    then does what that one does (`renamed`, the new option's action). Made by `deprecated_alias`."""

    def __init__(self, option_strings: list[str], dest: str, *, renamed: argparse.Action, **kwargs) -> None:
        self.renamed = renamed
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        command = parser.prog  # "tracker compare": the alias is deprecated for that command, not everywhere
        print(f"{command.split()[0]}: {option_string} is deprecated for '{command}': use "
              f"{self.renamed.option_strings[0]} (the old spelling goes in the next release)", file=sys.stderr)
        self.renamed(parser, namespace, values, option_string)


def deprecated_alias(renamed: argparse.Action) -> dict[str, Any]:
    """The `add_argument` keywords of an old spelling of the option `renamed` (what its `add_argument` returned):
    the same values, type and destination, hidden from the help, one line on stderr when used (`DeprecatedAlias`).

    Add it where `renamed` was added (its mutually exclusive group, if any):
    `group.add_argument("--runs", **deprecated_alias(run_ids))`.
    """
    return {"action": DeprecatedAlias, "renamed": renamed, "dest": renamed.dest, "nargs": renamed.nargs,
            "type": renamed.type, "choices": renamed.choices, "metavar": renamed.metavar,
            # SUPPRESS: the new spelling's default stands, and the alias never counts as given when it was not.
            "default": argparse.SUPPRESS, "help": argparse.SUPPRESS}


def measure_class() -> type[MeasureConfig]:
    """`MeasureConfig`, imported when called."""
    from tracker.measure.attempt import MeasureConfig

    return MeasureConfig


def session_class() -> type[SessionConfig]:
    """`SessionConfig`, imported when called."""
    from tracker.measure.runtimes.ort_runtime import SessionConfig

    return SessionConfig


def measure_config(args: argparse.Namespace) -> MeasureConfig:
    """The `MeasureConfig` the parsed options describe."""
    from tracker.measure.attempt import MeasureConfig

    timing = TimingConfig(min_runs=args.min_runs, min_seconds=args.min_seconds)
    return MeasureConfig(profile_runs=args.profile_runs, skip_runs=args.skip_runs, timing=timing,
                         speedup=speedup_config(args))


def speedup_config(args: argparse.Namespace) -> SpeedupConfig:
    """The `SpeedupConfig` the parsed --speedup-rounds and --speedup-seconds describe."""
    return SpeedupConfig(rounds=args.speedup_rounds, seconds=args.speedup_seconds)


def session_config(args: argparse.Namespace) -> SessionConfig:
    """The `SessionConfig` of the thread option (0 keeps the core-count default)."""
    from tracker.measure.runtimes.ort_runtime import SessionConfig

    return SessionConfig(intra_op_num_threads=args.threads) if args.threads else SessionConfig()


def setup_logging() -> None:
    """Per-step progress lines from the tracker; only warnings from the libraries it drives (`terminal.setup_logging`)."""
    from tracker.base.terminal import setup_logging as setup

    setup(progress=True)


# MLflow passes every MLproject parameter as a string and does not validate its type.
def _positive_int(text: str) -> int:
    return _checked(text, int, lambda v: v >= 1, "an integer >= 1")


def _rounds(text: str) -> int:
    return _checked(text, int, lambda v: v >= MIN_ROUNDS, f"an integer >= {MIN_ROUNDS}")


def _non_negative_int(text: str) -> int:
    return _checked(text, int, lambda v: v >= 0, "an integer >= 0")


def _non_negative_float(text: str) -> float:
    return _checked(text, float, lambda v: v >= 0, "a number >= 0")


def _optional_number(text: str) -> float | None:
    """A number, or None for "" (MLproject's empty default); its range is the config's to check."""
    return _checked(text, float, lambda v: True, "a number such as 0.05 (+5 %)") if text.strip() else None


def _checked(text: str, kind, ok, expected: str):
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
    if not ok(value):
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
    return value


def parse_dims(pairs: list[str]) -> dict[str, int]:
    """`--dim NAME=SIZE` options (each repeatable or comma-separated) as name -> size; a size under 1 only for a past
    length."""
    dims = {}
    for pair in (p.strip() for text in pairs for p in text.split(",")):
        if not pair:
            continue
        name, sep, size = pair.partition("=")
        if not sep or not size.strip().isdigit():
            raise ValueError(f"--dim expects NAME=SIZE with an integer size, got {pair!r}")
        # An empty input gives empty outputs, which every check passes; an empty past is a decoder's first step.
        if int(size) < 1 and "past" not in name.lower():
            raise ValueError(f"--dim {pair}: a dimension must be at least 1 (0 only for a past length, e.g. "
                             "past_sequence_length=0, a decoder's first step)")
        dims[name.strip()] = int(size)
    return dims


def parse_flag(text: str) -> bool:
    """true/false (MLproject passes every parameter as a value), also yes/no and 1/0."""
    value = {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False, "": False}.get(
        str(text).strip().lower())
    if value is None:
        raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")
    return value


def parse_names(text: str) -> tuple[str, ...]:
    """A comma-separated list of names (`--attempts a,b`), blanks dropped."""
    return tuple(n.strip() for n in text.split(",") if n.strip())
