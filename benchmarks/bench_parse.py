"""Benchmark: parsing a large ORT 1.32 profile with the tracker vs json.load + pandas vs ORT's own processor.

Each method runs in a fresh interpreter so its peak RSS is its own. Prints figures only; asserts no timings.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# A sibling module: run this file as a script (`python benchmarks/bench_parse.py`), which puts benchmarks/ on the path.
from synth_profile import gpt2_graph, synthesize_profile

# (method name in the child, the repeat option that applies to it, label)
_METHODS = (
    ("read", "repeat", "read_bytes (I/O floor)"),
    ("tracker", "repeat", "tracker parse_profile"),
    ("json_pandas", "slow_repeat", "json.load+pandas (gc on) [ref]"),
    ("json_pandas_nogc", "slow_repeat", "json.load+pandas (gc off)"),
    ("ort", "slow_repeat", "ORT profile_result_processor"),
    ("summarize", "repeat", "tracker summarize(skip_runs=1)"),
)
_LABELS = {name: label for name, _, label in _METHODS}


def check_profile(path: Path, *, kernel_events: int | None, runs: int | None) -> tuple[int, int]:
    """Parses the file with the tracker and fails loudly if it does not hold what was written."""
    from tracker import columns as C
    from tracker.errors import ProfileFormatError
    from tracker.profile_parse import parse_profile

    if path.is_file() and path.read_bytes()[:2] == b"\x1f\x8b":
        raise SystemExit(f"{path} is gzip: json.load and ORT's processor need the plain JSON; gunzip it first")
    try:
        profile = parse_profile(path)
    except ProfileFormatError as e:
        raise SystemExit(f"sanity check failed: {e}") from e
    got = (len(profile.events), profile.run_count)
    outside = int((profile.events[C.RUN] < 0).sum())
    if got[0] == 0 or got[1] == 0 or outside or (kernel_events is not None and got != (kernel_events, runs)):
        raise SystemExit(f"sanity check failed for {path}: parse_profile gave {got[0]} kernel events in {got[1]} "
                         f"runs ({outside} outside any run); expected {kernel_events} in {runs}")
    uneven = profile.events.groupby(C.RUN).size().nunique() != 1
    if kernel_events is not None and (profile.format != "memory" or uneven):
        raise SystemExit(f"sanity check failed: format {profile.format!r} (expected 'memory'), uneven runs: {uneven}")
    return got


def _peak_rss_mb() -> float:
    # VmHWM is this process's own peak. ru_maxrss is not: Linux carries it over fork + exec, so every child
    # would start at the parent's peak (here, the parent that wrote and checked the file).
    try:
        status = Path("/proc/self/status").read_text()
        return next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM:")) / 1024
    except (OSError, StopIteration):
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _reset_peak_rss() -> bool:
    """Resets VmHWM to the current RSS (Linux >= 4.0); False where that is not allowed."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def _child(method: str, path: str, repeat: int) -> dict:
    """Runs one method `repeat` times in this (fresh) interpreter; reports best wall time and peak RSS."""
    import gc

    if method in ("json_pandas", "json_pandas_nogc"):
        import pandas as pd

        def run(p: str) -> int:
            with open(p) as f:
                events = json.load(f)
            return len(pd.DataFrame([{**e, **e["args"]} for e in events if e["cat"] == "Node"]))
        if method == "json_pandas_nogc":
            gc.disable()
    elif method == "ort":
        import contextlib
        import io

        from onnxruntime.transformers.profile_result_processor import process_results

        def run(p: str) -> int:
            with contextlib.redirect_stdout(io.StringIO()):  # it prints "loading profile output ..."
                return len(process_results(p, argparse.Namespace(threshold=0.01, kernel_time_only=True)))
    elif method in ("tracker", "summarize"):
        from tracker.aggregate import summarize
        from tracker.profile_parse import parse_profile

        if method == "tracker":
            def run(p: str) -> int:
                return len(parse_profile(p).events)
        else:
            events = parse_profile(path).events  # untimed; the table it leaves is part of this row's baseline
            gc.collect()
            if not _reset_peak_rss():  # else the parse's own peak hides what summarize adds
                print("cannot reset the peak RSS: summarize's delta MB is a lower bound", file=sys.stderr)

            def run(p: str) -> int:
                return len(summarize(events, skip_runs=1))
    else:
        def run(p: str) -> int:
            return len(Path(p).read_bytes())
    base_mb = _peak_rss_mb()
    times, rows = [], 0
    for _ in range(repeat):
        start = time.perf_counter()
        rows = run(path)
        times.append(time.perf_counter() - start)
        gc.collect()
    return {"best_s": min(times), "rows": rows, "base_mb": base_mb, "peak_mb": _peak_rss_mb()}


