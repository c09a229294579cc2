"""int4 blocks with a float zero point each (`MatMulNBits` with float `zero_points`): every block of weights along K is
mapped onto 16 evenly spaced levels from its own minimum to its own maximum.

ORT's `MatMulNBitsQuantizer` stores a zero point as a 4-bit integer, so a block's offset is rounded to a whole step:
up to half a step of error on every weight of the block. A float zero point keeps the offset exact. Weights that were
already on such a grid (a GGUF's Q4_1 blocks of 32, dequantized: `scale * q + min`) come back exactly, which makes
this the known-answer check of the int4 weight path on a model converted from GGUF.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
from onnx import helper, numpy_helper

LEVELS = 15  # 4 bits: levels 0..15


def quantize_blocks(weight: np.ndarray, block_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A [K, N] float weight as MatMulNBits' inputs: packed levels [N, blocks, block_size / 2] (uint8, the first of
    each pair in the low nibble), scales [N * blocks] and float zero points [N * blocks], with `(q - zero) * scale`
    the value of each weight. The last block of a K that is not a multiple of `block_size` is padded with level 0;
    its min and max are those of the real weights only.

    Raises:
        ValueError: `weight` is not 2-D, or `block_size` is not an even number >= 2.
    """
    by_block, low, scale = min_max_blocks(weight, block_size)  # a constant block: level 0 is its value
    levels = np.rint((by_block - low[..., None]) / scale[..., None])
    levels = np.clip(np.nan_to_num(levels, nan=0.0), 0, LEVELS).astype(np.uint8)
    zero = -low / scale
    return pack_levels(levels), scale.astype(np.float32).reshape(-1), zero.astype(np.float32).reshape(-1)


def min_max_blocks(weight: np.ndarray, block_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A [K, N] float weight in blocks of `block_size` along K, each spanning 16 levels from its own minimum to its own
    maximum: the weights [N, blocks, block_size] (float64; NaN where K's last block is padded), each block's minimum
    and its scale [N, blocks] (1.0 for a constant block).

    Raises:
        ValueError: `weight` is not 2-D, or `block_size` is not an even number >= 2.
    """
    if weight.ndim != 2:
        raise ValueError(f"a MatMul weight is [K, N], got shape {weight.shape}")
    if block_size < 2 or block_size % 2:
        raise ValueError(f"block_size must be an even number >= 2, got {block_size}")
    k, n = weight.shape
    blocks = -(-k // block_size)
    padded = np.full((blocks * block_size, n), np.nan, dtype=np.float64)
    padded[:k] = weight
    by_block = padded.T.reshape(n, blocks, block_size)
    low, high = np.nanmin(by_block, axis=-1), np.nanmax(by_block, axis=-1)
    scale = (high - low) / LEVELS
    scale[scale == 0] = 1.0
    return by_block, low, scale


def pack_levels(levels: np.ndarray) -> np.ndarray:
    """4-bit levels (uint8 0..15, an even count along the last axis) two to a byte, the first in the low nibble."""
    return (levels[..., 0::2] | (levels[..., 1::2] << 4)).astype(np.uint8)


def quantize_matmuls(model: onnx.ModelProto, *, block_size: int, accuracy_level: int,
                     exclude: tuple[str, ...] = ()) -> int:
    """Replaces, in place, each MatMul of the main graph whose second input is a 2-D float initializer (and whose name
    is not in `exclude`) with a `MatMulNBits` of int4 blocks with float zero points (`quantize_blocks`). A weight no
    other node reads is dropped. Returns how many were replaced."""
    def blocks(node_name: str, weight: np.ndarray) -> tuple[list[np.ndarray], str]:
        return list(quantize_blocks(weight, block_size)), "fzp"

    return len(replace_matmuls(model, blocks, block_size=block_size, accuracy_level=accuracy_level, exclude=exclude))


# What a quantizer gives `replace_matmuls` for a node's weight: MatMulNBits' inputs after the activation (quantized
# weight, scales, zero points) and a tag for their names.
Blocks = Callable[[str, np.ndarray], tuple[list[np.ndarray], str]]


def replace_matmuls(model: onnx.ModelProto, blocks: Blocks, *, block_size: int, accuracy_level: int,
                    exclude: tuple[str, ...] = ()) -> dict[str, str]:
    """Replaces, in place, each MatMul of the main graph whose second input is a 2-D float initializer (and whose name
    is not in `exclude`) with a 4-bit `MatMulNBits` whose weight inputs `blocks` makes. A weight no other node reads
    is dropped. Returns the new node's name by the old one's."""
    graph = model.graph
    initializers = {t.name: t for t in graph.initializer}
    replaced: dict[str, str] = {}
    quantized = set()
    for index, node in enumerate(graph.node):
        weight = initializers.get(node.input[1]) if node.op_type == "MatMul" and len(node.input) == 2 else None
        if (weight is None or node.name in exclude or len(weight.dims) != 2
                or weight.data_type != onnx.TensorProto.FLOAT):
            continue
        values = numpy_helper.to_array(weight)
        k, n = values.shape
        arrays, tag = blocks(node.name, values)
        stem = f"{node.input[1]}_{tag}{block_size}"
        names = [f"{stem}_{part}" for part in ("q", "scales", "zeros")][:len(arrays)]
        graph.initializer.extend(numpy_helper.from_array(array, name) for array, name in zip(arrays, names))
        replaced[node.name] = f"{node.name}_Q4"
        graph.node[index].CopyFrom(helper.make_node(
            "MatMulNBits", [node.input[0], *names], list(node.output), name=replaced[node.name],
            domain="com.microsoft", K=k, N=n, bits=4, block_size=block_size, accuracy_level=accuracy_level))
        quantized.add(weight.name)
    dropped = quantized - {name for node in graph.node for name in node.input}  # tied weights stay
    if dropped:
        kept = [t for t in graph.initializer if t.name not in dropped]
        del graph.initializer[:]
        graph.initializer.extend(kept)
    if replaced and not any(o.domain == "com.microsoft" for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return replaced
