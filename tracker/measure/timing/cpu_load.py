"""How much of the machine's CPU other processes took while this one was timing a model.

A latency, a profile or a speed-up measured while something else kept the cores busy is not a fact
about the model. `watch_cpu_load` compares the machine's busy CPU time with this process's own over a
step; what is left (plus the hypervisor's steal time) is the other processes' load.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass

import psutil

# A step is "disturbed" when other processes (or the hypervisor) took more than this share of the
# machine's CPU time. Measured on the project's 2-core machines: an idle machine reads 0-3 %, one busy
# process on the side 45-50 %.
DISTURBED_LOAD = 0.15
# The kernel counts CPU time in clock ticks (10 ms on most Linux systems).
_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0.01


@dataclass
class CpuLoad:
    """Filled in when the watched block ends.

    Attributes:
        wall_s: the block's wall time.
        own_cpu_s: CPU time of this process (all its threads).
        others_cpu_s: CPU time of every other process, plus time the hypervisor took from this machine.
        cores: logical CPUs of the machine.
    """

    wall_s: float = 0.0
    own_cpu_s: float = 0.0
    others_cpu_s: float = 0.0
    cores: int = 1

    @property
    def other_load(self) -> float:
        """Share of the machine's CPU capacity (0-1) that other processes took."""
        capacity = self.wall_s * self.cores
        return min(1.0, self.others_cpu_s / capacity) if capacity > 0 else 0.0

    @property
    def resolution_s(self) -> float:
        """How far off `others_cpu_s` can be from counting in ticks: each per-CPU counter and this
        process's user and system times can each be off by a tick at both ends."""
        return 2 * _TICK_S * (self.cores + 2)

    @property
    def disturbed(self) -> bool:
        """Other processes took more than DISTURBED_LOAD of the machine, beyond what tick counting
        could make up (so a block of a few milliseconds is never called disturbed)."""
        return self.others_cpu_s - self.resolution_s > DISTURBED_LOAD * self.wall_s * self.cores


def _busy_seconds(times) -> float:
    """Busy CPU seconds of the whole machine (idle and I/O wait excluded; steal counted as busy)."""
    idle = times.idle + getattr(times, "iowait", 0.0)
    return sum(times) - idle - getattr(times, "guest", 0.0) - getattr(times, "guest_nice", 0.0)


def _own_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


@contextlib.contextmanager
def watch_cpu_load() -> Iterator[CpuLoad]:
    """Measures other processes' CPU load over the `with` block.

    CPU time is counted in ticks, so a block shorter than ~0.5 s reads coarsely (see
    `CpuLoad.disturbed`); it is meant for timing loops of a second or so.
    """
    process = psutil.Process()
    load = CpuLoad(cores=psutil.cpu_count() or 1)
    busy0, own0, t0 = _busy_seconds(psutil.cpu_times()), _own_seconds(process), time.perf_counter()
    try:
        yield load
    finally:
        load.wall_s = time.perf_counter() - t0
        load.own_cpu_s = _own_seconds(process) - own0
        load.others_cpu_s = max(0.0, _busy_seconds(psutil.cpu_times()) - busy0 - load.own_cpu_s)
