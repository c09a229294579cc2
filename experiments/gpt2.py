"""Study `gpt2`: a causal LM exported to ONNX, then every model transform of the registry as a nested run.

The study itself is `tracker.studies.gpt2`; this is its command line (MLproject entry point `gpt2`).

`--model` takes a local Hugging Face causal-LM folder: GPT-2, or a LLaMA-architecture model (llama, mistral, qwen2).
Without it the real gpt2-small architecture is built from its config with seeded weights (no model hub here); the
runs are tagged `tracker.weights` so nobody mistakes them for pretrained.
"""

from __future__ import annotations

import argparse
import functools
import sys

from tracker.base.errors import TrackerError
from tracker.base.termination import handle_sigterm
from tracker.cluster import CLUSTER_HELP
from tracker.experiment_args import (
    add_measure_args,
    field_default,
    measure_config,
    parse_flag,
    session_config,
    setup_logging,
)
from tracker.gpt2.families import supported
from tracker.measure.generation.generation import GenerationConfig
from tracker.search import parse_budget
from tracker.studies.gpt2 import (
    DEFAULT_ATTEMPTS,
    SCENARIOS,
    GPT2StudyConfig,
    TextConfig,
    check_study_inputs,
    run_gpt2_study,
)


def add_gpt2_args(parser: argparse.ArgumentParser) -> None:
    """Adds the study's options, each defaulting to its `GPT2StudyConfig` or `GenerationConfig` field ("" and "all"
    stand for None)."""
    study = functools.partial(field_default, GPT2StudyConfig)
    parser.add_argument("--model", default="", help="a local Hugging Face causal-LM folder (or cached name), or a "
                        f"GGUF file (converted to a float32 folder once; needs the lm extra): {supported()}")
    parser.add_argument("--size", default=study("size"), choices=("small", "tiny"),
                        help="architecture built from a config")
    parser.add_argument("--config-path", default="",
                        help="a config JSON file instead of --size (GPT-2 unless its model_type names another family)")
    parser.add_argument("--exporter", default=study("exporter"), choices=("dynamo", "torchscript"))
    parser.add_argument("--seq-lens", default=_joined(study("seq_lens")), help="sequence lengths timed, comma-separated")
    parser.add_argument("--headline-seq", type=int, default=study("headline_seq"),
                        help="the length profiled and checked")
    parser.add_argument("--attempts", default="all",
                        help=f"comma-separated registry entries, or 'all' ({','.join(DEFAULT_ATTEMPTS)})")
    parser.add_argument("--seed", type=int, default=study("seed"))
    parser.add_argument("--scenarios", default=_joined(study("scenarios")),
                        help=f"comma-separated, some of {','.join(SCENARIOS)} (forward always runs)")
    parser.add_argument("--gen-prefill-lens", default=_joined(field_default(GenerationConfig, "prefill_lens")),
                        help="generation: prompt lengths of the prompt pass; the largest is timed against the baseline")
    parser.add_argument("--gen-past-lens", default=_joined(field_default(GenerationConfig, "decode_past_lens")),
                        help="generation: past lengths of the decode step; the largest is timed against the baseline")
    parser.add_argument("--cluster", default="", metavar="ADDRESS", help=CLUSTER_HELP)
    parser.add_argument("--text", default="", help="a UTF-8 text file a pretrained model is judged on (default: the "
                        "standard library's documentation, pydoc_data)")
    parser.add_argument("--text-dataset", default="", help="a local Hugging Face dataset folder (save_to_disk) instead "
                        "of --text; needs `pip install datasets`")
    parser.add_argument("--max-ppl-increase", type=_optional_fraction, default=None,
                        help="the largest perplexity increase any attempt may show on the text (0.05 is +5 %%); "
                        "default: each precision's bound (tracker/measure/accuracy/lm_bounds.toml)")
    parser.add_argument("--search", nargs="?", const=True, default=False, type=parse_flag,
                        help="search the decode chains (int4 block size, accuracy level, symmetry; the KV cache's "
                        "type; IO binding; threads) for the fastest decode at the longest past that passes the "
                        "generation check, instead of the fixed decode attempts; needs --scenarios forward,generation")
    parser.add_argument("--budget", default="", help="wall time of --search, e.g. 20m, 90s (default: no limit)")


def _joined(values: tuple) -> str:
    """A tuple default as its option text: (8, 32, 128) -> "8,32,128"."""
    return ",".join(str(v) for v in values)


def _optional_fraction(value: str) -> float | None:
    """A non-negative fraction (0.05), or None for "" (MLproject's empty default)."""
    if not value.strip():
        return None
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a fraction such as 0.05 (+5 %), got {value!r}") from None
    if not number >= 0:
        raise argparse.ArgumentTypeError(f"expected a fraction >= 0 such as 0.05 (+5 %), got {value!r}")
    return number


def _ints(value: str, option: str) -> tuple[int, ...]:
    try:
        return tuple(int(v) for v in value.split(",") if v.strip())
    except ValueError:
        raise SystemExit(f"{option} expects comma-separated integers, got {value!r}") from None


def gpt2_config(args: argparse.Namespace) -> GPT2StudyConfig:
    seq_lens = _ints(args.seq_lens, "--seq-lens")
    past_lens = _ints(args.gen_past_lens, "--gen-past-lens")
    prefill_lens = _ints(args.gen_prefill_lens, "--gen-prefill-lens")
    scenarios = tuple(s.strip() for s in args.scenarios.split(",") if s.strip())
    attempts = None if args.attempts.strip() in ("", "all") else tuple(a.strip() for a in args.attempts.split(","))
    measure = measure_config(args)
    return GPT2StudyConfig(
        model=args.model or None,
        size=args.size,
        config_path=args.config_path or None,
        exporter=args.exporter,
        seq_lens=seq_lens,
        headline_seq=args.headline_seq,
        attempts=attempts,
        seed=args.seed,
        measure=measure,
        session=session_config(args),
        scenarios=("forward", *(s for s in scenarios if s != "forward")),
        generation=GenerationConfig(decode_past_lens=past_lens, speedup_past_len=max(past_lens, default=None),
                                    prefill_lens=prefill_lens, speedup_prefill_len=max(prefill_lens, default=None),
                                    seed=args.seed, timing=measure.timing),
        cluster=args.cluster or None,
        text=TextConfig(path=args.text or None, dataset=args.text_dataset or None,
                        max_ppl_increase=args.max_ppl_increase),
        search=args.search,
        budget_s=parse_budget(args.budget) if args.budget.strip() else None,
    )


def run(args: argparse.Namespace):
    return run_gpt2_study(gpt2_config(args), experiment=args.experiment)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_measure_args(parser)
    add_gpt2_args(parser)
    args = parser.parse_args(argv)
    try:
        config = gpt2_config(args)
        check_study_inputs(config)  # a model or a length the study cannot run: one line, before any work
    except (TrackerError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    setup_logging()
    handle_sigterm()  # `timeout`, a CI cancel: runs end FAILED, work folders go, exit 143
    study = run_gpt2_study(config, experiment=args.experiment)
    for scenario, best in study.scenario_bests.items():
        print(f"gpt2: best attempt in the {scenario} scenario that passed its accuracy check: {best or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
