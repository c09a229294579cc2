"""Real text in: read a corpus, tokenize it, and cut held-out evaluation chunks, prompts and timing rows from it."""

from __future__ import annotations

import codecs
import hashlib
import importlib
import logging
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from tracker.gpt2.prompts import chat_overhead, chat_prompt, text_start

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

logger = logging.getLogger(__name__)

PYDOC_ORIGIN = "pydoc_data.topics"
# More text than any evaluation here needs, and a bound on what a wrong path (a disk image) can cost.
MAX_READ_BYTES = 64 * 1024 * 1024
# A DatasetDict's split, in order of preference: held-out text first.
DATASET_SPLITS = ("test", "validation", "train")
DATASET_COLUMN = "text"


@dataclass(frozen=True)
class CorpusText:
    """A text to evaluate language models on, and where it came from.

    Attributes:
        text: the text, non-empty.
        origin: where it came from (a module, a path, a dataset folder), for the run's parameters.
        sha256: hex digest of the UTF-8 text, computed here so that it always matches `text`.
    """

    text: str
    origin: str
    sha256: str = field(init=False)

    def __post_init__(self) -> None:
        if not isinstance(self.text, str) or not self.text.strip():
            raise ValueError(f"CorpusText.text must be a non-empty str, got {type(self.text).__name__} "
                             f"of {len(self.text) if isinstance(self.text, str) else 0} chars")
        if not self.origin:
            raise ValueError("CorpusText.origin must name where the text came from, got an empty string")
        object.__setattr__(self, "sha256", hashlib.sha256(self.text.encode("utf-8")).hexdigest())


@dataclass(frozen=True, eq=False)
class TextInputs:
    """Token ids to judge a language model with: held-out chunks, prompts and timing rows.

    The arrays are made read-only here.

    Attributes:
        eval_ids: int64 [eval_chunks, eval_len], for perplexity and next-token agreement.
        prompt_ids: int64 [prompts, prompt_len], for greedy continuations; none of their text is in `eval_ids`.
        timing_ids: int64 [1, n] for each n, for latency measurements.
        real: the ids are real text; False for seeded random ids.
        origin: where the text (or the random ids) came from.
        sha256: digest of the text; empty when not real.
        tokens: tokens in the whole text; 0 when not real.
        chat_template: the prompts went through the tokenizer's chat template.
        note: why the ids are not real text; empty when they are.
    """

    eval_ids: np.ndarray
    prompt_ids: np.ndarray
    timing_ids: dict[int, np.ndarray]
    real: bool
    origin: str
    sha256: str
    tokens: int
    chat_template: bool
    note: str

    def __post_init__(self) -> None:
        arrays = {"eval_ids": self.eval_ids, "prompt_ids": self.prompt_ids}
        arrays.update({f"timing_ids[{n}]": a for n, a in self.timing_ids.items()})
        for name, a in arrays.items():
            if not isinstance(a, np.ndarray) or a.dtype != np.int64 or a.ndim != 2 or 0 in a.shape:
                raise ValueError(f"TextInputs.{name} must be a non-empty int64 array [rows, tokens], got "
                                 f"{getattr(a, 'dtype', type(a).__name__)} of shape {getattr(a, 'shape', None)}")
            a.setflags(write=False)
        for n, a in self.timing_ids.items():
            if a.shape != (1, n):
                raise ValueError(f"TextInputs.timing_ids[{n}] must have shape (1, {n}), got {a.shape}")
        if self.real == bool(self.note):
            raise ValueError(f"TextInputs.note must say why the ids are not real text exactly when real is False, "
                             f"got real={self.real} and note={self.note!r}")

    def params(self) -> dict[str, str]:
        """The run parameters that say what the model was judged on, under stable `text.*` keys."""
        return {
            "text.origin": self.origin,
            "text.sha256": self.sha256 or "none",
            "text.tokens": str(self.tokens),
            "text.eval_chunks": str(self.eval_ids.shape[0]),
            "text.eval_len": str(self.eval_ids.shape[1]),
            "text.prompts": str(self.prompt_ids.shape[0]),
            "text.prompt_len": str(self.prompt_ids.shape[1]),
            "text.chat_template": str(self.chat_template).lower(),
            "text.real": "true" if self.real else f"false: {self.note}",
        }


