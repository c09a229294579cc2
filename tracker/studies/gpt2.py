"""Study `gpt2`: export a causal LM once (GPT-2, or a local LLaMA-family folder), then every model transform of the
registry as a nested attempt run; with the `generation` scenario, each attempt's entry is also applied to a decode-ready
export and its generation measured."""

from __future__ import annotations

import logging
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from tracker.api import GenerationScenario, Study, StudySetup
from tracker.base.keys import TAG_WEIGHTS
from tracker.base.steps import StepTimes
from tracker.base.vocabulary import Kind
from tracker.executor import GENERATION, ON_A_CLUSTER
from tracker.measure.accuracy.lm_diff import LOGITS_FP32, LOGITS_RECORDED, LOGITS_TOLERANCES
from tracker.measure.accuracy.text_quality import load_bounds
from tracker.measure.attempt import MeasureConfig
from tracker.measure.generation.generation import GenerationConfig
from tracker.measure.generation.text_scoring import TextCheck, TextSet
from tracker.measure.runtimes.ort_runtime import SessionConfig
from tracker.optimize import FORWARD_ENTRIES, REGISTRY, ModelInfo, get_entry
from tracker.search import SearchConfig
from tracker.search.decode import DecodeSetup, DecodeSpace
from tracker.search.decode_search import DecodeSearch
from tracker.store import connect

if TYPE_CHECKING:
    from tracker.gpt2.families import LMShape
    from tracker.gpt2.text import TextInputs

logger = logging.getLogger(__name__)

# What the study runs by default: every entry that rewrites the model, and weight-only int4 (block 32), where a
# memory-bound decode step gains most. Session entries would only show ORT's default settings again, the hand-written
# fusions do not apply to GPT-2, and static int8 measured 0.46x on an encoder (README).
DEFAULT_ATTEMPTS = (*(name for name, entry in REGISTRY.items() if entry.kind == Kind.TRANSFORM and name in FORWARD_ENTRIES),
                    "int4_block32")
# With the generation scenario, also the fastest decodes this project makes (docs/results.md): attention fused with its
# past, as GroupQueryAttention on one KV buffer reading q/k/v packed, int4 weights with the lm_head, decoded through IO
# binding; in symmetric blocks of 32; in asymmetric blocks of 128 (a quarter of the scales: on seeded gpt2-small the
# zero points keep the top-1 agreement that symmetric 128 loses); and that with the KV cache in int8 (a quarter of
# the bytes attention reads). On the forward pass each is attention_fused+int4.
DECODE_ATTEMPTS = ("attention_fused+shared_kv+int4_block32+io_binding",
                   "attention_fused+shared_kv+int4_block128:symmetric=false+io_binding",
                   "attention_fused+shared_kv+int4_block128:symmetric=false+kv_int8+io_binding")
# forward: one pass over seq_lens tokens (every attempt's run); generation: prefill, decode against a KV cache,
# greedy generation, on a decode-ready export with the attempt's entry applied to it (gen.* on the same run).
SCENARIOS = ("forward", "generation")
# A decode chain measured in full (its forward attempt, its generation timed interleaved against the baseline's, its
# text scored twice) takes ~3x the baseline's attempt: 220-250 s against ~80 s on SmolLM2, 2 cores.
FULL_OVER_BASELINE = 3.0
# What a study says it judged an LM by (the param `lm.check`).
CHECK_QUALITY = "quality on real text: perplexity, top-1 along the text and greedy prompts within each precision's bound"
CHECK_SAME_FUNCTION = ("same function: the logits on the study's inputs against the baseline's (LOGITS_TOLERANCES); "
                       "not a quality judgment")


@dataclass(frozen=True)
class TextConfig:
    """The real text a pretrained LM is judged on (`tracker.gpt2.text`) and the bounds it must keep.

    Attributes:
        path: a UTF-8 text file; None (with no `dataset`): the standard library's documentation (`pydoc_data`).
        dataset: a local Hugging Face dataset folder (`save_to_disk`), instead of `path`.
        eval_chunks: held-out chunks of the text whose perplexity is measured.
        eval_len: tokens per chunk.
        prompts: real prompts continued greedily.
        prompt_len: tokens per prompt, the chat template's included.
        new_tokens: greedy tokens per prompt, compared with the baseline's.
        max_ppl_increase: replaces every precision's perplexity bound (`lm_bounds.toml`); None: the table's.
        chat: a tokenizer's chat template wraps each prompt.
    """

    path: str | None = None
    dataset: str | None = None
    eval_chunks: int = 8
    eval_len: int = 128
    prompts: int = 8
    prompt_len: int = 64
    new_tokens: int = 16
    max_ppl_increase: float | None = None
    chat: bool = True

    def __post_init__(self) -> None:
        if self.path and self.dataset:
            raise ValueError(f"give a text file ({self.path!r}) or a dataset folder ({self.dataset!r}), not both")
        if min(self.eval_chunks, self.prompts, self.new_tokens) < 1 or self.eval_len < 4 or self.prompt_len < 1:
            raise ValueError(f"need eval_chunks, prompts, new_tokens, prompt_len >= 1 and eval_len >= 4, got "
                             f"{self.eval_chunks}, {self.prompts}, {self.new_tokens}, {self.prompt_len}, {self.eval_len}")
        if self.max_ppl_increase is not None and not self.max_ppl_increase >= 0:
            raise ValueError(f"max_ppl_increase must be >= 0 (0.02 is +2 %), got {self.max_ppl_increase}")


