"""int4 folds the Reshapes that only flattened a linear layer's input for its Gemm (`quantize.flatten`): the
values do not change (beyond float rounding where the kernel tiles a batch's rows otherwise), the kernels go, and
a Reshape that is not a plain flatten and its inverse is left alone."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from tracker.optimize import Context, get_entry
from tracker.optimize.quantize import int4 as int4_module
from tracker.optimize.quantize.flatten import fold_flattening_reshapes

K, N, BLOCK = 64, 16, 32


def _run(model: onnx.ModelProto | str, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    source = model if isinstance(model, str) else model.SerializeToString()
    return ort.InferenceSession(source, providers=["CPUExecutionProvider"]).run(None, feeds)


def _linear(*, restored: list[str | int], flat_read_twice: bool = False) -> onnx.ModelProto:
    """X [b, s, K] -> Reshape [-1, K] -> MatMulNBits (int4, N) -> Add bias -> Reshape to X's [b, s] + [N] -> Relu
    -> Y; the second Reshape's output is declared `restored` (what shape inference would say of it)."""
    rng = np.random.default_rng(0)
    weights = rng.integers(0, 256, size=(N, K // BLOCK, BLOCK // 2), dtype=np.uint8)
    inits = [numpy_helper.from_array(weights, "W"),
             numpy_helper.from_array(rng.uniform(0.01, 0.1, N * K // BLOCK).astype(np.float32), "scales"),
             numpy_helper.from_array(rng.normal(size=N).astype(np.float32), "bias"),
             numpy_helper.from_array(np.array([-1, K], np.int64), "flat_shape"),
             numpy_helper.from_array(np.array([0], np.int64), "zero"),
             numpy_helper.from_array(np.array([2], np.int64), "two"),
             numpy_helper.from_array(np.array([N], np.int64), "n")]
    nodes = [
        helper.make_node("Reshape", ["X", "flat_shape"], ["flat"]),
        helper.make_node("MatMulNBits", ["flat", "W", "scales"], ["product"], domain="com.microsoft", K=K, N=N,
                         bits=4, block_size=BLOCK, accuracy_level=4),
        helper.make_node("Add", ["product", "bias"], ["biased"]),
        helper.make_node("Shape", ["X"], ["x_shape"]),
        helper.make_node("Slice", ["x_shape", "zero", "two"], ["leading"]),
        helper.make_node("Concat", ["leading", "n"], ["restore_shape"], axis=0),
        helper.make_node("Reshape", ["biased", "restore_shape"], ["restored"]),
        helper.make_node("Relu", ["restored"], ["Y"]),
    ]
    outputs = [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["b", "s", N])]
    if flat_read_twice:
        nodes.append(helper.make_node("Neg", ["flat"], ["also"]))
        outputs.append(helper.make_tensor_value_info("also", TensorProto.FLOAT, [None, K]))
    graph = helper.make_graph(nodes, "linear", [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["b", "s", K])],
                              outputs, inits,
                              value_info=[helper.make_tensor_value_info("restored", TensorProto.FLOAT, restored),
                                          helper.make_tensor_value_info("product", TensorProto.FLOAT, [None, N])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid("com.microsoft", 1)])


FEEDS = {"X": np.random.default_rng(1).normal(size=(2, 3, K)).astype(np.float32)}


def test_a_flatten_and_its_inverse_are_folded_with_the_same_values():
    model = _linear(restored=["b", "s", N])
    before = _run(model, FEEDS)
    assert fold_flattening_reshapes(model) == 1
    ops = [node.op_type for node in model.graph.node]
    assert ops == ["MatMulNBits", "Add", "Relu"]  # the Reshapes, and the Shape/Slice/Concat of the second, gone
    assert {i.name for i in model.graph.initializer} == {"W", "scales", "bias"}
    assert "product" not in {v.name for v in model.graph.value_info}  # no longer 2-D
    onnx.checker.check_model(model)
    np.testing.assert_array_equal(_run(model, FEEDS)[0], before[0])


@pytest.mark.parametrize(("restored", "flat_read_twice", "why"), [
    (["s", "b", N], False, "leading dimensions swapped"),
    (["b", "s", N + 1], False, "last dimension not the product's N"),
    ([None, "s", N], False, "a leading dimension unknown"),
    (["b", "s", N], True, "the flattened value feeds another node"),
])
def test_anything_less_than_a_proven_flatten_is_left_alone(restored, flat_read_twice, why):
    model = _linear(restored=restored, flat_read_twice=flat_read_twice)
    assert fold_flattening_reshapes(model) == 0, why
    assert [node.op_type for node in model.graph.node].count("Reshape") == 2


@pytest.mark.slow  # the tiny decoder is a dynamo export (shared by the session)
def test_int4_on_a_gpt2_decoder_folds_every_layers_products_and_decodes_the_same(tiny_gpt2_decoder, tmp_path,
                                                                                  monkeypatch):
    from tracker.gpt2.model import SIZES
    from tracker.measure.generation.decoder import DecoderSession
    from tracker.optimize import ModelInfo

    source = tiny_gpt2_decoder.path
    context = Context(info=ModelInfo(num_heads=SIZES["tiny"]["n_head"], hidden_size=SIZES["tiny"]["n_embd"]))
    graph = onnx.load(str(source), load_external_data=False)
    folded = get_entry("int4_block32")(source, tmp_path / "folded", context, graph=graph)
    monkeypatch.setattr(int4_module, "fold_flattening_reshapes", lambda model: 0)
    plain = get_entry("int4_block32")(source, tmp_path / "plain", context, graph=graph)

    def ops(candidate):
        return [n.op_type for n in onnx.load(str(candidate.path), load_external_data=False).graph.node]

    # qkv and the MLP's two; the attention output's Reshape also merges the heads ([batch, seq, heads, head_dim]
    # to [batch * seq, hidden]), so it is no plain flatten and stays.
    products = SIZES["tiny"]["n_layer"] * 3
    assert ops(plain).count("Reshape") - ops(folded).count("Reshape") == 2 * products
    assert f"{products} MatMulNBits read their input unflattened" in " ".join(folded.notes)
    tokens = np.random.default_rng(0).integers(0, SIZES["tiny"]["vocab_size"], size=(2, 9), dtype=np.int64)
    for past in (0, 6):  # a prompt pass and a decode step after a past
        outputs = [DecoderSession(ort.InferenceSession(str(c.path), providers=["CPUExecutionProvider"]))
                   for c in (plain, folded)]
        first, second = (d.session.run(None, d.phase_feeds(tokens, past)) for d in outputs)
        for a, b in zip(first, second, strict=True):  # batch 2: the kernel tiles the rows otherwise (~1e-7)
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
        assert np.array_equal(first[0].argmax(-1), second[0].argmax(-1))
