"""The `tracker` command's argparse parser: each command's arguments, their defaults read from the dataclass fields
they fill (`FieldDefault`), and the function in `tracker.cli.commands` that runs it."""

from __future__ import annotations

import argparse

from tracker.cli import check, commands

# The parser's description: what `tracker --help` says first.
DESCRIPTION = ("Command line: `tracker optimize|summarize|profile|inspect|upload|compare|check` (also "
               "`python -m tracker`).")


def build_parser() -> argparse.ArgumentParser:
    """The `tracker` parser: a subcommand per command, each with the function that runs it (`args.func`)."""
    from tracker.experiment_args import FieldDefault, deprecated_alias, field_default, measure_class, session_class
    from tracker.measure.timing.latency import TimingConfig

    parser = argparse.ArgumentParser(prog="tracker", description=DESCRIPTION)
    sub = parser.add_subparsers(required=True, metavar="COMMAND")
    _add_optimize_parser(sub)

    s = sub.add_parser("summarize", help="print the per-op table of an ONNX Runtime profile")
    s.add_argument("profile", help="profile JSON file (or gzip of it)")
    s.add_argument("--by", choices=("op", "node", "provider", "layer"), default="op")
    s.add_argument("--skip-runs", type=int, default=0, help="leading (warm-up) runs to leave out")
    s.add_argument("--top", type=int, default=None, help="show the N largest rows, the rest grouped")
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s.add_argument("--workers", type=int, default=None,
                   help="processes that read a large plain profile (default: 1 per 128 MiB, up to the CPUs and 4)")
    s.set_defaults(func=commands.summarize, progress=False)

    p = sub.add_parser("profile", help="profile a model file and log it as an attempt")
    p.add_argument("model", help="ONNX model file")
    p.add_argument("--feeds", default="", metavar="FILE",
                   help=".npz of arrays by input name, or .npy for a one-input model (default: generated)")
    _add_feed_options(p)
    p.add_argument("--name", default="", help="attempt name, the run name (default: the model file's stem)")
    runs = p.add_argument("--profile-runs", type=int, action=FieldDefault, field=(measure_class, "profile_runs"),
                          help="profiled runs (the first is dropped from tables)")
    p.add_argument("--runs", **deprecated_alias(runs))
    p.add_argument("--opt-level", choices=("disable", "basic", "extended", "layout", "all"), action=FieldDefault,
                   field=(session_class, "graph_optimization_level"))
    p.add_argument("--threads", type=int, default=None, help="intra-op threads (default: core count)")
    p.add_argument("--min-seconds", type=float, default=field_default(TimingConfig, "min_seconds"),
                   help="latency loop: at least this long")
    p.add_argument("--experiment", default=None, help="MLflow experiment name")
    p.add_argument("--top", type=int, default=15)
    p.set_defaults(func=commands.profile)

    i = sub.add_parser("inspect", help="print the ReferenceEvaluator trace of one run")
    i.add_argument("model", help="ONNX model file")
    _add_feed_options(i)
    i.add_argument("--verbose", type=int, choices=(1, 2, 3, 4), default=2)
    i.add_argument("--node", default=None, help="evaluate only this node, on inputs from a full run")
    i.set_defaults(func=commands.inspect, progress=False)
    k = sub.add_parser("cache", help="`tracker cache clear`: empty the search cache ($TRACKER_CACHE, else "
                       "tracker-cache beside the store)")
    k.add_argument("action", choices=("clear",))
    k.add_argument("--dir", default="", help="the cache folder (default: where --search keeps it)")
    k.set_defaults(func=commands.clear_cache, progress=False)
    u = sub.add_parser("upload", help="log the attempts kept locally when the tracking server was unreachable")
    u.add_argument("folder", nargs="?", default=None,
                   help="the outbox folder (default: $TRACKER_OUTBOX or ./tracker-outbox)")
    u.set_defaults(func=commands.upload_kept)
    _add_compare_parser(sub)
    _add_check_parser(sub)
    return parser


def _add_optimize_parser(sub) -> None:
    from tracker.cluster import CLUSTER_HELP
    from tracker.experiment_args import FieldDefault, add_measure_args, add_register_arg, add_text_args, parse_flag

    o = sub.add_parser(
        "optimize", help="run every registry attempt that applies to a model, each as a run; print the comparison",
        description="One study of MODEL: the baseline, then every attempt of the registry that applies to it "
                    "(tracker.optimize.REGISTRY), each a nested MLflow run judged by --task against the baseline. "
                    "Prints the comparison and the best attempt. Exit codes: 0 done, 1 the baseline failed (then "
                    "nothing else runs) or every attempt did (the runs are logged), 2 bad input (nothing logged).")
    o.add_argument("model", help="ONNX model file (its external data beside it)")
    o.add_argument("--feeds", default="", metavar="FILE",
                   help=".npz of arrays by input name, or .npy for a one-input model (default: generated, valid "
                        "for token ids, masks and token types; symbolic dims batch 1, sequence 128, else --dim)")
    _add_feed_options(o)
    o.add_argument("--task", action=FieldDefault, field=(_own_class, "task"),
                   help="how outputs are judged: raw (max |diff|), regression, classification, embedding, lm")
    o.add_argument("--attempts", default="", metavar="A,B",
                   help="run only these registry entries; also variants (ENTRY:KNOB=VALUE:KNOB=VALUE) and chains "
                        "(A+B), e.g. int8_dynamic:per_channel=true or attention_fused+int8_dynamic")
    o.add_argument("--skip", default="", metavar="A,B", help="do not run these registry entries")
    o.add_argument("--config", default="", metavar="CONFIG_JSON",
                   help="a Hugging Face config.json giving heads and hidden size (default: read from the graph)")
    o.add_argument("--name", default="", help="the study's name (default: the model file's stem)")
    o.add_argument("--search", nargs="?", const=True, action=FieldDefault, field=(_own_class, "search"), type=parse_flag,
                   metavar="true|false",
                   help="search the entries' knobs, a sensitivity fallback and chains for the fastest variant that "
                        "passes --task's check: an accuracy screen, a speed screen, then the leaders in full")
    o.add_argument("--budget", default="", metavar="DURATION",
                   help="wall time of --search, e.g. 20m, 90s, 1h30m (default: no limit)")
    o.add_argument("--fresh", nargs="?", const=True, default=False, type=parse_flag, metavar="true|false",
                   help="--search reads nothing from its cache (`tracker cache`)")
    add_text_args(o)
    add_register_arg(o)
    o.add_argument("--dry-run", action="store_true", help="list what would run, and why the others do not")
    o.add_argument("--cluster", default="", metavar="ADDRESS", help=CLUSTER_HELP)
    add_measure_args(o)
    o.set_defaults(func=commands.optimize)


