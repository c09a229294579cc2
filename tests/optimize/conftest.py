"""Small models the registry's entries apply to, and one cache of entry runs shared by the tests of this folder."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import pytest

from tests.models import make_linear_model
from tracker.measure.accuracy.lm_diff import LOGITS_TOLERANCES
from tracker.measure.accuracy.output_diff import TOLERANCES
from tracker.optimize import Candidate, Context, ModelInfo, apply

N_LAYER, N_HEAD, N_EMBD, VOCAB = 2, 4, 64, 1000
INFO = ModelInfo(num_heads=N_HEAD, hidden_size=N_EMBD)
EXPORTERS = ("dynamo", "torchscript")
# The tiny BERT encoder: BertConfig's architecture, seeded, built offline in about a second.
BERT_LAYERS, BERT_HEADS, BERT_HIDDEN, BERT_VOCAB, BERT_TYPES, BERT_POSITIONS = 2, 2, 32, 99, 2, 64
BERT_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


@dataclass(frozen=True)
class SmallModel:
    """A model file an entry can be tried on, its feeds, and the tolerance of each precision on its outputs."""

    path: Path
    feeds: list[dict[str, np.ndarray]]
    info: ModelInfo | None
    tolerances: dict


@dataclass(frozen=True)
class Run:
    """One entry run on one small model."""

    source: SmallModel
    result: Candidate
    target_dir: Path
    digest_before: dict[str, str]
    digest_after: dict[str, str]


def files_digest(model_path: Path) -> dict[str, str]:
    """sha256 of a model file and of every file beside it (its external data)."""
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(model_path.parent.iterdir()) if p.is_file()
    }


def make_mlp(*, seed: int = 0) -> onnx.ModelProto:
    """A 3-layer MLP, X float [N, 256] -> Y float [N, 10], whose weights are initializers as quantizers
    want them: a MatMul (K=256), a Gemm with transB=1 (K=128) and a MatMul whose K (48) is not a
    multiple of 32 nor as large as 128."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)

    def normal(shape: tuple[int, ...], scale: float) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    # Weights scaled by 1/sqrt(K), so that every layer's activations stay of order 1.
    arrays = {"W1": normal((256, 128), 256**-0.5), "B1": normal((128,), 0.1),
              "W2T": normal((48, 128), 128**-0.5), "B2": normal((48,), 0.1),
              "W3": normal((48, 10), 48**-0.5), "B3": normal((10,), 0.1)}
    nodes = [
        helper.make_node("MatMul", ["X", "W1"], ["H1a"], name="fc1"),
        helper.make_node("Add", ["H1a", "B1"], ["H1b"], name="fc1_bias"),
        helper.make_node("Relu", ["H1b"], ["H1"], name="relu1"),
        helper.make_node("Gemm", ["H1", "W2T", "B2"], ["H2a"], name="fc2", transB=1),
        helper.make_node("Relu", ["H2a"], ["H2"], name="relu2"),
        helper.make_node("MatMul", ["H2", "W3"], ["Ya"], name="fc3"),
        helper.make_node("Add", ["Ya", "B3"], ["Y"], name="fc3_bias"),
    ]
    graph = helper.make_graph(
        nodes, "mlp",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 256])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", 10])],
        initializer=[numpy_helper.from_array(a, name) for name, a in arrays.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    onnx.checker.check_model(model, full_check=True)
    return model


def gpt2_feeds(seq_len: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seq_len)
    return {"input_ids": rng.integers(0, VOCAB, (2, seq_len), dtype=np.int64)}


def make_tiny_bert(attn_implementation: str = "sdpa"):
    """A seeded `BertModel` (no pooler): vocab 99, hidden 32, 2 layers of 2 heads, intermediate 37.

    Biases and LayerNorm parameters get small seeded noise: BERT's init leaves them exactly 0 and 1, which
    no trained model has (as for GPT-2, see FACTS). "sdpa" is transformers' default attention.
    """
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(vocab_size=BERT_VOCAB, hidden_size=BERT_HIDDEN, num_hidden_layers=BERT_LAYERS,
                        num_attention_heads=BERT_HEADS, intermediate_size=37, type_vocab_size=BERT_TYPES,
                        max_position_embeddings=BERT_POSITIONS, attn_implementation=attn_implementation)
    model = BertModel(config, add_pooling_layer=False).eval()
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("bias") or "LayerNorm" in name:
                param.add_(torch.randn(param.shape, generator=generator) * 0.02)
    return model


def export_bert(model, path: Path, *, exporter: str = "dynamo") -> Path:
    """Exports `model`: input_ids, attention_mask, token_type_ids int64 [batch, seq] -> last_hidden_state
    [batch, seq, hidden], batch and sequence dynamic."""
    import warnings

    import torch

    class HiddenStates(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask, token_type_ids):
            return self.model(input_ids=input_ids, attention_mask=attention_mask,
                              token_type_ids=token_type_ids).last_hidden_state

    example = tuple(torch.from_numpy(a) for a in bert_feeds(2, 8, seed=0).values())
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the legacy exporter's deprecation and tracer warnings
        if exporter == "dynamo":
            batch, seq = torch.export.Dim("batch"), torch.export.Dim("seq", max=BERT_POSITIONS)
            program = torch.onnx.export(HiddenStates().eval(), example, dynamo=True, input_names=list(BERT_INPUTS),
                                        output_names=["last_hidden_state"], verbose=False,
                                        dynamic_shapes={name: {0: batch, 1: seq} for name in BERT_INPUTS})
            program.save(str(path), external_data=False)
        else:
            axes = {name: {0: "batch", 1: "seq"} for name in (*BERT_INPUTS, "last_hidden_state")}
            torch.onnx.export(HiddenStates().eval(), example, str(path), dynamo=False, opset_version=17,
                              input_names=list(BERT_INPUTS), output_names=["last_hidden_state"], dynamic_axes=axes)
    return path


def bert_feeds(batch: int, seq_len: int, *, seed: int, padding: str = "right") -> dict[str, np.ndarray]:
    """Valid BERT inputs: ids inside the vocabulary, two segments, and a mask with padding (zeros) in every row
    but the first. `padding`: "right" (as tokenizers pad BERT), "left", or "holes" (zeros inside a sequence)."""
    rng = np.random.default_rng(seed)
    mask = np.ones((batch, seq_len), dtype=np.int64)
    for row in range(1, batch):
        pad = min(2 * row, seq_len - 1)
        if padding == "right":
            mask[row, seq_len - pad:] = 0
        elif padding == "left":
            mask[row, :pad] = 0
        else:
            mask[row, 1:1 + 2 * pad:2] = 0
    token_types = np.zeros((batch, seq_len), dtype=np.int64)
    token_types[:, seq_len // 2:] = 1
    return {"input_ids": rng.integers(0, BERT_VOCAB, (batch, seq_len), dtype=np.int64),
            "attention_mask": mask, "token_type_ids": token_types}


@pytest.fixture(scope="session")
def tiny_gpt2():
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from tracker.gpt2.model import load_gpt2

    loaded = load_gpt2(size="tiny", seed=0)
    shape = (loaded.config.n_layer, loaded.num_heads, loaded.hidden_size, loaded.vocab_size)
    assert shape == (N_LAYER, N_HEAD, N_EMBD, VOCAB), "the expected counts in these tests assume this architecture"
    return loaded


@pytest.fixture(scope="session")
def small_models(request, tmp_path_factory):
    """Name -> its `SmallModel`, built on first use. Each file lies in a folder of its own, so that the
    source-unchanged check hashes exactly its files."""
    built: dict[str, SmallModel] = {}

    def linear() -> SmallModel:
        path = tmp_path_factory.mktemp("linear") / "model.onnx"
        onnx.save_model(make_linear_model(n_features=16, seed=0), str(path))
        feeds = [{"X": np.random.default_rng(1).standard_normal((4, 16)).astype(np.float32)}]
        return SmallModel(path, feeds, None, TOLERANCES)

    def gpt2(exporter: str) -> SmallModel:
        request.getfixturevalue("tiny_gpt2")  # checks the architecture these tests count on
        path = request.getfixturevalue("tiny_gpt2_export")(exporter).path  # shared with other modules, read-only
        return SmallModel(path, [gpt2_feeds(3), gpt2_feeds(11)], INFO, LOGITS_TOLERANCES)

    def mlp() -> SmallModel:
        path = tmp_path_factory.mktemp("mlp") / "model.onnx"
        onnx.save_model(make_mlp(seed=0), str(path))
        rng = np.random.default_rng(2)
        feeds = [{"X": rng.standard_normal((n, 256)).astype(np.float32)} for n in (8, 3)]
        return SmallModel(path, feeds, None, TOLERANCES)

    def bert() -> SmallModel:
        path = request.getfixturevalue("tiny_bert_export")  # shared with other modules, read-only
        # No ModelInfo: the entries read heads, hidden size and model type from the graph.
        return SmallModel(path, [bert_feeds(2, 7, seed=1), bert_feeds(3, 13, seed=2)], None, TOLERANCES)

    builders = {"linear_eyelike": linear, "mlp": mlp, **{f"gpt2_{e}": (lambda e=e: gpt2(e)) for e in EXPORTERS},
                "bert_dynamo": bert}

    def get(name: str) -> SmallModel:
        if name not in built:
            built[name] = builders[name]()
        return built[name]

    return get


# The small models, in the order an entry is tried on them: the first one it applies to is its test model.
SMALL_MODELS = ("linear_eyelike", "mlp", "gpt2_dynamo", "gpt2_torchscript", "bert_dynamo")


@pytest.fixture(scope="session")
def runs(small_models, tmp_path_factory):
    """Every (entry, model, runtime) is run once, on first use, and shared by the tests that look at it."""
    cache: dict[tuple[str, str, str], Run] = {}

    def get(name: str, model: str, runtime: str = "onnxruntime") -> Run:
        if (name, model, runtime) not in cache:
            source = small_models(model)
            target_dir = tmp_path_factory.mktemp(f"{name}_{model}_{runtime}")
            before = files_digest(source.path)
            context = Context(info=source.info, runtime=runtime, feeds=source.feeds[0])  # as a study gives it
            result = apply(name, source.path, target_dir, context)
            cache[name, model, runtime] = Run(source, result, target_dir, before, files_digest(source.path))
        return cache[name, model, runtime]

    return get
