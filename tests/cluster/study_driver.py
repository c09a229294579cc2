"""The driver of tests/cluster/ and benchmarks/bench_cluster.py: `tracker optimize` with argv, in this process,
with no machine roofs measured (~7 s per node that these runs do not look at)."""

from __future__ import annotations

import sys

import tracker.study
from tracker.cli import main

if __name__ == "__main__":
    tracker.study.measure_machine_or_none = lambda: None  # the nodes then measure none either
    sys.exit(main(sys.argv[1:]))
