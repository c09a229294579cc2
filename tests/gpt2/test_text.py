"""Real text in: reading a corpus, loading a local tokenizer, and cutting evaluation chunks, prompts and timing rows."""

from __future__ import annotations

import hashlib
import logging
import os
import re
import sys
import threading
from collections import Counter

import numpy as np
import pytest

from tracker.gpt2 import text as text_module
from tracker.gpt2.text import CorpusText, TextInputs, load_tokenizer, random_inputs, read_text, text_inputs

CHAT_TEMPLATE = (
    "{% for m in messages %}<|user|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
SIZES = {"eval_chunks": 6, "eval_len": 64, "prompts": 5, "prompt_len": 40}
PARAM_KEYS = {"text.origin", "text.sha256", "text.tokens", "text.eval_chunks", "text.eval_len", "text.prompts",
              "text.prompt_len", "text.chat_template", "text.real"}


@pytest.fixture(scope="module")
def pydoc() -> CorpusText:
    return read_text()


@pytest.fixture(scope="module")
def tokenizer_dirs(tmp_path_factory, pydoc) -> dict[str, str]:
    """A byte-level BPE trained on the pydoc text in well under a second, saved without and with a chat template."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator([pydoc.text], vocab_size=1000, min_frequency=2, show_progress=False)
    dirs = {}
    for name, template in [("plain", None), ("chat", CHAT_TEMPLATE)]:
        tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer)
        tokenizer.chat_template = template
        dirs[name] = str(tmp_path_factory.mktemp(name))
        tokenizer.save_pretrained(dirs[name])
    return dirs


@pytest.fixture(scope="module")
def plain(tokenizer_dirs):
    return load_tokenizer(tokenizer_dirs["plain"])


@pytest.fixture(scope="module")
def chat(tokenizer_dirs):
    return load_tokenizer(tokenizer_dirs["chat"])


@pytest.fixture(scope="module")
def stream(pydoc, plain) -> np.ndarray:
    return np.asarray(plain(pydoc.text, add_special_tokens=False, verbose=False)["input_ids"], dtype=np.int64)


def positions(stream: np.ndarray, row: np.ndarray) -> list[int]:
    """Where `row` occurs in `stream`, as token positions."""
    hay, needle = stream.astype(np.int32).tobytes(), row.astype(np.int32).tobytes()
    found, at = [], hay.find(needle)
    while at != -1:
        if at % 4 == 0:
            found.append(at // 4)
        at = hay.find(needle, at + 1)
    return found


def windows(rows: np.ndarray, width: int) -> set[tuple[int, ...]]:
    return {tuple(row[i: i + width]) for row in rows for i in range(len(row) - width + 1)}


def letter_share(s: str) -> float:
    return sum(c.isalpha() or c.isspace() for c in s) / len(s)


def known_word_share(s: str, text: str) -> float:
    """The share of the words in `s` (its cut ends aside) that are words of `text`: ~1 for a passage, low for noise."""
    words = re.findall(r"[A-Za-z]+", s)[1:-1]
    vocabulary = set(re.findall(r"[A-Za-z]+", text))
    return sum(w in vocabulary for w in words) / max(len(words), 1)


def test_the_default_text_is_python_documentation_in_english(pydoc):
    assert pydoc.origin == "pydoc_data.topics"
    assert len(pydoc.text) > 100_000
    assert pydoc.sha256 == hashlib.sha256(pydoc.text.encode("utf-8")).hexdigest()
    assert letter_share(pydoc.text) > 0.8
    assert " the " in pydoc.text


def test_the_default_text_keeps_each_paragraph_once_so_its_halves_share_no_passage(pydoc):
    # pydoc's "compound" topic repeats the "if" topic, and so on: a sixth of its text is there twice.
    counts = Counter(p.strip() for p in pydoc.text.split("\n\n") if p.strip())
    assert counts.most_common(1)[0][1] == 1


def test_evaluation_chunks_are_spread_over_the_second_half_and_share_no_window_with_the_prompts(pydoc, plain, stream):
    inputs = text_inputs(pydoc, plain, **SIZES, chat=False)
    assert inputs.eval_ids.shape == (6, 64) and inputs.eval_ids.dtype == np.int64
    half = len(stream) // 2
    starts = [positions(stream, row) for row in inputs.eval_ids]
    assert all(found and min(found) >= half for found in starts)
    firsts = sorted(found[0] for found in starts)
    assert all(b - a >= 64 for a, b in zip(firsts, firsts[1:]))
    assert firsts[-1] > len(stream) * 3 // 4, "the chunks should reach the end of the text, not bunch at its middle"
    assert not windows(inputs.eval_ids, 16) & windows(inputs.prompt_ids, 16)
    assert all(max(positions(stream, row)) + SIZES["prompt_len"] <= half for row in inputs.prompt_ids)


def test_prompts_decode_to_readable_text_starting_at_a_line_or_a_sentence(pydoc, plain, stream):
    inputs = text_inputs(pydoc, plain, **SIZES, chat=False)
    assert inputs.prompt_ids.shape == (5, 40) and inputs.prompt_ids.dtype == np.int64
    assert not inputs.chat_template
    for row in inputs.prompt_ids:
        assert known_word_share(plain.decode(row.tolist()), pydoc.text) > 0.95
        at = positions(stream, row)[0]
        assert at == 0 or plain.decode(stream[at - 1: at].tolist()).rstrip(" ").endswith(("\n", ".", "!", "?"))
    noise = random_inputs(vocab_size=len(plain), **SIZES, seed=0, why="test")
    assert np.mean([known_word_share(plain.decode(row.tolist()), pydoc.text) for row in noise.prompt_ids]) < 0.7


@pytest.mark.parametrize("prompt_len", [25, 26, 40, 41, 97], ids=lambda n: f"prompt_len={n}")
def test_the_chat_template_wraps_each_prompt_in_exactly_prompt_len_tokens(pydoc, chat, prompt_len):
    inputs = text_inputs(pydoc, chat, eval_chunks=2, eval_len=16, prompts=4, prompt_len=prompt_len)
    assert inputs.chat_template and inputs.params()["text.chat_template"] == "true"
    assert inputs.prompt_ids.shape == (4, prompt_len)
    for row in inputs.prompt_ids:
        decoded = chat.decode(row.tolist())
        assert decoded.startswith("<|user|>\n") and decoded.endswith("<|end|>\n<|assistant|>\n")
        assert len(decoded) > len("<|user|>\n<|end|>\n<|assistant|>\n")


def test_chat_false_leaves_prompts_as_raw_text_even_with_a_template(pydoc, chat):
    inputs = text_inputs(pydoc, chat, **SIZES, chat=False)
    assert not inputs.chat_template
    assert "<|user|>" not in chat.decode(inputs.prompt_ids[0].tolist())


def test_a_template_longer_than_the_prompt_is_an_error_naming_both_sizes(pydoc, chat):
    with pytest.raises(ValueError, match=r"template alone takes \d+ tokens.*prompt_len=5") as e:
        text_inputs(pydoc, chat, eval_chunks=2, eval_len=16, prompts=2, prompt_len=5)
    assert "\n" not in str(e.value)


def test_timing_rows_are_real_tokens_keyed_by_length(pydoc, plain, stream):
    inputs = text_inputs(pydoc, plain, **SIZES, seq_lens=(1, 16, 256))
    assert sorted(inputs.timing_ids) == [1, 16, 256]
    for n, row in inputs.timing_ids.items():
        assert row.shape == (1, n) and row.dtype == np.int64
        assert positions(stream, row[0])
    assert not inputs.timing_ids[16].flags.writeable


def test_params_name_the_text_under_stable_keys(pydoc, plain, stream):
    params = text_inputs(pydoc, plain, **SIZES).params()
    assert set(params) == PARAM_KEYS
    assert params["text.sha256"] == pydoc.sha256
    assert params["text.tokens"] == str(len(stream))
    assert params["text.real"] == "true" and params["text.chat_template"] == "false"
    assert (params["text.eval_chunks"], params["text.eval_len"], params["text.prompts"], params["text.prompt_len"]) == (
        "6", "64", "5", "40")


def test_a_text_too_short_for_the_asked_lengths_is_a_one_line_error_with_the_sizes(tmp_path, plain):
    path = tmp_path / "short.txt"
    path.write_text("A short text. It has a few sentences.\nAnd two lines.\n" * 3, encoding="utf-8")
    corpus = read_text(path=str(path))
    with pytest.raises(ValueError) as e:
        text_inputs(corpus, plain, eval_chunks=4, eval_len=128, prompts=4, prompt_len=32)
    message = str(e.value)
    assert "\n" not in message and str(path) in message
    n = len(plain(corpus.text, add_special_tokens=False)["input_ids"])
    assert f"has {n} tokens" in message and "4 x 128 = 512" in message and "4 x 32 = 128" in message


@pytest.mark.parametrize("content, expected", [
    (b"", "empty (0 bytes)"),
    (b"  \n", "empty (3 bytes)"),
    (b"text\0with a NUL", "NUL byte at offset 4 of 15 bytes"),
    (b"caf\xe9 latin-1", "bad byte at offset 3 of 12 bytes"),
], ids=["empty", "blank", "nul-byte", "latin-1"])
def test_an_empty_or_binary_file_is_a_one_line_error_with_its_path_and_size(tmp_path, content, expected):
    path = tmp_path / "corpus.txt"
    path.write_bytes(content)
    with pytest.raises(ValueError) as e:
        read_text(path=str(path))
    assert expected in str(e.value) and str(path) in str(e.value) and "\n" not in str(e.value)


def test_a_missing_file_is_an_error_naming_it(tmp_path):
    with pytest.raises(ValueError, match=r"no text file at .*missing\.txt.*0 bytes"):
        read_text(path=str(tmp_path / "missing.txt"))


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
def test_a_fifo_is_an_error_not_a_hang(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    raised: list[BaseException] = []

    def read() -> None:
        try:
            read_text(path=str(fifo))
        except ValueError as e:
            raised.append(e)

    # Opening a FIFO with no writer blocks: a thread keeps a regression from hanging the suite.
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout=10)
    assert not reader.is_alive(), "read_text blocked on a FIFO"
    assert raised and "not a regular file" in str(raised[0])


def test_a_file_over_the_cap_is_cut_and_says_so(tmp_path, monkeypatch, caplog):
    path = tmp_path / "long.txt"
    path.write_text("héllo wörld\n" * 100, encoding="utf-8")
    monkeypatch.setattr(text_module, "MAX_READ_BYTES", 100)
    with caplog.at_level(logging.WARNING, logger="tracker.gpt2.text"):
        corpus = read_text(path=str(path))
    assert len(corpus.text.encode("utf-8")) <= 100 and corpus.text.startswith("héllo wörld\n")
    assert "first 100 of 1400 bytes" in corpus.origin
    assert "first 100 of the 1400 bytes" in caplog.text


def test_a_path_and_a_dataset_together_are_an_error(tmp_path):
    with pytest.raises(ValueError, match="not both"):
        read_text(path=str(tmp_path / "a.txt"), dataset=str(tmp_path / "d"))


@pytest.mark.parametrize("files", [{}, {"config.json": '{"model_type": "gpt2"}'}], ids=["empty-folder", "config-only"])
def test_a_folder_without_a_tokenizer_gives_none_and_a_warning(tmp_path, caplog, files):
    for name, content in files.items():
        (tmp_path / name).write_text(content)
    with caplog.at_level(logging.WARNING, logger="tracker.gpt2.text"):
        assert load_tokenizer(str(tmp_path)) is None
    assert f"no tokenizer in {tmp_path}" in caplog.text


def test_random_inputs_say_they_are_not_real_text():
    inputs = random_inputs(vocab_size=50, **SIZES, seq_lens=(8,), seed=3, why="no tokenizer in the model folder")
    assert not inputs.real and inputs.note == "no tokenizer in the model folder"
    assert inputs.params()["text.real"] == "false: no tokenizer in the model folder"
    assert set(inputs.params()) == PARAM_KEYS
    assert inputs.eval_ids.shape == (6, 64) and inputs.prompt_ids.shape == (5, 40) and inputs.timing_ids[8].shape == (1, 8)
    again = random_inputs(vocab_size=50, **SIZES, seq_lens=(8,), seed=3, why="again")
    assert np.array_equal(inputs.eval_ids, again.eval_ids)


def test_inputs_that_are_not_real_must_say_why():
    ids = np.zeros((1, 4), dtype=np.int64)
    with pytest.raises(ValueError, match="note must say why"):
        TextInputs(eval_ids=ids, prompt_ids=ids, timing_ids={}, real=False, origin="x", sha256="", tokens=0,
                   chat_template=False, note="")


@pytest.mark.parametrize("sizes", [{"eval_len": 1}, {"prompts": 0}, {"seq_lens": (0,)}], ids=str)
def test_sizes_out_of_range_are_errors_listing_the_allowed_values(pydoc, plain, sizes):
    with pytest.raises(ValueError, match="expected eval_chunks >= 1, eval_len >= 2"):
        text_inputs(pydoc, plain, **{**SIZES, **sizes})


def test_a_dataset_folder_gives_its_text_column_from_the_test_split(tmp_path):
    datasets = pytest.importorskip("datasets")
    splits = datasets.DatasetDict({
        "train": datasets.Dataset.from_dict({"id": [1], "text": ["training text"]}),
        "test": datasets.Dataset.from_dict({"id": [1, 2], "text": ["First held-out line.", "Second one."]}),
    })
    splits.save_to_disk(str(tmp_path / "dict"))
    corpus = read_text(dataset=str(tmp_path / "dict"))
    assert corpus.text == "First held-out line.\nSecond one."
    assert corpus.origin == f"dataset {tmp_path / 'dict'} split test column text"


def test_a_dataset_without_a_text_column_uses_its_first_string_column(tmp_path):
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_dict({"id": [1, 2], "body": ["One.", "Two."]}).save_to_disk(str(tmp_path / "one"))
    assert read_text(dataset=str(tmp_path / "one")).text == "One.\nTwo."
    datasets.Dataset.from_dict({"id": [1, 2]}).save_to_disk(str(tmp_path / "numbers"))
    with pytest.raises(ValueError, match=r"no string column: columns \{'id'"):
        read_text(dataset=str(tmp_path / "numbers"))


def test_a_template_that_leaves_little_room_for_text_is_logged(pydoc, chat, caplog):
    with caplog.at_level(logging.WARNING, logger="tracker.gpt2.prompts"):
        text_inputs(pydoc, chat, eval_chunks=2, eval_len=16, prompts=3, prompt_len=26)
    assert caplog.text.count("the chat template takes 24 of each prompt's 26 tokens, leaving 2 for text") == 1


def test_a_dataset_without_the_datasets_package_says_how_to_install_it(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(ModuleNotFoundError, match="pip install datasets"):
        read_text(dataset=str(tmp_path))
