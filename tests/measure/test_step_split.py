"""Where a step's time goes: every node of a synthetic decode graph whose parts are known lands in its part, and a
profile's time splits into parts that add up to the step."""

from __future__ import annotations

import numpy as np
import onnx
import pandas as pd
import pytest
from onnx import TensorProto, helper, numpy_helper

from tracker.base.vocabulary import Phase
from tracker.measure.costmodel.step_split import Part, StepSplit, classify_nodes, read_step_split, split_step
from tracker.measure.schema import Scope, phase_prefix, read_phases, scenario_figures
from tracker.profile import columns as C

D, VOCAB, HEADS, HEAD_DIM = 8, 50, 2, 4
LAYER, LM_HEAD, ATTENTION, KV_IO, OTHER = (Part.LAYER_MATMULS, Part.LM_HEAD, Part.ATTENTION, Part.KV_IO,
                                           Part.OTHER)


def _weight(name: str, *shape: int, dtype=np.float32) -> onnx.TensorProto:
    return numpy_helper.from_array(np.zeros(shape, dtype=dtype), name)


def decode_graph() -> tuple[onnx.GraphProto, dict[str, Part]]:
    """One layer of a decoder, as ORT's runtime graph has it, with a tied lm_head dequantized each step, an MLP whose
    first product is quantized dynamically (unfused: DynamicQuantizeLinear, MatMulInteger, Cast, Mul) and whose
    second is int4; and the part each node must land in."""
    n = helper.make_node
    expected: dict[str, Part] = {}

    def node(part: Part, op: str, inputs: list[str], outputs: list[str], name: str, **kw) -> onnx.NodeProto:
        expected[name] = part
        return n(op, inputs, outputs, name=name, **kw)

    nodes = [
        node(OTHER, "Gather", ["wte_q_dq", "input_ids"], ["emb"], "embed"),
        node(OTHER, "LayerNormalization", ["emb", "ln_w", "ln_b"], ["ln1"], "ln_1", axis=-1),
        node(LAYER, "MatMul", ["ln1", "w_qkv"], ["qkv"], "qkv_proj"),
        node(ATTENTION, "Split", ["qkv"], ["q", "k", "v"], "split_qkv", axis=-1, num_outputs=3),
        node(ATTENTION, "Reshape", ["q", "heads_shape"], ["q4"], "q_heads"),
        node(ATTENTION, "Transpose", ["q4"], ["qt"], "q_transpose", perm=[0, 2, 1, 3]),
        node(ATTENTION, "Reshape", ["k", "heads_shape"], ["k4"], "k_heads"),
        node(ATTENTION, "Transpose", ["k4"], ["kt"], "k_transpose", perm=[0, 2, 1, 3]),
        node(KV_IO, "Concat", ["past_key", "kt"], ["present_key"], "cat_key", axis=2),
        node(ATTENTION, "Reshape", ["v", "heads_shape"], ["v4"], "v_heads"),
        node(ATTENTION, "Transpose", ["v4"], ["vt"], "v_transpose", perm=[0, 2, 1, 3]),
        node(KV_IO, "Concat", ["past_value", "vt"], ["present_value"], "cat_value", axis=2),
        node(ATTENTION, "FusedMatMul", ["qt", "present_key"], ["scores"], "qk", domain="com.microsoft", transB=1,
             alpha=0.5),
        node(ATTENTION, "Shape", ["past_key"], ["past_shape"], "mask_shape"),
        node(ATTENTION, "ConstantOfShape", ["past_shape"], ["mask_ones"], "mask_ones"),
        node(ATTENTION, "Cast", ["mask_ones"], ["mask_bool"], "mask_cast", to=TensorProto.BOOL),
        node(ATTENTION, "Where", ["mask_bool", "zero", "minus_inf"], ["mask"], "mask_where"),
        node(ATTENTION, "Add", ["scores", "mask"], ["masked"], "mask_add"),
        node(ATTENTION, "Softmax", ["masked"], ["probs"], "softmax", axis=-1),
        node(ATTENTION, "MatMul", ["probs", "present_value"], ["ctx"], "context"),
        node(ATTENTION, "Transpose", ["ctx"], ["ctx_t"], "ctx_transpose", perm=[0, 2, 1, 3]),
        node(ATTENTION, "Reshape", ["ctx_t", "flat_shape"], ["ctx_flat"], "ctx_merge"),
        node(LAYER, "Gemm", ["ctx_flat", "w_o", "b_o"], ["attn_out"], "o_proj"),
        node(OTHER, "Add", ["emb", "attn_out"], ["resid"], "residual"),
        node(OTHER, "LayerNormalization", ["resid", "ln_w", "ln_b"], ["ln2"], "ln_2", axis=-1),
        node(LAYER, "DynamicQuantizeLinear", ["ln2"], ["ln2_q", "ln2_scale", "ln2_zp"], "fc_quantize"),
        node(LAYER, "MatMulInteger", ["ln2_q", "w_fc_q", "ln2_zp", "w_fc_zp"], ["fc_int"], "fc"),
        node(LAYER, "Mul", ["ln2_scale", "w_fc_scale"], ["fc_scale"], "fc_scale"),
        node(LAYER, "Cast", ["fc_int"], ["fc_float"], "fc_cast", to=TensorProto.FLOAT),
        node(LAYER, "Mul", ["fc_float", "fc_scale"], ["fc_out"], "fc_rescale"),
        node(OTHER, "Gelu", ["fc_out"], ["gelu"], "gelu", domain="com.microsoft"),
        node(LAYER, "MatMulNBits", ["gelu", "w_proj_q4", "w_proj_scales"], ["proj"], "proj", domain="com.microsoft",
             K=4 * D, N=D, bits=4, block_size=32),
        node(OTHER, "Add", ["resid", "proj"], ["hidden"], "residual_2"),
        # the tied embedding, int8: dequantized and transposed every step for the lm_head (weight preparation)
        node(LM_HEAD, "DequantizeLinear", ["wte_q", "wte_scale"], ["wte_lm"], "wte_dequantize"),
        node(LM_HEAD, "Transpose", ["wte_lm"], ["wte_t"], "wte_transpose", perm=[1, 0]),
        node(LM_HEAD, "MatMul", ["hidden", "wte_t"], ["logits_raw"], "lm_head"),
        node(OTHER, "Add", ["logits_raw", "logit_bias"], ["logits"], "logit_bias"),
    ]
    initializers = [
        _weight("wte_q_dq", VOCAB, D), _weight("ln_w", D), _weight("ln_b", D), _weight("w_qkv", D, 3 * D),
        numpy_helper.from_array(np.array([1, -1, HEADS, HEAD_DIM], dtype=np.int64), "heads_shape"),
        numpy_helper.from_array(np.array([1, -1, D], dtype=np.int64), "flat_shape"),
        _weight("zero", 1), _weight("minus_inf", 1), _weight("w_o", D, D), _weight("b_o", D),
        _weight("w_fc_q", D, 4 * D, dtype=np.int8), _weight("w_fc_zp", 1, dtype=np.int8), _weight("w_fc_scale", 1),
        _weight("w_proj_q4", D, 1, 16, dtype=np.uint8), _weight("w_proj_scales", D),
        _weight("wte_q", VOCAB, D, dtype=np.int8), _weight("wte_scale", 1), _weight("logit_bias", VOCAB),
    ]
    f = TensorProto.FLOAT
    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, 1]),
              helper.make_tensor_value_info("past_key", f, [1, HEADS, "past", HEAD_DIM]),
              helper.make_tensor_value_info("past_value", f, [1, HEADS, "past", HEAD_DIM])]
    outputs = [helper.make_tensor_value_info("logits", f, [1, 1, VOCAB]),
               helper.make_tensor_value_info("present_key", f, None),
               helper.make_tensor_value_info("present_value", f, None)]
    return helper.make_graph(nodes, "decoder", inputs, outputs, initializers), expected


