"""`tracker check`: a regression gate for CI. MODEL against the champion (a registered model's version read from the
tracking store, or a file), speed and accuracy measured in one session (`tracker.measure.champion`); the exit code,
and the figures as text or as JSON for a CI comment."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from tracker.base.terminal import printable

if TYPE_CHECKING:
    import numpy as np
    import onnx

    from tracker.measure.champion import AgainstChampion

# What --against takes besides a file.
AGAINST_FORMS = "models:/NAME@ALIAS, models:/NAME/VERSION or a path to an ONNX file"


def check_against(args: argparse.Namespace) -> int:
    """`tracker check`: 0 when MODEL is not worse than the champion and passes the accuracy check against it, 1 when
    it is worse or fails it; bad input raises (exit 2, one line) before anything is measured."""
    import tempfile

    from tracker.base.model_io import check_ort_ops, load_model
    from tracker.experiment_args import speedup_config
    from tracker.measure.accuracy.task_diff import task_tolerances, tolerance_for
    from tracker.measure.attempt import Attempt
    from tracker.measure.champion import measure_against_champion
    from tracker.measure.runtimes.ort_runtime import SessionConfig
    from tracker.search.cache import model_digest

    tolerance = tolerance_for(task_tolerances(args.task), args.precision)  # an unknown task: before any work
    config = speedup_config(args)
    session = SessionConfig(intra_op_num_threads=args.threads) if args.threads else SessionConfig()
    model = load_model(args.model, load_external_data=False)
    check_ort_ops(model, source=repr(args.model))
    feeds, feeds_source = _feeds(args, model)
    with tempfile.TemporaryDirectory(prefix="tracker-check-") as tmp:
        champion_path, champion = _champion(args.against, Path(tmp))
        check_ort_ops(load_model(champion_path, load_external_data=False), source=f"the champion {args.against!r}")
        result = measure_against_champion(
            Attempt("model", Path(args.model), session=session, tolerance=tolerance),
            Attempt("champion", champion_path, session=session, tolerance=tolerance), feeds, config=config)
        champion["sha256"] = model_digest(champion_path)
    failure = result.failure()
    report = {
        "model": {"path": args.model, "sha256": model_digest(Path(args.model))},
        "champion": champion,
        "feeds": {"source": feeds_source, "inputs": {k: f"{v.dtype}{list(v.shape)}" for k, v in feeds.items()}},
        "task": args.task, "precision": args.precision,
        **result.figures(),
        "failure": failure, "exit_code": 0 if failure is None else 1,
    }
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        print(printable(format_check(report, result)))
    if failure is not None:
        print(printable(f"FAIL: {failure}"), file=_failure_stream(args))
        return 1
    return 0


def _failure_stream(args: argparse.Namespace):
    """Where the FAIL line goes: stdout beside the figures; stderr under --json, whose stdout is the JSON alone."""
    import sys

    return sys.stderr if args.json else sys.stdout


def format_check(report: dict, result: AgainstChampion) -> str:
    """The figures as text: what was compared on what, the speed-up and its verdict, the accuracy check, pass or
    not (the FAIL line, with the reason, is printed apart)."""
    champion = report["champion"]
    named = (f"{champion['uri']}: registered model {champion['name']} version {champion['version']}"
             if "version" in champion else champion["path"])
    feeds = ", ".join(f"{k} {v}" for k, v in report["feeds"]["inputs"].items())
    lines = [
        f"model:    {report['model']['path']} (sha256 {report['model']['sha256'][:12]})",
        f"champion: {named} (sha256 {champion['sha256'][:12]})",
        f"feeds:    {report['feeds']['source']}: {feeds}",
        f"speed:    {result.speed_text()}",
        f"accuracy: {report['task']} check {'passed' if result.diff.passed else 'FAILED'} {result.accuracy_text()}",
        f"verdict:  {result.verdict}",
    ]
    if result.passed:
        lines.append(f"pass: not worse than the champion (verdict {result.verdict}) and the accuracy check passed")
    return "\n".join(lines)


def _feeds(args: argparse.Namespace, model: onnx.ModelProto) -> tuple[dict[str, np.ndarray], str]:
    """The feeds both models run on: --feeds, or generated from MODEL's inputs as `tracker optimize` makes them."""
    from tracker.experiment_args import parse_dims
    from tracker.measure.inputs.feed_files import load_feeds
    from tracker.measure.inputs.feeds import make_feeds

    if args.feeds:
        return load_feeds(args.feeds, model), args.feeds
    return make_feeds(model, dims=parse_dims(args.dim), seed=args.seed), f"generated (seed {args.seed})"


def _champion(against: str, folder: Path) -> tuple[Path, dict[str, object]]:
    """The champion's ONNX file (a registered version is downloaded into `folder`) and what names it.

    Raises:
        ValueError: `against` is a URI of another kind, or names a registered model, version or alias that does not
            exist (naming what does).
        TrackingServerError: the tracking store does not answer.
        ModelError: the file is missing or not an ONNX model.
    """
    from tracker.base.errors import ModelError
    from tracker.base.model_io import load_model

    if against.startswith("models:/"):
        from tracker.store import connect, registry

        connect.setup_tracking()
        version = registry.resolve_version(against)
        return registry.download_onnx(version, folder), version.identity()
    if ":/" in against:
        raise ValueError(f"--against expects {AGAINST_FORMS}, got {against!r}")
    try:
        load_model(against, load_external_data=False, check=False)
    except ModelError as e:
        raise ModelError(f"--against: {e}") from e
    return Path(against), {"path": against}
