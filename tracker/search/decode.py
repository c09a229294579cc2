"""The decode search: for a causal language model in the generation scenario, the fastest decode chain at the
scenario's longest past that passes the generation check.

A decode chain is attention fused with its past on one KV buffer (`attention_fused+shared_kv`), then the weights'
quantization (int4 blocks by size, accuracy level, symmetry and block bias; int8 blocks; none), the KV cache's type
(fp32 or int8), and how the decode loop runs (IO binding, threads): `DecodeSpace`. The search

1. orders the candidates by the bytes one decode step reads (`step_bytes`): at a long past a step is memory-bound, so
   fewer bytes is the first guess at a faster step (compute the bytes miss, block bias's extra products, the accuracy
   level's int8 activations, is left to the screen);
2. makes each graph (the chain less its session settings) once on the decode-ready export and checks it as the
   generation scenario checks an attempt, without its timing: the baseline's greedy generation again, the logits along
   the baseline's tokens within the tolerance of its precision, and on real text the text check through its decode
   loop (`TextCheck`);
3. screens each of the graph's settings at the past, interleaved against the baseline's decode step (`time_phase`),
   racing: it stops once its upper bound lies below the leader's lower bound, or below 1.0 (the baseline);
4. hands the leaders to `optimize` (the study: an attempt run each, the forward pass and the generation scenario's
   calibrated figures).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir

from tracker.base.vocabulary import Kind, Phase
from tracker.measure.accuracy.lm_diff import LogitsTolerance
from tracker.measure.generation.decoder import PAST_PREFIX, DecoderSession, Generation
from tracker.measure.generation.generation import GenerationConfig, phase_tokens
from tracker.measure.generation.generation_check import GenerationDiff, compare_generations
from tracker.measure.generation.phase_timing import time_phase
from tracker.measure.generation.text_scoring import TextCheck
from tracker.measure.runtimes.ort_runtime import SessionConfig
from tracker.measure.timing.speedup import Speedup, SpeedupConfig
from tracker.optimize import REGISTRY, Candidate, Chain, Entry, ModelInfo, get_entry
from tracker.search.screen import Race
from tracker.search.space import expand

logger = logging.getLogger(__name__)

# A decode step's screen: fresh session pairs (each with its own prompt pass to the past), a few steps each.
DECODE_SCREEN = SpeedupConfig(rounds=4, max_rounds=4, seconds=0.0, round_seconds=0.2, min_pairs=4, warmup_runs=1)
ATTENTION = "attention_fused+shared_kv"
NO_QUANTIZATION = "fp32"  # the weights as exported


def default_weights() -> tuple[str, ...]:
    """The weights a decode search tries: int4 blocks over their entry's space (size, accuracy level, symmetry, block
    bias), int8 in asymmetric blocks of 32, and the weights as they are."""
    base = REGISTRY["int4_block32"]
    defaults = base.knob_values()
    int4 = tuple(":".join([base.name, *(f"{k}={str(v).lower()}" for k, v in variant.knob_values().items()
                                        if v != defaults[k])]) for variant in expand(base))
    return (*int4, "int8_block32:symmetric=false", NO_QUANTIZATION)


def added_rounding(graph: Chain) -> tuple[str, frozenset[str]]:
    """A decode graph's weights without what only adds rounding to them, and what it adds: int8 activations (an
    accuracy level above 0) and an int8 KV cache. Graphs of one key differ only by added rounding: when one fails the
    generation check, a graph that adds to its rounding is not expected to pass (`DecodeSpace` ranks them so)."""
    key, added = [], set()
    for step in graph.steps:
        values = step.knob_values()
        if step.name.startswith("kv_int8"):
            added.add("an int8 KV cache")
        elif "accuracy_level" in values:
            added |= {"int8 activations"} if values["accuracy_level"] else set()
            key.append(repr(sorted((k, v) for k, v in values.items() if k != "accuracy_level")))
        else:
            key.append(step.name)
    return "+".join(key), frozenset(added)


@dataclass(frozen=True)
class DecodeSpace:
    """The decode knobs a decode search combines; each is a chain step as `get_entry` reads it, "" for none.

    Attributes:
        weights: the weights' quantization (`NO_QUANTIZATION`: as exported).
        kv_cache: the KV cache's type ("" fp32, "kv_int8").
        sessions: how the decode loop runs ("" numpy feeds, "io_binding", "io_binding+ort_threads_1").
        attention: the chain's first steps.
    """

    weights: tuple[str, ...] = ()
    kv_cache: tuple[str, ...] = ("", "kv_int8")
    sessions: tuple[str, ...] = ("io_binding", "", "io_binding+ort_threads_1")
    attention: str = ATTENTION

    def graphs(self) -> list[tuple[Chain, list[Chain]]]:
        """Each graph the space makes (its chain without session steps), with its candidates (the graph under each
        of `sessions`).

        Raises:
            ValueError: a step `get_entry` does not know, or a session step among the graph's steps.
        """
        found = []
        for weights in self.weights or default_weights():
            for kv in self.kv_cache:
                parts = [self.attention, "" if weights == NO_QUANTIZATION else weights, kv]
                graph = get_entry("+".join(p for p in parts if p))
                if not isinstance(graph, Chain) or any(s.kind == Kind.SESSION for s in graph.steps):
                    raise ValueError(f"a decode graph is a chain of steps that rewrite the model, got {graph.name}")
                found.append((graph, [_with_session(graph, s) for s in self.sessions]))
        return found


def _with_session(graph: Chain, session: str) -> Chain:
    """`graph` with the session steps `session` spells ("" none, "io_binding+ort_threads_1") after it."""
    if not session:
        return graph
    settings = get_entry(session)
    return Chain((*graph.steps, *(settings.steps if isinstance(settings, Chain) else (settings,))))


@dataclass(frozen=True)
class DecodeSetup:
    """A decode-ready export and how its decoding is run and judged: the generation scenario's
    (`GenerationScenario.setup`), which a decode search measures with too.

    Attributes:
        decoder: the decode-ready export of the study's source model (inputs and outputs for a KV cache), as the
            baseline decodes it.
        config: what is timed (prefill and decode lengths, tokens generated, the length each speed-up is at): a decode
            screen's past is its decode speed-up's (`phase_lens`).
        session: the study's ONNX Runtime settings (the baseline's, without IO binding); a session entry sets its own
            on top.
        tolerances: the generation check's tolerance per precision ("fp32", "fp16", "int8", ...).
        info: heads and hidden size, for the entries that fuse transformer blocks.
        text: a language model's check on real text through the decode loop (`TextCheck`, decoder=True); None when
            the study has no real text.
    """

    decoder: Path
    config: GenerationConfig
    session: SessionConfig
    tolerances: Mapping[str, LogitsTolerance]
    info: ModelInfo | None = None
    text: TextCheck | None = None


@dataclass(frozen=True)
class DecodeTarget:
    """What a decode search measures against (`GenerationScenario.target`): the scenario's setup, and the baseline's
    greedy generation (its prompt, tokens and logits per step)."""

    setup: DecodeSetup
    reference: Generation

    @property
    def past_len(self) -> int:
        return self.setup.config.phase_lens[Phase.DECODE]


def check_decode(candidate: Candidate, target: DecodeTarget, *, workdir: Path) -> GenerationDiff:
    """The generation check of `candidate` (a decode-ready model) against the baseline's generation, with no timing:
    greedy tokens from the baseline's prompt, the logits along the baseline's tokens within the tolerance of its
    precision, and the text check when the study has real text."""
    session = candidate.session_on(target.setup.session)
    decoder = DecoderSession.open(str(candidate.path), session)
    reference = target.reference
    own = decoder.greedy(reference.prompt, reference.tokens.shape[1])
    along = decoder.forced_logits(reference.prompt, reference.tokens)
    del decoder
    quality = None
    if target.setup.text is not None:
        quality = target.setup.text.measure(candidate.path, session, precision=candidate.precision, workdir=workdir)
    return compare_generations(reference, own, along=along, tolerance=target.setup.tolerances[candidate.precision],
                               quality=quality)


def screen_decode(candidate: Candidate, target: DecodeTarget, *, must_beat: float,
                  config: SpeedupConfig = DECODE_SCREEN) -> tuple[Speedup, str | None]:
    """`candidate`'s decode step at the target's past, interleaved against the baseline's (a screen, not a verdict),
    racing: it stops after the first round whose upper bound lies below `must_beat`. Returns the speed-up, and why
    it stopped early (None when it ran its rounds)."""
    race = Race(must_beat)
    vocab = target.reference.step_logits[0].shape[-1]
    tokens = phase_tokens(target.setup.config, Phase.DECODE, target.past_len, vocab)
    timing = time_phase(target.setup.decoder, candidate.path, tokens=tokens, past_len=target.past_len,
                        baseline_session=replace(target.setup.session, decode_io_binding=False),
                        session=candidate.session_on(target.setup.session), config=config, stop=race.stop)
    return timing.speedup, race.why


def step_bytes(model: onnx.ModelProto | ir.Model, steps: Sequence[Entry], *, past_len: int, vocab: int) -> float:
    """What one decode step of the chain `steps` made of `model` (no steps: the baseline) reads and writes, in bytes:
    the products' weights at their bits (with each block's scale, and zero point when asymmetric), the KV cache at the
    past in its type, and the present written out again when the loop feeds numpy arrays (IO binding writes the new
    position only).

    Weights: 2-D initializers read by MatMul or Gemm (directly or through a Transpose); the one with `vocab` rows or
    columns is the lm_head. Weights named after `int8_modules`, and the lm_head under `lm_head=int8`, count 8 bits.
    """
    graph = (ir.from_proto(model) if isinstance(model, onnx.ModelProto) else model).graph
    quant = _quantization(steps)
    weight_bytes = 0.0
    for name, value in graph.initializers.items():
        if value.shape is None or len(value.shape) != 2 or not _read_by_a_product(value):
            continue
        dims = [d for d in value.shape if isinstance(d, int)]
        bits = quant.bits_for(name, lm_head=vocab in dims)
        weight_bytes += float(np.prod(dims)) * _bytes_per_weight(bits, quant.block, quant.symmetric)
    per_position = 0.0  # the past's static dims (heads, head_dim) over every layer's key and value
    for past in graph.inputs:
        if (past.name or "").startswith(PAST_PREFIX) and past.shape is not None:
            per_position += float(np.prod([d for d in past.shape if isinstance(d, int)]))
    names = [s.name for s in steps]
    kv_bytes = per_position * past_len * (1.0 if any(n.startswith("kv_int8") for n in names) else 4.0)
    written = 0.0 if any(n == "io_binding" for n in names) else kv_bytes
    return weight_bytes + kv_bytes + written


def _read_by_a_product(value: ir.Value) -> bool:
    """Whether a MatMul or Gemm reads `value`, directly or through a Transpose (a tied lm_head)."""
    return any(use.node.op_type in ("MatMul", "Gemm") or (use.node.op_type == "Transpose" and any(
        u.node.op_type in ("MatMul", "Gemm") for out in use.node.outputs for u in out.uses())) for use in value.uses())


@dataclass(frozen=True)
class _Quantization:
    """A chain's weight quantization as `step_bytes` counts it: `bits` per weight (32: none) in blocks of `block`
    (`symmetric`: no zero point), the lm_head's own choice ("same", "int8" or "fp32"), and the modules kept at
    8 bits."""

    bits: int
    block: int
    symmetric: bool
    lm_head: str = "same"
    int8_modules: tuple[str, ...] = ()

    def bits_for(self, name: str, *, lm_head: bool) -> int:
        if self.bits == 32:
            return 32
        if (lm_head and self.lm_head == "int8") or any(m in name for m in self.int8_modules):
            return 8
        return 32 if lm_head and self.lm_head == "fp32" else self.bits


def _quantization(steps: Sequence[Entry]) -> _Quantization:
    for step in steps:
        values: Mapping[str, Any] = step.knob_values()
        if "block_size" in values:
            return _Quantization(int(values["bits"]), int(values["block_size"]), bool(values["symmetric"]),
                                 str(values.get("lm_head", "same")), tuple(values.get("int8_modules") or ()))
    return _Quantization(32, 1, True)


def _bytes_per_weight(bits: int, block: int, symmetric: bool) -> float:
    if bits == 32:
        return 4.0
    return bits / 8 + 4.0 / block + (0.0 if symmetric else bits / 8 / block)

