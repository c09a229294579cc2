"""Which quantized nodes cost the accuracy, and the fewest kept in fp32 that make a failing quantization pass.

Leave-one-out, as Neural Compressor's fallback does: the quantization is made again with one block of nodes kept
in fp32, and only its task metric is computed (no timing). Blocks are ranked by how much keeping them helps; then
the top 1, 2, 3, 4, 6, 8... are kept in fp32 until the check passes (the margin is not monotone in the count, so
every count up to the first pass is tried in that order). A block is a run of consecutive nodes; for a language model
judged on real text, where a retry costs a quantization and a scoring of the text, it is one kind of projection
across the layers (q/k/v/o, gate/up/down, lm_head: `projection_groups`), and each row says which.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import onnx

from tracker.optimize import Candidate, Context, Entry
from tracker.optimize.quantize.lm_head import module_of
from tracker.optimize.quantize.prepare import quantizable_nodes
from tracker.search.screen import AccuracyCheck

logger = logging.getLogger(__name__)

# At most this many leave-one-out runs: more nodes are grouped into consecutive blocks.
MAX_BLOCKS = 48
COUNTS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)

Check = Callable[[Candidate], AccuracyCheck]


@dataclass
class Sensitivity:
    """What the fallback found.

    Attributes:
        entry: the failing quantization it started from.
        rows: one per block: its nodes, the margin and pass of the quantization with that block kept in fp32.
        tried: (count kept in fp32, margin, passed) of each retry, in order.
        found: the variant with the fewest blocks kept in fp32 that passed, or None.
        kept: the nodes `found` keeps in fp32.
        seconds: wall time of the fallback.
        stopped: why it ended without a passing variant ("" when it found one).
    """

    entry: Entry
    rows: list[dict] = field(default_factory=list)
    tried: list[tuple[int, float, bool]] = field(default_factory=list)
    found: Entry | None = None
    kept: tuple[str, ...] = ()
    seconds: float = 0.0
    stopped: str = ""


def projection_groups(source: Path, nodes: list[str]) -> dict[str, tuple[str, ...]] | None:
    """`nodes` grouped by the kind of torch module that made each (`self_attn.q_proj`, `mlp.down_proj`, `lm_head`:
    the module's path without its layer index), from the dynamo export's name scopes in `source`; nodes with no such
    module form one group last, `other`. None when fewer than two kinds are found: the graph says nothing of its projections.

    For a language model this is the sensitivity per projection (q/k/v/o, gate/up/down, lm_head): one retry per kind
    instead of one per block of consecutive nodes, each costing a quantization and a scoring of the text."""
    graph = onnx.load_model(str(source), load_external_data=False).graph
    wanted = set(nodes)
    kinds = {node.name: _projection_kind(module_of(node)) for node in graph.node if node.name in wanted}
    groups: dict[str, list[str]] = {}
    for name in nodes:
        groups.setdefault(kinds.get(name, ""), []).append(name)
    named = [kind for kind in groups if kind]
    if len(named) < 2:
        return None
    return {**{kind: tuple(groups[kind]) for kind in named}, **({"other": tuple(groups[""])} if "" in groups else {})}


def _projection_kind(module: str) -> str:
    """`model.layers.3.self_attn.q_proj` -> `self_attn.q_proj`, `lm_head` -> `lm_head`: a module's path after its
    last layer index ("" when it ends on one, or there is none)."""
    parts = [part for part in module.split(".") if part]
    last_index = max((i for i, part in enumerate(parts) if part.isdigit()), default=-1)
    return ".".join(parts[last_index + 1:])


def blocks_of(nodes: list[str], max_blocks: int = MAX_BLOCKS) -> list[tuple[str, ...]]:
    """`nodes` in at most `max_blocks` consecutive groups (one node each when they are few)."""
    if not nodes:
        return []
    size = -(-len(nodes) // max_blocks)
    return [tuple(nodes[i:i + size]) for i in range(0, len(nodes), size)]


def fallback(
    entry: Entry, source: Path, workdir: Path, context: Context, check: Check, *,
    out_of_time: Callable[[], bool] = lambda: False, max_blocks: int = MAX_BLOCKS, by_projection: bool = False,
) -> Sensitivity:
    """Finds the nodes of `entry`'s quantization that cost the accuracy and the fewest to keep in fp32.

    Args:
        entry: a quantization with an `exclude` knob whose candidate failed `check`.
        source: the model it quantizes.
        workdir: where the retries' models are made (each removed once checked).
        context: as the study gives it (`Context.work` shares the pre-processed graph between retries).
        check: a made candidate's accuracy against the baseline.
        out_of_time: asked before each retry; True stops the fallback (the reason says so).
        by_projection: one block per kind of projection when the graph names them (`projection_groups`; a language
            model judged on text, where each retry is costly), else blocks of consecutive nodes.

    Raises:
        ValueError: `entry` has no `exclude` knob.
    """
    if "exclude" not in entry.knobs() or not hasattr(entry, "pre_processing"):
        raise ValueError(f"{entry.name} has no exclude knob: it cannot keep nodes in fp32")
    found = Sensitivity(entry)
    start = time.perf_counter()
    workdir.mkdir(parents=True, exist_ok=True)
    nodes = quantizable_nodes(entry, source, workdir, context)
    projections = projection_groups(source, nodes) if by_projection else None
    blocks = list(projections.values()) if projections else blocks_of(nodes, max_blocks)
    names = list(projections) if projections else [""] * len(blocks)
    logger.info("sensitivity of %s: %d quantized nodes in %d %s, one kept in fp32 at a time", entry.name, len(nodes),
                len(blocks), "kinds of projection" if projections else "blocks")
    for index, block in enumerate(blocks):
        if out_of_time():
            found.stopped = f"the budget ran out after {index} of {len(blocks)} blocks"
            break
        result = _try(entry.variant(exclude=block), source, workdir / f"block{index}", context, check)
        found.rows.append({"block": index, "group": names[index],
                           "nodes": ",".join(block), "node_count": len(block),
                           "margin": result.margin, "passed": result.passed,
                           **{k: v for k, v in result.metrics.items() if k.startswith("diff.")}})
        logger.info("sensitivity of %s: block %d/%d (%s) kept in fp32: margin %.3f", entry.name, index + 1,
                    len(blocks), names[index] or (block[0] if len(block) == 1 else f"{len(block)} nodes"),
                    result.margin)
    ranked = [tuple(r["nodes"].split(",")) for r in sorted(found.rows, key=lambda r: -r["margin"])]
    # At least one block stays quantized: keeping them all in fp32 is the baseline, not a quantization.
    for count in (c for c in COUNTS if c < len(ranked)):
        if found.stopped or out_of_time():
            found.stopped = found.stopped or f"the budget ran out after {len(found.tried)} retries"
            break
        kept = tuple(dict.fromkeys(n for block in ranked[:count] for n in block))
        variant = entry.variant(exclude=kept)
        result = _try(variant, source, workdir / f"top{count}", context, check)
        found.tried.append((count, result.margin, result.passed))
        logger.info("sensitivity of %s: the %d most sensitive block(s) in fp32: margin %.3f (%s)", entry.name,
                    count, result.margin, "passes" if result.passed else "fails")
        if result.passed:
            found.found, found.kept = variant, kept
            break
    else:
        if not found.stopped:
            largest = max((c for c in COUNTS if c < len(ranked)), default=0)
            found.stopped = (f"no count of blocks kept in fp32 up to {largest} (of {len(ranked)}) passed"
                             if largest else f"{len(ranked)} block(s): none can be kept in fp32 with one quantized")
    found.seconds = time.perf_counter() - start
    return found


def _try(variant: Entry, source: Path, folder: Path, context: Context, check: Check) -> AccuracyCheck:
    try:
        return check(variant(source, folder, context))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
