"""The driving side of a cluster (`Fanout`): one `NodeMeasurer` per measuring node, the study's attempts sent to
free nodes (once per node type), each record logged as it comes back; a node that dies costs its attempt one retry
elsewhere; Ctrl-C ends what is in flight as FAILED runs.

Which task a free node takes next is `tracker.cluster.measurers`'; logging each record under the study run, and the
rows of those logged, `tracker.cluster.records`'.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import deque
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from tracker.base.steps import StepTimes
from tracker.base.terminal import one_line
from tracker.base.termination import Terminated
from tracker.cluster.address import Address, connect, import_ray, measuring_nodes
from tracker.cluster.measurers import DEPTH, Node, ScreenTask, Task, baselines_of, next_task, start_measurers, stranded
from tracker.cluster.node import NodeInfo
from tracker.cluster.records import StudyRecords
from tracker.cluster.wire import MODEL_FILE, Job, ModelFiles, Returned, ScreenJob
from tracker.measure.attempt import Attempt, AttemptResult
from tracker.measure.runtimes.ort_runtime import SessionConfig
from tracker.measure.timing.speedup import SpeedupConfig
from tracker.optimize import Candidate
from tracker.pipeline import AttemptSetup
from tracker.report.rows import AttemptRow
from tracker.search.screening import Screened

logger = logging.getLogger(__name__)

POLL_S = 0.5  # a wait's granularity: Ctrl-C is handled between two


class Fanout:
    """A study's measurements on a Ray cluster (`Study(..., cluster=ADDRESS)`).

    A runtime's first attempt is its baseline: measured on every node, each node's run tagged `tracker.node`; the
    first of each node type is that type's baseline row, the others `tracker.role` = "node_baseline". Every later
    attempt is measured once per node type, on a free node of that type, against that node's own baseline (its run
    says which: `tracker.baseline_run`).

    Args:
        address: the cluster's address (`Address.parse`: a malformed one fails here, before any work).
        study: the study's name.
        feeds: the inputs every attempt runs on.
    """

    def __init__(self, address: str, *, study: str, feeds: Mapping[str, np.ndarray]) -> None:
        self.address = Address.parse(address)
        self.study = study
        self.feeds = dict(feeds)
        self.steps = StepTimes()  # the nodes' measuring steps, summed (they overlap in time)
        self.records = StudyRecords(study, self.steps)  # each logged as it comes back
        self._connected = False
        self._nodes: list[Node] = []
        self._queues: dict[str, deque[Task]] = {}  # node type -> attempts waiting for a node of that type
        self._pending: dict[int, int] = {}  # job seq -> its tasks not logged yet
        self._attempts: dict[int, Attempt] = {}
        # model path -> its `ModelFiles` in the object store and the tasks still to log that use it: a file is read
        # and sent once however many attempts use it, and freed when the last of them is logged
        self._models: dict[str, list] = {}
        self._baselines: set[str] = set()  # runtimes whose baseline was sent
        self._screens: deque[ScreenTask] = deque()  # a search's screens waiting for a node with its baseline
        self._screened: dict[int, Screened] = {}  # screens that came back, by number, until `screens` takes them
        self._screens_sent = 0

    def connect(self) -> None:
        """Connects to the cluster and checks it has a measuring node, before any work.

        Raises:
            ClusterError: Ray is missing, the cluster cannot be reached, or it has no node with a `tracker_slot`.
        """
        self._connected = connect(self.address)
        measuring_nodes(self.address)

    def submit(self, attempt: Attempt, setup: AttemptSetup) -> int:
        """Sends an attempt to the nodes (every node, for a runtime's first attempt), and logs what came back
        meanwhile; returns the attempt's number, for `result`. The first attempt starts the nodes' measurers with
        `setup` (its `machine`: whether each node measures its own roofs)."""
        import_ray()
        if not self._nodes:
            self._start(setup)
        seq = len(self._attempts)
        self._attempts[seq] = attempt
        key = str(attempt.model.resolve()) if isinstance(attempt.model, Path) else f"in memory {seq}"
        model = self._put(key, attempt.model)
        name = attempt.model.name if isinstance(attempt.model, Path) else MODEL_FILE
        baseline = attempt.runtime not in self._baselines
        job = Job(seq, dataclasses.replace(attempt, model=Path(name)), dict(setup.tags), baseline=baseline)
        if baseline:  # measured again on every node: each node judges its attempts against its own
            self._baselines.add(attempt.runtime)
            tasks = [(n.own, Task(job, model, key, n.info.node_type)) for n in self._nodes if n.alive]
        else:  # once per node type
            tasks = [(queue, Task(job, model, key, node_type)) for node_type, queue in self._queues.items()]
        for queue, task in tasks:
            queue.append(task)
        self._pending[seq] = len(tasks)
        self._models[key][1] += len(tasks)
        if not self._models[key][1]:  # no node to send it to
            del self._models[key]
        logger.info("study %s: attempt %s sent to %s", self.study, attempt.name,
                    f"all {len(tasks)} nodes (its runtime's baseline)" if baseline else f"{len(tasks)} node type(s)")
        self.poll()
        return seq

    def baseline(self, runtime: str) -> Attempt | None:  # the attempt sent as `runtime`'s baseline (its first)
        return next((a for a in self._attempts.values() if a.runtime == runtime), None)

    def submit_screen(self, candidate: Candidate, *, session: SessionConfig, config: SpeedupConfig,
                      must_beat: float | None) -> int:
        """Sends a search's candidate to the next free node with a baseline, to be screened against it
        (`NodeMeasurer.screen`); returns its number, for `screens`."""
        key = str(Path(candidate.path).resolve())
        model = self._put(key, Path(candidate.path))
        self._screens_sent, name = self._screens_sent + 1, Path(Path(candidate.path).name)
        job = ScreenJob(self._screens_sent, dataclasses.replace(candidate, path=name), session, config, must_beat)
        self._screens.append(ScreenTask(job, model, key))
        self._models[key][1] += 1
        self.poll()
        return job.seq

    def screens(self, *, wait: bool = False) -> dict[int, Screened]:
        """The screens that came back since the last call, by number; with `wait`, once every screen sent is back."""
        while wait and (self._screens or any(isinstance(t, ScreenTask) for n in self._nodes for t, _ in n.sent)):
            self.poll(timeout_s=POLL_S)
        done, self._screened = self._screened, {}
        return done

    def _put(self, key: str, model: onnx.ModelProto | Path) -> Any:  # its files in the object store, put there once
        if key not in self._models:
            self._models[key] = [import_ray().put(ModelFiles.of(model)), 0]
        return self._models[key][0]

    def result(self, seq: int) -> AttemptResult:
        """Waits for attempt `seq`'s runs; its result as the driver knows it (no measurements: those are on its
        runs): its error when every node failed it, and its first run."""
        while self._pending[seq]:
            self.poll(timeout_s=POLL_S)
        return self._result(seq)

    def _result(self, seq: int) -> AttemptResult:
        outcomes = self.records.recorded.outcomes(seq)
        ok = [o for o in outcomes if o.error is None]
        if not outcomes:  # every node it was sent to stopped before it
            return AttemptResult(attempt=self._attempts[seq], error="no node measured it: every one stopped")
        first = (ok or outcomes)[0]
        return AttemptResult(attempt=self._attempts[seq], error=None if ok else first.error, logged=first.logged)

    def poll(self, *, timeout_s: float = 0.0) -> None:
        """Logs the records that came back (waiting up to `timeout_s` for one), and gives free nodes work."""
        ray = import_ray()
        sent = {ref: n for n in self._nodes for _, ref in n.sent}
        if sent:
            ready, _ = ray.wait(list(sent), num_returns=1, timeout=timeout_s, fetch_local=False)
            if ready:  # and every other one ready by now
                ready, _ = ray.wait(list(sent), num_returns=len(sent), timeout=0, fetch_local=False)
            for ref in ready:
                self._collect(sent[ref], ref)
        self._dispatch()

    def wait(self) -> None:
        """Waits until every attempt sent is logged."""
        while any(self._pending.values()):
            self.poll(timeout_s=POLL_S)

    def finish(self, error: BaseException | None) -> list[AttemptResult]:
        """The end of the study: waits for every measurement, or, when the study is unwinding from `error` (or a
        Ctrl-C lands while waiting), logs what came back and ends the rest as FAILED runs; then frees the nodes.
        Returns each attempt's result as the driver knows it (`result`), in the order they were sent."""
        try:
            if error is None:
                self.wait()
            else:
                self.cancel(error)
        except BaseException as e:
            self.cancel(e)
            raise
        finally:
            self.close()
        return [self._result(seq) for seq in self._attempts]

    def cancel(self, error: BaseException) -> None:
        """Logs what already came back, then stops every node's measurer: the attempts in flight and those
        waiting end as FAILED runs saying why (`error`: Ctrl-C, SIGTERM, or what else stopped the study)."""
        ray = import_ray()
        why = ("Ctrl-C" if isinstance(error, KeyboardInterrupt) else "SIGTERM" if isinstance(error, Terminated)
               else f"{type(error).__name__}: {one_line(str(error))}")
        try:
            self.poll()
        except Exception as e:  # a node that went meanwhile: what it measured is lost, the others are logged
            logger.warning("study %s: could not collect every record before stopping (%s)", self.study, e)
        for node in self._nodes:
            if node.sent:
                ray.kill(node.actor, no_restart=True)
                node.alive = False
            for index, (task, _) in enumerate(node.sent):
                where = "while measuring" if index == 0 else "waiting"
                if isinstance(task, Task):  # a screen has no run to end
                    self._log_failed(task, f"interrupted ({why}) {where} on node {node.info.node_id}", node=node.info)
            node.sent = []
            self._drop_own(node)
        for queue in self._queues.values():
            while queue:
                self._log_failed(queue.popleft(), f"interrupted ({why}) before it was measured")

    def close(self) -> None:
        """Stops the nodes' measurers (each removes its work folder first), disconnects if `connect` connected,
        and removes the records' folder."""
        ray = import_ray()
        alive = [n for n in self._nodes if n.alive]
        if alive:
            closing = [n.actor.close.remote() for n in alive]
            ray.wait(closing, num_returns=len(closing), timeout=10)
            for node in alive:
                ray.kill(node.actor, no_restart=True)
            self._nodes = []
        if self._connected:
            ray.shutdown()
            self._connected = False
        self.records.close()

    def rows(self) -> list[AttemptRow]:
        """The rows of every run logged, in study order, each attempt's node types as the nodes were found."""
        return self.records.recorded.rows(list(self._queues))  # its keys: the node types, as the nodes were found

    def _start(self, setup: AttemptSetup) -> None:
        """Starts the nodes' measurers (`start_measurers`), and the folder their records are unpacked in."""
        self.records.open(setup)
        self._nodes = start_measurers(self.address, self.study, self.feeds, setup)
        self._queues = {node.info.node_type: deque() for node in self._nodes}  # the types, as the nodes were found

    def _dispatch(self) -> None:
        """Gives each node holding fewer than `DEPTH` tasks its next ones, idle nodes first (two tasks go to two
        nodes): its own baselines, then the next attempts of its type whose runtime it has a baseline of, then a
        search's screens; fails the attempts no live node can take any more."""
        for depth in range(1, DEPTH + 1):
            for node in self._nodes:
                while node.alive and len(node.sent) < depth:
                    task = next_task(node, self._queues[node.info.node_type], self._screens)
                    if task is None:
                        break
                    run = node.actor.screen if isinstance(task, ScreenTask) else node.actor.measure
                    node.sent.append((task, run.remote(task.job, task.model)))
        self._fail_stranded()

    def _fail_stranded(self) -> None:
        """Attempts waiting for a node type none of whose live nodes has, or will have, their runtime's baseline:
        FAILED runs saying so."""
        for task, why in stranded(self._queues, self._nodes):
            self._log_failed(task, f"{why}{f'; after {task.retried}' if task.retried else ''}")
        if self._screens and not any(n.alive and "onnxruntime" in baselines_of(n) for n in self._nodes):
            while self._screens:
                self._screen_lost(self._screens.popleft(), "no live node has a baseline to screen it against")

    def _screen_lost(self, task: ScreenTask, why: str, *, retry: bool = False) -> None:  # sent again once when `retry`
        if retry and task.retried is None:
            task.retried = why
            self._screens.appendleft(task)
            return
        self._screened[task.job.seq] = Screened(None, None, None, error=why)
        self._done(task)

    def _collect(self, node: Node, ref: Any) -> None:
        """Logs the record `node` returned as `ref`; a node that died costs each attempt sent to it one retry on
        another node."""
        ray = import_ray()
        task = next(t for t, r in node.sent if r == ref)
        try:
            returned: Returned | Screened = ray.get(ref)
        except ray.exceptions.RayActorError as e:  # the node (or its measurer) died
            if node.alive:  # the first of its tasks to say so: the one it was measuring is the first sent
                node.alive, node.cut = False, node.sent[0][0]
                self._drop_own(node)
            node.sent = [(t, r) for t, r in node.sent if r != ref]
            if isinstance(task, ScreenTask):
                self._screen_lost(task, f"node {node.info.node_id} died: {one_line(str(e), 200)}", retry=True)
                return
            if task is not node.cut:  # sent, not started: measured by another node as if never sent
                self._queues[task.node_type].appendleft(task)
                return
            why = f"node {node.info.node_id} ({node.info.hostname}) died while measuring it: {one_line(str(e), 200)}"
            logger.error("study %s: attempt %s: %s", self.study, task.job.attempt.name, why)
            if task.job.baseline or task.retried is not None:
                self._log_failed(task, f"{why}{f'; after {task.retried}' if task.retried else ''}", node=node.info)
            else:  # first in line: measured next by a free node of its type
                task.retried = why
                self._queues[task.node_type].appendleft(task)
            return
        except ray.exceptions.RayError as e:
            node.sent = [(t, r) for t, r in node.sent if r != ref]
            if isinstance(task, ScreenTask):
                self._screen_lost(task, f"its node could not screen it: {one_line(str(e))}")
            else:
                self._log_failed(task, f"its node could not measure it: {one_line(str(e))}", node=node.info)
            return
        node.sent = [(t, r) for t, r in node.sent if r != ref]
        if isinstance(task, ScreenTask) or isinstance(returned, Screened):  # a screen's answer is a screen's
            assert isinstance(task, ScreenTask) and isinstance(returned, Screened)
            self._screened[task.job.seq] = returned
            self._done(task)
            return
        self.records.log_returned(task, returned, node)
        self._done(task)

    def _drop_own(self, node: Node) -> None:
        """Forgets the baselines a node that stopped was still to measure: they were its own."""
        while node.own:
            self._done(node.own.popleft())

    def _done(self, task: Task | ScreenTask) -> None:
        """A task logged or dropped: its attempt waits for one task less, and its model, used by no task left, is
        freed from the object store."""
        if isinstance(task, Task):
            self._pending[task.job.seq] -= 1
        self._models[task.model_key][1] -= 1
        if not self._models[task.model_key][1]:
            del self._models[task.model_key]

    def _log_failed(self, task: Task, why: str, *, node: NodeInfo | None = None) -> None:
        """Logs a FAILED run of an attempt the nodes did not measure, or not to the end, saying why."""
        self.records.log_failed(task, why, node=node)
        self._done(task)
