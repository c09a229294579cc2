"""The order a search tries its candidates in, before anything is timed: each family's expected speed-up on this
machine's instruction sets and this model's op mix (`priors.toml`, kept as data with the measurement behind each
entry), highest first. A budget that runs out then leaves untried the families least likely to win."""

from __future__ import annotations

import math
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import onnx

from tracker.measure.environment import ISA_FLAGS, isa

PRIORS_FILE = Path(__file__).with_name("priors.toml")
OP_MIXES = ("conv", "matmul")
# The instruction sets a prior may be kept for, most capable first: a machine takes the first it has that the file
# holds (an AMX machine has AVX-512 VNNI too, and takes its table when there is none of its own).
_PREFERENCE = ("amx_int8", "avx512_vnni", "avx_vnni", "avx512", "avx2", "arm_i8mm", "arm_dotprod")
_CONV_OPS, _MATMUL_OPS = {"Conv", "ConvTranspose", "ConvInteger", "QLinearConv"}, {"MatMul", "Gemm", "MatMulNBits"}


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


def prior_order(entries: Sequence, families: Sequence[str], graph: onnx.ModelProto, *,
                flags: Mapping[str, bool] | None = None, priors: Priors | None = None
                ) -> tuple[list, dict[str, float], str]:
    """`entries` (each of family `families[i]`) sorted by their family's expected speed-up, highest first (1.0 for a
    family the table does not hold; ties keep the given order). Returns them, each family's expectation, and one
    line saying why the order is what it is."""
    flags = isa() if flags is None else flags
    priors = priors or load_priors()
    mix = op_mix(graph)
    name, table = priors.for_machine(flags, mix)
    expected = {family: table.get(family, 1.0) for family in families}
    order = sorted(range(len(entries)), key=lambda i: -expected[families[i]])
    if name is None:
        has = ", ".join(n for n, present in flags.items() if present) or "none known"
        why = (f"no prior for this machine ({has}) and op mix ({mix or 'neither conv nor matmul'}) in "
               f"{priors.source}: the families are tried in turn")
    else:
        ranked = sorted(set(families), key=lambda f: -expected[f])
        why = (f"by the prior for {name}, {mix} ({priors.source}): "
               + ", ".join(f"{f} {expected[f]:.2f}x" for f in ranked if f in table)
               + (f"; the others ({', '.join(f for f in ranked if f not in table)}) 1.00x" if set(ranked) - set(table)
                  else ""))
    return [entries[i] for i in order], expected, why
