"""FLOPs and bytes of one ONNX Runtime kernel call, from its op type and the input and output shapes its
profile records: the cost model behind `tracker.measure.costmodel.roofline`.

Counting conventions (FLOPs of one call; |T| is the element count of tensor T, Y the first output):

- MatMul, FusedMatMul, MatMulNBits, MatMulBnb4, MatMulInteger, MatMulIntegerToFloat, DynamicQuantizeMatMul,
  QLinearMatMul: 2 |Y| K, K the shared dimension (batch and broadcast dimensions included in |Y|).
- Gemm, FusedGemm, QGemm: 2 |Y| K with K = |A| / M (right whatever transA is), + |Y| for a bias C.
  LinearRegressor (ai.onnx.ml): 2 |Y| F + |Y|.
- Conv, FusedConv, ConvInteger, QLinearConv: 2 |Y| (C_in / groups) prod(kernel) (the weight's shape after
  its first dimension), + |Y| for a bias; ConvTranspose: 2 |X| prod(weight shape after its first dimension).
- Attention (com.microsoft): the QKV projection 2 B S D_in D_qkv, plus QK^T and AV,
  2 B S_q S_kv (D_qk + D_v) = 4 B H S_q S_kv head_dim when D_qk = D_v. MultiHeadAttention and
  GroupQueryAttention: QK^T and AV only (their projections are separate MatMuls). S_kv is the present key's
  length when the kernel returns one (past + new), else the key's. The causal mask is not subtracted (the
  CPU kernels compute the full score matrix), nor is the softmax inside (it needs the head count, which no
  shape carries; ~5 FLOPs per score, a few % of the two products at head_dim 64).
- Normalizations, per element of Y: LayerNormalization 5 and GroupNormalization / InstanceNormalization 5 (as
  the DeepSpeed flops profiler counts an affine layer norm), SkipLayerNormalization 6 (+1 for the skip add),
  SimplifiedLayerNormalization / RMSNormalization 4 (square, sum, scale, gamma), SkipSimplifiedLayerNormalization
  5, EmbedLayerNormalization 7 (two embedding adds + 5), BatchNormalization 2 (inference: scale and shift).
- Softmax, LogSoftmax: 5 per element (max, subtract, exp, sum, divide; DeepSpeed counts 1).
- Elementwise ops: 1 per element of Y (activations included, Gelu, Erf and Tanh too, as DeepSpeed counts
  them); higher where the fused op does more: BiasGelu 2, FastGelu 2 with its bias input (else 1),
  BiasAdd 2, variadic Sum / Max / Min / Mean (inputs - 1). QuantizeLinear / DequantizeLinear 2 (scale,
  zero point), DynamicQuantizeLinear 4 (min, max, scale, round).
- Reductions and pooling: 1 per input element. Resize / Upsample: 1 per output element.
- Data movement (Reshape, Transpose, Gather, Concat, Cast, ...): 0 FLOPs, covered.
- Integer kernels (MatMulInteger, ...) count integer operations as FLOPs: against the fp32 peak they can pass
  100 %.
- Any other op type is not covered: no FLOPs (`covered_calls_pct` 0), its bytes still count.

Bytes of one call: every input plus every output, each read or written once (weights included, those ONNX
Runtime pre-packed and leaves out of the profile too: see the formulas). Gather, GatherElements, GatherND and
Slice read only what they return (an embedding lookup reads its rows, not the table); Shape and Size read no data.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import pandas as pd

from tracker.profile import columns as C

logger = logging.getLogger(__name__)

# Bytes per element of ORT's type names in profiles.
_ELEMENT_BYTES = {
    "float": 4, "double": 8, "float16": 2, "bfloat16": 2, "int8": 1, "uint8": 1, "int16": 2, "uint16": 2,
    "int32": 4, "uint32": 4, "int64": 8, "uint64": 8, "bool": 1, "int4": 0.5, "uint4": 0.5,
    "float4e2m1": 0.5, "float8e4m3fn": 1, "float8e4m3fnuz": 1, "float8e5m2": 1, "float8e5m2fnuz": 1,
    "complex64": 8, "complex128": 16,
}


class Tensor(NamedTuple):
    """One input or output of a kernel call: ORT's element type name and the shape."""

    dtype: str
    shape: tuple[int, ...]

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> float:
        return self.size * _ELEMENT_BYTES.get(self.dtype, 0)


