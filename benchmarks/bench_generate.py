"""Benchmark: generation side by side with onnxruntime-genai, on one LLaMA-architecture folder.

onnxruntime-genai's model builder writes the folder as int4 and fp32 CPU models, and its generator (`og.Generator`,
greedy) generates with them; this project's decode-ready export of the same folder generates with `DecoderSession`,
as the study's baseline (fp32), as `int4_block32` applied to the export, and as the study's decode chains (`CHAINS`:
fused GroupQueryAttention with rotary over packed q/k/v, int4 in genai's default blocks of 32, then `BEST`: in
asymmetric blocks of 128 with the KV cache in int8) decoding through IO binding (`BoundDecoder`: one KV buffer per
tensor, allocated once). genai's builder also writes int4 in the same asymmetric blocks of 128 (`genai int4 b128`), so
the weights' settings and the rest can be told apart. Every engine gets the same prompts and lengths, in
one run, in turn (round-robin), and greedy decoding: prefill tokens per second (the prompt pass and the first token),
decode tokens per second (each later token: one step against the KV cache) and the ratio to genai's int4, as the
ratio of the medians and as the median of each round's paired ratio with its 95 % interval (20 rounds of 256 new
tokens by default: with 64 tokens and 5 rounds the interval spans +-20 % on 2 cores). Prints the
table, the greedy tokens' agreement between engines of one precision, and the op types of the graphs. Asserts nothing.

    python benchmarks/bench_generate.py                   # a seeded LLaMA (4 layers, hidden 512, GQA 8/2) built here
    python benchmarks/bench_generate.py --model FOLDER    # a local Hugging Face LLaMA-architecture folder

Needs onnxruntime-genai: `pip install -e '.[genai]'`. A few minutes on 2 cores.
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

from tracker.measure.costmodel.step_split import StepSplit
from tracker.measure.generation.binding import BoundDecoder
from tracker.measure.generation.decode_split import numpy_step, profile_steps
from tracker.measure.generation.decoder import SEQLENS_K, TOTAL_SEQUENCE_LENGTH, DecoderSession
from tracker.measure.runtimes.ort_runtime import SessionConfig

INSTALL = "onnxruntime-genai is not installed: pip install -e '.[genai]' (or pip install 'onnxruntime-genai>=0.18,<0.19')"
# The seeded model's shape: a small LLaMA of the usual proportions (GQA 8 query heads to 2 key/value heads, a 32k
# vocabulary whose untied lm_head is 40 % of the weights, as in the 1B-class models people generate with on a CPU).
SEEDED = {"num_hidden_layers": 4, "hidden_size": 512, "intermediate_size": 1376, "num_attention_heads": 8,
          "num_key_value_heads": 2, "vocab_size": 32000, "max_position_embeddings": 2048, "bos_token_id": 1,
          "eos_token_id": 2, "tie_word_embeddings": False, "rms_norm_eps": 1e-5}
# Pause between two engines' generations: ORT's intra-op threads spin a while after a run (the default, which every
# session here keeps); the pause lets one session's spinning end before another's run starts.
PAUSE_S = 0.05
# The study's decode chains (as the GPT-2 study's DECODE_ATTEMPTS), decoded through IO binding: attention fused, then,
# on LLaMA-family graphs, one GroupQueryAttention per layer with its rotary positions and packed q/k/v
# (`optimize/attention/rotary_gqa`), then int4 weights: in genai's default blocks (symmetric, 32), and the best, in
# asymmetric blocks of 128 with the KV cache in int8 (`kv_int8`).
BEST = "attention_fused+shared_kv+int4_block128:symmetric=false+kv_int8"
CHAINS = {"tracker b32 chain": "attention_fused+shared_kv+int4_block32", "tracker b128 kv8 chain": BEST}
# genai's builder in the best chain's weight settings (its defaults: blocks of 32, symmetric)
GENAI_B128 = ("block_size=128", "is_symmetric=false")


@dataclass(frozen=True)
class Timed:
    """One greedy generation: its tokens, the time to the first token and the whole time."""

    tokens: np.ndarray
    first_token_s: float
    total_s: float


Engine = Callable[[np.ndarray, int], Timed]


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


def build_genai(folder: Path, out: Path, precision: str, cache: Path, extra: tuple[str, ...] = ()) -> float:
    """Runs onnxruntime-genai's model builder on `folder` (CPU, `precision`, `extra` options): the seconds it took."""
    start = time.perf_counter()
    command = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(folder), "-o", str(out),
               "-p", precision, "-e", "cpu", "-c", str(cache), *(("--extra_options", *extra) if extra else ())]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"the model builder failed ({precision}):\n{done.stderr[-3000:]}")
    return time.perf_counter() - start


