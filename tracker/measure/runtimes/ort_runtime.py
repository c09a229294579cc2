"""ONNX Runtime sessions: explicit settings, latency with profiling off, and a separate profiled session."""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx

from tracker.base.errors import ModelError
from tracker.measure.timing.latency import Latency

logger = logging.getLogger(__name__)

OPT_LEVELS = ("disable", "basic", "extended", "layout", "all")
EXECUTION_MODES = ("sequential", "parallel")


def _default_threads() -> int:
    return os.cpu_count() or 1


@dataclass(frozen=True)
class SessionConfig:
    """Every ONNX Runtime setting that changes timings, explicit so it can be recorded.

    Attributes:
        graph_optimization_level: ORT's session-time graph optimizations, one of OPT_LEVELS
            ("all" is ORT's own default).
        intra_op_num_threads: threads inside one kernel (default: the machine's core count).
        inter_op_num_threads: threads across independent nodes (used by parallel execution only).
        execution_mode: "sequential" (ORT's default: one node at a time) or "parallel" (independent
            branches of the graph at once, on `inter_op_num_threads` threads).
        providers: execution providers, in priority order.
        decode_io_binding: a decode-ready model generates through IO binding, its KV cache in buffers allocated
            once (`tracker.measure.generation.binding`), not through numpy. It changes how the decode loop feeds the
            session, not the session: it is recorded by the generation scenario (`gen.io_binding`), not here.
    """

    graph_optimization_level: str = "all"
    intra_op_num_threads: int = field(default_factory=_default_threads)
    inter_op_num_threads: int = 1
    execution_mode: str = "sequential"
    providers: tuple[str, ...] = ("CPUExecutionProvider",)
    decode_io_binding: bool = False

    def __post_init__(self) -> None:
        if self.graph_optimization_level not in OPT_LEVELS:
            raise ValueError(
                f"graph_optimization_level must be one of {OPT_LEVELS}, got {self.graph_optimization_level!r}"
            )
        if self.execution_mode not in EXECUTION_MODES:
            raise ValueError(f"execution_mode must be one of {EXECUTION_MODES}, got {self.execution_mode!r}")
        if self.intra_op_num_threads < 1 or self.inter_op_num_threads < 1:
            raise ValueError(
                "thread counts must be >= 1 (explicit, so they can be recorded), got "
                f"intra={self.intra_op_num_threads}, inter={self.inter_op_num_threads}"
            )

    def params(self) -> dict[str, str]:
        return {
            "ort.graph_optimization_level": self.graph_optimization_level,
            "ort.intra_op_num_threads": str(self.intra_op_num_threads),
            "ort.inter_op_num_threads": str(self.inter_op_num_threads),
            "ort.execution_mode": self.execution_mode,
            "ort.providers": ",".join(self.providers),
        }


@dataclass(frozen=True)
class ProfiledRun:
    """What a profiled session left behind."""

    profile_path: Path
    optimized_model_path: Path | None
    latency: Latency  # wall times of the profiled runs (all of them, the first included)


def make_session(
    model: onnx.ModelProto | str | Path,
    config: SessionConfig,
    *,
    profile_prefix: str | Path | None = None,
    optimized_model_path: str | Path | None = None,
    stop_spinning_after_run: bool = False,
):
    """Creates an `onnxruntime.InferenceSession` with `config`'s settings.

    Args:
        stop_spinning_after_run: the intra-op threads stop spinning when a run returns (ORT's
            `session.force_spinning_stop`); they still spin inside a run. Two sessions timed in turn
            need it: spinning threads of one would otherwise take the cores from the other's run.

    Raises:
        ModelError: ONNX Runtime refuses the model; the message carries ORT's reason.
    """
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = {
        "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
        "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        "layout": getattr(ort.GraphOptimizationLevel, "ORT_ENABLE_LAYOUT", ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED),
        "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    }[config.graph_optimization_level]
    options.intra_op_num_threads = config.intra_op_num_threads
    options.inter_op_num_threads = config.inter_op_num_threads
    options.execution_mode = {
        "sequential": ort.ExecutionMode.ORT_SEQUENTIAL,
        "parallel": ort.ExecutionMode.ORT_PARALLEL,
    }[config.execution_mode]
    options.log_severity_level = 3
    if stop_spinning_after_run:
        options.add_session_config_entry("session.force_spinning_stop", "1")
    if profile_prefix is not None:
        options.enable_profiling = True
        options.profile_file_prefix = str(profile_prefix)
    if optimized_model_path is not None:
        options.optimized_model_filepath = str(optimized_model_path)
        # The graph is what explains a profile's op types; its weights (GBs for an LLM) go to a side
        # file that is not logged.
        weights = Path(optimized_model_path).with_suffix(".weights.bin").name
        options.add_session_config_entry("session.optimized_model_external_initializers_file_name", weights)
        options.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
    source = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    try:
        return ort.InferenceSession(source, options, providers=list(config.providers))
    except Exception as e:  # ORT raises its own Fail/InvalidGraph/... types, not a common base
        raise ModelError(f"onnxruntime refused the model: {e}") from e


def profile_ort(
    model: onnx.ModelProto | str | Path,
    feeds: Mapping[str, np.ndarray],
    *,
    config: SessionConfig,
    runs: int,
    workdir: str | Path,
    save_optimized_model: bool = True,
) -> ProfiledRun:
    """Runs the model `runs` times in a session with profiling on.

    The first run is part of the profile (aggregations drop it with `skip_runs`). ORT's runtime graph
    (after its session-time fusions) is saved beside the profile, so the profile's op types can be
    explained: the graph itself, with its larger weights in a side file (`*.weights.bin`).
    """
    if runs < 1:
        raise ValueError(f"profile runs must be >= 1, got {runs}")
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    optimized = workdir / "ort_optimized_model.onnx" if save_optimized_model else None
    session = make_session(
        model, config, profile_prefix=workdir / "ort_profile", optimized_model_path=optimized
    )
    feeds = dict(feeds)
    durations = []
    for _ in range(runs):
        t0 = time.perf_counter()
        session.run(None, feeds)
        durations.append(time.perf_counter() - t0)
    raw = Path(session.end_profiling())
    profile_path = workdir / "ort_profile.json"
    shutil.move(raw, profile_path)
    if optimized is not None and not optimized.is_file():
        optimized = None
    return ProfiledRun(profile_path, optimized, Latency.from_values(durations))
