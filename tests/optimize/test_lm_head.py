"""Each quantization entry says what became of a language model's lm_head (`quantization.lm_head`): on the tiny
GPT-2 decode export, whose lm_head is tied to the embedding through a Transpose, int4 and int8 quantize it, and an
int4 that keeps the lm_head's node in fp32 says fp32."""

from __future__ import annotations

import onnx
import pytest

pytest.importorskip("torch")

from tracker.gpt2.model import SIZES  # noqa: E402
from tracker.optimize import REGISTRY, Context, ModelInfo, get_entry  # noqa: E402
from tracker.optimize.quantize.lm_head import lm_head_precision  # noqa: E402

pytestmark = pytest.mark.slow  # the tiny decoder is a dynamo export (shared by the session)

INFO = ModelInfo(num_heads=SIZES["tiny"]["n_head"], hidden_size=SIZES["tiny"]["n_embd"])


def _make(entry, source, tmp_path):
    found = get_entry(entry) if isinstance(entry, str) else entry
    return found(source, tmp_path / found.name.replace(":", "_"), Context(info=INFO),
                 graph=onnx.load(str(source), load_external_data=False))


def test_the_source_lm_head_is_fp32(tiny_gpt2_decoder):
    assert lm_head_precision(onnx.load(str(tiny_gpt2_decoder.path), load_external_data=False)) == "fp32"


@pytest.mark.parametrize(("entry", "precision"), [("int4_block32", "int4"), ("int8_dynamic", "int8")])
def test_quantization_counts_the_tied_lm_head(entry, precision, tiny_gpt2_decoder, tmp_path):
    candidate = _make(entry, tiny_gpt2_decoder.path, tmp_path)
    assert candidate.params["quantization.lm_head"] == precision
    assert any("lm_head" in note for note in candidate.notes)


def test_an_lm_head_kept_in_fp32_is_counted_as_fp32(tiny_gpt2_decoder, tmp_path):
    quantized = onnx.load(str(_make("int4_block32", tiny_gpt2_decoder.path, tmp_path).path), load_external_data=False)
    producer = {o: n for n in quantized.graph.node for o in n.output}
    node = producer["logits"]
    while node.op_type != "MatMulNBits":
        node = producer[node.input[0]]
    kept = REGISTRY["int4_block32"].variant(exclude=(node.name.removesuffix("_Q4"),))  # the quantizer's suffix
    candidate = _make(kept, tiny_gpt2_decoder.path, tmp_path / "kept")
    assert candidate.params["quantization.lm_head"] == "fp32"
    assert int(candidate.params["quantization.quantized_matmuls"]) == \
        int(_make("int4_block32", tiny_gpt2_decoder.path, tmp_path / "again").params["quantization.quantized_matmuls"]) - 1


def test_a_fused_tied_lm_head_is_untied_so_int4_quantizes_it(tiny_gpt2_decoder, tmp_path):
    fused = _make("attention_fused", tiny_gpt2_decoder.path, tmp_path)
    assert lm_head_precision(onnx.load(str(fused.path), load_external_data=False)) == "fp32"
    graph = onnx.load(str(fused.path), load_external_data=False).graph
    producer = {o: n for n in graph.node for o in n.output}
    assert producer["logits"].op_type == "FusedMatMul"  # onnxscript folded the tied weight's Transpose into it
    candidate = _make("attention_fused+int4_block32", tiny_gpt2_decoder.path, tmp_path / "chain")
    assert candidate.params["quantization.lm_head"] == "int4"
    assert any("untied copy" in note for note in candidate.notes)
