"""Benchmark: parsing a large ONNX Runtime 1.32 profile with the tracker vs json.load + pandas vs ORT's processor.

Each method runs in a fresh interpreter so its peak RSS is its own. Prints figures only; asserts no timings.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_SEQ, _LAYERS, _PID, _TID_POOL = 32, 12, 2019, ("140127813510912", "140127805118208", "140127796725504")
_FLOAT, _INT, _BOOL = "float", "int64", "bool"
_ITEM_BYTES = {_FLOAT: 4, _INT: 8, _BOOL: 1}
_H, _H2 = [1, _SEQ, 768], [_SEQ, 768]
_HD, _HT, _KT, _S = [1, _SEQ, 12, 64], [1, 12, _SEQ, 64], [1, 12, 64, _SEQ], [1, 12, _SEQ, _SEQ]
_I0, _I1 = (_INT, []), (_INT, [1])
# name, method in the child, repeat option that applies, label
_METHODS = (
    ("read", "read_bytes", "repeat", "read_bytes (I/O floor)"),
    ("tracker", "tracker.parse_profile", "repeat", "tracker parse_profile"),
    ("json_pandas", "json.load + DataFrame", "slow_repeat", "json.load+pandas (gc on) [ref]"),
    ("json_pandas_nogc", "json.load + DataFrame", "slow_repeat", "json.load+pandas (gc off)"),
    ("ort", "profile_result_processor", "slow_repeat", "ORT profile_result_processor"),
    ("summarize", "aggregate.summarize", "repeat", "tracker summarize(skip_runs=1)"),
)


def _conv1d(prefix: str, k: int, n: int, dur: int) -> list[tuple]:
    # HF GPT-2 Conv1D exports as Reshape -> Gemm -> Reshape; the Gemm carries the weight and bias.
    rows, cols = [_SEQ, k], [_SEQ, n]
    return [(f"{prefix}/Reshape", "Reshape", [(_FLOAT, [1, _SEQ, k]), (_INT, [2])], [(_FLOAT, rows)], 1, 2),
            (f"{prefix}/Gemm", "Gemm", [(_FLOAT, rows), (_FLOAT, [k, n]), (_FLOAT, [n])], [(_FLOAT, cols)], 2, dur),
            (f"{prefix}/Reshape_1", "Reshape", [(_FLOAT, cols), (_INT, [3])], [(_FLOAT, [1, _SEQ, n])], 1, 2)]


def _layer(p: str) -> list[tuple]:
    """The 44 kernels of one GPT-2 block in ORT's runtime graph: (name, op, inputs, outputs, n_params, dur_us)."""
    a, ln = f"{p}/attn", [(_FLOAT, _H), (_FLOAT, [768]), (_FLOAT, [768])]
    nodes = [(f"{p}/ln_1/LayerNormalization", "LayerNormalization", ln, [(_FLOAT, _H)], 2, 14)]
    nodes += _conv1d(f"{a}/c_attn", 768, 2304, 150)
    nodes += [(f"{a}/Split", "Split", [(_FLOAT, [1, _SEQ, 2304]), (_INT, [3])], [(_FLOAT, _H)] * 3, 1, 5),
              (f"{a}/Shape", "Shape", [(_FLOAT, _H)], [(_INT, [3])], 0, 1),
              (f"{a}/Gather", "Gather", [(_INT, [3]), _I0], [_I0], 1, 1),
              (f"{a}/Unsqueeze", "Unsqueeze", [_I0, _I1], [_I1], 1, 1),
              (f"{a}/Concat", "Concat", [_I1] * 4, [(_INT, [4])], 3, 2)]
    nodes += [(f"{a}/Reshape{s}", "Reshape", [(_FLOAT, _H), (_INT, [4])], [(_FLOAT, _HD)], 0, 2) for s in ("", "_1", "_2")]
    nodes += [(f"{a}/Transpose{s}", "Transpose", [(_FLOAT, _HD)], [(_FLOAT, o)], 0, 7)
              for s, o in (("", _HT), ("_1", _KT), ("_2", _HT))]
    nodes += [(f"{a}/FusedMatMul", "FusedMatMul", [(_FLOAT, _HT), (_FLOAT, _KT)], [(_FLOAT, _S)], 0, 16),
              (f"{a}/Shape_1", "Shape", [(_FLOAT, _HT)], [(_INT, [4])], 0, 1),
              (f"{a}/Gather_1", "Gather", [(_INT, [4]), _I0], [_I0], 1, 1),
              (f"{a}/Shape_2", "Shape", [(_FLOAT, _KT)], [(_INT, [4])], 0, 1),
              (f"{a}/Gather_2", "Gather", [(_INT, [4]), _I0], [_I0], 1, 1),
              (f"{a}/Sub", "Sub", [_I0, _I0], [_I0], 0, 1),
              (f"{a}/Unsqueeze_1", "Unsqueeze", [_I0, _I1], [_I1], 1, 1),
              (f"{a}/Slice", "Slice", [(_BOOL, [1, 1, 1024, 1024]), _I1, _I1, _I1], [(_BOOL, [1, 1, _SEQ, 1024])], 3, 3),
              (f"{a}/Slice_1", "Slice", [(_BOOL, [1, 1, _SEQ, 1024]), _I1, _I1, _I1], [(_BOOL, [1, 1, _SEQ, _SEQ])], 3, 2),
              (f"{a}/Cast", "Cast", [_I0], [(_FLOAT, [])], 0, 1),
              (f"{a}/Where", "Where", [(_BOOL, [1, 1, _SEQ, _SEQ]), (_FLOAT, _S), (_FLOAT, [])], [(_FLOAT, _S)], 1, 5),
              (f"{a}/Softmax", "Softmax", [(_FLOAT, _S)], [(_FLOAT, _S)], 0, 11),
              (f"{a}/MatMul", "MatMul", [(_FLOAT, _S), (_FLOAT, _HT)], [(_FLOAT, _HT)], 0, 13),
              (f"{a}/Transpose_3", "Transpose", [(_FLOAT, _HT)], [(_FLOAT, _HD)], 0, 7),
              (f"{a}/Concat_1", "Concat", [_I1] * 3, [(_INT, [3])], 2, 2),
              (f"{a}/Reshape_3", "Reshape", [(_FLOAT, _HD), (_INT, [3])], [(_FLOAT, _H)], 0, 2)]
    nodes += _conv1d(f"{a}/c_proj", 768, 768, 50)
    nodes += [(f"{p}/Add", "Add", [(_FLOAT, _H)] * 2, [(_FLOAT, _H)], 0, 5),
              (f"{p}/ln_2/LayerNormalization", "LayerNormalization", ln, [(_FLOAT, _H)], 2, 14)]
    nodes += _conv1d(f"{p}/mlp/c_fc", 768, 3072, 190)
    nodes += [(f"{p}/mlp/act/FastGelu", "FastGelu", [(_FLOAT, [1, _SEQ, 3072])], [(_FLOAT, [1, _SEQ, 3072])], 0, 30)]
    nodes += _conv1d(f"{p}/mlp/c_proj", 3072, 768, 185)
    nodes += [(f"{p}/Add_1", "Add", [(_FLOAT, _H)] * 2, [(_FLOAT, _H)], 0, 5)]
    assert len(nodes) == 44, len(nodes)
    return nodes


