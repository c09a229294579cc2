"""`tracker optimize MODEL.onnx --task lm --tokenizer FOLDER`: a language model of the user's judged on real text (the
standard library's documentation, cut with its tokenizer) within each precision's bound, and the inputs it refuses
before any run. The study runs the tiny seeded GPT-2; the refusals and --dry-run a one-table LM built in memory; the
tokenizer is a byte-level BPE trained on the same text."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pandas as pd
import pytest
from onnx import TensorProto, helper, numpy_helper

from tracker.cli import main
from tracker.gpt2.text import read_text
from tracker.studies.gpt2 import CHECK_QUALITY, CHECK_SAME_FUNCTION

FAST = ["--profile-runs", "3", "--min-runs", "3", "--min-seconds", "0", "--speedup-rounds", "4",
        "--speedup-seconds", "0", "--threads", "1"]
# Below the tiny GPT-2's 1000 ids, so that every id the tokenizer gives is one the model has.
TOKENIZER_VOCAB = 512


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory) -> Path:
    """A byte-level BPE trained on the pydoc text in well under a second, saved with `save_pretrained`."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator([read_text().text], vocab_size=TOKENIZER_VOCAB, min_frequency=2, show_progress=False)
    folder = tmp_path_factory.mktemp("tokenizer")
    PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def tiny_lm(tiny_gpt2_export, tmp_path_factory) -> Path:
    """The session's tiny seeded GPT-2 export (`input_ids` -> `logits`, 1000 ids), as a study names it: `tiny-lm`."""
    path = tmp_path_factory.mktemp("tiny-lm") / "tiny-lm.onnx"
    shutil.copyfile(tiny_gpt2_export("dynamo").path, path)
    return path


@pytest.fixture
def own_lm(tmp_path) -> Path:
    """A one-table LM (`embedding_lm`) of 1000 ids: enough for the tokenizer's, and no export to wait for."""
    return embedding_lm(tmp_path / "own-lm.onnx", "input_ids", vocab=1000)


@pytest.fixture
def tracking(store, tmp_path, monkeypatch):
    """The test's sqlite store, and an outbox of its own."""
    monkeypatch.setenv("TRACKER_OUTBOX", str(tmp_path / "outbox"))
    return store


def embedding_lm(path: Path, *inputs: str, vocab: int = 16) -> Path:
    """A one-table "LM": the logits at each position are the sum of the table's rows at every input's ids,
    [batch, seq] each -> [batch, seq, vocab]."""
    nodes = [helper.make_node("Gather", ["table", name], [f"{name}_rows"], axis=0) for name in inputs]
    total = nodes[0].output[0]
    for i, other in enumerate(list(nodes[1:])):
        nodes.append(helper.make_node("Add", [total, other.output[0]], [f"sum{i}"]))
        total = f"sum{i}"
    nodes.append(helper.make_node("Identity", [total], ["logits"]))
    table = np.random.default_rng(0).standard_normal((vocab, vocab)).astype(np.float32)
    graph = helper.make_graph(
        nodes, "embedding_lm", [helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "seq"]) for n in inputs],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "seq", vocab])],
        [numpy_helper.from_array(table, "table")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(path))
    return path


def runs_of(client) -> dict[str, object]:
    experiment = client.get_experiment_by_name("own")
    return {r.info.run_name: r for r in client.search_runs([experiment.experiment_id], max_results=100)}


def nothing_logged(client) -> bool:
    experiment = client.get_experiment_by_name("own")
    return experiment is None or not client.search_runs([experiment.experiment_id])


@pytest.mark.slow
def test_an_lm_with_its_tokenizer_is_judged_on_real_text_within_each_precisions_bound(tracking, tiny_lm,
                                                                                    tokenizer_dir, capsys):
    code = main(["optimize", str(tiny_lm), "--task", "lm", "--tokenizer", str(tokenizer_dir),
                 "--attempts", "int8_dynamic", "--experiment", "own", *FAST])

    assert code == 0, capsys.readouterr().err[-3000:]
    runs = runs_of(tracking)
    study = runs["tiny-lm"].data.params
    assert study["text.origin"].startswith("pydoc_data")
    assert study["text.real"] == "true"
    assert (study["text.eval_chunks"], study["text.eval_len"], study["text.prompts"]) == ("8", "128", "8")
    assert study["lm.check"] == CHECK_QUALITY
    for name in ("baseline", "int8_dynamic"):
        assert runs[name].info.status == "FINISHED", (name, runs[name].data.tags.get("tracker.error"))
    baseline = runs["baseline"].data
    assert baseline.metrics["quality.perplexity"] > 1
    assert baseline.metrics["quality.ppl_increase"] == 0
    int8 = runs["int8_dynamic"].data
    assert int8.params["quality.bound"] == "int8"
    assert {"quality.ppl_increase", "quality.top1_agreement"} <= set(int8.metrics)
    # The logits on the generated feeds are recorded, not bounded: the text decides.
    assert (int8.params["diff.tolerance"], int8.params["diff.max_abs_bound"]) == ("int8", "inf")


