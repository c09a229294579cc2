"""The runtimes an attempt can run in, behind one `Runtime` protocol, and the map from their names."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import onnx
from onnx.reference.op_run import OpRun

from tracker.measure.runtimes import reference_runtime as ref
from tracker.measure.runtimes.ort_runtime import SessionConfig, make_session, profile_ort
from tracker.measure.runtimes.reference_profile import profile_reference
from tracker.measure.timing.latency import Latency
from tracker.profile.parse import Profile

Feeds = Mapping[str, np.ndarray]
Run = Callable[[Feeds], list[np.ndarray]]  # one inference: feeds -> outputs


class AttemptSettings(Protocol):
    """What a runtime reads of an attempt (`tracker.measure.attempt.Attempt` has it)."""

    @property
    def model(self) -> onnx.ModelProto | Path: ...

    @property
    def session(self) -> SessionConfig: ...

    @property
    def new_ops(self) -> tuple[type[OpRun], ...]: ...


@dataclass(frozen=True)
class Profiled:
    """What a profiled run of an attempt gives.

    Attributes:
        latency: wall times of the profiled runs, the first (warm-up) included.
        profile: the per-node table, or None while it is still in `profile_path` to be parsed.
        profile_path: the runtime's own profile file, if it writes one.
        optimized_model_path: the graph the runtime actually ran, if it saves one.
    """

    latency: Latency
    profile: Profile | None = None
    profile_path: Path | None = None
    optimized_model_path: Path | None = None


class Runtime(Protocol):
    """What measuring an attempt needs of the runtime it runs in.

    Attributes:
        name: the attempt's `runtime` string, also the run's `tracker.runtime` tag.
        needs_weights: the runtime runs the model from this process's memory, so the model's
            external weights must be loaded (ONNX Runtime reads a path itself).
    """

    name: str
    needs_weights: bool

    def check(self, attempt: AttemptSettings) -> None:
        """Raises `ValueError` for a setting of `attempt` that this runtime does not take."""

    def params(self, attempt: AttemptSettings) -> dict[str, str]:
        """The run's params saying how this runtime runs `attempt`."""

    def runner(
        self, attempt: AttemptSettings, model: onnx.ModelProto | None, *, stop_spinning_after_run: bool = False
    ) -> Run:
        """A session (or evaluator) of `attempt`, made once, and its inference.

        Args:
            model: `attempt`'s model as loaded with its weights, where `needs_weights` (else unused).
            stop_spinning_after_run: threads of the session stop spinning when a run returns, so that
                they leave the cores to another session timed in turn.
        """

    def profile(
        self, attempt: AttemptSettings, model: onnx.ModelProto, feeds: Feeds, *, runs: int, workdir: Path
    ) -> Profiled:
        """Runs `attempt` `runs` times with per-node timing; the first run is a warm-up."""

    def trace(
        self, attempt: AttemptSettings, model: onnx.ModelProto, feeds: Feeds, levels: tuple[int, ...]
    ) -> dict[int, str]:
        """The runtime's text trace of one run at each verbosity level it has of `levels`."""


class OrtRuntime:
    """ONNX Runtime, with the attempt's `SessionConfig` (`tracker.measure.runtimes.ort_runtime`)."""

    name = "onnxruntime"
    needs_weights = False

    def check(self, attempt: AttemptSettings) -> None:
        if attempt.new_ops:
            raise ValueError(f"new_ops only apply to runtime={ReferenceRuntime.name!r}")

    def params(self, attempt: AttemptSettings) -> dict[str, str]:
        return attempt.session.params()

    def runner(
        self, attempt: AttemptSettings, model: onnx.ModelProto | None, *, stop_spinning_after_run: bool = False
    ) -> Run:
        # a path keeps large models out of this process's memory: ORT reads the file itself
        session = make_session(attempt.model, attempt.session, stop_spinning_after_run=stop_spinning_after_run)
        return lambda feeds: session.run(None, dict(feeds))

    def profile(
        self, attempt: AttemptSettings, model: onnx.ModelProto, feeds: Feeds, *, runs: int, workdir: Path
    ) -> Profiled:
        profiled = profile_ort(attempt.model, feeds, config=attempt.session, runs=runs, workdir=workdir)
        return Profiled(profiled.latency, profile_path=profiled.profile_path,
                        optimized_model_path=profiled.optimized_model_path)

    def trace(
        self, attempt: AttemptSettings, model: onnx.ModelProto, feeds: Feeds, levels: tuple[int, ...]
    ) -> dict[int, str]:
        return {}  # ONNX Runtime has no trace of the values a run computes, like the evaluator's verbose levels


class ReferenceRuntime:
    """onnx's pure-Python `ReferenceEvaluator`, with the attempt's `new_ops` kernels
    (`tracker.measure.runtimes.reference_runtime`)."""

    name = "reference"
    needs_weights = True

    def check(self, attempt: AttemptSettings) -> None:
        pass  # it takes new_ops; an attempt's ORT session settings are not used here (nor refused)

    def params(self, attempt: AttemptSettings) -> dict[str, str]:
        return {"reference.new_ops": ",".join(f"{c.op_domain}:{c.__name__}" for c in attempt.new_ops) or "none"}

    def runner(
        self, attempt: AttemptSettings, model: onnx.ModelProto | None, *, stop_spinning_after_run: bool = False
    ) -> Run:
        if model is None:
            raise ValueError("the reference runtime runs the model as loaded (needs_weights): got model=None")
        # the evaluator runs in the calling thread: it has no threads to stop spinning
        evaluator = ref.make_evaluator(model, new_ops=attempt.new_ops)

        def run(feeds: Feeds) -> list[np.ndarray]:
            outputs = evaluator.run(None, dict(feeds))
            assert isinstance(outputs, list)  # a dict only with intermediate=True
            return outputs

        return run

    def profile(
        self, attempt: AttemptSettings, model: onnx.ModelProto, feeds: Feeds, *, runs: int, workdir: Path
    ) -> Profiled:
        profile = profile_reference(model, feeds, new_ops=attempt.new_ops, runs=runs)
        return Profiled(Latency.from_values(profile.runs["dur_us"].to_numpy() * 1e-6), profile=profile)

    def trace(
        self, attempt: AttemptSettings, model: onnx.ModelProto, feeds: Feeds, levels: tuple[int, ...]
    ) -> dict[int, str]:
        return {level: ref.trace_reference(model, feeds, new_ops=attempt.new_ops, verbose=level) for level in levels}


# The name an attempt carries (`Attempt.runtime`, tag `tracker.runtime`) -> its runtime.
RUNTIMES: dict[str, Runtime] = {runtime.name: runtime for runtime in (OrtRuntime(), ReferenceRuntime())}


def get_runtime(name: str) -> Runtime:
    """The runtime of that name.

    Raises:
        ValueError: no runtime has that name; the message lists the names there are.
    """
    try:
        return RUNTIMES[name]
    except (KeyError, TypeError):
        raise ValueError(f"runtime must be one of {tuple(RUNTIMES)}, got {name!r}") from None
