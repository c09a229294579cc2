"""A model's outputs as the arrays a diff compares: a tensor as it is, a sequence of maps (a scikit-learn
classifier's ZipMap probabilities, as skl2onnx converts it by default) as a [rows, classes] table with its class
keys, a sequence of tensors element by element."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

TENSOR, MAPS, SEQUENCE = "tensor", "a sequence of maps", "a sequence of tensors"


@dataclass(frozen=True)
class OutputPart:
    """One array of an output, to compare with the same part of another run's output.

    Attributes:
        label: where it comes from, for messages: "output 1", or "output 1[2]" for a sequence's element.
        values: the array; a sequence of maps is one row per map and one column per class key.
        kind: `TENSOR`, `MAPS` or `SEQUENCE`: what the output was.
        keys: the class keys of a sequence of maps, in column order (sorted); None otherwise.
    """

    label: str
    values: np.ndarray
    kind: str = TENSOR
    keys: tuple | None = None


def output_parts(output: Any, index: int) -> list[OutputPart]:
    """The arrays of output `index` as ONNX Runtime (or the reference evaluator) returns it.

    A map is one row of class scores; a list of maps one row per map, its columns in sorted key order (rows
    must share their keys: ZipMap's always do). A list of tensors is one part per element; an empty list none.

    Raises:
        ValueError: the maps of one output have different keys.
    """
    if isinstance(output, dict):
        return [_class_table([output], index)]
    if isinstance(output, (list, tuple)) and output and all(isinstance(v, dict) for v in output):
        return [_class_table(output, index)]
    if isinstance(output, (list, tuple)) and all(isinstance(v, np.ndarray) for v in output):
        return [OutputPart(f"output {index}[{j}]", v, SEQUENCE) for j, v in enumerate(output)]
    return [OutputPart(f"output {index}", np.asarray(output))]


def paired_parts(baseline: Sequence[Any], attempt: Sequence[Any]) -> list[tuple[OutputPart, OutputPart]]:
    """The parts of each output of `baseline`, each with the same part of `attempt`'s (same kind, same length,
    same class keys); their shapes are for the caller to check.

    Raises:
        ValueError: the outputs cannot be paired: their numbers, kinds, sequence lengths or class keys differ.
    """
    if len(baseline) != len(attempt):
        raise ValueError(f"baseline has {len(baseline)} outputs but the attempt has {len(attempt)}")
    pairs: list[tuple[OutputPart, OutputPart]] = []
    for i, (b, a) in enumerate(zip(baseline, attempt)):
        b_parts, a_parts = output_parts(b, i), output_parts(a, i)
        b_kind, a_kind = (_kind(parts, o) for parts, o in ((b_parts, b), (a_parts, a)))
        if b_kind != a_kind:
            raise ValueError(f"output {i}: the baseline's is {b_kind} but the attempt's is {a_kind}")
        if len(b_parts) != len(a_parts):
            raise ValueError(f"output {i}: the baseline's sequence has {len(b_parts)} elements but the attempt's "
                             f"has {len(a_parts)}")
        for bp, ap in zip(b_parts, a_parts):
            if bp.keys != ap.keys:
                assert bp.keys is not None and ap.keys is not None, "one kind: both are maps, with keys"
                raise ValueError(f"{bp.label}: the baseline's class keys {list(bp.keys)} differ from the attempt's "
                                 f"{list(ap.keys)}")
        pairs += zip(b_parts, a_parts)
    return pairs


def output_nbytes(output: Any) -> int:
    """The bytes of an output's arrays (a sequence's elements summed; a map's values as a table)."""
    return sum(int(part.values.nbytes) for part in output_parts(output, 0))


def _kind(parts: list[OutputPart], output: Any) -> str:
    if parts:
        return parts[0].kind
    return SEQUENCE if isinstance(output, (list, tuple)) else TENSOR  # an empty sequence


def _class_table(maps: Sequence[dict], index: int) -> OutputPart:
    keys = sorted(maps[0], key=_key_order)
    for row, values in enumerate(maps):
        if set(values) != set(keys):
            raise ValueError(f"output {index}: the map of row {row} has keys {sorted(values, key=_key_order)}, the "
                             f"map of row 0 {keys}; a sequence of maps compares as a table of one column per key")
    table = np.array([[values[k] for k in keys] for values in maps], dtype=np.float64)
    return OutputPart(f"output {index}", table.reshape(len(maps), len(keys)), MAPS, tuple(keys))


def _key_order(key: Any) -> tuple[str, Any]:
    return type(key).__name__, key  # int64 or string keys (ZipMap has one type per map)
