"""Study `fusion`: the hand-written EyeLike + Add -> AddEyeLike fusion, under both runtimes.

The study itself is `tracker.studies.fusion`; this is its command line (MLproject entry point `fusion`).
"""

from __future__ import annotations

import argparse
import inspect
import sys

from tracker.base.termination import handle_sigterm
from tracker.cluster import CLUSTER_HELP
from tracker.experiment_args import add_measure_args, add_register_arg, measure_config, session_config, setup_logging
from tracker.studies import fusion


def run(args: argparse.Namespace):
    return fusion.run(experiment=args.experiment, measure=measure_config(args), session=session_config(args),
                      seed=args.seed, cluster=args.cluster or None, register=args.register or None)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_measure_args(parser)
    parser.add_argument("--seed", type=int, default=inspect.signature(fusion.run).parameters["seed"].default,
                        help="seed of A, B and X")
    parser.add_argument("--cluster", default="", metavar="ADDRESS", help=CLUSTER_HELP)
    add_register_arg(parser)
    args = parser.parse_args(argv)
    setup_logging()
    handle_sigterm()  # `timeout`, a CI cancel: runs end FAILED, work folders go, exit 143
    run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