def read_text(*, path: str | None = None, dataset: str | None = None) -> CorpusText:
    """The text to evaluate on: a UTF-8 file, a local dataset folder, or by default Python's own documentation.

    The default is `pydoc_data.topics` (the language reference, ~370k chars of English once each repeated
    paragraph is kept once), which every Python installation carries: nothing is downloaded and nothing is
    copied into the repository. A file or a dataset is taken as it is.

    Args:
        path: a UTF-8 text file; at most `MAX_READ_BYTES` of it are read (logged when cut).
        dataset: a folder written by `datasets.Dataset.save_to_disk` or `DatasetDict.save_to_disk`.

    Raises:
        ValueError: both were given; the file is missing, not a regular file, empty or binary; the dataset
            folder has no split or string column to read.
        ModuleNotFoundError: `dataset` was given and the `datasets` package is not installed.
    """
    if path is not None and dataset is not None:
        raise ValueError(f"read_text takes a path or a dataset, not both: got path={path!r} and dataset={dataset!r}")
    if path is not None:
        return _read_file(path)
    if dataset is not None:
        return _read_dataset(dataset)
    from pydoc_data.topics import topics

    # Topics repeat each other (the "compound" topic holds the "if" topic's text): a sixth of the second half's
    # passages would also be in the first, so the held-out chunks would not be held out. Keep each paragraph once.
    seen: set[str] = set()
    paragraphs = []
    for key in sorted(topics):
        for paragraph in topics[key].split("\n\n"):
            if paragraph.strip() not in seen:
                seen.add(paragraph.strip())
                paragraphs.append(paragraph)
    return CorpusText("\n\n".join(paragraphs), PYDOC_ORIGIN)


def _read_file(path: str) -> CorpusText:
    try:
        st = os.stat(path)
    except OSError as e:
        raise ValueError(f"no text file at {path!r} (0 bytes): {e.strerror}") from e
    # Opening a FIFO or a device would block or read forever: only regular files are read.
    if not stat.S_ISREG(st.st_mode):
        raise ValueError(f"{path!r} is not a regular file (mode {stat.filemode(st.st_mode)}, 0 bytes read)")
    size = st.st_size
    with open(path, "rb") as f:
        data = f.read(MAX_READ_BYTES)
    cut = size > MAX_READ_BYTES
    if not data.strip():
        raise ValueError(f"text file {path!r} is empty ({size} bytes)")
    if b"\0" in data:
        raise ValueError(f"{path!r} is binary, not UTF-8 text: a NUL byte at offset {data.index(0)} of {size} bytes")
    try:
        # Incremental, so that a character cut by the cap is dropped rather than taken for bad UTF-8.
        text = codecs.getincrementaldecoder("utf-8-sig")().decode(data, final=not cut)
    except UnicodeDecodeError as e:
        raise ValueError(f"{path!r} is not UTF-8 text: bad byte at offset {e.start} of {size} bytes") from e
    origin = path
    if cut:
        origin = f"{path} (first {MAX_READ_BYTES} of {size} bytes)"
        logger.warning("read only the first %d of the %d bytes of %s", MAX_READ_BYTES, size, path)
    return CorpusText(text, origin)


