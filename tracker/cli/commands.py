"""What each `tracker` command does, once its arguments are parsed (`tracker.cli.parser`): each imports what it
needs when it runs, so that parsing one command does not import another's modules."""

from __future__ import annotations

import argparse
import json
import sys

from tracker.base.redaction import redact
from tracker.base.terminal import printable


def error(text: str) -> None:
    """One `error:` line on stderr: credentials redacted, control characters escaped."""
    print(f"error: {printable(redact(text))}", file=sys.stderr)


def optimize(args: argparse.Namespace) -> int:
    """`tracker optimize`: plans a study of the user's model, runs it (or prints the plan) and prints the comparison."""
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
        register=args.register or None,
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
    if study.registered is not None:
        print(printable(study.registered.line()))
    failure = own.study_failure(study.results, study.failures)
    if failure:  # the runs are logged, but there is nothing to ship: 1, as `compare --require` when one did not pass
        error(failure)
        return 1
    return 0


def clear_cache(args: argparse.Namespace) -> int:
    """`tracker cache clear`: empties the search cache."""
    from pathlib import Path

    from tracker.base.settings import cache_folder
    from tracker.search.cache import clear

    root = Path(args.dir) if args.dir else cache_folder()
    entries, size = clear(root)
    print(f"removed {entries} search cache entries ({size / 1e6:.1f} MB) from {root}")
    return 0


def compare_study(args: argparse.Namespace) -> int:
    """`tracker compare`: prints a study's attempts side by side, and whether each `--require`d one passed."""
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


def upload_kept(args: argparse.Namespace) -> int:
    """`tracker upload`: logs the attempts and studies kept in the outbox."""
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
        error(f"{reason}; not uploaded: it stays in {path}")
    for path, reason in done.kept.items():
        error(f"{path} not uploaded ({reason}); it stays in the outbox: run `tracker upload {folder}` again once "
               "the tracking store answers")
    return 2 if done.refused or done.kept else 0


def summarize(args: argparse.Namespace) -> int:
    """`tracker summarize`: prints the per-op (node, provider, layer) table of a profile."""
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
        print(summary_table(summary))
    return 0


def summary_table(summary) -> str:
    """A profile's summary as aligned text, or why it is empty."""
    from tracker.profile import columns as C

    if summary.empty:
        return ("No kernel events were found: the profile holds no Node events named '<node>_kernel_time', only "
                "session events. That usually means no inference run was profiled (end_profiling() was called "
                "before the first run, or every run failed before its first kernel).")
    shown = summary[[C.KEY, C.TOTAL_US, C.CALLS, C.PCT, C.US_PER_RUN, C.MEAN_US]].copy()
    shown[C.KEY] = shown[C.KEY].astype(str).map(printable)  # escaped before the columns are aligned
    return shown.to_string(index=False, float_format=lambda v: f"{v:.2f}")


def profile(args: argparse.Namespace) -> int:
    """`tracker profile`: profiles a model file, logs it as an attempt and prints its largest ops."""
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
            error(f"the tracking store refused the run of attempt {name} ({result.refused}){failed}; it is kept in "
                   f"{result.outbox}")
            return 2
        error(f"attempt {name} could not be logged{failed}; it is kept in {result.outbox}: send it with "
               f"`tracker upload {result.outbox}` once the tracking store answers")
        return 2
    if not result.ok:
        error(f"attempt {name} failed: {result.error}")
        return 1
    from tracker.profile import aggregate

    latency = result.latency
    assert latency is not None  # an attempt that ran without an error was timed
    print(f"run {result.run_id}: p50 {latency.p50_ms:.3f} ms, mean {latency.mean_ms:.3f} ms "
          f"over {latency.runs} runs; profiling overhead x{result.overhead_ratio:.2f}")
    print(summary_table(aggregate.top_n(result.summary(skip_runs=config.skip_runs), args.top)))
    return 0


def inspect(args: argparse.Namespace) -> int:
    """`tracker inspect`: prints the ReferenceEvaluator's trace of one run, or of one node alone."""
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