@pytest.mark.slow
def test_a_search_judges_every_candidate_of_an_lm_on_real_text(tracking, tiny_lm, tokenizer_dir, capsys, tmp_path):
    # int4's 12 variants (int8 on text: test_lm_study): each candidate's check scores the text, ~1 s on this LM.
    code = main(["optimize", str(tiny_lm), "--task", "lm", "--tokenizer", str(tokenizer_dir), "--search",
                 "--attempts", "int4_block32", "--experiment", "own", *FAST])

    assert code == 0, capsys.readouterr().err[-3000:]
    runs = runs_of(tracking)
    study = runs["tiny-lm"]
    found = Path(tracking.download_artifacts(study.info.run_id, "report/search_candidates.json", str(tmp_path)))
    logged = json.loads(found.read_text())
    table = pd.DataFrame(logged["data"], columns=logged["columns"])
    made = table[table["margin"].notna()]
    assert len(made) >= 2, table[["name", "status", "reason"]]
    # Each candidate judged by its precision's bound on the text: its perplexity increase recorded, and the margin
    # the search ranks by negative exactly when a bound failed.
    assert made["diff.quality.ppl_increase"].notna().all()
    assert ((made["margin"] >= 0) == made["passed"].astype(bool)).all(), made[["name", "margin", "passed"]]
    leaders = [r for r in runs.values() if r.data.tags.get("tracker.role") == "attempt"
               and r.info.run_name != "baseline"]
    assert all("quality.ppl_increase" in r.data.metrics for r in leaders)


@pytest.mark.slow
def test_an_lm_without_a_tokenizer_is_judged_as_before_and_says_it_was_the_same_function_check(tracking, own_lm,
                                                                                             capsys):
    code = main(["optimize", str(own_lm), "--task", "lm", "--attempts", "ort_opt_disabled", "--experiment", "own", *FAST])

    assert code == 0, capsys.readouterr().err[-3000:]
    runs = runs_of(tracking)
    assert runs["own-lm"].data.params["lm.check"] == CHECK_SAME_FUNCTION
    assert not any(key.startswith("text.") for key in runs["own-lm"].data.params)
    assert not any(key.startswith("quality.") for key in runs["baseline"].data.metrics)
    assert runs["ort_opt_disabled"].data.params["diff.max_abs_bound"] != "inf"


@pytest.mark.parametrize(("tokenizer", "expected"), [
    pytest.param(True, "judged on: real text, pydoc_data.topics (", id="with a tokenizer"),
    pytest.param(False, "judged on: the feeds' logits against the baseline's (same-function check only)",
                 id="without"),
])
def test_dry_run_says_what_an_lm_is_judged_on_and_logs_nothing(tracking, own_lm, tokenizer_dir, capsys, tokenizer,
                                                              expected):
    extra = ["--tokenizer", str(tokenizer_dir)] if tokenizer else []

    assert main(["optimize", str(own_lm), "--task", "lm", *extra, "--dry-run"]) == 0

    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if line.startswith("judged on: "))
    assert line.startswith(expected), line
    if tokenizer:
        assert "8 x 128 held-out tokens, 8 prompts of 64 tokens; each precision's bounds" in line
    assert nothing_logged(tracking)


@pytest.mark.parametrize(("args", "message"), [
    pytest.param(["--task", "embedding", "--tokenizer", "{tokenizer}"],
                 "--tokenizer judges a language model on real text: it needs --task lm, got --task embedding",
                 id="a tokenizer without task lm"),
    pytest.param(["--task", "lm", "--text", "notes.txt"], "--text is for the check on real text: add --tokenizer",
                 id="a text without a tokenizer"),
    pytest.param(["--task", "lm", "--max-ppl-increase", "0.05"], "--max-ppl-increase is for the check on real text",
                 id="a bound without a tokenizer"),
    pytest.param(["--task", "lm", "--tokenizer", "{tokenizer}", "--max-ppl-increase", "0"],
                 "--max-ppl-increase must be > 0 (0.05 is +5 %), got 0.0", id="a bound of 0"),
    pytest.param(["--task", "lm", "--tokenizer", "{empty}"], "no tokenizer in {empty}: expected a folder written by "
                 "save_pretrained", id="a folder with no tokenizer"),
])
def test_bad_text_options_exit_2_in_one_line_and_log_nothing(tracking, own_lm, tokenizer_dir, tmp_path, capsys, args,
                                                             message):
    (tmp_path / "empty").mkdir()
    folders = {"tokenizer": tokenizer_dir, "empty": tmp_path / "empty"}

    assert main(["optimize", str(own_lm), *(a.format(**folders) for a in args), "--experiment", "own"]) == 2

    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and message.format(**folders) in errors[0], errors
    assert nothing_logged(tracking)


@pytest.mark.parametrize(("inputs", "vocab", "message"), [
    pytest.param(("input_ids", "token_type_ids"), 1000, "feeding only input_ids and attention_mask; {model} takes "
                 "input_ids, token_type_ids", id="an input the text check does not feed"),
    pytest.param(("input_ids",), 16, "but {model} has a vocabulary of 16 (logits 'logits'): is it this model's "
                 "tokenizer?", id="ids beyond the model's vocabulary"),
])
def test_a_model_the_text_cannot_be_scored_on_is_refused_naming_why(tracking, tokenizer_dir, tmp_path, capsys, inputs,
                                                                    vocab, message):
    model = embedding_lm(tmp_path / "own-lm.onnx", *inputs, vocab=vocab)

    assert main(["optimize", str(model), "--task", "lm", "--tokenizer", str(tokenizer_dir), "--experiment", "own"]) == 2

    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and message.format(model=model) in errors[0], errors
    assert nothing_logged(tracking)
