"""The KV cache in int8: ORT's `GroupQueryAttention` keeps keys and values as int8 with static scales and dequantizes
them inside the kernel (its `k_quant_type`, `v_quant_type` and `kv_cache_bit_width`).

At a past of 512 on gpt2-small the fp32 cache is 38 MB that every decode step reads: after int4 weights, the largest
part of what a step streams. In int8 it is a quarter. The scales are static inputs of the kernel, so they are
calibrated here: the source model runs a seeded prompt (or the study's tokens, where the context has them) through
its prompt pass, and each layer's keys and values give their largest magnitude per channel (per head and position in
the head) or per tensor, with a margin for the positions the prompt did not reach. Values past a scale's range
saturate; the generation check judges what that costs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tracker.base.vocabulary import Kind
from tracker.optimize.attention.shared_kv import has_attention
from tracker.optimize.base import Candidate, Context, recorded_positions
from tracker.optimize.entry import Entry, knob
from tracker.optimize.model_files import copy_model, prepare_output, save_proto

# The prompt the scales are calibrated on when the context gives no tokens: seeded, this many rows and positions
# (or the model's positions, if fewer).
CALIBRATION_BATCH, CALIBRATION_LEN, CALIBRATION_SEED = 2, 256, 0
# Each scale covers this much more than the largest magnitude calibration saw: positions and tokens it did not see
# may reach further. int8 keeps 1/127 of the range per step, so the margin costs little resolution.
MARGIN = 1.25
_INT8_MAX = 127
_GQA_CACHE = (3, 4)  # GroupQueryAttention's past_key and past_value inputs
_SCALE_INPUTS = 12  # k_scale and v_scale are inputs 12 and 13
_QUANT_ATTRIBUTES = ("k_quant_type", "v_quant_type", "kv_cache_bit_width")


def cached_attentions(graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    """The `GroupQueryAttention` nodes whose past key and value are graph inputs and whose presents are graph outputs
    (`shared_kv`'s form): the caches the decode loop keeps."""
    inputs = {i.name for i in graph.input}
    outputs = {o.name for o in graph.output}
    return [n for n in graph.node if n.op_type == "GroupQueryAttention" and len(n.input) > 4 and len(n.output) > 2
            and all(n.input[i] in inputs for i in _GQA_CACHE) and n.output[1] in outputs and n.output[2] in outputs
            and _attribute(n, "k_quant_type", b"NONE") == b"NONE"]


def _attribute(node: onnx.NodeProto, name: str, default: object) -> object:
    return next((helper.get_attribute_value(a) for a in node.attribute if a.name == name), default)


@dataclass(frozen=True)
class KVInt8(Entry):
    """Keys and values of every cached `GroupQueryAttention` stored as int8 with static scales, calibrated on a
    prompt pass of the source (see the module). The model's past inputs and present outputs become int8; the decode
    loop keeps them as it keeps float ones.

    Knobs: `per_channel` (a scale per head and position in the head, [1, kv_heads, 1, head_size]; else one per
    tensor).
    """

    name: str = "kv_int8"
    per_channel: bool = knob(True, (False, True), short="ch")

    kind = Kind.QUANTIZATION
    inserts_ops = True
    params_prefix = "kv_cache"

    @property
    def summary(self) -> str:
        return (f"the KV cache in int8 inside GroupQueryAttention (static scales per "
                f"{'channel' if self.per_channel else 'tensor'}, calibrated on a prompt)")

    def __post_init__(self) -> None:
        self.check_knobs()

    def requires(self, model: onnx.ModelProto, context: Context) -> str | None:
        return has_attention(model, context)

    def make(self, source: Path, target_dir: Path, context: Context) -> Candidate:
        target = prepare_output(source, target_dir, self.name)
        header = onnx.load_model(str(source), load_external_data=False)
        nodes = cached_attentions(header.graph)
        if not nodes:
            copy_model(source, target)
            return Candidate(path=target, applied=False, fusions={"GroupQueryAttention": 0}, fully_optimized=None,
                             precision="fp32", notes=("no GroupQueryAttention keeps a KV cache of the graph's inputs "
                                                      "(make one first: attention_fused+shared_kv+kv_int8): nothing "
                                                      "quantized",))
        ranges, tokens = calibrate(source, context, positions=recorded_positions(header))
        model = onnx.load_model(str(source), load_external_data=True)
        quantize_caches(model, ranges, per_channel=self.per_channel)
        save_proto(model, target)
        mode = "channel (head, position in the head)" if self.per_channel else "tensor"
        return Candidate(
            path=target, applied=True, fusions={"GroupQueryAttention": len(nodes)}, fully_optimized=None,
            precision="int8",
            notes=(f"{len(nodes)} GroupQueryAttention keep keys and values in int8, one static scale per {mode}",
                   f"scales: the largest magnitude of a prompt pass over {tokens} tokens, times {MARGIN}; larger "
                   "values saturate"),
            params={"kv_cache.dtype": "int8", "kv_cache.calibration_tokens": str(tokens),
                    "kv_cache.margin": str(MARGIN)},
        )


def calibrate(source: Path, context: Context, *, positions: int | None) -> tuple[dict[str, np.ndarray], int]:
    """Each cache's largest magnitude per (head, position in the head), [heads, head_size], over one prompt pass of
    the source: the context's `input_ids` when it has them, else a seeded prompt (no longer than the model's
    `positions`, when known). Also the tokens it saw."""
    from tracker.measure.generation.decoder import DecoderSession
    from tracker.measure.runtimes.ort_runtime import SessionConfig

    decoder = DecoderSession.open(source, SessionConfig())
    given = (context.feeds or {}).get("input_ids")
    if given is not None:
        tokens = np.asarray(given, dtype=np.int64)
    else:
        length = min(CALIBRATION_LEN, positions or CALIBRATION_LEN)
        rng = np.random.default_rng(CALIBRATION_SEED)
        tokens = rng.integers(0, decoder.vocab_size, size=(CALIBRATION_BATCH, length), dtype=np.int64)
    _, presents = decoder.prefill(tokens)
    ranges = {name: np.abs(np.asarray(presents[name], dtype=np.float32)).max(axis=(0, 2)) for name in decoder.past_names}
    return ranges, int(tokens.size)


def quantize_caches(model: onnx.ModelProto, ranges: dict[str, np.ndarray], *, per_channel: bool) -> None:
    """Makes every cached `GroupQueryAttention` of `model` keep int8 keys and values with scales from `ranges`
    (by past input name, [heads, head_size]), in place: the scales as initializers, the kernel's quantization
    attributes, and the past inputs and present outputs typed int8."""
    graph = model.graph
    mode = "PER_CHANNEL" if per_channel else "PER_TENSOR"
    cache_values: set[str] = set()
    for node in cached_attentions(graph):
        scales = []
        for index in _GQA_CACHE:
            past = node.input[index]
            peak = np.maximum(ranges[past] * MARGIN, 1e-6)
            if per_channel:  # [1, heads, 1, head_size]: broadcast over the batch and the positions
                scale = (peak / _INT8_MAX).reshape(1, peak.shape[0], 1, peak.shape[1])
            else:
                scale = np.array([peak.max() / _INT8_MAX])
            name = f"{past}.scale"
            graph.initializer.append(numpy_helper.from_array(scale.astype(np.float32), name))
            scales.append(name)
            cache_values.update((past, node.output[index - 2]))
        inputs = list(node.input) + [""] * max(0, _SCALE_INPUTS - len(node.input))
        inputs[_SCALE_INPUTS:_SCALE_INPUTS + 2] = scales
        node.ClearField("input")
        node.input.extend(inputs)
        kept = [a for a in node.attribute if a.name not in _QUANT_ATTRIBUTES]  # ORT's optimizer writes the defaults
        node.ClearField("attribute")
        node.attribute.extend(kept)
        node.attribute.extend([helper.make_attribute("k_quant_type", mode), helper.make_attribute("v_quant_type", mode),
                               helper.make_attribute("kv_cache_bit_width", 8)])
    for value in [*graph.input, *graph.output]:
        if value.name in cache_values:
            value.type.tensor_type.elem_type = TensorProto.INT8


ENTRY = KVInt8()
