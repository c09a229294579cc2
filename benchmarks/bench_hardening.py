"""Benchmark: peak memory and time of parse_profile on the hostile files of issue 14 (a one-line gzip, NUL bytes);
with `--probe`, the outside probe of issue 22 instead (held/broke per case).

Each file is parsed in a fresh interpreter (so its peak RSS is its own) by whichever `tracker` it imports: run it
with PYTHONPATH pointing at another checkout to measure that one. Prints figures only; asserts nothing.

`--probe [--only ITEMS]` runs the cases of `probe_logging.py`, `probe_server.py`, `probe_inputs.py` and
`probe_outputs.py` (items 1-14 of issue 22) and `probe_third.py` (issue 35's, items "r3.N"), each in an empty folder, from outside (`python -m tracker ...`), and
prints per case whether it held, with what the user saw. `PYTHONPATH=/path/to/older/checkout` probes that one.
"""

from __future__ import annotations

import argparse
import gzip
import os
import subprocess
import sys
import tempfile
from pathlib import Path

# Sibling modules: run this file as a script (`python benchmarks/bench_hardening.py`).
from probe_common import run_cases
from synth_profile import _profile_text, gpt2_graph

_CHILD = """
import sys, time
from tracker.base.errors import ProfileFormatError
from tracker.base.memory import peak_rss_bytes
from tracker.profile.parse import parse_profile
before, start = peak_rss_bytes(), time.perf_counter()
try:
    outcome = f"{len(parse_profile(sys.argv[1]).events):,} rows"
except ProfileFormatError as e:
    outcome = f"ProfileFormatError: {str(e)[:90]}"
seconds, peak = time.perf_counter() - start, peak_rss_bytes()
print(f"{seconds:.2f} {peak / 2**20:.0f} {(peak - before) / 2**20:.0f} {outcome}")
"""


def write_gzip_profile(path: Path, *, runs: int, one_line: bool) -> int:
    """A synthetic GPT-2 profile (`synth_profile`), gzip level 1, one event per line or all on one line."""
    with gzip.open(path, "wt", encoding="utf-8", compresslevel=1) as out:
        for piece in _profile_text(runs, seed=0):
            out.write(piece.replace("\n", "") if one_line else piece)
    return runs * len(gpt2_graph())


def measure(path: Path, tracker_root: Path | None = None) -> str:
    env = {**os.environ, **({"PYTHONPATH": str(tracker_root)} if tracker_root else {})}
    command = [sys.executable, "-c", _CHILD, str(path)]
    # Run from the file's folder: `python -c` puts the working directory, a checkout perhaps, first on the path.
    done = subprocess.run(command, capture_output=True, text=True, check=False, env=env, cwd=path.parent)
    if done.returncode != 0:
        return f"child failed (rc {done.returncode}): {done.stderr.strip().splitlines()[-1:]}"
    seconds, peak, grown, outcome = done.stdout.strip().split(" ", 3)
    return f"{float(seconds):8.2f} {int(peak):8d} {int(grown):9d}  {outcome}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--text-gib", type=float, default=1.0, help="expanded size of the gzip profiles")
    parser.add_argument("--nul-gib", type=float, default=2.0, help="size of the sparse file of NUL bytes")
    parser.add_argument("--dir", type=Path, default=None, help="where to write the files (default: a temp dir)")
    parser.add_argument("--before", type=Path, default=None,
                        help="also parse each file with the tracker of this checkout (e.g. a `git archive` of HEAD~1)")
    parser.add_argument("--probe", action="store_true", help="run issue 22's outside probe instead (held/broke)")
    parser.add_argument("--only", default="", help="with --probe: the issue's items to run, e.g. 1,2,9")
    args = parser.parse_args(argv)
    if args.probe:
        return probe(only={item.strip() for item in args.only.split(",") if item.strip()}, folder=args.dir)
    import tracker

    runs = max(2, round(args.text_gib * 2**30 / (len(gpt2_graph()) * 912)))
    with tempfile.TemporaryDirectory(prefix="bench_hardening_", dir=args.dir) as tmp:
        files = {}
        for layout in ("one per line", "one line"):
            path = Path(tmp) / f"{layout.replace(' ', '_')}.json.gz"
            print(f"writing {runs} runs, {layout} -> {path.name} ...", file=sys.stderr)
            write_gzip_profile(path, runs=runs, one_line=layout == "one line")
            files[f"gzip, {layout}"] = path
        nul = Path(tmp) / "nul.json"
        nul.touch()
        os.truncate(nul, int(args.nul_gib * 2**30))  # sparse
        files[f"{args.nul_gib:g} GiB of NUL bytes"] = nul
        print(f"{runs * len(gpt2_graph()):,} kernel events, ~{args.text_gib:g} GiB of text; tracker: this checkout "
              f"({Path(tracker.__file__).parent}){f', and before: {args.before}' if args.before else ''}")
        print(f"{'file':32} {'MB':>7} {'s':>8} {'peak MB':>8} {'grown MB':>9}  outcome")
        for name, path in files.items():
            print(f"{name:32} {path.stat().st_size / 1e6:7.0f} {measure(path)}")
            if args.before:
                print(f"{'  before':32} {'':7} {measure(path, args.before)}")
    return 0


def probe(*, only: set[str], folder: Path | None) -> int:
    """Runs the probe's cases (see the module docstring); prints one line per case, then the count held."""
    import importlib

    import tracker

    cases = [case for module in ("probe_logging", "probe_server", "probe_inputs", "probe_outputs", "probe_third")
             for case in importlib.import_module(module).CASES if not only or case[0] in only]
    # issue 22's items ("1" to "14"), then the third probe's (issue 35: "r3.2" ...)
    cases.sort(key=lambda case: (case[0].startswith("r3."), int(case[0].removeprefix("r3."))))
    print(f"issue 22 and issue 35 probes of {Path(tracker.__file__).parent}: {len(cases)} cases")
    return run_cases(cases, folder)


if __name__ == "__main__":
    sys.exit(main())