@dataclass(frozen=True)
class GPT2StudyConfig:
    """What the GPT-2 study exports, which attempts it runs and how it measures them.

    Attributes:
        model: a local Hugging Face causal-LM folder (or cached name) for `from_pretrained`: GPT-2 or a LLaMA-family
            architecture (`tracker.gpt2.families.FAMILIES`); None builds GPT-2 from `size`.
        size: "small" (the real gpt2-small architecture) or "tiny" (for tests).
        config_path: a config JSON file (GPT-2's, unless its `model_type` names another family), instead of `size`.
        exporter: "dynamo" or "torchscript".
        seq_lens: sequence lengths timed (profiling off) for every attempt.
        headline_seq: the length that is profiled, checked against the baseline and headlined.
        batch: batch size of the token inputs.
        attempts: registry entries to run after the baseline (default: DEFAULT_ATTEMPTS).
        seed: seed of the weights (when built from a config) and of the tokens.
        measure: how every attempt is measured.
        session: ONNX Runtime settings of every attempt.
        scenarios: some of SCENARIOS; "forward" always (the attempts' runs are its measurement).
        generation: what the generation scenario measures; its decode step is timed against the baseline's at
            its `speedup_past_len`, with `measure.speedup`.
        cluster: the Ray address of a cluster to measure the forward scenario on (`tracker.cluster`); None: here.
        text: the real text a pretrained model is judged on, and its bounds; a model with seeded weights, or without
            a tokenizer, gets seeded random tokens and the same-function check only.
        search: search the decode chains (`tracker.search.decode`) instead of running the fixed decode attempts; it
            needs the generation scenario. Only the attempts named in `attempts` run besides.
        budget_s: the search's wall-time budget in seconds (None: no limit).
        decode_space: the decode knobs the search combines (None: `DecodeSpace()`).
    """

    model: str | None = None
    size: str = "small"
    config_path: str | None = None
    exporter: str = "dynamo"
    seq_lens: tuple[int, ...] = (8, 32, 128)
    headline_seq: int = 32
    batch: int = 1
    attempts: tuple[str, ...] | None = None
    seed: int = 0
    measure: MeasureConfig = field(default_factory=MeasureConfig)
    session: SessionConfig = field(default_factory=SessionConfig)
    scenarios: tuple[str, ...] = ("forward",)
    generation: GenerationConfig = field(default_factory=GenerationConfig)
    cluster: str | None = None
    text: TextConfig = field(default_factory=TextConfig)
    search: bool = False
    budget_s: float | None = None
    decode_space: DecodeSpace | None = None

    def __post_init__(self) -> None:
        if "forward" not in self.scenarios or not set(self.scenarios) <= set(SCENARIOS):
            raise ValueError(f"scenarios must be some of {SCENARIOS}, forward included, got {self.scenarios}")
        if not self.seq_lens or min(self.seq_lens) < 1:
            raise ValueError(f"seq_lens must be positive integers, got {self.seq_lens}")
        if self.headline_seq not in self.seq_lens:
            raise ValueError(f"headline_seq {self.headline_seq} must be one of seq_lens {self.seq_lens}")
        if self.batch < 1:
            raise ValueError(f"batch must be >= 1, got {self.batch}")
        if self.cluster and "generation" in self.scenarios:
            ON_A_CLUSTER.check(GENERATION, fix="run it without --cluster")
        if self.search and "generation" not in self.scenarios:
            raise ValueError("--search searches the decode chains: add --scenarios forward,generation (an LM's forward "
                             "pass is searched by `tracker optimize MODEL --search --task lm`)")
        if self.budget_s is not None and not self.search:
            raise ValueError("--budget bounds a search: add --search")
        for spec in self.attempts or ():
            try:
                get_entry(spec)
            except ValueError as e:
                raise ValueError(f"unknown attempt {spec!r}: {e}") from None

    @property
    def attempt_names(self) -> tuple[str, ...]:
        if self.attempts is not None or self.search:  # the search replaces the fixed attempts
            return self.attempts or ()
        return DEFAULT_ATTEMPTS + (DECODE_ATTEMPTS if "generation" in self.scenarios else ())


