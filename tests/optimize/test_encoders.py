"""The transformer entries on a BERT-style encoder (a tiny seeded BERT, exported both ways), and reading heads, hidden
size and model type from a graph or a Hugging Face config.json (`tracker.optimize.model_info`)."""

from __future__ import annotations

import json
import logging

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from tests.optimize.conftest import (
    BERT_HEADS,
    BERT_HIDDEN,
    BERT_LAYERS,
    N_EMBD,
    N_HEAD,
    bert_feeds,
    export_bert,
    make_tiny_bert,
)
from tracker.optimize import REGISTRY, Context, ModelInfo, apply
from tracker.optimize.base import ort_transformer, transformer
from tracker.optimize.model_info import (
    ORT_MODEL_TYPES,
    detect,
    detect_from_config,
    detect_from_graph,
    detect_model_info,
    detect_model_type,
)

pytest.importorskip("torch")
pytest.importorskip("transformers")

TRANSFORMER_ENTRIES = [name for name, entry in REGISTRY.items() if getattr(entry, "applies", None) in (transformer, ort_transformer)]
BERT_INFO = ModelInfo(num_heads=BERT_HEADS, hidden_size=BERT_HIDDEN, model_type="bert")
GPT2_INFO = ModelInfo(num_heads=N_HEAD, hidden_size=N_EMBD, model_type="gpt2")
# fp32 variants of one graph differ by float noise (~1e-6 here); 1e-4 separates breakage from noise (FACTS).
FP32_ATOL = 1e-4
PADDINGS = ("right", "left", "holes")


@pytest.fixture(scope="module")
def bert_exports(small_models, tmp_path_factory):
    """(exporter, attention implementation) -> the tiny BERT's ONNX file; ("dynamo", "sdpa") is `bert_dynamo`."""
    built = {}

    def get(exporter: str, attn: str):
        if (exporter, attn) == ("dynamo", "sdpa"):
            return small_models("bert_dynamo").path
        if (exporter, attn) not in built:
            path = tmp_path_factory.mktemp(f"bert_{exporter}_{attn}") / "model.onnx"
            built[exporter, attn] = export_bert(make_tiny_bert(attn), path, exporter=exporter)
        return built[exporter, attn]

    return get


def _graph(path) -> onnx.ModelProto:
    return onnx.load_model(str(path), load_external_data=False)