def _has_ort_processor() -> bool:
    # It reads a finished profile file with json.load and needs no session or model.
    from importlib.util import find_spec

    try:
        return find_spec("onnxruntime.transformers.profile_result_processor") is not None
    except ImportError:
        return False


def _measure(method: str, path: Path, repeat: int) -> dict:
    cmd = [sys.executable, __file__, "--child", method, "--profile", str(path), "--repeat", str(repeat)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"child {method!r} failed (rc {done.returncode}):\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _report(path: Path, kernel_events: int, runs: int, results: dict[str, dict]) -> None:
    size_mb = path.stat().st_size / 1e6
    print(f"profile: {path.name}, {size_mb:.1f} MB, {kernel_events:,} kernel events in {runs} runs "
          f"({path.stat().st_size / kernel_events:.0f} bytes/kernel event); python {sys.version.split()[0]}")
    print(f"{'method':32} {'best s':>7} {'kev/s':>6} {'peak MB':>8} {'base MB':>8} {'delta MB':>9} {'peak/file':>9}")
    for name, r in results.items():
        print(f"{_LABELS[name]:32} {r['best_s']:7.3f} {kernel_events / r['best_s'] / 1e3:6.0f} {r['peak_mb']:8.0f} "
              f"{r['base_mb']:8.0f} {r['peak_mb'] - r['base_mb']:9.0f} {r['peak_mb'] / size_mb:9.2f}")
    ref = results["json_pandas"]
    print("vs json.load+pandas (gc on):  speed-up   peak RSS ratio   delta RSS ratio")
    for name in [n for n in ("tracker", "json_pandas_nogc", "ort") if n in results]:
        r = results[name]
        print(f"  {_LABELS[name]:28} {ref['best_s'] / r['best_s']:8.1f}x {r['peak_mb'] / ref['peak_mb']:14.2f} "
              f"{(r['peak_mb'] - r['base_mb']) / (ref['peak_mb'] - ref['base_mb']):17.2f}")
    print("summarize runs on the parsed table: its base MB includes that table, its delta is only what it adds.")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=120_000,
                        help="kernel events to synthesize, rounded up to whole runs of 533 (at least 2 runs)")
    parser.add_argument("--profile", type=Path, help="benchmark this existing profile instead of a synthetic one")
    parser.add_argument("--write-only", type=Path, metavar="PATH", help="write the synthetic profile here and exit")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeat", type=int, default=3, help="runs of the fast methods (best is kept)")
    parser.add_argument("--slow-repeat", type=int, default=1, help="runs of json.load and ORT's processor")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(_child(args.child, str(args.profile), args.repeat)))
        return 0
    runs = max(2, -(-args.events // len(gpt2_graph())))  # summarize(skip_runs=1) needs a second run
    with tempfile.TemporaryDirectory(prefix="bench_parse_") as tmp:
        path, expected = args.profile, None
        if path is None:
            path = args.write_only or Path(tmp) / "profile_gpt2_synthetic.json"
            print(f"synthesizing {runs} runs x {len(gpt2_graph())} kernels -> {path} ...", file=sys.stderr)
            expected = synthesize_profile(path, runs=runs, seed=args.seed)
            if args.write_only:
                print(f"wrote {path}: {expected:,} kernel events in {runs} runs")
                return 0
        kernel_events, runs = check_profile(path, kernel_events=expected, runs=runs if expected else None)
        results = {}
        for name, which, label in _METHODS:
            if name == "ort" and not _has_ort_processor():
                print("skipping ORT's processor: onnxruntime.transformers.profile_result_processor is not importable",
                      file=sys.stderr)
                continue
            repeat = getattr(args, which)
            print(f"measuring {label} (best of {repeat}) ...", file=sys.stderr)
            results[name] = _measure(name, path, repeat)
        if expected is not None and results["json_pandas"]["rows"] != kernel_events:
            raise SystemExit(f"reference built {results['json_pandas']['rows']} rows, expected {kernel_events}")
        _report(path, kernel_events, runs, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