def check_study_inputs(config: GPT2StudyConfig) -> LMShape:
    """The shape of the model the study would load, read from its config alone (no weights), after checking that
    every length the study runs fits in the model's positions: the bad input a study refuses before any work.

    Raises:
        ModelError: the model is not available offline, or is not a causal LM of a supported family (the message
            names its architecture and the supported ones).
        ValueError: a sequence length, prompt or past plus its new tokens longer than the model's positions.
    """
    from tracker.gpt2.families import lm_shape
    from tracker.gpt2.model import lm_config

    shape = lm_shape(lm_config(model=config.model, size=config.size, config_path=config.config_path))
    if max(config.seq_lens) > shape.max_positions:
        raise ValueError(f"the model has {shape.max_positions} positions; seq_lens {config.seq_lens} are longer")
    if "generation" in config.scenarios:
        config.generation.check_positions(shape.max_positions)
    if config.text.path or config.text.dataset:
        from tracker.gpt2.text import read_text

        read_text(path=config.text.path, dataset=config.text.dataset)  # an empty, binary or missing file: now
    return shape


def study_text(config: GPT2StudyConfig, *, folder: str | None, vocab_size: int) -> TextInputs | None:
    """The real text a pretrained model (loaded from `folder`) is judged on; None for seeded weights (no text can
    judge them). A folder without a tokenizer gives seeded random ids, and says so (`TextInputs.note`).

    Raises:
        ValueError: the text is empty, binary, or too short for the asked lengths (the message has the sizes).
    """
    from tracker.gpt2.text import load_tokenizer, random_inputs, read_text, text_inputs

    if folder is None:
        return None
    t = config.text
    tokenizer = load_tokenizer(folder)
    if tokenizer is None:
        return random_inputs(vocab_size=vocab_size, seed=config.seed, why=f"no tokenizer in {folder}",
                             eval_chunks=t.eval_chunks, eval_len=t.eval_len, prompts=t.prompts,
                             prompt_len=t.prompt_len, seq_lens=config.seq_lens)
    return text_inputs(read_text(path=t.path, dataset=t.dataset), tokenizer, chat=t.chat, eval_chunks=t.eval_chunks,
                       eval_len=t.eval_len, prompts=t.prompts, prompt_len=t.prompt_len, seq_lens=config.seq_lens)


