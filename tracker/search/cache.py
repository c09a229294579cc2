"""The search cache: what a search learned of each candidate (its accuracy check, its speed screens, and the model it
made when it passed), so that a second search of the same model on the same machine reuses it instead of making,
checking and timing again. Only the leaders' full measurement, which needs fresh sessions, is done again.

A candidate's entry is keyed by everything its figures depend on (`SearchCache.open`): the model's content, the
feeds, how outputs are judged, the session settings, the ONNX Runtime, onnx and project versions, the CPU model, its
instruction sets and core count; and the entry with every knob value. An entry is a folder written whole (into a
temporary folder, then renamed), so Ctrl-C leaves either the old one or the new one; an unreadable one is ignored
with a warning and written again. The folder is kept under `max_bytes`, the least recently used entries going first.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

import numpy as np
import onnx

from tracker.base.files import read_small_file
from tracker.measure.environment import cpu_model, isa
from tracker.measure.timing.speedup import Speedup
from tracker.optimize import Candidate, Chain, Entry
from tracker.search.sensitivity import Sensitivity

logger = logging.getLogger(__name__)

MAX_BYTES = 4 * 2**30
_FORMAT = 1
_ENTRY_FILE = "entry.json"


@dataclass
class Cached:
    """What the cache holds of one candidate: its check, its screens by kind ("screen", "long_screen"), and the
    candidate it made (None when its model was not kept: it failed its check, and no fallback can rescue it)."""

    passed: bool
    margin: float
    metrics: dict[str, float]
    precision: str
    params: dict[str, str]
    size_bytes: int
    candidate: Candidate | None
    screens: dict[str, dict] = field(default_factory=dict)
    made_s: float = 0.0  # what making it took, the first time
    sensitivity: dict | None = None  # the sensitivity fallback's outcome on it (`put_sensitivity`)

    def sensitivity_of(self, entry: Entry) -> Sensitivity | None:
        """The sensitivity fallback an earlier search ran on this failing candidate (`entry`), or None."""
        data = self.sensitivity
        if data is None:
            return None
        kept = tuple(data["kept"])
        return Sensitivity(entry, rows=list(data["rows"]), tried=[tuple(t) for t in data["tried"]],
                           found=entry.variant(exclude=kept) if kept else None, kept=kept,
                           seconds=float(data["seconds"]), stopped=str(data["stopped"]))

    def expected(self) -> float | None:
        """What this candidate is expected to reach, from what was measured of it: its screen's speed-up when it passed
        its check, 0 when it failed (last in line), None when it was checked but never screened."""
        if not self.passed:
            return 0.0
        figures = self.screens.get("long_screen") or self.screens.get("screen")
        return None if figures is None else float(figures["speedup"])

    def screen(self, kind: str, must_beat: float) -> tuple[Speedup, str | None] | None:
        """The screen of this `kind` judged against `must_beat` now: (its figures, why it is raced out or None);
        None when there is none, or when it was cut short against a leader this search has not (time it again)."""
        figures = self.screens.get(kind)
        if figures is None or (figures["raced_out"] and figures["ci_high"] >= must_beat):
            return None
        found = Speedup(figures["speedup"], figures["ci_low"], figures["ci_high"], 0.95, int(figures["pairs"]),
                        rounds=int(figures["rounds"]))
        if found.ci_high >= must_beat:
            return found, None
        return found, f"{figures['raced_out'] or f'upper bound {found.ci_high:.2f}x < {must_beat:.2f}x'} (cached)"


@dataclass
class SearchCache:
    """The cache folder and the key of this search's model, feeds, judge, session and machine."""

    root: Path
    context: str
    source: Path  # the searched model: a session entry's candidate runs it as it is
    max_bytes: int = MAX_BYTES
    fresh: bool = False  # write what is measured, read nothing
    reused: dict[str, str] = field(default_factory=dict)  # candidate -> what was reused, for the log

    @classmethod
    def open(cls, root: Path, *, source: Path, feeds: Mapping[str, np.ndarray], judged_by: str, session: object,
             fresh: bool = False, max_bytes: int = MAX_BYTES) -> SearchCache | None:
        """The cache in `root` for a search of `source`, or None (with a one-line warning) when `root` cannot be
        made or written: the search then runs without it."""
        try:
            root.mkdir(parents=True, exist_ok=True)
            probe = root / f".probe-{os.getpid()}"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as e:
            logger.warning("search cache: %s cannot be written (%s: %s); searching without the cache", root,
                           type(e).__name__, e)
            return None
        import onnxruntime

        parts = {"model": model_digest(source), "feeds": feeds_digest(feeds), "judged_by": judged_by,
                 "session": repr(session), "onnxruntime": onnxruntime.__version__, "onnx": onnx.__version__,
                 "tracker": _version(), "cpu": cpu_model(), "cores": str(os.cpu_count()),
                 "isa": ",".join(name for name, has in isa().items() if has)}
        context = hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()
        return cls(root, context, Path(source), max_bytes=max_bytes, fresh=fresh)

    def reused_line(self) -> str:
        """What this search took from the cache, for the log."""
        if not self.reused:
            return "nothing reused (a first search of this model here, or --fresh)"
        named = "; ".join(f"{name} ({what})" for name, what in list(self.reused.items())[:5])
        more = f"; and {len(self.reused) - 5} more" if len(self.reused) > 5 else ""
        return f"reused {len(self.reused)} candidate(s): {named}{more}"

    def _folder(self, entry: Entry) -> Path:
        steps = entry.steps if isinstance(entry, Chain) else (entry,)
        identity = json.dumps([self.context, [(type(s).__name__, s.name, s.knob_params()) for s in steps]])
        return self.root / hashlib.sha256(identity.encode()).hexdigest()[:32]

    def get(self, entry: Entry) -> Cached | None:
        """The cached check (and screens, and model) of `entry`; None on a miss, with `fresh`, or for an entry that
        cannot be read (a warning; it is written again)."""
        folder = self._folder(entry)
        if self.fresh or not folder.is_dir():
            return None
        try:
            data = json.loads(read_small_file(folder / _ENTRY_FILE, max_bytes=4 * 2**20, what="a search cache entry"))
            if data.get("format") != _FORMAT or data.get("entry") != entry.name:
                raise ValueError(f"format {data.get('format')} of entry {data.get('entry')!r}")
            made = data.get("candidate")
            candidate = None
            if made is not None:
                path = self.source if made["file"] is None else folder / "model" / made["file"]
                if not path.is_file():
                    raise ValueError(f"its model {path.name} is missing")
                candidate = Candidate(path=path, applied=bool(made["applied"]), fusions=dict(made["fusions"]),
                                      fully_optimized=made["fully_optimized"], precision=str(made["precision"]),
                                      notes=tuple(made["notes"]), params=dict(made["params"]),
                                      session=dict(made["session"]))
            found = Cached(passed=bool(data["passed"]), margin=float(data["margin"]), metrics=dict(data["metrics"]),
                           precision=str(data["precision"]), params=dict(data["params"]),
                           size_bytes=int(data["size_bytes"]), candidate=candidate, screens=dict(data["screens"]),
                           made_s=float(data.get("made_s", 0.0)), sensitivity=data.get("sensitivity"))
        except (OSError, ValueError, KeyError, TypeError, RecursionError) as e:
            logger.warning("search cache: the entry of %s in %s cannot be read (%s: %s); it is ignored and measured "
                           "again", entry.name, folder, type(e).__name__, e)
            return None
        os.utime(folder)  # recently used: the last to go when the cache is over its size
        return found

    def put(self, entry: Entry, candidate: Candidate, *, passed: bool, margin: float, metrics: Mapping[str, float],
            size_bytes: int, made_s: float = 0.0) -> None:
        """Keeps `entry`'s check, and its model when it passed or the sensitivity fallback may rescue it (the others
        are never screened). A cache that cannot take it is skipped with a warning."""
        data = {"format": _FORMAT, "entry": entry.name, "passed": passed, "margin": margin,
                "metrics": {k: float(v) for k, v in metrics.items()}, "precision": candidate.precision,
                "params": {**candidate.params, "precision": candidate.precision}, "size_bytes": size_bytes,
                "candidate": None, "screens": {}, "written": time.time(), "made_s": made_s}
        # The model of one that passed, or that the sensitivity fallback may rescue (it is screened for that).
        keep_model = (passed or "exclude" in entry.knobs()) and not candidate.new_ops and candidate.path.is_file()
        # A session entry's candidate is the searched model itself: nothing to copy (only what the entry made is).
        runs_source = candidate.path.resolve() == self.source.resolve()
        if keep_model:
            data["candidate"] = {"file": None if runs_source else candidate.path.name, "applied": candidate.applied,
                                 "fusions": candidate.fusions, "fully_optimized": candidate.fully_optimized,
                                 "precision": candidate.precision, "notes": list(candidate.notes),
                                 "params": candidate.params, "session": dict(candidate.session)}
        self._write(entry, data, model_dir=candidate.path.parent if keep_model and not runs_source else None)

    def put_screen(self, entry: Entry, kind: str, found: Speedup, raced_out: str | None) -> None:
        """Adds a speed screen's figures to `entry`'s cached check (rewriting its `entry.json` whole)."""
        self._add(entry, "screens", {kind: {"speedup": found.speedup, "ci_low": found.ci_low, "ci_high": found.ci_high,
                                            "pairs": found.pairs, "rounds": found.rounds, "raced_out": raced_out}})

    def put_sensitivity(self, entry: Entry, found: Sensitivity) -> None:
        """Adds the sensitivity fallback's outcome on `entry` (not one the budget cut short: that is no answer)."""
        if found.found is None and "budget" in found.stopped:
            return
        self._add(entry, "sensitivity", {"rows": found.rows, "tried": found.tried, "kept": list(found.kept),
                                         "seconds": found.seconds, "stopped": found.stopped})

    def _add(self, entry: Entry, key: str, value: dict) -> None:
        """Adds `value` to `entry`'s cached `key` (a dict of screens, or the sensitivity), rewriting its file whole."""
        folder = self._folder(entry)
        try:
            data = json.loads((folder / _ENTRY_FILE).read_text())
            data[key] = {**(data.get(key) or {}), **value} if key == "screens" else value
            partial = folder / f"{_ENTRY_FILE}.{os.getpid()}.partial"
            partial.write_text(json.dumps(data))
            partial.replace(folder / _ENTRY_FILE)
        except (OSError, ValueError, KeyError) as e:
            logger.warning("search cache: could not keep the %s of %s (%s: %s)", key, entry.name, type(e).__name__, e)

    def _write(self, entry: Entry, data: dict, *, model_dir: Path | None) -> None:
        folder = self._folder(entry)
        partial = self.root / f".partial-{folder.name}-{os.getpid()}"
        if model_dir is not None and self.root.resolve().is_relative_to(model_dir.resolve()):
            logger.warning("search cache: %s's model lies in %s, which holds the cache: not kept", entry.name,
                           model_dir)
            return
        try:
            shutil.rmtree(partial, ignore_errors=True)
            if model_dir is not None:
                shutil.copytree(model_dir, partial / "model")
            partial.mkdir(exist_ok=True)
            (partial / _ENTRY_FILE).write_text(json.dumps(data))
            if folder.exists():
                shutil.rmtree(folder)
            partial.rename(folder)  # whole, or not at all
        except OSError as e:
            shutil.rmtree(partial, ignore_errors=True)
            logger.warning("search cache: could not keep %s (%s: %s)", entry.name, type(e).__name__, e)
            return
        self._trim()

    def _trim(self) -> None:
        """Removes the least recently used entries while the folder holds more than `max_bytes`."""
        entries = [(p.stat().st_mtime, p, _bytes(p)) for p in self.root.iterdir()
                   if p.is_dir() and not p.name.startswith(".")]
        total = sum(size for _, _, size in entries)
        for _, path, size in sorted(entries, key=lambda e: e[0]):
            if total <= self.max_bytes:
                break
            shutil.rmtree(path, ignore_errors=True)
            total -= size