def gpt2_graph() -> list[tuple]:
    """The 533 kernels of one GPT-2 small run at sequence length 32, in execution order."""
    nodes = [("/transformer/wte/Gather", "Gather", [(_INT, [1, _SEQ]), (_FLOAT, [50257, 768])], [(_FLOAT, _H)], 1, 9),
             ("/transformer/wpe/Gather", "Gather", [(_INT, [1, _SEQ]), (_FLOAT, [1024, 768])], [(_FLOAT, _H)], 1, 4),
             ("/transformer/Add", "Add", [(_FLOAT, _H)] * 2, [(_FLOAT, _H)], 0, 5)]
    for i in range(_LAYERS):
        nodes += _layer(f"/transformer/h.{i}")
    ln = [(_FLOAT, _H), (_FLOAT, [768]), (_FLOAT, [768])]
    nodes += [("/transformer/ln_f/LayerNormalization", "LayerNormalization", ln, [(_FLOAT, _H)], 2, 14),
              ("/lm_head/MatMul", "MatMul", [(_FLOAT, _H), (_FLOAT, [768, 50257])], [(_FLOAT, [1, _SEQ, 50257])], 1, 2100)]
    return nodes


def _nbytes(io: list) -> int:
    total = 0
    for dtype, shape in io:
        n = _ITEM_BYTES[dtype]
        for d in shape:
            n *= d
        total += n
    return total