def test_every_node_of_a_known_decode_graph_lands_in_its_part():
    graph, expected = decode_graph()
    parts = classify_nodes(graph)
    wrong = {name: (parts[name], part) for name, part in expected.items() if parts[name] != part}
    assert not wrong, wrong  # node: (found, expected)
    assert set(parts) == set(expected)


def test_without_a_logits_output_every_product_is_the_layers():
    graph, _ = decode_graph()
    parts = classify_nodes(graph, logits="no_such_output")
    assert parts["lm_head"] == LAYER and parts["wte_transpose"] == LAYER
    assert Part.LM_HEAD not in parts.values()


@pytest.mark.parametrize(("op", "operands"), [("QGemm", (0, 3)), ("QLinearMatMul", (0, 3)), ("Gemm", (0, 1)),
                                              ("DynamicQuantizeMatMul", (0, 1)), ("MatMulIntegerToFloat", (0, 1))],
                         ids=lambda v: str(v))
def test_a_product_has_a_weight_when_one_of_its_operands_is_constant_and_only_then(op, operands):
    inputs = [f"in{i}" for i in range(max(operands) + 1)]
    weight_at = operands[1]
    graph = helper.make_graph(
        [helper.make_node(op, inputs, ["y"], name="with_weight"),
         helper.make_node(op, [*inputs[:weight_at], "y", *inputs[weight_at + 1:]], ["out"], name="two_activations")],
        "g", [helper.make_tensor_value_info("in0", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)],
        [_weight(name, 2) for name in inputs[1:]])
    parts = classify_nodes(graph)
    assert parts == {"with_weight": LAYER, "two_activations": ATTENTION}


# --- splitting a profile ----------------------------------------------------------------------------------------

PARTS = {"qkv_proj": LAYER, "lm_head": LM_HEAD, "softmax": ATTENTION, "cat_key": KV_IO, "ln_1": OTHER}
# per step: each node's µs; the wall time in ms; ORT's model_run in µs
KERNEL_US = {"qkv_proj": 1000.0, "lm_head": 3000.0, "softmax": 500.0, "cat_key": 200.0, "ln_1": 100.0}
MODEL_RUN_US = 5000.0  # 200 µs between kernels


