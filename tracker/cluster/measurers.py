"""A study's measurers as the driver keeps them: one `NodeMeasurer` per node holding a `tracker_slot`, pinned there
(`start_measurers`), the tasks sent to them, and which task a free node takes next (`next_task`, `stranded`)."""

from __future__ import annotations

import dataclasses
import logging
from collections import Counter, deque
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tracker.base.terminal import one_line
from tracker.cluster.address import SLOT, Address, ClusterError, import_ray, measuring_nodes
from tracker.cluster.node import NodeInfo, NodeMeasurer
from tracker.cluster.wire import Job, ScreenJob
from tracker.pipeline import AttemptSetup

logger = logging.getLogger(__name__)

START_TIMEOUT_S = 60.0  # for every node's measurer to start (a slot another study holds frees only when it ends)
# Tasks sent to a node's measurer at once: it measures one at a time, and starts the next as soon as one ends, while
# the driver may be busy making a candidate.
DEPTH = 2


@dataclasses.dataclass(eq=False)
class Task:
    """An attempt's measurement (`Job`) for one node of its type."""

    job: Job
    model: Any  # the reference of its `ModelFiles` in the object store
    model_key: str  # its key among `Fanout._models`
    node_type: str  # the node type it waits for
    retried: str | None = None  # why it was measured again, after its first node died


@dataclasses.dataclass(eq=False)
class ScreenTask:
    """A search's screen (`ScreenJob`), for any node with a baseline."""

    job: ScreenJob
    model: Any
    model_key: str
    retried: str | None = None  # why it was sent again, after its first node died


@dataclasses.dataclass(eq=False)
class Node:
    """A started measurer, and what the driver sent it."""

    actor: Any
    info: NodeInfo
    own: deque[Task] = dataclasses.field(default_factory=deque)  # this node's baselines, before anything else
    runtimes: set[str] = dataclasses.field(default_factory=set)  # whose baseline it measured
    cut: Task | ScreenTask | None = None  # the task it was measuring when it died
    # the tasks sent to its measurer, in order (it measures the first), each with the reference to its result
    sent: list[tuple[Task | ScreenTask, Any]] = dataclasses.field(default_factory=list)
    alive: bool = True


def start_measurers(address: Address, study: str, feeds: Mapping[str, np.ndarray], setup: AttemptSetup) -> list[Node]:
    """Starts one measurer on each node holding a `tracker_slot`, pinned there, and waits for them to start; those
    still starting after `START_TIMEOUT_S` are stopped and left out.

    Raises:
        ClusterError: none started within `START_TIMEOUT_S` (their slots are held by other studies).
    """
    ray = import_ray()
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    shared = ray.put(dict(feeds))
    measurer = ray.remote(NodeMeasurer)
    actors = [measurer.options(resources={SLOT: 1}, num_cpus=0, max_concurrency=1, max_restarts=0,
                               scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False))
              .remote(study, shared, dataclasses.replace(setup, tags={}), roofs=setup.machine is not None)
              for node_id in measuring_nodes(address)]
    started = {a.where.remote(): a for a in actors}
    ready, late = ray.wait(list(started), num_returns=len(started), timeout=START_TIMEOUT_S)
    nodes: list[Node] = []
    for ref in ready:
        try:
            nodes.append(Node(started[ref], ray.get(ref)))
        except ray.exceptions.RayError as e:
            logger.warning("study %s: a node's measurer did not start (%s)", study, one_line(str(e)))
    for ref in late:
        ray.kill(started[ref], no_restart=True)
    if not nodes:
        raise ClusterError(f"no measuring node of the Ray cluster at {address.text} started within "
                           f"{START_TIMEOUT_S:g} s: their {SLOT!r} is held by other studies")
    types = Counter(node.info.node_type for node in nodes)
    logger.info("study %s: %d measuring node(s)%s; node types: %s", study, len(nodes),
                f" ({len(late)} busy elsewhere, left out)" if late else "",
                ", ".join(f"{t} ({n})" for t, n in types.items()))
    return nodes


def next_task(node: Node, queue: deque[Task], screens: deque[ScreenTask]) -> Task | ScreenTask | None:
    """What free `node` measures next, taken from where it waits: its own baselines, then the next attempt in its node
    type's `queue` whose runtime it has a baseline of, then a search's screen (against its onnxruntime baseline)."""
    if node.own:
        return node.own.popleft()
    for task in queue:
        if task.job.attempt.runtime in node.runtimes:
            queue.remove(task)
            return task
    return screens.popleft() if screens and "onnxruntime" in node.runtimes else None


def stranded(queues: Mapping[str, deque[Task]], nodes: Sequence[Node]) -> list[tuple[Task, str]]:
    """The attempts waiting for a node type none of whose live nodes has, or will have, their runtime's baseline,
    taken out of `queues`, each with why."""
    lost = []
    for node_type, queue in queues.items():
        live = [n for n in nodes if n.alive and n.info.node_type == node_type]
        able = set().union(*(baselines_of(n) for n in live))
        for task in [t for t in queue if t.job.attempt.runtime not in able]:
            queue.remove(task)
            lost.append((task, f"no live node of type {node_type!r} is left" if not live else
                         f"no node of type {node_type!r} has a baseline of runtime {task.job.attempt.runtime!r} "
                         "(it failed there)"))
    return lost


def baselines_of(node: Node) -> set[str]:
    """The runtimes `node` has a baseline of, or is to measure one of."""
    coming = [t.job for t in [*node.own, *(task for task, _ in node.sent)] if isinstance(t, Task) and t.job.baseline]
    return node.runtimes | {job.attempt.runtime for job in coming}