def _shapes(io: list) -> str:
    return "[" + ",".join('{"%s":[%s]}' % (t, ",".join(map(str, s))) for t, s in io) + "]"


def _event(cat: str, name: str, ts: int, dur: int, args: str = "") -> str:
    return (f'{{"cat" : "{cat}","pid" :{_PID},"tid" :{_PID},"dur" :{dur},"ts" :{ts},"ph" : "X",'
            f'"name" :"{name}","args" : {{{args}}}}}')


def _thread_stats(rng: random.Random, dur: int) -> str:
    # What ORT's ThreadPoolProfiler::Stop writes (raw JSON) when the session has an intra-op pool.
    busy = int(dur >= 10)
    blocks = ", ".join([str(rng.choice((4, 8, 16)))] * 4) if busy else ""
    subs = ",".join(f'"{t}": {{"num_run": {int(busy)}, "core": {c}}}' for c, t in enumerate(_TID_POOL, 1))
    return ('{"main_thread": {"thread_pool_name": "session-1-intra-op", "thread_id": "140127830296384", '
            f'"block_size": [{blocks}], "core": 0, "Distribution": {rng.randint(1, 4) * busy}, '
            f'"DistributionEnqueue": {busy}, "Run": {dur // 2 * busy}, "Wait": {rng.randint(0, 3) * busy}, '
            f'"WaitRevoke": 0}}, "sub_threads": {{{subs}}}}}')