class MadeModels:
    """Models an entry made of a source in this study, kept by the source's content (`model_digest`) and the entry's
    name with its knobs: what a search made of its leaders is measured from, never made twice (`Study.optimize` takes
    it)."""

    def __init__(self) -> None:
        self._made: dict[tuple[str, str], tuple[Candidate, float]] = {}
        self._digests: dict[tuple[str, int, int], str] = {}  # (path, size, mtime): each source read once

    def put(self, source: Path, entry: Entry, candidate: Candidate, seconds: float) -> None:
        """Keeps `candidate`, which `entry` made of `source` in `seconds`."""
        self._made[self._key(source, entry)] = (candidate, seconds)

    def take(self, source: Path, entry: Entry) -> tuple[Candidate, float] | None:
        """What `entry` made of `source` and the seconds it took, once; None when nothing was kept."""
        return self._made.pop(self._key(source, entry), None) if self._made else None

    def _key(self, source: Path, entry: Entry) -> tuple[str, str]:
        stat = Path(source).stat()
        file = (str(Path(source).resolve()), stat.st_size, stat.st_mtime_ns)
        if file not in self._digests:
            self._digests[file] = model_digest(Path(source))
        return self._digests[file], entry.name


def model_digest(path: Path) -> str:
    """sha256 of a model file and of the external data files it names, in order."""
    digest = hashlib.sha256()
    path = Path(path)
    files = [path]
    graph = onnx.load_model(str(path), load_external_data=False)
    for tensor in graph.graph.initializer:
        for item in tensor.external_data:
            if item.key == "location" and (path.parent / item.value) not in files:
                files.append(path.parent / item.value)
    for file in files:
        digest.update(file.name.encode())
        with open(file, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def feeds_digest(feeds: Mapping[str, np.ndarray]) -> str:
    """sha256 of the feeds: each input's name, dtype, shape and bytes."""
    digest = hashlib.sha256()
    for name in sorted(feeds):
        array = np.ascontiguousarray(feeds[name])
        digest.update(f"{name}|{array.dtype}|{array.shape}".encode())
        digest.update(array.tobytes() if array.dtype != object else repr(array.tolist()).encode())
    return digest.hexdigest()


def clear(root: Path) -> tuple[int, int]:
    """Removes every entry of the cache folder `root`: (entries, bytes) removed."""
    if not root.is_dir():
        return 0, 0
    found = [p for p in root.iterdir() if p.is_dir()]
    size = sum(_bytes(p) for p in found)
    for path in found:
        shutil.rmtree(path, ignore_errors=True)
    return len([p for p in found if not p.name.startswith(".")]), size


def _bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def _version() -> str:
    try:
        return metadata.version("onnx-optimization-tracker")
    except metadata.PackageNotFoundError:
        return "unknown"
