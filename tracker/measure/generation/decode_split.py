"""Where a decode step's time goes: one profiled session whose steps are timed as the decode loop runs them, and the
split of that time over the step's parts (`tracker.measure.costmodel.step_split`).

The step is whatever a runner does: the numpy loop's `session.run` with the past fed as arrays and the presents
returned as arrays (`numpy_step`), or another way of running the same session (IO binding with buffers kept
between steps): `profile_steps` takes a function that binds a runner to the profiled session. The host's part of the
KV cache I/O is the step's wall time outside ONNX Runtime's `model_run`, so it drops with a runner that copies less.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from tracker.measure.costmodel.step_split import StepSplit, classify_nodes, split_step
from tracker.measure.runtimes.ort_runtime import SessionConfig, make_session
from tracker.measure.timing.speedup import Runner
from tracker.profile.parse import Profile, parse_profile

logger = logging.getLogger(__name__)

# Makes the runner of one step from the profiled session (an `onnxruntime.InferenceSession`).
BindStep = Callable[[object], Runner]


def numpy_step(feeds: Mapping[str, np.ndarray]) -> BindStep:
    """One step as the numpy decode loop runs it: the past fed as arrays, every output returned as an array."""
    feeds = dict(feeds)
    return lambda session: (lambda: session.run(None, feeds))  # type: ignore[attr-defined]


def time_steps(runner: Runner, runs: int) -> tuple[float, ...]:
    """The wall time, in ms, of each of `runs` calls of `runner`: one step as the decode loop runs it."""
    if runs < 1:
        raise ValueError(f"runs must be >= 1, got {runs}")
    walls = []
    for _ in range(runs):
        start = time.perf_counter()
        runner()
        walls.append((time.perf_counter() - start) * 1e3)
    return tuple(walls)


@dataclass(frozen=True)
class ProfiledSteps:
    """A profiled session's steps: its profile, its runtime graph and the wall time of each step.

    Attributes:
        profile: the parsed profile (one `model_run` per step).
        graph: ONNX Runtime's runtime graph, whose nodes the profile's kernels are (weights not loaded).
        wall_ms: each step's wall time, in the order run.
        profile_path: the profile file.
    """

    profile: Profile
    graph: onnx.GraphProto
    wall_ms: tuple[float, ...]
    profile_path: Path

    def split(self, *, skip_runs: int = 1) -> StepSplit:
        """The steps' split after the first `skip_runs` (`split_step`)."""
        parts = classify_nodes(self.graph)
        return split_step(self.profile.events, self.profile.runs, self.wall_ms, parts, skip_runs=skip_runs)


def profile_steps(model: onnx.ModelProto | str | Path, config: SessionConfig, bind: BindStep, *, runs: int,
                  workdir: str | Path) -> ProfiledSteps:
    """Runs `runs` steps (`bind(session)`) in a session with profiling on, timing each, and reads back its profile
    and its runtime graph (saved at session creation; its larger weights go to a side file, removed once the graph
    is read).

    Raises:
        ModelError: ONNX Runtime refuses the model.
    """
    if runs < 2:
        raise ValueError(f"runs must be >= 2 (the first is dropped), got {runs}")
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    optimized = workdir / "ort_optimized_model.onnx"
    session = make_session(model, config, profile_prefix=workdir / "ort_profile", optimized_model_path=optimized)
    wall_ms = time_steps(bind(session), runs)
    profile_path = workdir / "ort_profile.json"
    shutil.move(session.end_profiling(), profile_path)
    del session
    profile = parse_profile(profile_path)
    if profile.run_count != runs:
        raise ValueError(f"the profile holds {profile.run_count} model_run events for {runs} steps: a runner must "
                         "run the session exactly once per call")
    graph = onnx.load(str(optimized), load_external_data=False).graph
    # Only the graph is read: its weights' side file (the model's size again, GBs for an LLM) goes at once.
    optimized.with_suffix(".weights.bin").unlink(missing_ok=True)
    return ProfiledSteps(profile=profile, graph=graph, wall_ms=wall_ms, profile_path=profile_path)
