"""Benchmark: how sure is a verdict? A/A repeats and known changes of the study's speed-up measurement.

For each model and case, the attempt is timed against its baseline exactly as a study does it
(`tracker.measure.measurement.time_against`, the default `SpeedupConfig` unless told otherwise), `--repeats` times.
The "true" ratio of a case is measured apart, by long isolated runs of each model (A B A B, each alone).
Prints per case: false verdicts, how often the interval covers the true ratio, the median interval
half-width, the median detectable change and the seconds per repeat. Asserts nothing.

    python benchmarks/bench_speedup.py                       # linreg, fusion, gpt2-tiny, gpt2-small
    python benchmarks/bench_speedup.py --models linreg --repeats 5
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import onnx
from calibration import with_extra_work

from tracker.measure.attempt import Attempt
from tracker.measure.environment import huge_pages, with_huge_pages
from tracker.measure.measurement import time_against
from tracker.measure.runtimes.ort_runtime import SessionConfig, make_session
from tracker.measure.timing.speedup import SpeedupConfig

MODELS = ("linreg", "fusion", "gpt2-tiny", "gpt2-small")


@dataclass(frozen=True)
class Case:
    """An attempt against a baseline, and what its verdict must be."""

    model: str
    name: str
    baseline: Attempt
    attempt: Attempt
    expected: str  # the verdicts a correct measurement gives, "|"-separated ("same|inconclusive" for A/A)
    true_ratio: float | None = None  # baseline time / attempt time from long isolated runs; 1 for A/A
    own_ratio: float | None = None  # the same, the sessions in their own settings (ORT's default spinning)
    note: str = ""


def build_models(names: list[str], folder: Path) -> dict[str, tuple[Path, dict[str, np.ndarray]]]:
    """Each model as a file in `folder`, with its feeds."""
    out = {}
    for name in names:
        if name == "linreg":
            from skl2onnx import to_onnx
            from sklearn.datasets import load_diabetes
            from sklearn.linear_model import LinearRegression
            from sklearn.model_selection import train_test_split

            X, y = load_diabetes(return_X_y=True)
            X_train, X_test, y_train, _ = train_test_split(X, y, random_state=11)
            model = to_onnx(LinearRegression().fit(X_train, y_train), X_train[:1].astype(np.float32), target_opset=18)
            feeds = {model.graph.input[0].name: X_test.astype(np.float32)}
        elif name == "fusion":
            from tracker.studies.fusion import make_linear_model

            model = make_linear_model(n_features=100)
            feeds = {"X": np.random.default_rng(0).standard_normal((4, 100)).astype(np.float32)}
        else:
            from tracker.gpt2.export import export_gpt2
            from tracker.gpt2.model import load_gpt2
            from tracker.gpt2.tokens import feeds_for, make_tokens

            size = name.split("-")[1]
            logging.getLogger("bench").info("exporting %s", name)
            loaded = load_gpt2(model=None, size=size, config_path=None, seed=0)
            exported = export_gpt2(loaded, folder / name / "model.onnx")
            tokens = make_tokens(batch=1, seq_len=32, vocab_size=loaded.vocab_size, seed=0)
            out[name] = (exported.path, feeds_for(tokens, exported.input_names))
            continue
        path = folder / name / "model.onnx"
        path.parent.mkdir(parents=True, exist_ok=True)
        onnx.save(model, str(path))
        out[name] = (path, feeds)
    return out


def isolated_ratio(baseline: Attempt, attempt: Attempt, feeds, *, seconds: float, cycles: int = 6,
                   stop_spinning: bool = True) -> float:
    """Baseline / attempt time per call from long runs of each alone, in fresh sessions each cycle, the
    sessions' order alternating: the geometric mean of the cycles' ratios. Fresh sessions each cycle,
    because two sessions of one model differ by a few percent on these machines: a truth from one
    session of each would be off by as much. Calls are timed as the speed-up times them (back-to-back
    blocks of >= 2 ms, the median block), so the harness's own cost per call is the same on both sides.

    Args:
        stop_spinning: the sessions' threads stop spinning after a run, as in the speed-up's sessions;
            False times them with their own settings only (ORT's default spinning).
    """
    logs = []
    for cycle in range(cycles):
        per_call = {}
        for a in (baseline, attempt) if cycle % 2 == 0 else (attempt, baseline):
            session = make_session(a.model, a.session, stop_spinning_after_run=stop_spinning)
            per_call[a.name] = _median_block(lambda s=session: s.run(None, dict(feeds)), seconds)
            del session
        logs.append(math.log(per_call[baseline.name] / per_call[attempt.name]))
    spread = statistics.stdev(logs) / math.sqrt(len(logs))
    settings = "spinning stopped" if stop_spinning else "own settings"
    logging.getLogger("bench").info("true ratio %s / %s (%s): %.4f (+-%.2f%% standard error over %d cycles)",
                                    baseline.name, attempt.name, settings, math.exp(statistics.mean(logs)),
                                    100 * spread, cycles)
    return math.exp(statistics.mean(logs))


def _median_block(run, seconds: float, *, block_s: float = 2e-3, warmup: int = 10) -> float:
    """Median seconds per call over blocks of back-to-back calls (>= `block_s` each) for `seconds`."""
    for _ in range(warmup):
        run()
    t0 = time.perf_counter()
    run()
    calls = max(1, math.ceil(block_s / (time.perf_counter() - t0)))
    blocks = []
    start = time.perf_counter()
    while len(blocks) < 10 or time.perf_counter() - start < seconds:
        t0 = time.perf_counter()
        for _ in range(calls):
            run()
        blocks.append((time.perf_counter() - t0) / calls)
    return statistics.median(blocks)


def cases_for(model: str, path: Path, feeds, folder: Path, *, threads: int, true_seconds: float) -> list[Case]:
    session = SessionConfig(intra_op_num_threads=threads)
    baseline = Attempt("baseline", path, session=session)
    cases = [Case(model, "A/A", baseline, replace(baseline, name="same_file"), "same|inconclusive", 1.0, 1.0,
                  "the baseline's own file, new sessions")]
    if model == "gpt2-small":
        one = replace(baseline, name="threads_1", session=SessionConfig(intra_op_num_threads=1))
        cases.append(Case(model, f"threads {threads}->1", baseline, one, "worse",
                          note="intra-op threads 2 -> 1"))
        from tracker.optimize import ModelInfo, apply

        basic = apply("ort_opt_basic", path, folder / "ort_opt_basic", ModelInfo(num_heads=12, hidden_size=768))
        cases.append(Case(model, "ort_opt_basic", baseline, Attempt("ort_opt_basic", basic.path, session=session),
                          "", note="a fp32 attempt: the interval's width"))
    else:
        slower = with_extra_work(onnx.load(str(path)), copies=1)
        slow_path = folder / model / "extra_work.onnx"
        onnx.save(slower, str(slow_path))
        cases.append(Case(model, "extra work", baseline, Attempt("extra_work", slow_path, session=session),
                          "worse", note="the graph computed twice"))
    out = []
    for case in cases:
        if case.true_ratio is None:
            case = replace(
                case,
                true_ratio=isolated_ratio(case.baseline, case.attempt, feeds, seconds=true_seconds),
                own_ratio=isolated_ratio(case.baseline, case.attempt, feeds, seconds=true_seconds, stop_spinning=False),
            )
        out.append(case)
    return out


def run_case(case: Case, feeds, config: SpeedupConfig, repeats: int) -> dict[str, object]:
    results, seconds = [], []
    for i in range(repeats):
        t0 = time.perf_counter()
        s = time_against(case.attempt, case.baseline, feeds, config)
        seconds.append(time.perf_counter() - t0)
        results.append(s)
        print(f"  {case.model:<10} {case.name:<14} {i + 1:>2}/{repeats}: {s.speedup:.4f} [{s.ci_low:.4f}, "
              f"{s.ci_high:.4f}] {s.interval_verdict:<12} mde {s.mde:.1%}  {s.rounds} rounds  {seconds[-1]:.1f} s", flush=True)
    wrong = sum(s.interval_verdict not in case.expected.split("|") for s in results)
    covered = sum(s.ci_low <= case.true_ratio <= s.ci_high for s in results)
    return {
        "model": case.model, "case": case.name, "true": case.true_ratio, "own": case.own_ratio,
        "expected": case.expected or "-",
        "repeats": repeats, "wrong": wrong if case.expected else None, "covered": covered,
        "median": statistics.median(s.speedup for s in results),
        "half_width": statistics.median((s.ci_high - s.ci_low) / 2 / s.speedup for s in results),
        "mde": statistics.median(s.mde for s in results),
        "disturbed": sum(s.disturbed_rounds > 0 for s in results),
        "seconds": statistics.median(seconds),
        "rounds": statistics.median(s.rounds for s in results),
        "verdicts": ",".join(sorted({s.interval_verdict for s in results})),
    }


def print_table(rows: list[dict[str, object]]) -> None:
    head = f"{'model':<11}{'case':<15}{'true':>7}{'own':>7}{'expect':>18}{'n':>4}{'wrong':>7}{'covers':>8}" \
           f"{'median':>8}{'±width':>8}{'mde':>7}{'disturb':>8}{'rounds':>7}{'s/rep':>7}  verdicts"
    print(head)
    for r in rows:
        wrong = "-" if r["wrong"] is None else f"{r['wrong']}/{r['repeats']}"
        print(f"{r['model']:<11}{r['case']:<15}{r['true']:>7.3f}{r['own']:>7.3f}{r['expected']:>18}"
              f"{r['repeats']:>4}{wrong:>7}{r['covered'] / r['repeats']:>8.0%}{r['median']:>8.3f}"
              f"{r['half_width']:>8.2%}{r['mde']:>7.1%}"
              f"{r['disturbed']:>8}{r['rounds']:>7.0f}{r['seconds']:>7.1f}  {r['verdicts']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma list of {MODELS}")
    parser.add_argument("--repeats", type=int, default=20, help="repeats per case on the small models")
    parser.add_argument("--large-repeats", type=int, default=5, help="repeats per case on gpt2-small")
    parser.add_argument("--threads", type=int, default=2, help="intra-op threads of the baselines")
    parser.add_argument("--true-seconds", type=float, default=1.5, help="isolated run time per model and cycle")
    parser.add_argument("--huge-pages", choices=("on", "off"), default="on",
                        help="run with glibc's malloc asking for huge pages, as `mlflow run .` does (default on)")
    parser.add_argument("--rounds", type=int, default=SpeedupConfig.rounds)
    parser.add_argument("--seconds", type=float, default=SpeedupConfig.seconds)
    args = parser.parse_args(argv)
    if args.huge_pages == "on" and huge_pages() == "off" and argv is None:
        # GLIBC_TUNABLES is read at start-up: run this script again with it
        os.execve(sys.executable, [sys.executable, *sys.argv], with_huge_pages(dict(os.environ)))
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = sorted(set(models) - set(MODELS))
    if unknown:
        parser.error(f"unknown models {unknown}; expected some of {MODELS}")
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    logging.getLogger("bench").setLevel(logging.INFO)
    config = SpeedupConfig(rounds=args.rounds, seconds=args.seconds)
    print(f"speed-up config: {config}; huge pages: {huge_pages()}")
    rows = []
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-speedup-") as tmp:
        built = build_models(models, Path(tmp))
        for model in models:
            path, feeds = built[model]
            for case in cases_for(model, path, feeds, Path(tmp), threads=args.threads, true_seconds=args.true_seconds):
                repeats = args.large_repeats if model == "gpt2-small" else args.repeats
                print(f"{model} / {case.name} ({case.note}): true ratio {case.true_ratio:.4f}", flush=True)
                rows.append(run_case(case, feeds, config, repeats))
    print()
    print_table(rows)
    print(f"\ntotal {time.perf_counter() - start:.0f} s. true: baseline/attempt from long isolated runs, threads "
          "stopping their spin after a run as in the speed-up (1 for A/A); own: the same in the sessions' own "
          "settings; "
          "wrong: verdicts other than the expected one; covers: intervals holding the true ratio; ±width: median "
          "half-width of the interval relative to the estimate; mde: median detectable change; disturb: repeats "
          "with a round kept although other processes used the CPU")
    return 0


if __name__ == "__main__":
    sys.exit(main())
