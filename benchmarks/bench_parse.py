"""Benchmark: parsing a large ORT 1.32 profile with the tracker vs json.load + pandas vs ORT's own processor.

Each method runs in a fresh interpreter so its peak RSS is its own. Prints figures only; asserts no timings.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
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
    ("tracker_1proc", "repeat", "tracker parse, 1 process"),
    ("tracker_whole", "repeat", "tracker parse, whole text"),
    ("tracker_gzip", "repeat", "tracker parse_profile, gzip"),
    ("json_pandas", "slow_repeat", "json.load+pandas (gc on) [ref]"),
    ("json_pandas_nogc", "slow_repeat", "json.load+pandas (gc off)"),
    ("ort", "slow_repeat", "ORT profile_result_processor"),
    ("summarize", "repeat", "tracker summarize(skip_runs=1)"),
    ("parse_summarize", "repeat", "tracker parse+summarize"),
)
_LABELS = {name: label for name, _, label in _METHODS}


def check_profile(path: Path, *, kernel_events: int | None, runs: int | None) -> tuple[int, int]:
    """Parses the file with the tracker and fails loudly if it does not hold what was written."""
    from tracker.base.errors import ProfileFormatError
    from tracker.profile import columns as C
    from tracker.profile.parse import parse_profile

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


def straightforward_parse(path: Path):
    """The kernel table and runs of a profile built the obvious way: `json.load`, then a Python list per column.

    An independent reference for `parse_profile`: no msgspec, no chunks, no codes. Slow (json.load).
    """
    import bisect

    import numpy as np
    import pandas as pd

    from tracker.profile import columns as C

    with path.open("rb") as file:
        events = json.load(file)
    windows = sorted((e["ts"], e["dur"]) for e in events if e["cat"] == "Session" and e["name"] == "model_run")
    kernels = [e for e in events if e["cat"] == "Node" and e["name"].endswith("_kernel_time")]
    del events
    starts = [ts for ts, _ in windows]

    def run_of(ts: int) -> int:
        i = bisect.bisect_right(starts, ts) - 1
        return i if i >= 0 and ts <= windows[i][0] + windows[i][1] else -1

    def arg(e: dict, key: str, default: str = "0") -> str:
        return e["args"].get(key, default)

    def shapes(e: dict, key: str) -> str:  # ORT writes them compact: [{"float":[1,32,768]}]
        return json.dumps(e["args"].get(key, []), separators=(",", ":"))

    table = pd.DataFrame(
        {
            C.OP_TYPE: [arg(e, "op_name", "") for e in kernels],
            C.NODE: [e["name"].removesuffix("_kernel_time") for e in kernels],
            C.PROVIDER: [arg(e, "provider", "") for e in kernels],
            C.RUN: np.array([run_of(e["ts"]) for e in kernels], dtype=np.int64),
            C.DUR_US: np.array([e.get("dur", 0) for e in kernels], dtype=np.int64),
            C.TS_US: np.array([e["ts"] for e in kernels], dtype=np.int64),
            C.THREAD: [str(e.get("tid", 0)) for e in kernels],
            C.INPUT_SHAPES: [shapes(e, "input_type_shape") for e in kernels],
            C.OUTPUT_SHAPES: [shapes(e, "output_type_shape") for e in kernels],
            C.OUTPUT_SIZE: np.array([int(arg(e, "output_size")) for e in kernels], dtype=np.int64),
            C.ACTIVATION_SIZE: np.array([int(arg(e, "activation_size")) for e in kernels], dtype=np.int64),
            C.PARAMETER_SIZE: np.array([int(arg(e, "parameter_size")) for e in kernels], dtype=np.int64),
            C.MEM_IN_USE_DELTA: pd.array([None if (m := arg(e, "mem_in_use_delta", None)) is None else int(m)
                                          for e in kernels], dtype="Int64"),
        }
    )
    # Like the tracker's table, the columns of repeated strings are categorical (pandas sorts the categories).
    labels = (C.OP_TYPE, C.NODE, C.PROVIDER, C.THREAD, C.INPUT_SHAPES, C.OUTPUT_SHAPES)
    table = table.astype({column: "category" for column in labels}) if kernels else table
    runs = pd.DataFrame({C.RUN: np.arange(len(windows), dtype=np.int64),
                         C.TS_US: np.array(starts, dtype=np.int64),
                         C.DUR_US: np.array([dur for _, dur in windows], dtype=np.int64)})
    return table, runs


def compare_straightforward(path: Path) -> bool:
    """Prints whether the streamed, whole-text and straightforward parses agree; True if all do."""
    import pandas as pd

    from tracker.profile.parse import parse_profile

    def same(a: pd.DataFrame, b: pd.DataFrame) -> str:
        try:
            pd.testing.assert_frame_equal(a, b)
        except AssertionError as e:
            return "DIFFERENT: " + " ".join(str(e).split())[:300]
        return "identical"

    streamed = parse_profile(path, stream_above_bytes=0)  # what parse_profile does from 4 MiB on (workers too)
    one = parse_profile(path, stream_above_bytes=0, workers=1)
    whole = parse_profile(path, stream_above_bytes=2**62)
    print(f"compare: parse_profile streamed {len(streamed.events):,} rows, {streamed.run_count} runs, "
          f"format {streamed.format!r}; in 1 process {len(one.events):,} rows; whole text {len(whole.events):,} "
          f"rows, format {whole.format!r}")
    verdicts = {
        "streamed vs whole-text events": same(streamed.events, whole.events),
        "streamed vs whole-text runs": same(streamed.runs, whole.runs),
        "streamed vs 1-process events": same(streamed.events, one.events),
        "streamed vs 1-process runs": same(streamed.runs, one.runs),
        "format and truncated": "identical"
        if (streamed.format, streamed.truncated) == (whole.format, whole.truncated) == (one.format, one.truncated)
        else "DIFFERENT",
    }
    print("compare: json.load reference ...", file=sys.stderr)
    table, runs = straightforward_parse(path)
    verdicts["streamed vs json.load reference events"] = same(streamed.events, table)
    verdicts["streamed vs json.load reference runs"] = same(streamed.runs, runs)
    for what, verdict in verdicts.items():
        print(f"compare: {what}: {verdict}")
    return all(v == "identical" for v in verdicts.values())


def _peak_rss_mb() -> float:
    from tracker.base.memory import peak_rss_bytes  # VmHWM, this process's own peak

    peak = peak_rss_bytes()
    if peak:
        return peak / 2**20
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
    elif method in ("tracker", "tracker_1proc", "tracker_whole", "tracker_gzip", "parse_summarize"):
        from tracker.profile.aggregate import summarize
        from tracker.profile.parse import parse_profile

        # The default parse streams files from 4 MiB on, with worker processes from 128 MiB on; the whole-text
        # parse decodes the file in one go.
        kwargs = {"tracker_whole": {"stream_above_bytes": 2**62}, "tracker_1proc": {"workers": 1}}.get(method, {})
        _record_worker_peaks()

        def run(p: str) -> int:
            _WORKER_PEAKS_MB.clear()
            events = parse_profile(p, **kwargs).events
            return len(summarize(events, skip_runs=1)) if method == "parse_summarize" else len(events)
    elif method == "summarize":
        from tracker.profile.aggregate import summarize
        from tracker.profile.parse import parse_profile

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
    _WORKER_PEAKS_MB.clear()
    times, rows = [], 0
    for _ in range(repeat):
        start = time.perf_counter()
        rows = run(path)
        times.append(time.perf_counter() - start)
        gc.collect()
    workers_mb = sum(_WORKER_PEAKS_MB)  # of the last run; they run at the same time as this process
    return {"best_s": min(times), "rows": rows, "base_mb": base_mb, "peak_mb": _peak_rss_mb(),
            "workers": len(_WORKER_PEAKS_MB), "workers_mb": workers_mb}


_WORKER_PEAKS_MB: list[float] = []


def _record_worker_peaks() -> None:
    """Notes the peak RSS each worker process of parse_profile reports (VmHWM; theirs, not this process's)."""
    from tracker.profile.worker import Worker

    result = Worker.result

    def recording_result(self):
        stretch = result(self)
        _WORKER_PEAKS_MB.append(stretch.peak_rss_bytes / 2**20)
        return stretch

    Worker.result = recording_result


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
          f"({path.stat().st_size / kernel_events:.0f} bytes/kernel event); python {sys.version.split()[0]}, "
          f"{len(os.sched_getaffinity(0))} CPUs")
    print(f"{'method':32} {'best s':>7} {'kev/s':>6} {'peak MB':>8} {'base MB':>8} {'delta MB':>9} {'workers MB':>11} "
          f"{'peak/file':>9}")
    for name, r in results.items():
        workers = f"{r['workers']} x {r['workers_mb'] / r['workers']:4.0f}" if r.get("workers") else "-"
        total_mb = r["peak_mb"] + r.get("workers_mb", 0)
        print(f"{_LABELS[name]:32} {r['best_s']:7.3f} {kernel_events / r['best_s'] / 1e3:6.0f} {r['peak_mb']:8.0f} "
              f"{r['base_mb']:8.0f} {r['peak_mb'] - r['base_mb']:9.0f} {workers:>11} {total_mb / size_mb:9.2f}")
    if any(r.get("workers") for r in results.values()):
        print("workers MB: the peak RSS of each worker process parse_profile started (1 per 128 MiB of text, up to "
              "the CPUs); peak/file counts them with this process's peak, as they run at the same time.")
    ref = results.get("json_pandas")
    one = results.get("tracker_1proc")
    if one is not None and "tracker" in results:
        print(f"parse_profile with its workers vs in 1 process: {one['best_s'] / results['tracker']['best_s']:.2f}x")
    if ref is None:
        return
    print("vs json.load+pandas (gc on):  speed-up   peak RSS ratio   delta RSS ratio")
    shown = ("tracker", "tracker_1proc", "tracker_whole", "tracker_gzip", "parse_summarize", "json_pandas_nogc", "ort")
    for name in [n for n in shown if n in results]:
        r = results[name]
        peak = r["peak_mb"] + r.get("workers_mb", 0)
        delta = peak - r["base_mb"]
        print(f"  {_LABELS[name]:28} {ref['best_s'] / r['best_s']:8.1f}x {peak / ref['peak_mb']:14.2f} "
              f"{delta / (ref['peak_mb'] - ref['base_mb']):17.2f}")
    print("summarize runs on the parsed table: its base MB includes that table, its delta is only what it adds.")
    print("parse+summarize is timed end to end, as one would use it; ORT's processor does the same work.")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=533_000,
                        help="kernel events to synthesize, rounded up to whole runs of 533 (at least 2 runs)")
    parser.add_argument("--profile", type=Path, help="benchmark this existing profile instead of a synthetic one")
    parser.add_argument("--write-only", type=Path, metavar="PATH", help="write the synthetic profile here and exit")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeat", type=int, default=3, help="runs of the fast methods (best is kept)")
    parser.add_argument("--slow-repeat", type=int, default=1, help="runs of json.load and ORT's processor")
    parser.add_argument("--methods", default=",".join(name for name, _, _ in _METHODS if name != "tracker_gzip"),
                        help="comma-separated rows to measure (default: all but tracker_gzip): " + ", ".join(_LABELS))
    parser.add_argument("--compare-straightforward", action="store_true",
                        help="first check that the streamed, whole-text and a plain json.load parse give the same "
                             "table (exit 1 if not)")
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
        gz_path = Path(tmp) / (path.name + ".gz")
        if "tracker_gzip" in args.methods.split(","):
            print(f"compressing {path.name} (gzip level 1) ...", file=sys.stderr)
            with path.open("rb") as plain, gzip.open(gz_path, "wb", compresslevel=1) as packed:
                shutil.copyfileobj(plain, packed, 2**20)
        if args.compare_straightforward and not compare_straightforward(path):
            raise SystemExit("the parses differ")
        wanted = set(args.methods.split(","))
        if wanted - set(_LABELS):
            raise SystemExit(f"unknown --methods {sorted(wanted - set(_LABELS))}; expected some of {list(_LABELS)}")
        results = {}
        for name, which, label in [m for m in _METHODS if m[0] in wanted]:
            if name == "ort" and not _has_ort_processor():
                print("skipping ORT's processor: onnxruntime.transformers.profile_result_processor is not importable",
                      file=sys.stderr)
                continue
            repeat = getattr(args, which)
            print(f"measuring {label} (best of {repeat}) ...", file=sys.stderr)
            results[name] = _measure(name, gz_path if name == "tracker_gzip" else path, repeat)
        if expected is not None and "json_pandas" in results and results["json_pandas"]["rows"] != kernel_events:
            raise SystemExit(f"reference built {results['json_pandas']['rows']} rows, expected {kernel_events}")
        _report(path, kernel_events, runs, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