def _read_dataset(folder: str) -> CorpusText:
    try:
        # Optional: only this path needs it, and importlib keeps the type checker from requiring it.
        datasets: Any = importlib.import_module("datasets")
    except ModuleNotFoundError as e:
        raise ModuleNotFoundError(f"reading the dataset folder {folder!r} needs the datasets package: "
                                  f"pip install datasets") from e
    if not os.path.isdir(folder):
        raise ValueError(f"no dataset folder at {folder!r}")
    try:
        loaded = datasets.load_from_disk(folder)
    except (FileNotFoundError, ValueError) as e:
        raise ValueError(f"{folder!r} is not a folder written by save_to_disk: {e}") from e
    split = ""
    if isinstance(loaded, datasets.DatasetDict):
        split = next((s for s in DATASET_SPLITS if s in loaded), "")
        if not split:
            raise ValueError(f"dataset {folder!r} has splits {sorted(loaded)}, expected one of {list(DATASET_SPLITS)}")
        loaded = loaded[split]
    strings = [name for name, feature in loaded.features.items()
               if isinstance(feature, datasets.Value) and feature.dtype in ("string", "large_string")]
    if not strings:
        raise ValueError(f"dataset {folder!r} has no string column: columns {dict(loaded.features)} "
                         f"of {loaded.num_rows} rows")
    column = DATASET_COLUMN if DATASET_COLUMN in strings else strings[0]
    rows: list[str] = []
    chars = 0
    for batch in loaded.select_columns([column]).iter(batch_size=1024):
        for row in batch[column]:
            if row:
                rows.append(row)
                chars += len(row) + 1
        if chars > MAX_READ_BYTES:
            logger.warning("read only the first %d rows (%d chars) of %s", len(rows), chars, folder)
            break
    text = "\n".join(rows)
    if not text.strip():
        raise ValueError(f"dataset {folder!r} column {column!r} has no text in its {loaded.num_rows} rows")
    where = f" split {split}" if split else ""
    return CorpusText(text, f"dataset {folder}{where} column {column}")


def load_tokenizer(model_dir: str) -> PreTrainedTokenizerBase | None:
    """The tokenizer saved in a local model folder, or None (logged) when it has none. Nothing is downloaded.

    Args:
        model_dir: a folder written by `save_pretrained`.
    """
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    except (OSError, ValueError, KeyError, TypeError) as e:
        # OSError: no such folder; ValueError: a folder without tokenizer files; KeyError/TypeError: a
        # config naming a tokenizer class this transformers does not know.
        logger.warning("no tokenizer in %s, so no real text for it: %s", model_dir, str(e).splitlines()[0])
        return None
    # A folder with only a config.json loads as that family's tokenizer with an empty vocabulary.
    if not tokenizer("The text.", add_special_tokens=False)["input_ids"]:
        logger.warning("no tokenizer in %s, so no real text for it: the %s loaded from it has an empty vocabulary",
                       model_dir, type(tokenizer).__name__)
        return None
    return tokenizer


def text_inputs(corpus: CorpusText, tokenizer: PreTrainedTokenizerBase, *, eval_chunks: int, eval_len: int,
                prompts: int, prompt_len: int, seq_lens: Sequence[int] = (), chat: bool = True) -> TextInputs:
    """Held-out evaluation chunks, prompts and timing rows cut from one tokenization of `corpus`.

    The evaluation chunks are spread evenly over the second half of the tokens; the prompts and timing rows
    come from the first half, so no prompt text is evaluated on. Each prompt starts at a line or a sentence
    when one is near. With `chat` and a tokenizer that has a chat template, a prompt is a user message through
    the template, its text cut so that the whole prompt is exactly `prompt_len` tokens.

    Args:
        corpus: the text.
        tokenizer: the model's tokenizer.
        eval_chunks: held-out chunks, >= 1.
        eval_len: tokens per chunk, >= 2 (a chunk of one token predicts nothing).
        prompts: prompts, >= 1.
        prompt_len: tokens per prompt, template included, >= 1.
        seq_lens: lengths of the timing rows, one row each.
        chat: apply the tokenizer's chat template to the prompts when it has one.

    Raises:
        ValueError: a size is out of range, the text has too few tokens for what was asked, or the chat template
            alone leaves no room for text in `prompt_len` tokens.
    """
    _check_sizes(eval_chunks=eval_chunks, eval_len=eval_len, prompts=prompts, prompt_len=prompt_len, seq_lens=seq_lens)
    offsets_ok = bool(getattr(tokenizer, "is_fast", False))
    enc = tokenizer(corpus.text, add_special_tokens=False, return_offsets_mapping=offsets_ok, verbose=False)
    ids = np.asarray(enc["input_ids"], dtype=np.int64)
    starts = np.asarray([s for s, _ in enc["offset_mapping"]]) if offsets_ok else None
    n = len(ids)
    half = n // 2
    need_eval, need_prompts = eval_chunks * eval_len, prompts * prompt_len
    longest = max(seq_lens, default=0)
    if need_eval > n - half or need_prompts > half or longest > half:
        raise ValueError(
            f"text {corpus.origin!r} has {n} tokens: its second half ({n - half}) must hold the evaluation chunks "
            f"({eval_chunks} x {eval_len} = {need_eval}) and its first half ({half}) the prompts "
            f"({prompts} x {prompt_len} = {need_prompts}) and the longest timing row ({longest})"
        )
    stride = (n - half) // eval_chunks
    eval_ids = np.stack([ids[half + i * stride: half + i * stride + eval_len] for i in range(eval_chunks)])
    template = chat and bool(getattr(tokenizer, "chat_template", None))
    overhead = chat_overhead(tokenizer, prompt_len=prompt_len) if template else 0
    slot = half // prompts
    rows = []
    for i in range(prompts):
        window = ids[i * slot: (i + 1) * slot]
        begin = 0
        if starts is not None:  # a slow tokenizer gives no offsets: the prompt starts where its slot does
            begin = text_start(corpus.text, starts[i * slot: (i + 1) * slot], limit=slot - prompt_len)
        if template:
            rows.append(chat_prompt(tokenizer, window, begin, prompt_len=prompt_len, overhead=overhead))
        else:
            rows.append(window[begin: begin + prompt_len])
    timing_ids = {k: ids[:k].reshape(1, k).copy() for k in seq_lens}
    logger.info("text %s: %d tokens, %d x %d evaluation tokens, %d prompts of %d tokens%s", corpus.origin, n,
                eval_chunks, eval_len, prompts, prompt_len, " (chat template)" if template else "")
    return TextInputs(eval_ids=eval_ids, prompt_ids=np.stack(rows).astype(np.int64), timing_ids=timing_ids, real=True,
                      origin=corpus.origin, sha256=corpus.sha256, tokens=n, chat_template=template, note="")