def run_gpt2_study(config: GPT2StudyConfig, *, experiment: str | None = None, workdir: str | Path | None = None,
                   name: str = "gpt2") -> Study:
    """Exports the model (GPT-2 or a LLaMA-family folder), checks ONNX Runtime against PyTorch, and logs the baseline
    and every attempt.

    Each attempt may fail (the optimizer raises, ORT refuses the result): its run is marked FAILED
    with the error and the study goes on. In the generation scenario, an entry that does not apply to the
    decode-ready export, or fails on it, leaves the reason in the attempt's param `gen.error`.

    Raises:
        ModelError, ValueError: as `check_study_inputs`, before anything is loaded or exported.
    """
    from tracker.gpt2.decode import export_decoder, verify_decoder
    from tracker.gpt2.export import export_gpt2, verify_export
    from tracker.gpt2.families import family_support
    from tracker.gpt2.model import load_lm
    from tracker.gpt2.tokens import feeds_for, make_tokens

    check_study_inputs(config)  # before anything is exported: a model or a length it cannot run is the caller's error
    connect.setup_tracking()  # an unreachable server is an error now, not after the export
    steps = StepTimes()
    generation = "generation" in config.scenarios
    with tempfile.TemporaryDirectory(prefix="tracker-gpt2-") as tmp:
        work = Path(workdir) if workdir is not None else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        logger.info("gpt2: loading the model (%s)", config.model or config.config_path or config.size)
        with steps.step("load"):
            loaded = load_lm(model=config.model, size=config.size, config_path=config.config_path, seed=config.seed)
        support = family_support(loaded.model.config)
        if generation and not support.known:
            logger.warning("gpt2: no generation scenario for %s: %s", loaded.source, support.reason)
            generation = False
        logger.info("gpt2: exporting with the %s exporter", config.exporter)
        with steps.step("export"):
            exported = export_gpt2(loaded, work / "baseline" / "model.onnx", exporter=config.exporter)
        text = study_text(config, folder=loaded.folder, vocab_size=loaded.vocab_size)
        real = text is not None and text.real
        if text is not None and not text.real:
            logger.warning("gpt2: judging %s on random token ids, not text (%s): same-function check only",
                           loaded.source, text.note)
        tokens = {n: (np.repeat(text.timing_ids[n], config.batch, axis=0) if text is not None and real else
                      make_tokens(batch=config.batch, seq_len=n, vocab_size=loaded.vocab_size, seed=config.seed))
                  for n in config.seq_lens}
        logger.info("gpt2: checking ONNX Runtime against PyTorch at seq %d", config.headline_seq)
        with steps.step("export"):
            check = verify_export(loaded, exported.path, tokens[config.headline_seq])
        baseline_metrics = {
            "export.seconds": exported.seconds,
            "export.torch_max_abs": check.max_abs,
            "export.torch_passed": float(check.passed),
        }
        baseline_params = {"export.torch_atol": repr(check.atol)}
        decoder = None
        if generation:
            logger.info("gpt2: exporting ready to decode, and checking it over 16 greedy steps")
            with steps.step("export"):
                decoder = export_decoder(loaded, work / "baseline" / "decoder.onnx")
                prompt = tokens[config.headline_seq][:, : loaded.max_positions - 16]
                decode_check = verify_decoder(loaded, decoder.path, prompt, steps=16)
            baseline_metrics.update({"export.decoder_seconds": decoder.seconds,
                                     "export.decoder_torch_max_abs": decode_check.max_abs,
                                     "export.decoder_tokens_match": float(decode_check.tokens_match),
                                     "export.decoder_torch_passed": float(decode_check.passed)})
            baseline_params["export.decoder_torch_atol"] = repr(decode_check.atol)
        feeds = {n: feeds_for(t, exported.input_names) for n, t in tokens.items()}
        info = ModelInfo(num_heads=loaded.num_heads, hidden_size=loaded.attention_size)
        weights = "pretrained" if loaded.pretrained else "random (seeded), not pretrained"
        title = "GPT-2" if loaded.family == "gpt2" else type(loaded.model).__name__
        params = {
            **loaded.params,
            "export.exporter": exported.exporter,
            "export.opset": str(exported.opset),
            "seq_lens": ",".join(map(str, config.seq_lens)),
            "headline_seq": str(config.headline_seq),
            "batch": str(config.batch),
            "scenarios": ",".join(config.scenarios),
            **(config.generation.params() if generation else {}),
            **({"gen.skipped": support.reason} if "generation" in config.scenarios and not generation else {}),
            **(text.params() if text is not None else {}),
            "lm.check": CHECK_QUALITY if real else CHECK_SAME_FUNCTION,
        }
        del loaded  # the PyTorch weights (~0.5 GB for gpt2-small) are not needed while measuring
        checked = None
        if text is not None and text.real:
            checked = TextSet(text.eval_ids, text.prompt_ids, new_tokens=config.text.new_tokens)
        bounds = load_bounds(max_ppl_increase=config.text.max_ppl_increase)
        tolerances = LOGITS_RECORDED if checked is not None else LOGITS_TOLERANCES
        scenario = None
        if decoder is not None:
            decode = DecodeSetup(decoder.path, config.generation, config.session, tolerances, info=info,
                                 text=TextCheck(checked, bounds, decoder=True) if checked else None)
            scenario = GenerationScenario(decode, speedup=config.measure.speedup, max_positions=decoder.max_positions)
        setup = StudySetup(tags={TAG_WEIGHTS: weights}, workdir=work / "measure", generation=scenario,
                           latency_feeds={f"s{n}": f for n, f in feeds.items()}, prior_steps=steps,
                           quality=TextCheck(checked, bounds) if checked is not None else None)
        with Study(name, feeds=feeds[config.headline_seq], experiment=experiment, config=config.measure,
                   params=params, setup=setup, cluster=config.cluster) as study:
            start = time.perf_counter()
            study.attempt("baseline", exported.path, session=config.session, tolerance=LOGITS_FP32,
                          description=f"{title} exported with the {exported.exporter} exporter ({weights})",
                          metrics=baseline_metrics, params=baseline_params)
            if config.search and scenario is not None and scenario.baseline is not None:
                search = DecodeSearch(scenario.target(), workdir=work / "search", space=config.decode_space,
                                      config=SearchConfig(budget_s=config.budget_s),
                                      full_attempt_s=FULL_OVER_BASELINE * (time.perf_counter() - start))
                study.run_strategy(search, exported.path, info=info, session=config.session, tolerance=tolerances)
            for name in config.attempt_names:
                study.optimize(name, exported.path, info=info, session=config.session, tolerance=tolerances)
        return study