def genai_engine(out: Path, threads: int) -> Engine:
    """Greedy generation with onnxruntime-genai's generator on the model the builder wrote to `out`, its session on
    `threads` intra-op threads (written into its genai_config.json, as the tracker's sessions are told theirs)."""
    import onnxruntime_genai as og

    path = out / "genai_config.json"
    config = json.loads(path.read_text())
    config["model"]["decoder"]["session_options"]["intra_op_num_threads"] = threads
    path.write_text(json.dumps(config, indent=4))
    model = og.Model(str(out))

    def generate(prompt: np.ndarray, new_tokens: int) -> Timed:
        length = prompt.shape[1] + new_tokens
        params = og.GeneratorParams(model)
        # greedy; min_length = max_length: an end-of-text token does not stop it early
        params.set_search_options(do_sample=False, max_length=length, min_length=length, batch_size=1)
        generator = og.Generator(model, params)  # allocates the KV cache: not timed, as a session is not
        start = time.perf_counter()
        generator.append_tokens(prompt.astype(np.int32))  # the prompt pass
        generator.generate_next_token()
        first = time.perf_counter() - start
        for _ in range(new_tokens - 1):
            generator.generate_next_token()  # one step against the KV cache, then its argmax
        total = time.perf_counter() - start
        tokens = np.asarray(generator.get_sequence(0))[prompt.shape[1]:]
        return Timed(tokens[None, :].astype(np.int64), first, total)

    return generate


def tracker_engine(path: Path, session: SessionConfig, *, io_binding: bool, capacity: int) -> Engine:
    """Greedy generation with this project's decode loop on a decode-ready export: `DecoderSession.greedy` (numpy
    past and present), or through IO binding (`BoundDecoder`, buffers allocated once for `capacity` positions)."""
    decoder = DecoderSession.open(path, session)
    run = BoundDecoder(decoder, batch=1, capacity=capacity).greedy if io_binding else decoder.greedy

    def generate(prompt: np.ndarray, new_tokens: int) -> Timed:
        generation = run(prompt, new_tokens)
        return Timed(generation.tokens, generation.first_token_s, generation.total_s)

    return generate


def measure(engines: dict[str, Engine], prompt: np.ndarray, new_tokens: int, runs: int) -> dict[str, list[Timed]]:
    """Each engine's `runs` timed generations (after one untimed), the engines in turn in every round."""
    for engine in engines.values():
        engine(prompt, new_tokens)
        time.sleep(PAUSE_S)
    timed: dict[str, list[Timed]] = {name: [] for name in engines}
    for _ in range(runs):
        for name, engine in engines.items():
            timed[name].append(engine(prompt, new_tokens))
            time.sleep(PAUSE_S)
    return timed


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
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else ""
    return f"{cpu}, {os.cpu_count()} cores"


@dataclass
class Prepared:
    """Every engine, ready to generate, and what making them took."""

    engines: dict[str, Engine]
    graphs: dict[str, Path]  # the int4 graphs whose decode step is split (genai's, then the tracker's fastest)
    float_chain: Path  # the tracker's chain with a float KV cache, whose past genai's graphs are fed
    session: SessionConfig
    vocab_size: int
    seconds: dict[str, float]


def prepare(folder: Path, work: Path, *, threads: int, capacity: int) -> Prepared:
    """Builds genai's int4 (its defaults, and in blocks of 128) and fp32 models of `folder`, this project's
    decode-ready export, its `int4_block32` and its `CHAINS`, and opens an engine on each."""
    from tracker.gpt2.decode import export_decoder
    from tracker.gpt2.model import load_lm
    from tracker.optimize import Context, ModelInfo, get_entry

    loaded = load_lm(model=str(folder))
    if capacity > loaded.max_positions:
        raise SystemExit(f"a prompt and its new tokens ({capacity}) exceed the model's {loaded.max_positions} positions")
    seconds = {f"genai {p}": build_genai(folder, work / f"genai-{p}", p, work / "cache") for p in ("int4", "fp32")}
    seconds["genai int4 b128"] = build_genai(folder, work / "genai-int4-b128", "int4", work / "cache", GENAI_B128)
    start = time.perf_counter()
    baseline = export_decoder(loaded, work / "tracker" / "decoder.onnx").path
    info, vocab_size = ModelInfo(num_heads=loaded.num_heads, hidden_size=loaded.hidden_size), loaded.vocab_size
    del loaded  # the PyTorch weights are not needed while timing
    seconds["tracker baseline (export)"] = time.perf_counter() - start
    made = {}
    for label, spec in (("tracker int4", "int4_block32"), *CHAINS.items()):
        start = time.perf_counter()
        made[label] = get_entry(spec)(baseline, work / "tracker" / label.replace(" ", "-"), Context(info=info),
                                      graph=onnx.load(str(baseline), load_external_data=False))
        seconds[f"{label} ({spec})"] = time.perf_counter() - start
    plain = SessionConfig(intra_op_num_threads=threads)
    best = made["tracker b128 kv8 chain"]
    session = best.session_on(plain)
    engines = {
        "genai int4": genai_engine(work / "genai-int4", threads),
        "genai int4 b128": genai_engine(work / "genai-int4-b128", threads),
        "genai fp32": genai_engine(work / "genai-fp32", threads),
        "tracker baseline": tracker_engine(baseline, plain, io_binding=False, capacity=capacity),
        "tracker int4": tracker_engine(made["tracker int4"].path, made["tracker int4"].session_on(plain),
                                       io_binding=False, capacity=capacity),
        **{label: tracker_engine(made[label].path, made[label].session_on(plain), io_binding=True, capacity=capacity)
           for label in CHAINS},
    }
    graphs = {"genai int4": genai_model_file(work / "genai-int4"),
              "genai int4 b128": genai_model_file(work / "genai-int4-b128"), "tracker b128 kv8 chain": best.path}
    return Prepared(engines, graphs, made["tracker b32 chain"].path, session, vocab_size, seconds)