def _add_compare_parser(sub) -> None:
    from tracker.compare import PASS_RULE
    from tracker.experiment_args import deprecated_alias

    c = sub.add_parser(
        "compare", help="print a study's attempts side by side; exit 1 if a --require'd attempt did not pass",
        description="Reads a study's attempt runs from the tracking store (MLFLOW_TRACKING_URI, else "
                    "./mlflow.db), prints one row per attempt, optionally writes the HTML report, and "
                    f"gates CI with --require. {PASS_RULE} Exit codes: 0 every required attempt passed "
                    "(or none required), 1 one did not, 2 the runs could not be read.")
    which = c.add_mutually_exclusive_group(required=True)
    which.add_argument("run", nargs="?", metavar="RUN_ID", help="the study's parent run (the run id the study's "
                                                                 "last log line links to)")
    which.add_argument("--study-run", metavar="RUN_ID", help="the study's parent run, as RUN_ID")
    which.add_argument("--study", metavar="NAME", help="the latest run of this study (needs --experiment)")
    run_ids = which.add_argument("--run-ids", nargs="+", metavar="RUN_ID", help="attempt runs, in the order to show")
    which.add_argument("--runs", **deprecated_alias(run_ids))
    c.add_argument("--experiment", metavar="NAME", help="experiment of --study")
    c.add_argument("--html", metavar="PATH", help="also write the offline HTML report there")
    c.add_argument("--require", action="append", default=[], metavar="NAME",
                   help="attempt that must pass (repeatable): it exists, did not crash, and its accuracy "
                        "check passed (verdict not 'rejected'); its speed-up does not matter")
    c.add_argument("--json", action="store_true", help="machine-readable output")
    c.set_defaults(func=commands.compare_study, progress=False)


def _add_check_parser(sub) -> None:
    from tracker.experiment_args import FieldDefault, add_speedup_args

    c = sub.add_parser(
        "check", help="a regression gate for CI: MODEL against the registry's champion, speed and accuracy; exit 1 "
                      "if it is worse or fails the accuracy check",
        description="Measures MODEL against the champion in one session: the speed-up with its interval from rounds "
                    "of fresh sessions timed interleaved, the verdict, and MODEL's outputs against the champion's "
                    "on the same feeds, judged by --task's check. The champion is read from the model registry of "
                    "the tracking store (MLFLOW_TRACKING_URI, else ./mlflow.db; credentials from MLflow's "
                    "variables), or is a file. Exit codes: 0 not worse and the accuracy check passed, 1 the verdict "
                    "is worse or the accuracy check failed, 2 bad input (nothing measured).")
    c.add_argument("model", help="the new ONNX model file (its external data beside it)")
    c.add_argument("--against", required=True, metavar="MODELS_URI|FILE",
                   help="the champion: models:/NAME@ALIAS, models:/NAME/VERSION, or an ONNX file")
    c.add_argument("--feeds", default="", metavar="FILE",
                   help=".npz of arrays by input name, or .npy for a one-input model (default: generated from "
                        "MODEL's inputs, as `tracker optimize` makes them)")
    _add_feed_options(c)
    c.add_argument("--task", action=FieldDefault, field=(_own_class, "task"),
                   help="how MODEL's outputs are judged against the champion's: raw (max |diff|), regression, "
                        "classification, embedding, lm")
    c.add_argument("--precision", choices=("fp32", "fp16", "int8", "int4"), default="fp32",
                   help="the bound of --task's check: that of the lower precision of the two models")
    add_speedup_args(c, against="the champion")
    c.add_argument("--threads", type=int, default=0, help="ORT intra-op threads of both models (0: core count)")
    c.add_argument("--json", action="store_true", help="print the figures as JSON (for a CI comment)")
    c.set_defaults(func=check.check_against)


def _add_feed_options(parser: argparse.ArgumentParser) -> None:
    from tracker.experiment_args import FieldDefault

    parser.add_argument("--dim", action="append", default=[], metavar="NAME=SIZE",
                        help="size of a symbolic input dim, repeatable or comma-separated (e.g. --dim batch=4,seq=32)")
    parser.add_argument("--seed", type=int, action=FieldDefault, field=(_own_class, "seed"),
                        help="seed of the generated feeds")


def _own_class() -> type:
    """`OwnModelConfig`, imported when a default is first read (`FieldDefault`)."""
    from tracker.studies.own_plan import OwnModelConfig

    return OwnModelConfig
