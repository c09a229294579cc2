"""Command line: `tracker optimize|summarize|profile|inspect|upload|compare` (also `python -m tracker`)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from tracker.base.errors import TrackerError
from tracker.base.files import no_space_note, working_folder
from tracker.base.redaction import redact
from tracker.base.terminal import printable, setup_logging
from tracker.base.termination import EXIT_CODE, received, sigterm_as_exit


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    setup_logging(progress=getattr(args, "progress", True))
    try:
        working_folder()  # one line, not a traceback from the first os.getcwd, when it was removed
        with sigterm_as_exit():  # `timeout`, a CI cancel: runs end FAILED, exit 143
            return args.func(args)
    except (TrackerError, ValueError, ConnectionError) as e:
        _error(str(e))
        return 2
    except Exception as e:
        if received():  # SIGTERM that surfaced as another error (e.g. an ImportError from a cut import)
            print("terminated (SIGTERM): runs logged so far are kept; the run that was cut is FAILED", file=sys.stderr)
            return EXIT_CODE
        if not no_space_note(e):
            raise
        _error(f"{type(e).__name__}: {e}{no_space_note(e)}")  # a full disk: which folder, not a traceback
        return 2
    except KeyboardInterrupt:  # what was logged stays; open runs were ended FAILED on the way out
        print("interrupted (Ctrl-C): runs logged so far are kept; the run that was cut is FAILED", file=sys.stderr)
        return 130


def _error(text: str) -> None:
    """One `error:` line on stderr: credentials redacted, control characters escaped."""
    print(f"error: {printable(redact(text))}", file=sys.stderr)


def _parser() -> argparse.ArgumentParser:
    from tracker.experiment_args import FieldDefault, deprecated_alias, field_default, measure_class, session_class
    from tracker.measure.timing.latency import TimingConfig

    parser = argparse.ArgumentParser(prog="tracker", description=__doc__)
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
    s.set_defaults(func=_summarize, progress=False)

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
    p.set_defaults(func=_profile)

    i = sub.add_parser("inspect", help="print the ReferenceEvaluator trace of one run")
    i.add_argument("model", help="ONNX model file")
    _add_feed_options(i)
    i.add_argument("--verbose", type=int, choices=(1, 2, 3, 4), default=2)
    i.add_argument("--node", default=None, help="evaluate only this node, on inputs from a full run")
    i.set_defaults(func=_inspect, progress=False)
    k = sub.add_parser("cache", help="`tracker cache clear`: empty the search cache ($TRACKER_CACHE, else "
                       "tracker-cache beside the store)")
    k.add_argument("action", choices=("clear",))
    k.add_argument("--dir", default="", help="the cache folder (default: where --search keeps it)")
    k.set_defaults(func=_cache, progress=False)
    u = sub.add_parser("upload", help="log the attempts kept locally when the tracking server was unreachable")
    u.add_argument("folder", nargs="?", default=None,
                   help="the outbox folder (default: $TRACKER_OUTBOX or ./tracker-outbox)")
    u.set_defaults(func=_upload)
    _add_compare_parser(sub)
    return parser


def _add_optimize_parser(sub) -> None:
    from tracker.cluster import CLUSTER_HELP
    from tracker.experiment_args import FieldDefault, add_measure_args, add_text_args, parse_flag

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
    o.add_argument("--dry-run", action="store_true", help="list what would run, and why the others do not")
    o.add_argument("--cluster", default="", metavar="ADDRESS", help=CLUSTER_HELP)
    add_measure_args(o)
    o.set_defaults(func=_optimize)


def _optimize(args: argparse.Namespace) -> int:
    from pathlib import Path

    from tracker.base.keys import check_experiment_name
    from tracker.compare import format_table
    from tracker.experiment_args import measure_config, parse_dims, parse_names, session_config
    from tracker.search import parse_budget
    from tracker.studies import own, own_plan

    check_experiment_name(args.experiment)  # before any work: MLflow would refuse it at the first run
    config = own_plan.OwnModelConfig(
        model=Path(args.model),
        feeds=Path(args.feeds) if args.feeds else None,
        task=args.task,
        attempts=parse_names(args.attempts) or None,
        skip=parse_names(args.skip),
        dims=parse_dims(args.dim),
        config_json=Path(args.config) if args.config else None,
        name=args.name or None,
        seed=args.seed,
        measure=measure_config(args),
        session=session_config(args),
        search=args.search,
        budget_s=parse_budget(args.budget) if args.budget else None, fresh=args.fresh,
        cluster=args.cluster or None,
        tokenizer=Path(args.tokenizer) if args.tokenizer else None, text=Path(args.text) if args.text else None,
        max_ppl_increase=args.max_ppl_increase,
    )
    chosen = own_plan.plan(config)  # bad input fails here, before any run is made
    if args.dry_run:
        print(printable(own_plan.format_plan(config, chosen)))
        return 0
    study = own.run(config, experiment=args.experiment, chosen=chosen)
    print(printable(format_table(own.comparison(study))))
    if study.search_result is not None:
        from tracker.search.result import format_search

        print(printable(format_search(study.search_result)))
    failure = own.study_failure(study.results, study.failures)
    if failure:  # the runs are logged, but there is nothing to ship: 1, as `compare --require` when one did not pass
        _error(failure)
        return 1
    return 0


def _cache(args: argparse.Namespace) -> int:
    from pathlib import Path

    from tracker.base.settings import cache_folder
    from tracker.search.cache import clear

    root = Path(args.dir) if args.dir else cache_folder()
    entries, size = clear(root)
    print(f"removed {entries} search cache entries ({size / 1e6:.1f} MB) from {root}")
    return 0


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
    c.set_defaults(func=_compare, progress=False)


def _compare(args: argparse.Namespace) -> int:
    from tracker import compare
    from tracker.report.study import write_report
    from tracker.store import connect

    if (args.study is None) != (args.experiment is None):
        raise ValueError("--study and --experiment go together")
    if args.html:
        compare.check_report_path(args.html)  # before reading runs: a bad path fails fast
    connect.setup_tracking()
    comparison = compare.load_comparison(study_run_id=args.run or args.study_run, experiment=args.experiment,
                                         study=args.study, run_ids=args.run_ids or ())
    requirements = compare.check_required(comparison.rows, args.require)
    if args.html:
        path = write_report(comparison.rows, args.html, title=comparison.title, best=comparison.best)
    if args.json:
        print(json.dumps({**compare.to_json(comparison, requirements),
                          "html": str(path) if args.html else None}, indent=1))
    else:
        print(printable(compare.format_table(comparison)))
        for q in requirements:
            print(printable(f"require {q.name}: {'pass' if q.passed else 'FAIL'}: {q.reason}"))
        if args.html:
            print(f"report written to {path}")
    return 0 if all(q.passed for q in requirements) else 1


def _upload(args: argparse.Namespace) -> int:
    from pathlib import Path

    from tracker import upload
    from tracker.base.redaction import redact_uri
    from tracker.run.record import outbox_root
    from tracker.store import connect

    folder = Path(args.folder) if args.folder else outbox_root()
    if not upload.has_pending(folder):
        print(f"nothing to upload under {folder}")
        return 0
    uri = connect.setup_tracking()
    done = upload.upload_outbox(folder)
    print(f"uploaded {len(done.run_ids)} attempt run(s) to {redact_uri(uri)}: {', '.join(done.run_ids) or '-'}")
    for path, run_id in done.uploaded.items():
        left_out = done.left_out.get(path)
        without = f" (without {'; '.join(f'{k}: {v}' for k, v in left_out.items())})" if left_out else ""
        print(printable(f"  {path}: run {run_id}{without}"))
    for run_id in done.studies:
        print(f"study run {run_id}: summary and report logged, rebuilt from its attempt runs")
    for path, reason in done.refused.items():
        _error(f"{reason}; not uploaded: it stays in {path}")
    for path, reason in done.kept.items():
        _error(f"{path} not uploaded ({reason}); it stays in the outbox: run `tracker upload {folder}` again once "
               "the tracking store answers")
    return 2 if done.refused or done.kept else 0


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


def _summarize(args: argparse.Namespace) -> int:
    from tracker.profile import aggregate
    from tracker.profile.parse import parse_profile

    profile = parse_profile(args.profile, workers=args.workers)
    summary = aggregate.summarize(profile.events, by=args.by, skip_runs=args.skip_runs)
    if args.top is not None:  # --top 0 is an error, not "show everything"
        summary = aggregate.top_n(summary, args.top)
    if args.json:
        print(json.dumps({
            "profile": args.profile, "format": profile.format, "truncated": profile.truncated,
            "runs": profile.run_count, "skip_runs": args.skip_runs, "by": args.by,
            "rows": json.loads(summary.to_json(orient="records")),
        }, indent=1))
    else:
        print(f"{args.profile}: {profile.run_count} runs, format {profile.format}"
              f"{', TRUNCATED' if profile.truncated else ''}; by {args.by}, {args.skip_runs} run(s) skipped")
        print(_table(summary))
    return 0


def _table(summary) -> str:
    from tracker.profile import columns as C

    if summary.empty:
        return ("No kernel events were found: the profile holds no Node events named '<node>_kernel_time', only "
                "session events. That usually means no inference run was profiled (end_profiling() was called "
                "before the first run, or every run failed before its first kernel).")
    shown = summary[[C.KEY, C.TOTAL_US, C.CALLS, C.PCT, C.US_PER_RUN, C.MEAN_US]].copy()
    shown[C.KEY] = shown[C.KEY].astype(str).map(printable)  # escaped before the columns are aligned
    return shown.to_string(index=False, float_format=lambda v: f"{v:.2f}")


def _profile(args: argparse.Namespace) -> int:
    from tracker.api import log_attempt
    from tracker.base.keys import check_experiment_name
    from tracker.base.model_io import check_ort_ops, load_model
    from tracker.experiment_args import parse_dims
    from tracker.measure.attempt import MeasureConfig
    from tracker.measure.inputs.feed_files import load_feeds
    from tracker.measure.inputs.feeds import make_feeds
    from tracker.measure.runtimes.ort_runtime import SessionConfig
    from tracker.measure.timing.latency import TimingConfig
    from tracker.studies.own_plan import default_name

    if args.experiment:
        check_experiment_name(args.experiment)  # before any work: MLflow would refuse it at the first run
    model = load_model(args.model)
    check_ort_ops(model, source=repr(args.model))  # before any run is made
    if args.feeds:
        feeds = load_feeds(args.feeds, model)
    else:
        feeds = make_feeds(model, dims=parse_dims(args.dim), seed=args.seed)
    name = args.name or default_name(args.model)
    session = SessionConfig(graph_optimization_level=args.opt_level,
                            **({"intra_op_num_threads": args.threads} if args.threads else {}))
    config = MeasureConfig(profile_runs=args.profile_runs, skip_runs=1 if args.profile_runs > 1 else 0,
                           timing=TimingConfig(min_seconds=args.min_seconds))
    result = log_attempt(args.model, feeds, name=name, experiment=args.experiment, config=config,
                         session=session)
    if result.run_id is None:
        failed = f" (and the attempt failed: {result.error})" if not result.ok else ""
        if result.refused:
            _error(f"the tracking store refused the run of attempt {name} ({result.refused}){failed}; it is kept in "
                   f"{result.outbox}")
            return 2
        _error(f"attempt {name} could not be logged{failed}; it is kept in {result.outbox}: send it with "
               f"`tracker upload {result.outbox}` once the tracking store answers")
        return 2
    if not result.ok:
        _error(f"attempt {name} failed: {result.error}")
        return 1
    from tracker.profile import aggregate

    latency = result.latency
    assert latency is not None  # an attempt that ran without an error was timed
    print(f"run {result.run_id}: p50 {latency.p50_ms:.3f} ms, mean {latency.mean_ms:.3f} ms "
          f"over {latency.runs} runs; profiling overhead x{result.overhead_ratio:.2f}")
    print(_table(aggregate.top_n(result.summary(skip_runs=config.skip_runs), args.top)))
    return 0


def _inspect(args: argparse.Namespace) -> int:
    from tracker.base.model_io import load_model
    from tracker.experiment_args import parse_dims
    from tracker.measure.inputs.feeds import make_feeds
    from tracker.measure.runtimes import reference_runtime as ref

    model = load_model(args.model)
    feeds = make_feeds(model, dims=parse_dims(args.dim), seed=args.seed)
    if args.node:
        evaluation = ref.evaluate_node(model, args.node, feeds, verbose=args.verbose)
        print(printable(evaluation.trace), end="")
        for kind, values in (("input", evaluation.inputs), ("output", evaluation.outputs)):
            for name, value in values.items():
                print(printable(f"{kind} {name}: {value.dtype}{list(value.shape)}\n{value}"))
    else:
        print(printable(ref.trace_reference(model, feeds, verbose=args.verbose)), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
