"""Gathers the kernel calls of one stretch of a plain profile file in a process of its own.

`tracker.profile.parse` starts `python -m tracker.profile.worker PATH START STOP BLOCK_BYTES` for each stretch
but the first, which it reads itself, and merges what the workers print: a pickled `StretchResult`. This module
imports numpy and msgspec but not pandas, so a worker is up in about a tenth of a second.
"""

from __future__ import annotations

import gc
import os
import pickle
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import tracker
from tracker.base.errors import ProfileFormatError
from tracker.base.memory import peak_rss_bytes
from tracker.profile.kernels import GatheredColumns, gather
from tracker.profile.stream import iter_mapped_batches


@dataclass
class StretchResult:
    """What a worker hands back: the columns of its stretch, or why it could not read it."""

    columns: GatheredColumns | None
    truncated: bool = False
    error: str = ""
    peak_rss_bytes: int = 0  # the worker's own peak resident memory, where Linux tells it (VmHWM)


def gather_stretch(path: Path, start: int, stop: int, block_bytes: int) -> StretchResult:
    """Gathers the kernel calls of `path[start:stop]`, a stretch between two commas that `event_commas` found."""
    try:
        columns, truncated = gather(iter_mapped_batches(path, str(path), block_bytes, start=start, stop=stop))
    except ProfileFormatError as e:  # not a list of events: the cut was not between events, or the file is bad
        return StretchResult(columns=None, error=str(e))
    return StretchResult(columns=columns.gathered(), truncated=truncated)


class Worker:
    """A running `python -m tracker.profile.worker`; `result()` waits for it."""

    def __init__(self, path: Path, start: int, stop: int, block_bytes: int) -> None:
        # The tracker may be importable only from where it was imported here (a checkout on sys.path).
        package_root = str(Path(tracker.__file__).resolve().parents[1])
        python_path = os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")]))
        env = {**os.environ, "PYTHONPATH": python_path, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
        command = [sys.executable, "-m", __name__, str(path), str(start), str(stop), str(block_bytes)]
        self._process = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
        )

    def result(self) -> StretchResult:
        out, err = self._process.communicate()
        if self._process.returncode != 0:
            message = err.decode(errors="replace").strip().splitlines()[-1:] or ["no message"]
            return StretchResult(columns=None, error=f"worker exited with {self._process.returncode}: {message[0]}")
        return pickle.loads(out)

    def stop(self) -> None:
        if self._process.poll() is None:
            self._process.kill()
            self._process.communicate()


def main(argv: list[str]) -> None:
    path, start, stop, block_bytes = Path(argv[0]), *map(int, argv[1:])
    gc.disable()  # decoding makes millions of objects and no cycles
    result = gather_stretch(path, start, stop, block_bytes)
    result.peak_rss_bytes = peak_rss_bytes()
    sys.stdout.buffer.write(pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL))


if __name__ == "__main__":
    # Through the module's import name, so the pickle names `tracker.profile.worker.StretchResult`, not `__main__`.
    from tracker.profile.worker import main as _main

    _main(sys.argv[1:])