def random_inputs(*, vocab_size: int, eval_chunks: int, eval_len: int, prompts: int, prompt_len: int,
                  seq_lens: Sequence[int] = (), seed: int, why: str) -> TextInputs:
    """Seeded random ids of the same shapes as `text_inputs`, for a model with no tokenizer; marked not real.

    Args:
        vocab_size: ids are drawn from [0, vocab_size).
        seed: seed of the random generator.
        why: why there is no real text (e.g. "no tokenizer in the model folder"); it goes into `text.real`.

    Raises:
        ValueError: a size is out of range, or `why` is empty.
    """
    _check_sizes(eval_chunks=eval_chunks, eval_len=eval_len, prompts=prompts, prompt_len=prompt_len, seq_lens=seq_lens)
    if vocab_size < 1 or not why:
        raise ValueError(f"random_inputs needs vocab_size >= 1 and a reason, got vocab_size={vocab_size}, why={why!r}")
    rng = np.random.default_rng(seed)
    logger.warning("judging on random token ids, not text: %s", why)
    return TextInputs(
        eval_ids=rng.integers(0, vocab_size, size=(eval_chunks, eval_len), dtype=np.int64),
        prompt_ids=rng.integers(0, vocab_size, size=(prompts, prompt_len), dtype=np.int64),
        timing_ids={k: rng.integers(0, vocab_size, size=(1, k), dtype=np.int64) for k in seq_lens},
        real=False, origin=f"random ids (seed {seed}, vocab {vocab_size})", sha256="", tokens=0,
        chat_template=False, note=why,
    )


def _check_sizes(*, eval_chunks: int, eval_len: int, prompts: int, prompt_len: int, seq_lens: Sequence[int]) -> None:
    if eval_chunks < 1 or eval_len < 2 or prompts < 1 or prompt_len < 1 or any(k < 1 for k in seq_lens):
        raise ValueError(
            f"expected eval_chunks >= 1, eval_len >= 2, prompts >= 1, prompt_len >= 1 and seq_lens >= 1, got "
            f"eval_chunks={eval_chunks}, eval_len={eval_len}, prompts={prompts}, prompt_len={prompt_len}, "
            f"seq_lens={list(seq_lens)}"
        )
