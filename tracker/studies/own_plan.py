"""What `tracker optimize MODEL.onnx` was asked (`OwnModelConfig`) and what it will run (`Plan`): the feeds, what was
read of the model, the entries that apply and why the others do not, the real text an LM is judged on; all decided
before any run is made, and what `--dry-run` prints."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx

from tracker.base.keys import check_registered_model_name
from tracker.base.model_io import check_ort_ops, load_model
from tracker.cluster import Address
from tracker.executor import ON_A_CLUSTER, TEXT
from tracker.gpt2.text import TextInputs
from tracker.measure.accuracy.task_diff import TASKS
from tracker.measure.attempt import MAX_ATTEMPT_NAME_LENGTH, MeasureConfig, check_name
from tracker.measure.environment import cpu_model, isa
from tracker.measure.inputs.feed_files import load_feeds
from tracker.measure.inputs.feeds import make_feeds
from tracker.measure.inputs.model_inputs import index_tables, input_specs
from tracker.measure.runtimes.ort_runtime import SessionConfig
from tracker.optimize import FORWARD_ENTRIES, REGISTRY, Context, ModelInfo, applicable, get_entry
from tracker.optimize.model_info import detect
from tracker.optimize.opset import plan_note

# The inputs the text check feeds (`text_scoring.score_forward`): the ids, and a mask of ones when the model takes one.
TEXT_INPUTS = ("input_ids", "attention_mask")


def default_name(model: str | Path) -> str:
    """The run name a model file gets: its stem, with the characters a run name cannot hold made `_`."""
    stem = re.sub(r"[^A-Za-z0-9_.-]", "_", Path(model).stem)[:100]
    return stem if stem and stem[0] not in ".-" else f"model{stem}"[:100]


@dataclass(frozen=True)
class OwnModelConfig:
    """What `tracker optimize` was asked to do.

    Attributes:
        model: the ONNX file (its external data beside it).
        feeds: an `.npz` (arrays by input name) or `.npy` (one input) file of real inputs; None generates
            valid ones (`make_feeds`).
        task: how outputs are judged against the baseline's, one of `TASKS`.
        attempts: registry entries to run; None runs every entry that applies.
        skip: registry entries not to run.
        dims: sizes of symbolic input dims, for generated feeds.
        config_json: a Hugging Face `config.json` giving heads and hidden size (else read from the graph).
        name: the study's name (default: the model file's stem).
        seed: seed of generated feeds.
        measure: how every attempt is measured.
        session: ONNX Runtime settings of every attempt.
        search: search the entries' knobs and chains (`Study.search`) instead of running each entry once.
        budget_s: the search's wall-time budget in seconds (None: no limit).
        fresh: the search reads nothing from its cache (`settings.cache_folder()`), and measures every candidate.
        cluster: the Ray address of a cluster to measure on (`tracker.cluster`); None measures here.
        tokenizer: a local Hugging Face tokenizer folder (task lm only): the LM is judged on real text cut with it
            (perplexity, top-1 along the text, greedy prompts) within each precision's bound; None: on the feeds'
            logits only (same function).
        text: a UTF-8 text file to judge on with `tokenizer`; None: the standard library's documentation.
        max_ppl_increase: replaces every precision's perplexity bound (0.05 is +5 %); None: `lm_bounds.toml`'s.
        register: a registered model's name: the study's best becomes a new version of it (`Study(register=...)`).
    """

    model: Path
    feeds: Path | None = None
    task: str = "raw"
    attempts: tuple[str, ...] | None = None
    skip: tuple[str, ...] = ()
    dims: Mapping[str, int] = field(default_factory=dict)
    config_json: Path | None = None
    name: str | None = None
    seed: int = 0
    measure: MeasureConfig = field(default_factory=MeasureConfig)
    session: SessionConfig = field(default_factory=SessionConfig)
    search: bool = False
    budget_s: float | None = None
    fresh: bool = False
    cluster: str | None = None
    tokenizer: Path | None = None
    text: Path | None = None
    max_ppl_increase: float | None = None
    register: str | None = None

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise ValueError(f"unknown task {self.task!r}; expected one of {', '.join(TASKS)}")
        self._check_text()
        unknown = sorted(set(self.skip) - set(REGISTRY))
        if unknown:
            raise ValueError(f"unknown attempts {unknown}; the registry has {', '.join(REGISTRY)}")
        for spec in self.attempts or ():
            if self.search and spec not in REGISTRY:
                raise ValueError(f"--search takes registered entries in --attempts (their knobs are searched), got "
                                 f"{spec!r}; the registry has {', '.join(REGISTRY)}")
            get_entry(spec)  # an unknown entry, knob or value: the message lists what is allowed
        if self.budget_s is not None and not self.search:
            raise ValueError("--budget bounds a search: add --search")
        if self.fresh and not self.search:
            raise ValueError("--fresh makes a search ignore its cache: add --search")
        if self.budget_s is not None and not self.budget_s > 0:
            raise ValueError(f"the budget must be a positive number of seconds, got {self.budget_s}")
        if self.cluster:
            Address.parse(self.cluster)  # a malformed address: before any work
        if self.register is not None:
            check_registered_model_name(self.register)

    def _check_text(self) -> None:
        """The text options: a tokenizer for an LM only, the text and its bound only with a tokenizer."""
        if self.tokenizer is not None and self.task != "lm":
            raise ValueError(f"--tokenizer judges a language model on real text: it needs --task lm, got --task "
                             f"{self.task}")
        if self.tokenizer is None:
            for option, value in (("--text", self.text), ("--max-ppl-increase", self.max_ppl_increase)):
                if value is not None:
                    raise ValueError(f"{option} is for the check on real text: add --tokenizer (the model's tokenizer "
                                     f"folder)")
            return
        if self.max_ppl_increase is not None and not self.max_ppl_increase > 0:
            raise ValueError(f"--max-ppl-increase must be > 0 (0.05 is +5 %), got {self.max_ppl_increase}")
        if self.cluster:  # --tokenizer: the model is judged on real text
            ON_A_CLUSTER.check(TEXT, fix="run it without --cluster, or without --tokenizer")

    @property
    def study_name(self) -> str:
        """`name`, else `default_name(model)`."""
        return self.name or default_name(self.model)


@dataclass(frozen=True)
class Plan:
    """What a study of the user's model will run, decided before any run is made.

    Attributes:
        feeds: the inputs every attempt runs on.
        feeds_source: where they come from (the file, or how they were generated).
        info: heads, hidden size and model type, where the model is a transformer and they could be read.
        info_source: where `info` was read ("config.json", "graph"), or why it could not be.
        run: the registry entries to run, in registry order.
        not_run: every other entry, with the reason it does not run.
        text: the real text an LM is judged on (`--tokenizer`); None: judged on the feeds alone.
        opset: what the entries that insert ops do about the model's opset (`optimize.opset.plan_note`), if anything.
    """

    feeds: dict[str, np.ndarray]
    feeds_source: str
    info: ModelInfo | None
    info_source: str
    run: tuple[str, ...]
    not_run: dict[str, str]
    text: TextInputs | None = None
    opset: str | None = None


def plan(config: OwnModelConfig) -> Plan:
    """Reads the model and its feeds and picks the entries that apply.

    Raises:
        ModelError: the model cannot be read, or ONNX Runtime has no kernel for one of its ops.
        FeedError: the feeds file does not fit the model, or valid feeds cannot be generated.
        ValueError: an entry named in `attempts` does not apply to the model (with the reason); with a tokenizer, as
            `plan_text`.
    """
    model = load_model(config.model, load_external_data=False)
    check_ort_ops(model, source=repr(str(config.model)))  # before any run is made
    text = plan_text(config, model) if config.tokenizer is not None else None
    if config.feeds is not None:
        feeds, source = load_feeds(config.feeds, model), str(config.feeds)
    else:
        feeds = make_feeds(model, dims=config.dims, seed=config.seed)
        source = f"generated (seed {config.seed})"
    detection = detect(model, config.config_json)
    info = detection.info
    context = Context(info=info, feeds=feeds)
    reasons = applicable(model, context)
    wanted = config.attempts if config.attempts is not None else FORWARD_ENTRIES
    refused = {n: get_entry(n).why_not(model, context) for n in config.attempts or ()}
    refused = {n: why for n, why in refused.items() if why is not None}
    if refused:
        raise ValueError("; ".join(f"{n} does not apply to {config.model}: {why}" for n, why in refused.items()))
    for n in config.attempts or ():  # checked when each attempt starts too: by then the baseline is logged
        _check_attempt_name(n, get_entry(n).name)
    # Registered entries in registry order, then the variants and chains asked for, in the order given.
    run = tuple(n for n in REGISTRY if n in wanted and n not in config.skip and reasons[n] is None)
    run += tuple(n for n in config.attempts or () if n not in REGISTRY)
    not_run = {}
    for name, reason in reasons.items():
        if name in run:
            continue
        decode_only = name not in FORWARD_ENTRIES and config.attempts is None
        not_run[name] = ("skipped (--skip)" if name in config.skip else reason
                         or ("changes only how a model decodes, which this study does not measure" if decode_only
                             else "not chosen (--attempts)"))
    info_source = detection.source if info is not None else (detection.reason or "not read")
    return Plan(feeds=feeds, feeds_source=source, info=info, info_source=str(info_source), run=run, not_run=not_run,
                text=text, opset=plan_note(model))


def _check_attempt_name(asked: str, name: str) -> None:
    """Refuses, in the plan, an attempt whose name (a chain's steps joined by `+`) no run could take.

    Raises:
        ValueError: naming what was asked, the name it gives and its length.
    """
    if len(name) > MAX_ATTEMPT_NAME_LENGTH:
        raise ValueError(f"attempt {asked!r} is named {name!r}, {len(name)} characters: an attempt name is at most "
                         f"{MAX_ATTEMPT_NAME_LENGTH} (it names the run and its work folder); chain fewer steps")
    check_name("attempt", name)


def plan_text(config: OwnModelConfig, model: onnx.ModelProto) -> TextInputs:
    """The real text the LM of `config.tokenizer` is judged on, once the model is known to take it: only the inputs
    the text check feeds (`TEXT_INPUTS`), and ids inside its vocabulary where the graph says how large that is.

    The timing feeds stay the study's (`--feeds`, or generated); no timing rows are cut from the text.

    Raises:
        ValueError: the model takes other inputs, or its first output is not [batch, seq, vocab]; the folder holds
            no tokenizer; the text cannot be read or is too short (`text_inputs`); the tokenizer gives ids beyond
            the model's vocabulary.
    """
    from tracker.gpt2.text import load_tokenizer, read_text, text_inputs

    names = [spec.name for spec in input_specs(model)]
    if "input_ids" not in names or not set(names) <= set(TEXT_INPUTS):
        raise ValueError(f"--tokenizer scores the model on text, feeding only {' and '.join(TEXT_INPUTS)}; "
                         f"{config.model} takes {', '.join(names) or 'no input'}")
    if not model.graph.output:
        raise ValueError(f"--tokenizer reads the model's first output as logits; {config.model} has no output")
    logits = model.graph.output[0]
    shape = logits.type.tensor_type.shape
    if logits.type.tensor_type.HasField("shape") and len(shape.dim) != 3:
        dims = [d.dim_value or d.dim_param or "?" for d in shape.dim]
        raise ValueError(f"--tokenizer reads the model's first output as logits [batch, seq, vocab]; {config.model}'s "
                         f"first output {logits.name!r} has shape {dims}")
    tokenizer = load_tokenizer(str(config.tokenizer))
    if tokenizer is None:
        raise ValueError(f"no tokenizer in {config.tokenizer}: expected a folder written by save_pretrained "
                         f"(tokenizer.json, or a vocabulary and its tokenizer_config.json)")
    corpus = read_text(path=str(config.text) if config.text is not None else None)
    # The lm study's sizes (`TextConfig`); no timing rows (seq_lens): the study times its own feeds.
    text = text_inputs(corpus, tokenizer, chat=True, eval_chunks=8, eval_len=128, prompts=8, prompt_len=64,
                       seq_lens=())
    # The vocabulary, where the graph says: the logits' static last dim, the rows of the table the ids index.
    widths = {f"logits {logits.name!r}": shape.dim[-1].dim_value} if shape.dim and shape.dim[-1].dim_value else {}
    if "input_ids" in (tables := index_tables(model)):
        widths[f"embedding {tables['input_ids'].table!r}"] = tables["input_ids"].rows
    top = int(max(text.eval_ids.max(), text.prompt_ids.max()))
    for where, width in widths.items():
        if top >= width:
            raise ValueError(f"the tokenizer in {config.tokenizer} gives ids up to {top} on the text, but "
                             f"{config.model} has a vocabulary of {width} ({where}): is it this model's tokenizer?")
    return text


def format_plan(config: OwnModelConfig, chosen: Plan) -> str:
    """What `--dry-run` prints: the feeds, what was read of the model, what an LM is judged on, and each entry with
    why it runs or not."""
    feeds = ", ".join(f"{k}: {v.dtype}{list(v.shape)}" for k, v in chosen.feeds.items())
    info = (f"{chosen.info.model_type or 'transformer'}, {chosen.info.num_heads} heads, hidden size "
            f"{chosen.info.hidden_size} (from the {chosen.info_source})" if chosen.info
            else f"no transformer info: {chosen.info_source}")
    has = [name for name, present in isa().items() if present]
    lines = [f"study {config.study_name}: {config.model} (task {config.task})",
             f"machine: {cpu_model()}, {os.cpu_count()} cores; instruction sets: {', '.join(has) or 'none known'}",
             f"feeds ({chosen.feeds_source}): {feeds}", f"model: {info}"]
    if chosen.opset:
        lines.append(f"opset: {chosen.opset}")
    if config.task == "lm":
        lines.append(f"judged on: {_judged_on(config, chosen.text)}")
    lines += ["attempts:", "  baseline: runs"]
    width = max(map(len, REGISTRY))
    for name, entry in REGISTRY.items():
        why = "runs" if name in chosen.run else f"does not run: {chosen.not_run[name]}"
        lines.append(f"  {name.ljust(width)}  {entry.kind:<12}  {why}")
    for spec in chosen.run:
        if spec not in REGISTRY:
            lines.append(f"  {get_entry(spec).name}  {get_entry(spec).kind:<12}  runs ({spec})")
    if config.search:
        budget = "no budget" if config.budget_s is None else f"a budget of {config.budget_s:g} s"
        lines.append(f"--search: the knobs of the entries that run, a sensitivity fallback and chains, with {budget}")
    return "\n".join(lines)


def _judged_on(config: OwnModelConfig, text: TextInputs | None) -> str:
    """What an LM is judged on, in one line of `format_plan`."""
    if text is None:
        return "the feeds' logits against the baseline's (same-function check only): add --tokenizer for real text"
    bound = (f"perplexity +{config.max_ppl_increase:.1%} at most (--max-ppl-increase), each precision's other bounds"
             if config.max_ppl_increase is not None else "each precision's bounds (lm_bounds.toml)")
    chunks, length = text.eval_ids.shape
    prompts, prompt_len = text.prompt_ids.shape
    template = ", chat template" if text.chat_template else ""
    return (f"real text, {text.origin} ({text.tokens} tokens): {chunks} x {length} held-out tokens, {prompts} prompts "
            f"of {prompt_len} tokens{template}; {bound}")
