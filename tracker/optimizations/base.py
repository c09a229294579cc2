"""What an optimization attempt returns (`Transformed`), what it is told (`ModelInfo`), and the file helpers
every attempt shares."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import onnx

PRECISIONS = ("fp32", "fp16", "int8")

# Protobuf cannot serialize a message of 2 GiB or more: only then must weights go to an external file.
_PROTOBUF_LIMIT_BYTES = 2**31 - 1


@dataclass(frozen=True)
class ModelInfo:
    """What the fusers cannot reliably read from the graph.

    Attributes:
        num_heads: attention heads per layer.
        hidden_size: width of the residual stream.
        model_type: `onnxruntime.transformers` model type ("gpt2", "bert", ...).
    """

    num_heads: int
    hidden_size: int
    model_type: str = "gpt2"

    def __post_init__(self) -> None:
        if self.num_heads < 1 or self.hidden_size < 1:
            raise ValueError(
                f"num_heads and hidden_size must be >= 1, got num_heads={self.num_heads}, "
                f"hidden_size={self.hidden_size}"
            )
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must be a multiple of num_heads ({self.num_heads})"
            )


@dataclass(frozen=True)
class Transformed:
    """What one attempt did.

    Attributes:
        path: the new model file (its external data, if any, lies beside it).
        applied: False when the attempt could not do what it is for (no attention to fuse, nothing
            quantized); `notes` say why, and `path` is still a model that runs.
        fusions: count of each fused op type in the new graph, e.g. {"SkipLayerNormalization": 24}.
        fully_optimized: the optimizer's own verdict (ORT's `is_fully_optimized`), None where it has none.
        precision: "fp32", "fp16" or "int8": the precision of the weights and compute.
        notes: what a reader of the run should know (what was skipped, repaired, or left unfused).
        params: what was done, as strings to log (`optimizer.opt_level`, ...).
    """

    path: Path
    applied: bool
    fusions: dict[str, int]
    fully_optimized: bool | None
    precision: str
    notes: tuple[str, ...] = ()
    params: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {self.precision!r}")
        bad = {k: v for k, v in self.fusions.items() if not isinstance(v, int) or isinstance(v, bool) or v < 0}
        if bad:
            raise ValueError(f"fusion counts must be non-negative ints, got {bad}")


Transform = Callable[[Path, Path, ModelInfo], Transformed]


def prepare_output(source: Path, target_dir: Path, name: str) -> Path:
    """Checks `source` exists and returns `target_dir/<name>.onnx` (creating the folder).

    Raises:
        ValueError: `source` is not a file, or the output would overwrite it.
    """
    source = Path(source)
    if not source.is_file():
        raise ValueError(f"source model must be an existing .onnx file, got {source}")
    target_dir = Path(target_dir)
    target_dir.mkdir(parents=True, exist_ok=True)
    target = target_dir / f"{name}.onnx"
    if target.resolve() == source.resolve():
        raise ValueError(f"the output of {name!r} would overwrite its source {source}: pick another target_dir")
    return target


def needs_external_data(model: onnx.ModelProto) -> bool:
    """True when `model` is too large for one protobuf file."""
    return model.ByteSize() >= _PROTOBUF_LIMIT_BYTES


def save_proto(model: onnx.ModelProto, path: Path) -> None:
    """Saves `model` as one file, or with its weights in `<path>.data` when it is too large for one."""
    if needs_external_data(model):
        onnx.save_model(model, str(path), save_as_external_data=True, location=f"{path.name}.data")
    else:
        onnx.save_model(model, str(path))


def copy_model(source: Path, target: Path) -> None:
    """Writes an unchanged copy of `source` (external data included) to `target`."""
    save_proto(onnx.load_model(str(source), load_external_data=True), target)


def count_ops(model: onnx.ModelProto, op_types: tuple[str, ...]) -> dict[str, int]:
    """How many nodes of the main graph have each of `op_types` (any domain)."""
    counts = dict.fromkeys(op_types, 0)
    for node in model.graph.node:
        if node.op_type in counts:
            counts[node.op_type] += 1
    return counts


def ort_fused_counts(statistics: Mapping[str, int]) -> dict[str, int]:
    """ORT's `get_fused_operator_statistics()` as plain non-negative ints."""
    return {str(op): int(count) for op, count in statistics.items()}
