"""int4 blocks with integer zero points, and each block's mean rounding error added back by a small float product.

A block's weights are mapped onto 16 levels, `(q - zero) * scale`, with `zero` a 4-bit integer (what ONNX Runtime's
fast `MatMulNBits` kernels take). Rounding leaves each weight an error `r`; its mean over the block, `c`, is a bias
the block adds to every output, correlated across the block's 32 weights where the random part of the errors
cancels. It is added back exactly: with `s_b(x)` the sum of the block's inputs, the product is

    x @ W = MatMulNBits(x) + sum over blocks b of s_b(x) * c[b, n] (+ the errors' zero-mean rest)

computed as `(x @ S) @ C`: `S` [K, blocks] sums each block's inputs (shared by the products that read the same
input), `C` [blocks, N] holds the means, K / 32 times fewer numbers than the weight.

On weights that were on a grid with a float minimum per block (a GGUF's Q4_1 blocks of 32: `scale * q + min`), the
error of each block is that minimum's distance to the integer grid, the same for all its weights: the correction
makes the int4 product exact. On SmolLM2-135M (Q4_1; its lm_head in int8 blocks, the embedding it shares being Q8_0
in the file) int4 in blocks of 32 goes from +24 % perplexity to +1.1 % with int8 compute (accuracy level 4); with
float compute and the lm_head in fp32, to the baseline exactly (docs/methodology.md, "Quality bounds for language
models"). The price is
three small kernels per product (two where the block sum is shared): on SmolLM2's decode step, 6.0 ms -> 9.5 ms.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from tracker.optimize.quantize.float_zero_points import LEVELS, min_max_blocks, pack_levels, replace_matmuls


def quantize_blocks_int(weight: np.ndarray, block_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A [K, N] float weight as MatMulNBits' inputs with 4-bit zero points: packed levels [N, blocks, block_size / 2],
    scales [N * blocks], packed zero points [N * ceil(blocks / 2)] (two per byte, the first in the low nibble), and the
    mean rounding error of each block [blocks, N] (float32). A block spans its own minimum to maximum; a K that is not
    a multiple of `block_size` pads its last block with the zero point's level (weights of 0), outside the mean.

    Raises:
        ValueError: `weight` is not 2-D, or `block_size` is not an even number >= 2.
    """
    # a constant block (scale 1.0): its value is all rounding error, given back by the mean
    by_block, low, scale = min_max_blocks(weight, block_size)
    n, blocks = low.shape
    # The levels run from the block's own minimum, so they are exact on a Q4_1 block; the zero point is the nearest
    # 4-bit integer to where 0 falls, and whatever it misses (a block all of one sign included) is the same for every
    # weight of the block: the mean error gives it back.
    levels = np.clip(np.rint((by_block - low[..., None]) / scale[..., None]), 0, LEVELS)
    zero = np.clip(np.rint(-low / scale), 0, LEVELS)
    error = by_block - (levels - zero[..., None]) * scale[..., None]
    mean_error = np.nanmean(error, axis=-1)
    levels = np.where(np.isnan(by_block), zero[..., None], levels).astype(np.uint8)
    zeros = zero.astype(np.uint8)
    if blocks % 2:
        zeros = np.concatenate([zeros, np.zeros((n, 1), dtype=np.uint8)], axis=1)
    return (pack_levels(levels), scale.astype(np.float32).reshape(-1), pack_levels(zeros).reshape(-1),
            mean_error.T.astype(np.float32))


def quantize_matmuls_corrected(model: onnx.ModelProto, *, block_size: int, accuracy_level: int,
                               exclude: tuple[str, ...] = ()) -> dict[str, np.ndarray]:
    """Replaces, in place, each MatMul of the main graph on a 2-D float initializer (not named in `exclude`) with a
    `MatMulNBits` of int4 blocks with 4-bit zero points (`quantize_blocks_int`). Returns each new node's mean block
    errors by its name, for `add_corrections` once the graph around the products is final."""
    corrections: dict[str, np.ndarray] = {}

    def blocks(node_name: str, weight: np.ndarray) -> tuple[list[np.ndarray], str]:
        packed, scales, zeros, mean_error = quantize_blocks_int(weight, block_size)
        corrections[node_name] = mean_error
        return [packed, scales, zeros], "iq"

    renamed = replace_matmuls(model, blocks, block_size=block_size, accuracy_level=accuracy_level, exclude=exclude)
    return {renamed[name]: errors for name, errors in corrections.items()}


def add_corrections(model: onnx.ModelProto, corrections: dict[str, np.ndarray], block_size: int) -> int:
    """After each `MatMulNBits` named in `corrections`, adds `(x @ S) @ C` to its output (the module's docstring):
    one block sum `x @ S` per input read by several products. Returns how many products were corrected."""
    graph = model.graph
    nodes: list[onnx.NodeProto] = []
    initializers: list[onnx.TensorProto] = []
    sums: dict[tuple[str, int], str] = {}
    corrected = 0
    for node in graph.node:
        mean_error = corrections.get(node.name)
        if node.op_type != "MatMulNBits" or mean_error is None:
            nodes.append(node)
            continue
        k = next(a.i for a in node.attribute if a.name == "K")
        source, output = node.input[0], node.output[0]
        key = (source, k)
        if key not in sums:
            blocks = mean_error.shape[0]
            summing = np.zeros((k, blocks), dtype=np.float32)
            for b in range(blocks):
                summing[b * block_size:(b + 1) * block_size, b] = 1.0
            sums[key] = f"{node.name}_block_sums"
            initializers.append(numpy_helper.from_array(summing, f"{sums[key]}_S"))
            nodes.append(helper.make_node("MatMul", [source, f"{sums[key]}_S"], [sums[key]], name=f"{node.name}_BlockSum"))
        product = f"{output}_uncorrected"
        node.output[0] = product
        nodes.append(node)
        initializers.append(numpy_helper.from_array(mean_error, f"{node.name}_mean_block_error"))
        nodes.append(helper.make_node("MatMul", [sums[key], f"{node.name}_mean_block_error"], [f"{output}_correction"],
                                      name=f"{node.name}_Correction"))
        nodes.append(helper.make_node("Add", [product, f"{output}_correction"], [output], name=f"{node.name}_Corrected"))
        corrected += 1
    del graph.node[:]
    graph.node.extend(nodes)
    graph.initializer.extend(initializers)
    return corrected