def print_rates(timed: dict[str, list[Timed]], prompt_len: int, new_tokens: int) -> None:
    reference = rates(timed["genai int4"], prompt_len, new_tokens)[1]
    print("| engine | prefill tok/s | decode tok/s | ms/token | decode vs genai int4 | paired by round [95 %] |")
    print("|---|---|---|---|---|---|")
    for name, runs in timed.items():
        prefill, decode = rates(runs, prompt_len, new_tokens)
        ratio, low, high = paired_ratio(runs, timed["genai int4"], new_tokens)
        print(f"| {name} | {prefill:,.0f} | {decode:,.1f} | {1e3 / decode:.2f} | {decode / reference:.2f}x "
              f"| {ratio:.2f}x [{low:.2f}, {high:.2f}] |")
    first = {name: runs[0].tokens for name, runs in timed.items()}
    for a, b in (("genai fp32", "tracker baseline"), ("genai int4", "tracker int4"), ("genai int4", "tracker b32 chain"),
                 ("genai int4 b128", "tracker b128 kv8 chain"), ("tracker b32 chain", "tracker b128 kv8 chain")):
        same = first[a] == first[b]
        where = "-" if same.all() else int(np.argmax(~same))
        print(f"greedy tokens, {a} vs {b}: {same.mean():.0%} equal (first difference at {where})")


def print_splits(prepared: Prepared, work: Path, *, past_len: int, seed: int) -> None:
    """One decode step after `past_len` tokens of each int4 graph, split over its parts, with genai's graph run as the
    tracker's is (numpy feeds, its attention mask all ones): what differs is the graph, not the loop around it."""
    context = np.random.default_rng(seed).integers(3, prepared.vocab_size, size=(1, past_len), dtype=np.int64)

    def step_feeds(path: Path) -> dict[str, np.ndarray]:
        decoder = DecoderSession.open(path, prepared.session)
        return decoder.feeds(context[:, -1:], decoder.prefill(context)[1])

    feeds = step_feeds(prepared.graphs["tracker b128 kv8 chain"])  # its cache in int8
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
    parser.add_argument("--model", default="", help="a local LLaMA-architecture folder; default: a seeded one")
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--runs", type=int, default=20,
                        help="timed generations per engine (after one untimed); 6 or more give the paired ratio an "
                             "interval narrower than its range")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="intra-op threads of every session")
    parser.add_argument("--workdir", default="", help="where the models go (default: a temporary folder)")
    args = parser.parse_args(argv)
    try:
        import onnxruntime_genai as og
    except ImportError:
        raise SystemExit(INSTALL) from None
    import onnxruntime

    with tempfile.TemporaryDirectory(prefix="bench-generate-") as tmp:
        work = Path(args.workdir or tmp)
        work.mkdir(parents=True, exist_ok=True)
        folder = Path(args.model) if args.model else seeded_llama_folder(work / "llama", seed=args.seed)
        prepared = prepare(folder, work, threads=args.threads, capacity=args.prompt_len + args.new_tokens)
        shutil.rmtree(work / "cache", ignore_errors=True)
        # ids from 3 on: not the seeded tokenizer's <unk>, <s> and </s>
        rng = np.random.default_rng(args.seed)
        prompt = rng.integers(3, prepared.vocab_size, size=(1, args.prompt_len), dtype=np.int64)
        load_before = os.getloadavg()[0]
        timed = measure(prepared.engines, prompt, args.new_tokens, args.runs)
        print(f"machine: {machine()}; onnxruntime {onnxruntime.__version__}, onnxruntime-genai {og.__version__}")
        print(f"model: {folder if args.model else 'seeded LLaMA ' + json.dumps(SEEDED)}")
        print(f"batch 1, prompt {args.prompt_len}, {args.new_tokens} new tokens (greedy), median of {args.runs} "
              f"generations per engine, engines in turn (a round: one of each); intra-op threads {args.threads} "
              f"everywhere, ORT's default spinning in every session, {PAUSE_S * 1e3:.0f} ms between generations; "
              f"load average {load_before:.2f} before, {os.getloadavg()[0]:.2f} after")
        print("build / export seconds: " + ", ".join(f"{k} {v:.1f}" for k, v in prepared.seconds.items()), end="\n\n")
        print_rates(timed, args.prompt_len, args.new_tokens)
        print()
        print_splits(prepared, work, past_len=args.prompt_len + args.new_tokens // 2, seed=args.seed + 1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
