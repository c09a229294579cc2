"""Small models the registry's entries apply to, and one cache of entry runs shared by the tests of this folder."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import pytest

from tracker.measure.lm_diff import LOGITS_TOLERANCES
from tracker.measure.output_diff import TOLERANCES
from tracker.optimize import Candidate, Context, ModelInfo, apply
from tracker.optimize.add_eyelike import make_linear_model

N_LAYER, N_HEAD, N_EMBD, VOCAB = 2, 4, 64, 1000
INFO = ModelInfo(num_heads=N_HEAD, hidden_size=N_EMBD)
EXPORTERS = ("dynamo", "torchscript")


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


def gpt2_feeds(seq_len: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seq_len)
    return {"input_ids": rng.integers(0, VOCAB, (2, seq_len), dtype=np.int64)}


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
        from tracker.gpt2.export import export_gpt2

        tiny = request.getfixturevalue("tiny_gpt2")
        path = export_gpt2(tiny, tmp_path_factory.mktemp(exporter) / "model.onnx", exporter=exporter).path
        return SmallModel(path, [gpt2_feeds(3), gpt2_feeds(11)], INFO, LOGITS_TOLERANCES)

    def mlp() -> SmallModel:
        path = tmp_path_factory.mktemp("mlp") / "model.onnx"
        onnx.save_model(make_mlp(seed=0), str(path))
        rng = np.random.default_rng(2)
        feeds = [{"X": rng.standard_normal((n, 256)).astype(np.float32)} for n in (8, 3)]
        return SmallModel(path, feeds, None, TOLERANCES)

    builders = {"linear_eyelike": linear, "mlp": mlp, **{f"gpt2_{e}": (lambda e=e: gpt2(e)) for e in EXPORTERS}}

    def get(name: str) -> SmallModel:
        if name not in built:
            built[name] = builders[name]()
        return built[name]

    return get


# The small models, in the order an entry is tried on them: the first one it applies to is its test model.
SMALL_MODELS = ("linear_eyelike", "mlp", "gpt2_dynamo", "gpt2_torchscript")


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
