"""The measuring side of a cluster: one `NodeMeasurer` per node (a Ray actor holding the node's `tracker_slot`)
measures the study's attempts (and a search's screens) there one at a time, each against the baseline it measured
itself, in its own process, as a local study does; it returns each record (or screen), and never talks to the
tracking store."""

from __future__ import annotations

import dataclasses
import logging
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from tracker.base.keys import TAG_NODE, TAG_NODE_TYPE
from tracker.base.memory import release_free_memory
from tracker.cluster.wire import Job, ModelFiles, Returned, ScreenJob, pack_record
from tracker.measure.attempt import AttemptResult
from tracker.measure.environment import cpu_model
from tracker.pipeline import AttemptSetup, measure_machine_or_none, measure_record
from tracker.search.screen import screen_speed
from tracker.search.screening import Screened

logger = logging.getLogger(__name__)

NODE_TYPE_LABEL = "tracker_node_type"  # a node's Ray label naming its hardware type (`ray start --labels ...`)
# When a node started and ended a measurement (epoch seconds, its clock): two on one node never overlap.
METRIC_START = "cluster.measure_start_s"
METRIC_END = "cluster.measure_end_s"


@dataclasses.dataclass(frozen=True)
class NodeInfo:
    """Where a `NodeMeasurer` runs: the Ray node's id, its hardware type (its `tracker_node_type` label, else its
    CPU model) and its hostname."""

    node_id: str
    node_type: str
    hostname: str


class NodeMeasurer:
    """Measures a study's attempts on the node it was placed on, one at a time.

    Its first job is the study's baseline (each runtime's); every later attempt is timed interleaved against that
    baseline's model in this process, so a speed-up never mixes two machines.

    Args:
        study: the study's name.
        feeds: the inputs every attempt runs on.
        setup: how attempts are measured (its `machine` is ignored: `roofs` says whether to measure this node's).
        roofs: measure this node's peak FLOP/s and bandwidth for the rooflines (~7 s on 2 cores), before its first
            attempt.
    """

    def __init__(self, study: str, feeds: Mapping[str, np.ndarray], setup: AttemptSetup, *, roofs: bool) -> None:
        _log_progress()
        self._feeds = dict(feeds)
        self._setup = dataclasses.replace(setup, study=study, machine=None)
        self._roofs = roofs
        self._work = Path(tempfile.mkdtemp(prefix="tracker-node-"))
        self._baselines: dict[str, AttemptResult] = {}  # runtime -> its baseline, as measured here
        import ray

        context = ray.get_runtime_context()
        label = context.get_node_labels().get(NODE_TYPE_LABEL)
        self.info = NodeInfo(node_id=context.get_node_id(), node_type=label if isinstance(label, str) and label
                             else cpu_model(), hostname=socket.gethostname())

    def where(self) -> NodeInfo:
        """This node (the driver asks once, when the actor has started)."""
        return self.info

    def measure(self, job: Job, model: ModelFiles) -> Returned:
        """Measures one attempt and returns its record, FAILED with the reason when measuring failed.

        A baseline job's result becomes this node's baseline of its runtime (when it succeeded); any other job must
        come after that baseline (the driver sends none before).
        """
        if self._roofs:
            self._roofs = False
            self._setup = dataclasses.replace(self._setup, machine=measure_machine_or_none())
        runtime = job.attempt.runtime
        assert job.baseline or runtime in self._baselines, f"no baseline of runtime {runtime} on this node"
        start_s = time.time()
        folder = self._work / f"{job.seq}-{job.attempt.name}"
        attempt = dataclasses.replace(job.attempt, model=model.write(folder / "model"))
        tags = {**job.tags, TAG_NODE: self.info.node_id, TAG_NODE_TYPE: self.info.node_type}
        measured = measure_record(attempt, self._feeds, dataclasses.replace(self._setup, tags=tags),
                                  baselines=self._baselines, workdir=folder)
        measured.record.metrics.update({METRIC_START: start_s, METRIC_END: time.time()})
        try:
            packed = pack_record(measured.record)
        finally:
            if job.baseline and measured.result.ok:  # its model file stays: later attempts are timed against it
                self._baselines.setdefault(runtime, measured.result)
            else:
                shutil.rmtree(folder, ignore_errors=True)
        release_free_memory()
        return Returned(record=packed, steps=dict(measured.result.steps.seconds))

    def screen(self, job: ScreenJob, model: ModelFiles) -> Screened:
        """Times a search's candidate against this node's baseline (`search.screen.screen_speed`): a screen, no run.
        The driver sends none before this node has its baseline."""
        baseline = self._baselines.get("onnxruntime")
        assert baseline is not None, "no onnxruntime baseline on this node"
        folder = self._work / f"screen-{job.seq}"
        try:
            candidate = dataclasses.replace(job.candidate, path=model.write(folder))
            found, raced_out = screen_speed(candidate, baseline.attempt, self._feeds, session=job.session,
                                            config=job.config, must_beat=job.must_beat)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
            release_free_memory()
        return Screened(found, raced_out, self.info.node_id)

    def close(self) -> None:
        """Removes this measurer's work folder (the driver calls it before it stops the measurer)."""
        self._baselines.clear()
        shutil.rmtree(self._work, ignore_errors=True)


def _log_progress() -> None:
    """The tracker's progress lines in this worker process, on its stderr (Ray shows them on the driver)."""
    tracker = logging.getLogger("tracker")
    if not tracker.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S"))
        tracker.addHandler(handler)
    tracker.setLevel(logging.INFO)
