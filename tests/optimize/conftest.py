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

    builders = {"linear_eyelike": linear, **{f"gpt2_{e}": (lambda e=e: gpt2(e)) for e in EXPORTERS}}

    def get(name: str) -> SmallModel:
        if name not in built:
            built[name] = builders[name]()
        return built[name]

    return get


# The small models, in the order an entry is tried on them: the first one it applies to is its test model.
SMALL_MODELS = ("linear_eyelike", "gpt2_dynamo", "gpt2_torchscript")


@pytest.fixture(scope="session")
def runs(small_models, tmp_path_factory):
    """Every (entry, model, runtime) is run once, on first use, and shared by the tests that look at it."""
    cache: dict[tuple[str, str, str], Run] = {}

    def get(name: str, model: str, runtime: str = "onnxruntime") -> Run:
        if (name, model, runtime) not in cache:
            source = small_models(model)
            target_dir = tmp_path_factory.mktemp(f"{name}_{model}_{runtime}")
            before = files_digest(source.path)
            result = apply(name, source.path, target_dir, Context(info=source.info, runtime=runtime))
            cache[name, model, runtime] = Run(source, result, target_dir, before, files_digest(source.path))
        return cache[name, model, runtime]

    return get