def _without_values(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` as `Study` shows it to `Entry.applies`: initializers keep their names and shapes, not their values."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    for tensor in copy.graph.initializer:
        for values in ("raw_data", "float_data", "int32_data", "int64_data", "double_data", "uint64_data"):
            tensor.ClearField(values)
    return copy


def _session(path, *, optimized: bool = True) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    options.log_severity_level = 3
    if not optimized:  # the graph as written: ORT's own session-time fusions could hide what a file does
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _fused_ops(path) -> dict[str, int]:
    counts: dict[str, int] = {}
    for node in _graph(path).graph.node:
        counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return counts


EXPORTS = [
    pytest.param("gpt2_dynamo", GPT2_INFO, id="gpt2-dynamo"),
    pytest.param("gpt2_torchscript", GPT2_INFO, id="gpt2-torchscript"),
    pytest.param(("dynamo", "sdpa"), BERT_INFO, id="bert-dynamo-sdpa"),
    pytest.param(("dynamo", "eager"), BERT_INFO, id="bert-dynamo-eager"),
    pytest.param(("torchscript", "sdpa"), BERT_INFO, id="bert-torchscript-sdpa"),
    pytest.param(("torchscript", "eager"), BERT_INFO, id="bert-torchscript-eager"),
]


def _export_path(small_models, bert_exports, export):
    return small_models(export).path if isinstance(export, str) else bert_exports(*export)


@pytest.mark.slow
@pytest.mark.parametrize(("export", "expected"), EXPORTS)
def test_heads_hidden_size_and_model_type_are_read_from_every_export(small_models, bert_exports, export, expected):
    graph = _graph(_export_path(small_models, bert_exports, export))
    assert detect_from_graph(graph).source == "graph"
    assert detect_model_info(graph) == expected
    # As a study shows the graph to an entry's check: without the weights' values.
    assert detect_model_info(_without_values(graph)) == expected


@pytest.mark.slow
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_an_already_fused_encoder_is_read_from_its_attention_nodes(bert_exports, tmp_path, attn):
    fused = apply("attention_fused", bert_exports("dynamo", attn), tmp_path, Context()).path
    graph = _graph(fused)
    assert sum(n.op_type in ("Attention", "MultiHeadAttention") for n in graph.graph.node) == BERT_LAYERS
    assert not any(n.op_type == "Softmax" for n in graph.graph.node)
    assert detect_model_info(graph) == BERT_INFO


def test_a_graph_without_layer_norms_or_head_shapes_gets_a_reason_not_a_guess(small_models):
    detection = detect(_graph(small_models("linear_eyelike").path))
    assert detection.info is None and "no layer normalization" in detection.reason
    # The dynamo export stripped of its declared shapes and of its values: head_dim is nowhere left to read.
    stripped = _without_values(_graph(small_models("bert_dynamo").path))
    del stripped.graph.value_info[:]
    detection = detect(stripped)
    assert detection.info is None and "no attention heads found" in detection.reason


@pytest.mark.slow
def test_the_model_type_is_a_decoder_only_with_a_causal_mask(small_models, bert_exports):
    assert detect_model_type(_graph(small_models("gpt2_dynamo").path)) == "gpt2"
    assert detect_model_type(_graph(bert_exports("torchscript", "sdpa"))) == "bert"
    # An encoder-decoder's type cannot be told from the graph: it needs a config.json.
    graph = _graph(bert_exports("torchscript", "sdpa"))
    graph.graph.input[0].name = "decoder_input_ids"
    assert detect_model_type(graph) is None
    assert "encoder-decoder" in detect(graph).reason


def _config(tmp_path, **fields):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(fields))
    return path


def test_a_hugging_face_config_gives_the_info_and_maps_its_model_type(small_models, tmp_path):
    make_tiny_bert().config.to_json_file(tmp_path / "config.json")
    graph = _graph(small_models("bert_dynamo").path)
    detection = detect(graph, tmp_path / "config.json")
    assert (detection.info, detection.source) == (BERT_INFO, "config.json")
    assert detect_model_info(graph, tmp_path) == BERT_INFO  # the folder holding config.json works too
    # GPT-2 and DistilBERT spell heads and hidden size their own way.
    assert detect_from_config(_config(tmp_path, model_type="gpt2", n_head=12, n_embd=768)).info == ModelInfo(
        12, 768, "gpt2")
    assert detect_from_config(_config(tmp_path, model_type="distilbert", n_heads=12, dim=768)).info == ModelInfo(
        12, 768, "bert")
    assert ORT_MODEL_TYPES["roberta"] == "bert"


def test_a_config_wins_over_the_graph_and_a_disagreement_is_a_warning(small_models, tmp_path, caplog):
    config = _config(tmp_path, model_type="bert", num_attention_heads=4, hidden_size=BERT_HIDDEN)
    with caplog.at_level(logging.WARNING, logger="tracker.optimize.model_info"):
        info = detect_model_info(_graph(small_models("bert_dynamo").path), config)
    assert info == ModelInfo(4, BERT_HIDDEN, "bert")
    assert any("the graph says" in r.getMessage() and "num_heads=2" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(("fields", "reason"), [
    pytest.param({"model_type": "mamba", "num_attention_heads": 4, "hidden_size": 32},
                 "model_type 'mamba' has no onnxruntime.transformers optimizer type (known: albert, bart, bert",
                 id="unknown-type"),
    pytest.param({"model_type": "bert", "hidden_size": 32}, "has no num_attention_heads/n_head", id="no-heads"),
    pytest.param({"model_type": "bert", "num_attention_heads": 5, "hidden_size": 32}, "must be a multiple of",
                 id="heads-do-not-divide"),
    pytest.param({"model_type": "bert", "num_attention_heads": "2", "hidden_size": 32}, "must be integers",
                 id="heads-as-text"),
])
def test_a_config_that_cannot_be_used_gives_a_clear_reason(small_models, tmp_path, fields, reason):
    detection = detect(_graph(small_models("bert_dynamo").path), _config(tmp_path, **fields))
    assert detection.info is None
    assert reason in detection.reason


def test_a_config_that_is_not_json_is_bad_input(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="must be a readable Hugging Face config.json"):
        detect_from_config(tmp_path / "config.json")
    with pytest.raises(ValueError, match="must be a readable"):
        detect_from_config(tmp_path / "missing.json")


@pytest.mark.parametrize("name", TRANSFORMER_ENTRIES)
def test_every_transformer_entry_applies_to_an_encoder_without_a_model_info(small_models, name):
    graph = _without_values(_graph(small_models("bert_dynamo").path))
    assert REGISTRY[name].why_not(graph, Context()) is None
    reason = REGISTRY[name].why_not(_graph(small_models("linear_eyelike").path), Context())
    assert reason is not None


@pytest.mark.parametrize("name", TRANSFORMER_ENTRIES)
def test_every_transformer_entry_on_the_encoder_detects_bert_and_stays_within_its_tolerance(runs, name):
    run = runs(name, "bert_dynamo")
    candidate = run.result
    onnx.checker.check_model(str(candidate.path))
    assert run.digest_after == run.digest_before, "the entry changed its source"
    assert candidate.params["optimizer.info_source"] == "graph"
    if "optimizer.model_type" in candidate.params:
        assert candidate.params["optimizer.model_type"] == "bert"
        assert candidate.params["optimizer.num_heads"] == str(BERT_HEADS)
        assert candidate.params["optimizer.hidden_size"] == str(BERT_HIDDEN)
    assert not any("gpt" in note.lower() or "lm_head" in note for note in candidate.notes), candidate.notes
    tolerance = run.source.tolerances[candidate.precision]
    for feeds in run.source.feeds:
        diff = tolerance.compare(_session(run.source.path).run(None, feeds), _session(candidate.path).run(None, feeds))
        assert diff.passed, f"{name}: {diff.metrics()} outside {tolerance}"


def test_a_model_info_without_a_model_type_takes_it_from_the_graph(runs):
    # conftest's GPT-2 INFO gives heads and hidden size only, as the GPT-2 study does.
    params = runs("ort_opt_basic", "gpt2_dynamo").result.params
    assert params["optimizer.model_type"] == "gpt2"
    assert params["optimizer.info_source"] == "given, model_type from graph"


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_attention_fusion_fuses_every_layer_of_a_dynamo_encoder_within_fp32_tolerance(runs, bert_exports,
                                                                                       tmp_path, attn):
    source = bert_exports("dynamo", attn)
    candidate = runs("attention_fused", "bert_dynamo").result if attn == "sdpa" else apply(
        "attention_fused", source, tmp_path, Context())
    assert candidate.applied
    assert candidate.fusions["Attention"] + candidate.fusions["MultiHeadAttention"] == BERT_LAYERS
    assert candidate.fusions["SkipLayerNormalization"] == 2 * BERT_LAYERS
    assert candidate.fusions["BiasGelu"] == BERT_LAYERS
    assert candidate.params["attention.repaired_reshapes"] == "0"  # GPT-2's repair: nothing to repair here
    ops = _fused_ops(candidate.path)
    assert ops.get("Attention", 0) + ops.get("MultiHeadAttention", 0) == BERT_LAYERS
    assert "Softmax" not in ops, "an attention was left unfused"

    reference, fused = _session(source, optimized=False), _session(candidate.path)
    for padding in PADDINGS:
        feeds = bert_feeds(3, 11, seed=4, padding=padding)
        assert (feeds["attention_mask"] == 0).any() and (feeds["token_type_ids"] == 1).any()
        (expected,), (got,) = reference.run(None, feeds), fused.run(None, feeds)
        np.testing.assert_allclose(got, expected, rtol=0, atol=FP32_ATOL, err_msg=padding)
        # The fused attention reads the mask: without the zeros, the padded rows' outputs change.
        (unmasked,) = fused.run(None, {**feeds, "attention_mask": np.ones_like(feeds["attention_mask"])})
        assert np.abs(unmasked[1:] - got[1:]).max() > 1e-3
        np.testing.assert_allclose(unmasked[0], got[0], rtol=0, atol=FP32_ATOL)


def test_attention_fusion_reports_not_applied_on_the_torchscript_export_of_an_encoder(bert_exports, tmp_path):
    candidate = apply("attention_fused", bert_exports("torchscript", "sdpa"), tmp_path, Context())
    assert not candidate.applied
    assert candidate.fusions["Attention"] + candidate.fusions["MultiHeadAttention"] == 0
    assert any("no attention fused" in note for note in candidate.notes)


ORT_BERT_ATTENTION = [
    pytest.param(("dynamo", "sdpa"), 0, id="dynamo-sdpa"),
    pytest.param(("dynamo", "eager"), 0, id="dynamo-eager"),
    pytest.param(("torchscript", "sdpa"), 0, id="torchscript-sdpa"),
    pytest.param(("torchscript", "eager"), BERT_LAYERS, id="torchscript-eager"),
]


@pytest.mark.parametrize(("export", "attention"), ORT_BERT_ATTENTION)
def test_ort_bert_optimizer_fuses_layer_norms_and_gelu_and_attention_only_on_torchscript_eager(
    bert_exports, tmp_path, export, attention
):
    candidate = apply("ort_opt_basic", bert_exports(*export), tmp_path, Context())
    assert candidate.params["optimizer.model_type"] == "bert"
    assert candidate.fusions["SkipLayerNormalization"] == 2 * BERT_LAYERS
    assert candidate.fusions["BiasGelu"] == BERT_LAYERS
    assert candidate.fusions["Attention"] + candidate.fusions["MultiHeadAttention"] == attention
    assert candidate.fusions["EmbedLayerNormalization"] == (1 if attention else 0)
    assert candidate.fully_optimized is bool(attention)
    assert any("attention not fused by ORT's bert optimizer" in n for n in candidate.notes) is not bool(attention)


def test_ort_embed_layer_norm_is_right_only_for_right_padded_masks_and_says_so(bert_exports, tmp_path):
    source = bert_exports("torchscript", "eager")
    candidate = apply("ort_opt_basic", source, tmp_path, Context())
    assert any("right-padded masks" in note for note in candidate.notes)
    reference, optimized = _session(source, optimized=False), _session(candidate.path)
    diffs = {}
    for padding in PADDINGS:
        feeds = bert_feeds(3, 11, seed=5, padding=padding)
        diffs[padding] = float(np.abs(optimized.run(None, feeds)[0] - reference.run(None, feeds)[0]).max())
    assert diffs["right"] < FP32_ATOL, diffs
    assert diffs["left"] > 1e-3 and diffs["holes"] > 1e-3, diffs


@pytest.mark.parametrize(("model", "tied"), [("gpt2_dynamo", True), ("gpt2_torchscript", False),
                                             ("bert_dynamo", False)])
def test_int8_mentions_a_tied_weight_only_where_the_source_has_one(runs, model, tied):
    notes = runs("int8_dynamic", model).result.notes
    assert any("through a Transpose" in note for note in notes) is tied, notes
