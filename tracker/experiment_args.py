"""Command-line options every study script shares (they mirror the MLproject parameters)."""

from __future__ import annotations

import argparse
import logging
from typing import TYPE_CHECKING

from tracker.measure.timing.speedup import MIN_ROUNDS, SpeedupConfig

if TYPE_CHECKING:  # imported where used: `tracker` (the CLI) parses these options and must start fast
    from tracker.measure.attempt import MeasureConfig
    from tracker.measure.runtimes.ort_runtime import SessionConfig

DEFAULT_EXPERIMENT = "onnx-optimization"


def add_measure_args(parser: argparse.ArgumentParser) -> None:
    """Adds --profile-runs, --skip-runs, --min-runs, --min-seconds, --speedup-rounds, --speedup-seconds,
    --threads, --experiment."""
    parser.add_argument("--profile-runs", type=_positive_int, default=20, help="runs of the profiled session")
    parser.add_argument("--skip-runs", type=_non_negative_int, default=1, help="warm-up runs left out of per-op tables")
    parser.add_argument("--min-runs", type=_positive_int, default=50, help="latency: at least this many runs")
    parser.add_argument("--min-seconds", type=_non_negative_float, default=1.0, help="latency: at least this long")
    parser.add_argument("--speedup-rounds", type=_rounds, default=SpeedupConfig.rounds,
                        help=f"speed-up: rounds of fresh sessions timed against the baseline (>= {MIN_ROUNDS})")
    parser.add_argument("--speedup-seconds", type=_non_negative_float, default=SpeedupConfig.seconds,
                        help="speed-up: seconds per attempt, sessions included; more rounds while they last")
    parser.add_argument("--threads", type=_non_negative_int, default=0, help="ORT intra-op threads (0: core count)")
    parser.add_argument(
        "--experiment", default=DEFAULT_EXPERIMENT,
        help="MLflow experiment (ignored under `mlflow run`, which sets its own)",
    )


def measure_config(args: argparse.Namespace) -> MeasureConfig:
    """The `MeasureConfig` the parsed options describe."""
    from tracker.measure.attempt import MeasureConfig
    from tracker.measure.timing.latency import TimingConfig

    timing = TimingConfig(min_runs=args.min_runs, min_seconds=args.min_seconds)
    speedup = SpeedupConfig(rounds=args.speedup_rounds, seconds=args.speedup_seconds)
    return MeasureConfig(profile_runs=args.profile_runs, skip_runs=args.skip_runs, timing=timing, speedup=speedup)


def session_config(args: argparse.Namespace) -> SessionConfig:
    """The `SessionConfig` of the thread option (0 keeps the core-count default)."""
    from tracker.measure.runtimes.ort_runtime import SessionConfig

    return SessionConfig(intra_op_num_threads=args.threads) if args.threads else SessionConfig()


def setup_logging() -> None:
    """Per-step progress lines from the tracker; only warnings from the libraries it drives."""
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    logging.getLogger("tracker").setLevel(logging.INFO)


# MLflow passes every MLproject parameter as a string and does not validate its type.
def _positive_int(text: str) -> int:
    return _checked(text, int, lambda v: v >= 1, "an integer >= 1")


def _rounds(text: str) -> int:
    return _checked(text, int, lambda v: v >= MIN_ROUNDS, f"an integer >= {MIN_ROUNDS}")


def _non_negative_int(text: str) -> int:
    return _checked(text, int, lambda v: v >= 0, "an integer >= 0")


def _non_negative_float(text: str) -> float:
    return _checked(text, float, lambda v: v >= 0, "a number >= 0")


def _checked(text: str, kind, ok, expected: str):
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
    if not ok(value):
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
    return value
