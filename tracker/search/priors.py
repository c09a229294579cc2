"""The order a search tries its candidates in, before anything is timed: each candidate's expected speed-up, highest
first. A budget that runs out then leaves untried the candidates least likely to win. The sources, in order of trust:

1. the cache: what an earlier search of this model on this machine screened (`SearchCache`), per candidate;
2. the prior of its family on this machine's instruction sets and this model's op mix (`priors.toml`, kept as data
   with the measurement behind each entry);
3. the cost model: Amdahl's law over the baseline's profile (the share of its time in the ops the family
   quantizes) and this machine's int8 and int4 MatMul throughputs against fp32 (`costmodel.machine.kernel_speedups`).
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import onnx

from tracker.measure.costmodel.machine import kernel_speedups
from tracker.measure.environment import ISA_FLAGS, isa
from tracker.profile import columns as C
from tracker.profile.aggregate import summarize
from tracker.profile.parse import Profile

PRIORS_FILE = Path(__file__).with_name("priors.toml")
OP_MIXES = ("conv", "matmul")
# The instruction sets a prior may be kept for, most capable first: a machine takes the first it has that the file
# holds (an AMX machine has AVX-512 VNNI too, and takes its table when there is none of its own).
_PREFERENCE = ("amx_int8", "avx512_vnni", "avx_vnni", "avx512", "avx2", "arm_i8mm", "arm_dotprod")
_CONV_OPS, _MATMUL_OPS = {"Conv", "ConvTranspose", "ConvInteger", "QLinearConv"}, {"MatMul", "Gemm", "MatMulNBits"}
# What the cost model knows of a family: the precision it computes in, and the op types (as the baseline's profile
# names them) it quantizes. Dynamic int8 leaves convolutions alone in practice (ORT's ConvInteger is slow).
_QUANTIZES = {"Int8Dynamic": ("int8", {"MatMul", "Gemm", "FusedMatMul"}),
              "Int8Static": ("int8", {"MatMul", "Gemm", "FusedMatMul", "Conv", "FusedConv"}),
              "Int4": ("int4", {"MatMul", "FusedMatMul"})}


@dataclass(frozen=True)
class Priors:
    """The expected speed-up of each family (`Int8Static`, `Int8Dynamic`, ...) by instruction set and op mix."""

    table: Mapping[str, Mapping[str, Mapping[str, float]]]
    source: str

    def for_machine(self, flags: Mapping[str, bool], op_mix: str | None) -> tuple[str | None, dict[str, float]]:
        """(the instruction set whose table applies, that table for `op_mix`); (None, {}) when none does."""
        for name in _PREFERENCE:
            tables = self.table.get(name, {})
            if flags.get(name) and op_mix is not None and op_mix in tables:
                return name, dict(tables[op_mix])
        return None, {}


def load_priors(path: str | Path = PRIORS_FILE) -> Priors:
    """Reads a priors file (`[<instruction set>.<op mix>]` tables of family = expected speed-up).

    Raises:
        ValueError: it cannot be read, or names an instruction set, an op mix or a value it may not (one line naming
            what is known).
    """
    try:
        raw = tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ValueError(f"cannot read the search priors {path}: {e}") from e
    table: dict[str, dict[str, dict[str, float]]] = {}
    for name, mixes in raw.items():
        if name not in ISA_FLAGS:
            raise ValueError(f"{path}: unknown instruction set {name!r}; known: {', '.join(ISA_FLAGS)}")
        for mix, families in (mixes or {}).items() if isinstance(mixes, dict) else ():
            if mix not in OP_MIXES or not isinstance(families, dict):
                raise ValueError(f"{path}: [{name}.{mix}] is not a table of an op mix; expected one of "
                                 f"{', '.join(OP_MIXES)}")
            for family, value in families.items():
                if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0 \
                        or not math.isfinite(value):
                    raise ValueError(f"{path}: [{name}.{mix}] {family} = {value!r}; expected a speed-up above 0")
            table.setdefault(name, {})[mix] = {f: float(v) for f, v in families.items()}
    return Priors(table, str(path))


def op_mix(graph: onnx.ModelProto) -> str | None:
    """Where most of the model's weights are read: "conv" or "matmul" (by the initializers' elements each kind of op
    takes), None for a model with neither. Shapes only: a graph without its weights' values will do."""
    sizes = {t.name: math.prod(t.dims) for t in graph.graph.initializer}
    weights = {"conv": 0, "matmul": 0}
    for node in graph.graph.node:
        kind = "conv" if node.op_type in _CONV_OPS else "matmul" if node.op_type in _MATMUL_OPS else None
        if kind:
            weights[kind] += sum(sizes.get(name, 0) for name in node.input)
    best = max(weights, key=lambda k: weights[k])
    return best if weights[best] else None