def profile(walls_ms: list[float], *, slow_kernels: dict[int, float] | None = None):
    """A profile of len(walls_ms) steps, each with the same kernels (but `slow_kernels`: step -> factor)."""
    rows, runs = [], []
    for run in range(len(walls_ms)):
        factor = (slow_kernels or {}).get(run, 1.0)
        rows += [{C.NODE: node, C.OP_TYPE: "X", C.RUN: run, C.DUR_US: us * factor} for node, us in KERNEL_US.items()]
        rows.append({C.NODE: "not_in_graph", C.OP_TYPE: "Y", C.RUN: run, C.DUR_US: 0.0})
        runs.append({C.RUN: run, C.TS_US: 0.0, C.DUR_US: MODEL_RUN_US * factor})
    return pd.DataFrame(rows), pd.DataFrame(runs)


def test_the_parts_add_up_to_the_step_and_the_host_time_is_wall_less_model_run():
    events, runs = profile([100.0, 7.0, 7.0, 7.0, 7.0])
    split = split_step(events, runs, [100.0, 7.0, 7.0, 7.0, 7.0], PARTS, skip_runs=1)
    assert split.runs == 2  # the middle half of the 4 steps after the first
    assert split.step_ms == pytest.approx(7.0)
    assert (split.layer_matmuls_ms, split.lm_head_ms, split.attention_ms) == pytest.approx((1.0, 3.0, 0.5))
    assert split.kv_host_ms == pytest.approx(2.0) and split.kv_concat_ms == pytest.approx(0.2)
    assert split.kv_io_ms == pytest.approx(2.2)
    assert split.between_kernels_ms == pytest.approx(0.2) and split.other_ms == pytest.approx(0.3)
    total = sum(split.part_ms(p) for p in Part)
    assert total == pytest.approx(split.step_ms, rel=1e-12)
    assert sum(split.share(p) for p in Part) == pytest.approx(1.0)


def test_steps_outside_the_middle_half_by_wall_time_are_left_out():
    walls = [100.0, 7.0, 7.0, 7.0, 7.0, 50.0, 6.0]
    events, runs = profile(walls, slow_kernels={5: 8.0})  # step 5 was slowed by another process
    split = split_step(events, runs, walls, PARTS, skip_runs=1)
    assert split.step_ms == pytest.approx(7.0) and split.lm_head_ms == pytest.approx(3.0)
    assert split.runs == 4  # of the 6 steps kept, ranked by wall time, the 2nd to the 5th: 6 and 50 are left out


@pytest.mark.parametrize("steps", [1, 2, 3])
def test_a_few_steps_still_give_a_split(steps):
    walls = [9.0] + [7.0 + i for i in range(steps)]
    events, runs = profile(walls)
    split = split_step(events, runs, walls, PARTS)
    assert split.runs == steps and split.lm_head_ms == pytest.approx(3.0)


def test_wall_times_that_do_not_pair_with_the_runs_are_refused():
    events, runs = profile([7.0, 7.0])
    with pytest.raises(ValueError, match="one wall time per profiled step"):
        split_step(events, runs, [7.0], PARTS)
    with pytest.raises(ValueError, match="leaves no step"):
        split_step(events, runs, [7.0, 7.0], PARTS, skip_runs=2)


def test_the_split_round_trips_through_the_decode_phases_metrics():
    events, runs = profile([9.0, 7.0, 7.0])
    split = split_step(events, runs, [9.0, 7.0, 7.0], PARTS)
    prefix = phase_prefix(Phase.DECODE, 512)
    metrics = {prefix + key: value for key, value in split.metrics().items()}
    assert prefix + "split.lm_head_ms" in metrics and prefix + "split.lm_head_share" in metrics
    assert read_step_split(metrics, prefix) == split
    metrics[prefix + "roofline.memory_bound"] = 1.0  # a phase is read at a length with a roofline or a speed-up
    assert read_phases(metrics)[Phase.DECODE].split == split
    assert scenario_figures(metrics, Scope(Phase.PREFILL, 512)).split is None
    del metrics[prefix + "split.kv_host_ms"]
    assert read_step_split(metrics, prefix) is None  # a split is read whole or not at all


def test_a_split_is_a_value():
    values = dict(step_ms=10.0, layer_matmuls_ms=4.0, lm_head_ms=2.0, attention_ms=1.0, kv_io_ms=2.0, other_ms=1.0,
                  kv_host_ms=1.5, kv_concat_ms=0.5, between_kernels_ms=0.2, runs=5)
    split = StepSplit(**values)
    assert split.share(Part.LM_HEAD) == pytest.approx(0.2) and split.share("kv_io") == pytest.approx(0.2)
    assert StepSplit(**{**values, "step_ms": 0.0}).share(Part.OTHER) != StepSplit(**values).share(Part.OTHER)
