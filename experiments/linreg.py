"""Study `linreg`: scikit-learn LinearRegression on the diabetes data, and what ORT does at session start.

The study itself is `tracker.studies.linreg`; this is its command line (MLproject entry point `linreg`).
"""

from __future__ import annotations

import argparse
import sys

from tracker.base.termination import handle_sigterm
from tracker.cluster import CLUSTER_HELP
from tracker.experiment_args import add_measure_args, add_register_arg, measure_config, session_config, setup_logging
from tracker.studies import linreg


def run(args: argparse.Namespace):
    return linreg.run(experiment=args.experiment, measure=measure_config(args), session=session_config(args),
                      cluster=args.cluster or None, register=args.register or None)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_measure_args(parser)
    parser.add_argument("--cluster", default="", metavar="ADDRESS", help=CLUSTER_HELP)
    add_register_arg(parser)
    args = parser.parse_args(argv)
    setup_logging()
    handle_sigterm()  # `timeout`, a CI cancel: runs end FAILED, work folders go, exit 143
    run(args)  # a failed attempt is logged on its own run; the study itself still succeeded
    return 0


if __name__ == "__main__":
    sys.exit(main())