def synthesize_profile(path: Path, *, runs: int, seed: int = 0) -> int:
    """Writes a GPT-2-like ORT 1.32 profile of `runs` runs in ORT's own layout; returns its kernel event count."""
    rng = random.Random(seed)
    static = [(f"{name}_kernel_time", op, _shapes(ins), _shapes(outs), _nbytes(outs),
               _nbytes(ins[:len(ins) - n_params]), _nbytes(ins[len(ins) - n_params:]), dur)
              for name, op, ins, outs, n_params, dur in gpt2_graph()]
    lines = [_event("Session", "model_loading_uri", 3, 251_306), _event("Session", "session_initialization", 251_420, 903_877)]
    t, in_use, peak, arena = 1_156_000, 0, 0, 0
    for run in range(runs):
        slow = 3.0 if run == 0 else 1.0  # the first run allocates and picks kernels
        exec_ts = t + rng.randint(5, 12)
        ts = exec_ts + rng.randint(3, 8)
        for index, (name, op, in_shapes, out_shapes, out_size, act_size, param_size, base) in enumerate(static):
            dur = max(1, round(base * slow * rng.uniform(0.8, 1.3)))
            delta = -(-out_size // 64) * 64 - (in_use // 2 if index % 3 == 0 else 0)
            in_use += delta
            peak = max(peak, in_use)
            arena_delta = max(0, -(-peak // 1_048_576) * 1_048_576 - arena)
            arena += arena_delta
            args = [("op_name", f'"{op}"'), ("provider", '"CPUExecutionProvider"'), ("node_index", f'"{index}"'),
                    ("input_type_shape", in_shapes), ("output_type_shape", out_shapes),
                    ("output_size", f'"{out_size}"'), ("activation_size", f'"{act_size}"'),
                    ("parameter_size", f'"{param_size}"'), ("thread_scheduling_stats", _thread_stats(rng, dur)),
                    ("mem_in_use_delta", f'"{delta}"'), ("mem_bytes_in_use", f'"{in_use}"'),
                    ("mem_in_use_peak", f'"{peak}"'), ("mem_arena_held", f'"{arena}"'),
                    ("mem_arena_held_delta", f'"{arena_delta}"'), ("mem_requested_in_use_delta", f'"{delta - 64}"'),
                    ("mem_bytes_requested_in_use", f'"{max(0, in_use - 192)}"')]
            rng.shuffle(args)  # ORT keeps args in an unordered_map: the key order varies per event
            lines.append(_event("Node", name, ts, dur, ",".join(f'"{k}" : {v}' for k, v in args)))
            ts += dur + rng.randint(1, 4)
        exec_end = ts + rng.randint(2, 6)
        lines.append(_event("Session", "SequentialExecutor::Execute", exec_ts, exec_end - exec_ts))
        lines.append(_event("Session", "model_run", t, exec_end + rng.randint(2, 6) - t))
        t = exec_end + rng.randint(60, 250)
        in_use = 0
    path.write_text("[\n" + ",\n".join(lines) + "\n]\n")
    return runs * len(static)


def check_profile(path: Path, *, kernel_events: int | None, runs: int | None) -> tuple[int, int]:
    """Parses the file with the tracker and fails loudly if it does not hold what was written."""
    from tracker import columns as C
    from tracker.profile_parse import parse_profile

    profile = parse_profile(path)
    got = (len(profile.events), profile.run_count)
    outside = int((profile.events[C.RUN] < 0).sum())
    if got[0] == 0 or got[1] == 0 or outside or (kernel_events is not None and got != (kernel_events, runs)):
        raise SystemExit(f"sanity check failed for {path}: parse_profile gave {got[0]} kernel events in {got[1]} "
                         f"runs ({outside} outside any run); expected {kernel_events} in {runs}")
    if kernel_events is not None and (profile.format != "memory" or profile.events.groupby(C.RUN).size().nunique() != 1):
        raise SystemExit(f"sanity check failed: format {profile.format!r} (expected 'memory') or uneven runs")
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
                return len(process_results(p, argparse.Namespace(threshold=0.0, kernel_time_only=True)))
    elif method in ("tracker", "summarize"):
        from tracker.aggregate import summarize
        from tracker.profile_parse import parse_profile

        if method == "tracker":
            def run(p: str) -> int:
                return len(parse_profile(p).events)
        else:
            events = parse_profile(path).events  # untimed; the table it leaves is part of this row's baseline
            gc.collect()
            _reset_peak_rss()  # else the parse's own peak would hide what summarize adds

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
    print(f"{'method':32} {'best s':>7} {'Mev/s':>6} {'peak MB':>8} {'base MB':>8} {'delta MB':>9} {'peak/file':>9}")
    for name, _, _, label in _METHODS:
        r = results[name]
        print(f"{label:32} {r['best_s']:7.3f} {kernel_events / r['best_s'] / 1e6:6.2f} {r['peak_mb']:8.0f} "
              f"{r['base_mb']:8.0f} {r['peak_mb'] - r['base_mb']:9.0f} {r['peak_mb'] / size_mb:9.2f}")
    ref = results["json_pandas"]
    print("vs json.load+pandas (gc on):  speed-up   peak RSS ratio   delta RSS ratio")
    for name in ("tracker", "json_pandas_nogc", "ort"):
        r, label = results[name], next(m[3] for m in _METHODS if m[0] == name)
        print(f"  {label:28} {ref['best_s'] / r['best_s']:8.1f}x {r['peak_mb'] / ref['peak_mb']:14.2f} "
              f"{(r['peak_mb'] - r['base_mb']) / (ref['peak_mb'] - ref['base_mb']):17.2f}")
    print("summarize runs on the parsed table: its base MB includes that table, its delta is only what it adds.")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=120_000, help="kernel events to synthesize (whole runs of 533)")
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
    runs = -(-args.events // len(gpt2_graph()))
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
        for name, _, which, label in _METHODS:
            repeat = getattr(args, which)
            print(f"measuring {label} (best of {repeat}) ...", file=sys.stderr)
            results[name] = _measure(name, path, repeat)
        if expected is not None and results["json_pandas"]["rows"] != kernel_events:
            raise SystemExit(f"reference built {results['json_pandas']['rows']} rows, expected {kernel_events}")
        _report(path, kernel_events, runs, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
