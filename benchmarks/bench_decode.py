"""Which decode figure is true: known answers at decode scale, under the study's harness and its alternatives.

On gpt2-small (seeded weights, decode-ready export) at a past of `--past` tokens, one decode step of:
- an A/A pair (the model against itself: 1.00), in fp32 and in int4;
- a decode graph computed twice (the model beside a copy of itself with its own weights, logits added: 0.50);
- `int4_block32`, and the best decode chain (`attention_fused+shared_kv+int4_block32`, decoded through IO binding),
against the fp32 export, timed interleaved (`tracker.measure.timing.speedup.time_in_rounds`) by:
- `study`: fresh sessions whose threads stop spinning after each run (what the generation scenario uses);
- `spin`: ONNX Runtime's default spinning, one block each in turn;
- `spin-pause`: the same with a pause before each block, long enough for the other session's threads to park.

Prints each case's speed-up and 95 % interval, and the tokens per second the study derives from the same rounds.
Takes ~15 minutes on 2 cores (`--harness study` alone: ~6). Run on a quiet machine:

    python benchmarks/bench_decode.py [--past 512] [--harness study,spin,spin-pause] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
from onnx import compose, helper

import tracker.measure.timing.speedup as speedup_module
from tracker.measure.generation.binding import loop_step
from tracker.measure.generation.decoder import DecoderSession
from tracker.measure.runtimes.ort_runtime import SessionConfig, make_session
from tracker.measure.timing.interval import estimate_speedup
from tracker.measure.timing.speedup import SpeedupConfig, time_in_rounds
from tracker.optimize import Context, ModelInfo, get_entry

HARNESSES = ("study", "spin", "spin-pause")
PAUSE_S = 0.030  # longer than ONNX Runtime's threads spin after a run
BEST = "attention_fused+shared_kv+int4_block32"


def computed_twice(source: Path, target: Path) -> Path:
    """The decode graph beside a copy of itself with its own weights; logits are the two copies' sum, the copy's
    presents extra outputs, so every node of both runs."""
    first = onnx.load(str(source))
    copy = compose.add_prefix(onnx.load(str(source)), "b_")
    inputs = {i.name for i in first.graph.input}
    for node in copy.graph.node:
        node.input[:] = [x[2:] if x.startswith("b_") and x[2:] in inputs else x for x in node.input]
    for node in first.graph.node:
        node.output[:] = ["a_logits" if o == "logits" else o for o in node.output]
    first.graph.node.extend(copy.graph.node)
    first.graph.initializer.extend(copy.graph.initializer)
    first.graph.node.append(helper.make_node("Add", ["a_logits", "b_logits"], ["logits"], name="twice_logits"))
    first.graph.output.extend(o for o in copy.graph.output if o.name != "b_logits")
    onnx.save(first, str(target), save_as_external_data=True, location=target.name + ".data")
    return target


def runners(path: Path, session: SessionConfig, tokens: np.ndarray, past: int, *, stop_spinning: bool):
    def make():
        decoder = DecoderSession(make_session(str(path), session, stop_spinning_after_run=stop_spinning))
        return loop_step(decoder, decoder.phase_feeds(tokens, past), io_binding=session.decode_io_binding)

    return make


def measure(base, attempt, harness: str, tokens: np.ndarray, past: int) -> str:
    (base_path, base_session), (path, session) = base, attempt
    stop = harness == "study"
    original = speedup_module._time_block
    if harness == "spin-pause":
        def paused(run, calls, settle):
            time.sleep(PAUSE_S)
            return original(run, calls, settle)

        speedup_module._time_block = paused
    try:
        config = SpeedupConfig()
        rounds = time_in_rounds(runners(base_path, base_session, tokens, past, stop_spinning=stop),
                                runners(path, session, tokens, past, stop_spinning=stop), config)
    finally:
        speedup_module._time_block = original
    s = estimate_speedup(rounds, confidence=config.confidence)
    base_ms = 1e3 * float(np.median(np.concatenate([r.baseline_s for r in rounds])))
    return (f"{s.speedup:6.3f} [{s.ci_low:.3f}, {s.ci_high:.3f}]  {base_ms:6.2f} -> {base_ms / s.speedup:6.2f} ms "
            f"per token ({1e3 / base_ms * s.speedup:6.1f} tok/s), other load {s.other_load:.0%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--past", type=int, default=512)
    parser.add_argument("--harness", default=",".join(HARNESSES))
    parser.add_argument("--workdir", help="keep the exports here (default: a temporary folder)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-decode-") as tmp:
        work = Path(args.workdir or tmp)
        work.mkdir(parents=True, exist_ok=True)
        from tracker.gpt2.decode import export_decoder
        from tracker.gpt2.model import load_gpt2

        print("exporting gpt2-small ready to decode, and making the attempts (a few minutes)...", flush=True)
        decoder = work / "decoder.onnx"
        if not decoder.exists():
            export_decoder(load_gpt2(size="small", seed=0), decoder)
        graph = onnx.load(str(decoder), load_external_data=False)
        context = Context(info=ModelInfo(num_heads=12, hidden_size=768))
        made = {spec: get_entry(spec)(decoder, work / spec.replace("+", "_"), context, graph=graph).path
                for spec in ("int4_block32", BEST)}
        twice = computed_twice(decoder, work / "twice.onnx")
        int4_twice = computed_twice(made["int4_block32"], work / "int4_twice.onnx")
        plain, bound = SessionConfig(), replace(SessionConfig(), decode_io_binding=True)
        fp32, int4 = (decoder, plain), (made["int4_block32"], plain)
        cases = [("A/A fp32 (1.00)", fp32, fp32), ("computed twice fp32 (0.50)", fp32, (twice, plain)),
                 ("A/A int4 (1.00)", int4, int4), ("computed twice int4 (0.50)", int4, (int4_twice, plain)),
                 ("int4_block32", fp32, int4), (BEST + "+io_binding", fp32, (made[BEST], bound))]
        tokens = np.random.default_rng(0).integers(0, 50257, size=(1, args.past + 1), dtype=np.int64)
        for harness in args.harness.split(","):
            if harness not in HARNESSES:
                raise SystemExit(f"--harness takes some of {HARNESSES}, got {harness!r}")
            print(f"\nharness {harness}, decode step at a past of {args.past}:", flush=True)
            for label, base, attempt in cases:
                print(f"  {label:<58} {measure(base, attempt, harness, tokens, args.past)}", flush=True)


if __name__ == "__main__":
    main()