@dataclass(frozen=True)
class KernelCost:
    """FLOPs and bytes of one kernel call; `flops` is None when the op type is not covered."""

    flops: float | None
    bytes: float


def parse_shapes(text: str | None) -> list[Tensor]:
    """ORT's compact shape list ('[{"float":[4,100]},{"int64":[2]}]') as tensors; "" or None is no tensor.

    Raises:
        ValueError: text that is not such a list.
    """
    if text is None or (isinstance(text, float) and math.isnan(text)) or text == "":
        return []
    try:
        entries = json.loads(text)
        return [Tensor(str(dtype), tuple(int(d) for d in shape)) for entry in entries for dtype, shape in entry.items()]
    except (json.JSONDecodeError, AttributeError, TypeError) as e:
        raise ValueError(f"expected shapes like '[{{\"float\":[4,100]}}]', got {text!r}") from e


# --- Formulas: (inputs, outputs) -> (FLOPs, bytes of a weight the profile does not list) of one call ---
# ONNX Runtime pre-packs constant weights (MatMul's B, Gemm's B, the integer and n-bit MatMuls' B, Attention's
# QKV weights) at session start, and its profile then leaves them out of the call's inputs: the formulas add
# their bytes back, from the shapes the call does list.

Formula = Callable[[Sequence[Tensor], Sequence[Tensor]], tuple[float, float]]
_NBITS_ASSUMED = 4  # bits of a MatMulNBits weight the profile leaves out (the quantizers' default)


def _k_of(a: tuple[int, ...], y: tuple[int, ...]) -> int:
    """K of a matmul from A and Y: A is [.., M, K], or [.., K, M] under a transA (FusedMatMul): the dimension
    that is not M (either, when K == M)."""
    if len(a) < 2 or len(y) < 2:
        return a[-1] if a else 1
    return a[-1] if a[-2] == y[-2] else a[-2]


def _matmul(i: Sequence[Tensor], o: Sequence[Tensor]) -> tuple[float, float]:
    y, k = o[0], _k_of(i[0].shape, o[0].shape)
    unlisted = 0.0 if len(i) >= 2 else k * y.shape[-1] * _ELEMENT_BYTES.get(i[0].dtype, 4)
    return 2.0 * y.size * k, unlisted


def _integer_matmul(i: Sequence[Tensor], o: Sequence[Tensor]) -> tuple[float, float]:
    """MatMulInteger, DynamicQuantizeMatMul, ...: B is the one 8-bit input of rank >= 2 after A (scales and
    zero points are scalars or vectors)."""
    y, k = o[0], i[0].shape[-1]
    listed = any(len(t.shape) >= 2 and t.dtype in ("int8", "uint8") for t in i[1:])
    return 2.0 * y.size * k, 0.0 if listed else float(k * y.shape[-1])