def op_time(profile: Profile, *, skip_runs: int = 1) -> dict[str, float]:
    """Each op type's share of a profile's kernel time (its first `skip_runs` runs left out when it has more)."""
    runs = int(profile.events[C.RUN].max()) + 1 if len(profile.events) else 0
    summary = summarize(profile.events, by="op", skip_runs=skip_runs if runs > skip_runs else 0)
    return {str(k): float(p) / 100.0 for k, p in zip(summary[C.KEY], summary[C.PCT])}


def cost_estimate(family: str, op_time: Mapping[str, float], speedups: Mapping[str, float]) -> float | None:
    """The cost model's expected speed-up of `family`: Amdahl's law over the share of the baseline's time in the ops it
    quantizes (`op_time`: op type -> share, summing to 1) and how much faster those run in its precision here
    (`speedups`, `kernel_speedups`). None for a family it does not model."""
    if family not in _QUANTIZES:
        return None
    precision, ops = _QUANTIZES[family]
    share = min(1.0, sum(op_time.get(op, 0.0) for op in ops))
    return 1.0 / ((1.0 - share) + share / speedups[precision])


def prior_order(entries: Sequence, families: Sequence[str], graph: onnx.ModelProto, *,
                flags: Mapping[str, bool] | None = None, priors: Priors | None = None,
                measured: Mapping[str, float] | None = None, op_time: Mapping[str, float] | None = None,
                speedups: Callable[[], Mapping[str, float]] | None = None) -> tuple[list, dict[str, float], str]:
    """`entries` (each of family `families[i]`) sorted by their expected speed-up, highest first (ties keep the given
    order): an entry's own figure in `measured` (the cache's screen), else its family's prior for this machine and
    op mix, else, given the baseline's `op_time` shares, the cost model's estimate (`speedups` measures this
    machine's kernels, once, when one is needed), else 1.0. Returns them, each family's expectation, and one line
    saying why the order is what it is."""
    flags = isa() if flags is None else flags
    priors = priors or load_priors()
    measured = measured or {}
    mix = op_mix(graph)
    name, table = priors.for_machine(flags, mix)
    expected = {family: table.get(family, 1.0) for family in families}
    modelled: dict[str, float] = {}
    if op_time and any(f not in table and f in _QUANTIZES for f in expected):
        kernels = (speedups or kernel_speedups)()
        modelled = {f: cost_estimate(f, op_time, kernels) or 1.0 for f in expected if f not in table and f in _QUANTIZES}
        expected.update(modelled)
    order = sorted(range(len(entries)), key=lambda i: -measured.get(entries[i].name, expected[families[i]]))
    if name is None:
        has = ", ".join(n for n, present in flags.items() if present) or "none known"
        why = (f"no prior for this machine ({has}) and op mix ({mix or 'neither conv nor matmul'}) in "
               f"{priors.source}")
    else:
        why = (f"by the prior for {name}, {mix} ({priors.source}): "
               + ", ".join(f"{f} {expected[f]:.2f}x" for f in sorted(table, key=lambda f: -table[f]) if f in expected))
    if modelled:
        why += "; by the cost model (the baseline's time in the ops quantized, this machine's kernels): " + ", ".join(
            f"{f} {v:.2f}x" for f, v in sorted(modelled.items(), key=lambda i: -i[1]))
    rest = sorted(f for f in set(families) if f not in table and f not in modelled)
    if rest:
        why += f"; the others ({', '.join(rest)}) 1.00x" if (name or modelled) else ": the families are tried in turn"
    hits = sum(e.name in measured for e in entries)
    if hits:
        why += f"; {hits} candidate(s) first by what the cache screened of them"
    return [entries[i] for i in order], expected, why