def _nbits_matmul(i: Sequence[Tensor], o: Sequence[Tensor]) -> tuple[float, float]:
    """MatMulNBits (B: uint8 [N, blocks, blob]) and MatMulBnb4 (B: uint8 [N K / 2])."""
    y, k = o[0], i[0].shape[-1]
    n = y.shape[-1]
    listed = any(t.dtype == "uint8" and (len(t.shape) == 3 or t.size >= n * k // 2) for t in i[1:])
    return 2.0 * y.size * k, 0.0 if listed else n * k * _NBITS_ASSUMED / 8


def _gemm(i: Sequence[Tensor], o: Sequence[Tensor]) -> tuple[float, float]:
    y = o[0]
    m, n = y.shape
    k = i[0].size // m  # |A| = M K whatever transA is
    b_listed = len(i) >= 2 and len(i[1].shape) == 2 and i[1].size == k * n
    has_c = len(i) - 1 - b_listed > 0
    return 2.0 * y.size * k + (y.size if has_c else 0), 0.0 if b_listed else k * n * _ELEMENT_BYTES.get(i[0].dtype, 4)


def _qgemm(i: Sequence[Tensor], o: Sequence[Tensor]) -> tuple[float, float]:
    y = o[0]
    return 2.0 * y.size * i[0].size / y.shape[0], 0.0


def _linear_regressor(i: Sequence[Tensor], o: Sequence[Tensor]) -> tuple[float, float]:
    x = i[0].shape
    return 2.0 * o[0].size * (x[-1] if len(x) > 1 else 1) + o[0].size, 0.0


def _conv(i: Sequence[Tensor], o: Sequence[Tensor]) -> tuple[float, float]:
    """Conv, FusedConv, ConvInteger, QLinearConv: W is the first input after X of X's rank (QLinearConv lists
    scales and zero points before it); + |Y| for a bias, a [C_out] vector after W (int32 for an 8-bit W, so
    that a per-channel scale is not taken for one)."""
    rank = len(i[0].shape)
    at = next(n for n, t in enumerate(i) if n > 0 and len(t.shape) == rank)
    y = o[0]
    bias_type = ("int32",) if i[at].dtype in ("int8", "uint8") else ("float", "float16", "bfloat16", "double")
    bias = any(t.shape == (y.shape[1],) and t.dtype in bias_type for t in i[at + 1:])
    return 2.0 * y.size * math.prod(i[at].shape[1:]) + (y.size if bias else 0), 0.0


def _conv_transpose(i: Sequence[Tensor], o: Sequence[Tensor]) -> tuple[float, float]:
    return 2.0 * i[0].size * math.prod(i[1].shape[1:]) + (o[0].size if len(i) >= 3 else 0), 0.0


def _attention(i: Sequence[Tensor], o: Sequence[Tensor]) -> tuple[float, float]:
    x = i[0].shape  # [B, S, D_in]
    b, s, d_v = x[0], x[1], o[0].shape[-1]
    if len(i) >= 2 and len(i[1].shape) == 2:  # weights [D_in, D_q + D_k + D_v], listed
        w, unlisted = i[1].shape, 0.0
    else:  # pre-packed: the bias [D_q + D_k + D_v] comes first
        d_qkv = i[1].size if len(i) >= 2 and len(i[1].shape) == 1 else 3 * d_v
        w = (x[-1], d_qkv)
        unlisted = float(x[-1] * d_qkv * _ELEMENT_BYTES.get(i[0].dtype, 4))
    d_qk = (w[1] - d_v) / 2
    presents = [t.shape for t in o[1:] if len(t.shape) == 5]  # present: [2, B, H, past + S, head_dim]
    pasts = [t.shape for t in i[2:] if len(t.shape) == 5 and t.shape[0] == 2]
    s_kv = presents[0][3] if presents else s + (pasts[0][3] if pasts else 0)
    return 2.0 * b * s * w[0] * w[1] + 2.0 * b * s * s_kv * (d_qk + d_v), unlisted


def _multi_head_attention(i: Sequence[Tensor], o: Sequence[Tensor]) -> tuple[float, float]:
    q = i[0].shape
    b, s = q[0], q[1]
    d_v = o[0].shape[-1]
    if len(q) == 5:  # packed QKV [B, S, H, 3, head_dim]: no key input
        d_qk, s_kv = q[2] * q[4], s
    else:
        d_qk = q[-1]
        key = i[1].shape  # [B, L, D], [B, H, L, head_dim] or packed KV [B, L, H, 2, head_dim]
        s_kv = key[2] if len(key) == 4 else key[1]
    if len(o) > 1 and len(o[1].shape) == 4:  # present key [B, H, past + L, head_dim]
        s_kv = o[1].shape[2]
    return 2.0 * b * s * s_kv * (d_qk + d_v), 0.0


def _group_query_attention(i: Sequence[Tensor], o: Sequence[Tensor]) -> tuple[float, float]:
    q = i[0].shape
    d = o[0].shape[-1]  # H x head_dim: every query head attends to the whole (shared) key
    s_kv = o[1].shape[2] if len(o) > 1 and len(o[1].shape) == 4 else q[1]
    return 4.0 * q[0] * q[1] * s_kv * d, 0.0


def _per_output(per_element: float) -> Formula:
    return lambda i, o: (per_element * o[0].size, 0.0)


def _per_input(per_element: float) -> Formula:
    return lambda i, o: (per_element * i[0].size, 0.0)


def _variadic(i: Sequence[Tensor], o: Sequence[Tensor]) -> tuple[float, float]:
    return max(1, len(i) - 1) * o[0].size, 0.0


def _fast_gelu(i: Sequence[Tensor], o: Sequence[Tensor]) -> tuple[float, float]:
    return (2 if len(i) > 1 else 1) * o[0].size, 0.0


_ELEMENTWISE = (
    "Add", "Sub", "Mul", "Div", "Pow", "Sqrt", "Reciprocal", "Neg", "Abs", "Exp", "Log", "Erf", "Tanh",
    "Sigmoid", "Relu", "LeakyRelu", "PRelu", "Elu", "Selu", "Celu", "Gelu", "QuickGelu", "HardSigmoid",
    "HardSwish", "Softplus", "Softsign", "Mish", "Clip", "Where", "Equal", "Less", "Greater", "LessOrEqual",
    "GreaterOrEqual", "Not", "And", "Or", "Xor", "Floor", "Ceil", "Round", "Sign", "Mod", "IsNaN", "IsInf",
    "Sin", "Cos", "BitShift", "Shrink", "ThresholdedRelu",
)
_DATA_MOVEMENT = (
    "Reshape", "Transpose", "Gather", "GatherElements", "GatherND", "Concat", "Slice", "Split", "Squeeze",
    "Unsqueeze", "Cast", "CastLike", "Identity", "Expand", "Shape", "Size", "Flatten", "Pad", "Tile",
    "ConstantOfShape", "Range", "ScatterND", "ScatterElements", "DepthToSpace", "SpaceToDepth", "Trilu",
    "EyeLike", "MemcpyFromHost", "MemcpyToHost", "Dropout", "NonZero", "OneHot",
)
_REDUCTIONS = (
    "ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2", "ReduceSumSquare",
    "ReduceLogSum", "ReduceLogSumExp", "ArgMax", "ArgMin", "MaxPool", "AveragePool", "GlobalAveragePool",
    "GlobalMaxPool", "LpPool",
)

# FLOPs per element of the first output (the module docstring says why each count).
_PER_OUTPUT_ELEMENT = {
    **dict.fromkeys((*_ELEMENTWISE, "Resize", "Upsample"), 1),
    **dict.fromkeys(("BiasGelu", "BiasAdd", "BatchNormalization", "QuantizeLinear", "DequantizeLinear"), 2),
    **dict.fromkeys(("SimplifiedLayerNormalization", "RMSNormalization"), 4),
    **dict.fromkeys(("LayerNormalization", "GroupNormalization", "InstanceNormalization",
                     "SkipSimplifiedLayerNormalization", "Softmax", "LogSoftmax"), 5),
    "SkipLayerNormalization": 6, "EmbedLayerNormalization": 7,
}
FORMULAS: Mapping[str, Formula] = {
    "MatMul": _matmul, "FusedMatMul": _matmul,
    **dict.fromkeys(("MatMulInteger", "MatMulIntegerToFloat", "DynamicQuantizeMatMul", "QLinearMatMul"),
                    _integer_matmul),
    "MatMulNBits": _nbits_matmul, "MatMulBnb4": _nbits_matmul,
    "Gemm": _gemm, "FusedGemm": _gemm, "QGemm": _qgemm, "LinearRegressor": _linear_regressor,
    **dict.fromkeys(("Conv", "FusedConv", "ConvInteger", "QLinearConv"), _conv), "ConvTranspose": _conv_transpose,
    "Attention": _attention, "MultiHeadAttention": _multi_head_attention,
    "GroupQueryAttention": _group_query_attention,
    **{op: _per_output(n) for op, n in _PER_OUTPUT_ELEMENT.items()},
    "FastGelu": _fast_gelu,
    **dict.fromkeys(("Sum", "Max", "Min", "Mean"), _variadic),
    "DynamicQuantizeLinear": _per_input(4),
    **dict.fromkeys(_REDUCTIONS, _per_input(1)),
    **dict.fromkeys(_DATA_MOVEMENT, _per_output(0)),
}
COVERED_OPS = frozenset(FORMULAS)
# The matrix products, whatever an attempt made of them (fused, quantized to 8 or 4 bits).
MATMUL_OPS = frozenset(("MatMul", "FusedMatMul", "Gemm", "FusedGemm", "QGemm", "MatMulNBits", "MatMulBnb4",
                        "MatMulInteger", "MatMulIntegerToFloat", "DynamicQuantizeMatMul", "QLinearMatMul"))


def kernel_cost(op_type: str, input_shapes: str | None, output_shapes: str | None) -> KernelCost:
    """FLOPs and bytes of one kernel call from its op type and ORT's shape lists (see the module docstring).

    `bytes` adds a weight ONNX Runtime pre-packed (left out of the profile's inputs). An op type without a
    formula, or shapes its formula cannot read (a missing input), give `flops` None; shapes that are not ORT's
    shape lists give `bytes` NaN too.
    """
    try:
        inputs, outputs = parse_shapes(input_shapes), parse_shapes(output_shapes)
    except ValueError as e:
        logger.debug("%s: %s", op_type, e)
        return KernelCost(None, float("nan"))
    nbytes = _bytes_moved(op_type, inputs, outputs)
    formula = FORMULAS.get(op_type)
    if formula is None:
        return KernelCost(None, nbytes)
    try:
        flops, unlisted = formula(inputs, outputs)
        return KernelCost(float(flops), nbytes + unlisted)
    except (IndexError, ValueError, StopIteration, ZeroDivisionError) as e:  # an input the formula needs is absent
        logger.debug("%s: no FLOPs from inputs %s, outputs %s (%s)", op_type, input_shapes, output_shapes, e)
        return KernelCost(None, nbytes)


_READS_WHAT_IT_RETURNS = ("Gather", "GatherElements", "GatherND", "Slice")  # not the whole table or tensor
_READS_NO_DATA = ("Shape", "Size")


def _bytes_moved(op_type: str, inputs: Sequence[Tensor], outputs: Sequence[Tensor]) -> float:
    written = sum(t.nbytes for t in outputs)
    if op_type in _READS_NO_DATA:
        return float(written)
    if op_type in _READS_WHAT_IT_RETURNS:  # the rows it returns, and its indices (or starts, ends, ...)
        return float(2 * written + sum(t.nbytes for t in inputs[1:]))
    return float(sum(t.nbytes for t in inputs) + written)


def kernel_costs(events: pd.DataFrame) -> pd.DataFrame:
    """`flops` (NaN where not covered) and `bytes` of every kernel call of `events`, on the same index.

    Each distinct (op type, input shapes, output shapes) is computed once: a GPT-2 profile of half a million
    calls holds a few hundred.
    """
    columns = [C.OP_TYPE, C.INPUT_SHAPES, C.OUTPUT_SHAPES]
    if events.empty:
        return pd.DataFrame({"flops": pd.Series(dtype=float), "bytes": pd.Series(dtype=float)}, index=events.index)
    codes = events.groupby(columns, sort=False, observed=True, dropna=False).ngroup().to_numpy()
    first = pd.Series(np.arange(len(events))).groupby(codes).first()
    costs = []
    for pos in first.to_numpy():
        op_type, input_shapes, output_shapes = (_text(v) for v in events.iloc[pos][columns])
        costs.append(kernel_cost(op_type or "", input_shapes, output_shapes))  # "": no op type, so no formula
    flops = np.array([np.nan if c.flops is None else c.flops for c in costs])
    nbytes = np.array([c.bytes for c in costs])
    return pd.DataFrame({"flops": flops[codes], "bytes": nbytes[codes]}, index=events.index)


def _text(value) -> str | None:
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else str(value)
