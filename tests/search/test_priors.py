"""The search's order before anything is timed: each family by its expected speed-up on this
machine's instruction sets and this model's op mix, from `priors.toml`; the log says why."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tracker.measure.environment import ISA_FLAGS
from tracker.optimize import REGISTRY, Context
from tracker.search.priors import PRIORS_FILE, cost_estimate, load_priors, op_mix, prior_order
from tracker.search.space import by_family, candidates, family, interleave

ROOT = Path(__file__).resolve().parents[2]
VNNI = {name: name in ("avx2", "avx512", "avx512_vnni") for name in ISA_FLAGS}
AVX2 = {name: name == "avx2" for name in ISA_FLAGS}


def _cnn() -> onnx.ModelProto:
    """A convolution, then a small classifier head: most weights are the convolution's."""
    rng = np.random.default_rng(0)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    w = numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "w")
    head = numpy_helper.from_array(rng.standard_normal((8, 4)).astype(np.float32), "head")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("GlobalAveragePool", ["r"], ["p"]), helper.make_node("Flatten", ["p"], ["f"]),
             helper.make_node("MatMul", ["f", "head"], ["y"])]
    graph = helper.make_graph(nodes, "cnn", [x], [y], [w, head])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _mlp() -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 16])
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((16, 16)).astype(np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "mlp", [x], [y], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _ordered(model: onnx.ModelProto, flags) -> tuple[list[str], str]:
    found, _ = candidates(model, Context(feeds={}))
    mixed = interleave(by_family(found).values())
    ordered, _, why = prior_order(mixed, [family(e) for e in mixed], model, flags=flags)
    return [family(e) for e in ordered], why


def test_on_a_vnni_machine_a_cnn_tries_static_int8_first_and_dynamic_int8_last():
    families, why = _ordered(_cnn(), VNNI)
    assert families[0] == "Int8Static" and families[-1] == "Int8Dynamic"
    first_other = next(i for i, f in enumerate(families) if f != "Int8Static")
    assert set(families[first_other:-sum(f == "Int8Dynamic" for f in families)]) - {"Int8Static"}, \
        "the families without a prior come between, at 1.00x"
    assert "Int8Static" not in families[first_other:], "every static variant comes before the rest"
    assert why.startswith("by the prior for avx512_vnni, conv (") and "Int8Static 3.20x, Int8Dynamic 0.50x" in why


def test_a_matmul_model_on_an_avx2_machine_tries_dynamic_int8_first():
    families, why = _ordered(_mlp(), AVX2)
    assert families[0] == "Int8Dynamic"
    assert why.startswith("by the prior for avx2, matmul") and "Int8Dynamic 1.32x" in why


def test_a_machine_without_a_prior_keeps_the_families_in_turn():
    found, _ = candidates(_cnn(), Context(feeds={}))
    mixed = interleave(by_family(found).values())
    none = {name: False for name in ISA_FLAGS}

    ordered, _, why = prior_order(mixed, [family(e) for e in mixed], _cnn(), flags=none)

    assert [e.name for e in ordered] == [e.name for e in mixed]
    assert why.startswith("no prior for this machine (none known) and op mix (conv)")


def test_the_cost_model_is_amdahls_law_over_the_quantized_ops_share():
    shares = {"MatMul": 0.6, "FusedMatMul": 0.2, "Softmax": 0.2}

    assert cost_estimate("Int8Dynamic", shares, {"int8": 4.0, "int4": 2.0}) == pytest.approx(1 / (0.2 + 0.8 / 4))
    assert cost_estimate("Int4", shares, {"int8": 4.0, "int4": 2.0}) == pytest.approx(1 / (0.2 + 0.8 / 2))
    assert cost_estimate("ort_parallel", shares, {"int8": 4.0, "int4": 2.0}) is None


def test_without_a_prior_the_cost_model_orders_the_quantizations_and_the_cache_goes_first():
    found, _ = candidates(_mlp(), Context(feeds={}))
    mixed = interleave(by_family(found).values())
    none = {name: False for name in ISA_FLAGS}
    asked = []

    def speedups():  # this machine's kernels, measured once when the cost model is needed
        asked.append(1)
        return {"int8": 3.0, "int4": 1.5}

    ordered, expected, why = prior_order(mixed, [family(e) for e in mixed], _mlp(), flags=none,
                                         op_time={"MatMul": 0.9, "Add": 0.1}, speedups=speedups)
    families = [family(e) for e in ordered]
    assert asked == [1] and expected["Int8Dynamic"] == pytest.approx(1 / (0.1 + 0.9 / 3))
    assert families[0] == "Int8Dynamic" and families.index("Int4") > max(
        i for i, f in enumerate(families) if f == "Int8Dynamic"), families
    assert "by the cost model (" in why and "Int8Dynamic 2.50x" in why and "Int4 1.43x" in why

    last = ordered[-1].name  # the cache screened it fastest: first, whatever its family's expectation
    again, _, why = prior_order(mixed, [family(e) for e in mixed], _mlp(), flags=none, measured={last: 9.0},
                                op_time={"MatMul": 0.9, "Add": 0.1}, speedups=speedups)
    assert again[0].name == last and "1 candidate(s) first by what the cache screened of them" in why


@pytest.mark.timing
def test_kernel_speedups_of_a_product_against_itself_read_one():
    from tracker.measure.costmodel.machine import gemm_model, time_against_fp32

    same = time_against_fp32({"same": gemm_model(256, rows=64)}, n=256, rows=64)
    assert 0.8 < same["same"] < 1.25, same


def test_op_mix_is_where_most_weights_are_read():
    assert op_mix(_cnn()) == "conv" and op_mix(_mlp()) == "matmul"
    relu = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                             [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                             [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    assert op_mix(helper.make_model(relu)) is None


def test_every_prior_names_a_real_family_and_has_its_measurement_in_the_docs():
    families = {family(e) for e in REGISTRY.values()}
    docs = (ROOT / "docs" / "search.md").read_text()
    rows = [line for line in docs.splitlines() if line.startswith("| `")]
    for name, mixes in load_priors().table.items():
        for mix, table in mixes.items():
            for kind, value in table.items():
                assert kind in families, f"{kind} in {PRIORS_FILE} is no family of the registry"
                assert any(f"`{name}`" in r and f"`{mix}`" in r and f"`{kind}`" in r and f"{value:g}x" in r
                           for r in rows), f"docs/search.md has no row for {name}, {mix}, {kind} = {value:g}x"


@pytest.mark.parametrize("text, message", [
    ("[avx9000.conv]\nInt8Static = 2.0\n", "unknown instruction set 'avx9000'; known: avx2, avx512, avx512_vnni"),
    ("[avx2.attention]\nInt8Static = 2.0\n", "[avx2.attention] is not a table of an op mix; expected one of conv"),
    ("[avx2.conv]\nInt8Static = -1\n", "[avx2.conv] Int8Static = -1; expected a speed-up above 0"),
    ("[avx2.conv\n", "cannot read the search priors"),
])
def test_a_bad_priors_file_is_one_line_naming_what_is_known(tmp_path, text, message):
    path = tmp_path / "priors.toml"
    path.write_text(text)
    with pytest.raises(ValueError, match=re.escape(message)) as raised:
        load_priors(path)
    assert "\n" not in str(raised.value).strip()


def test_coverage_counts_per_family_what_the_budget_reached():
    from tracker.search.result import Row, SearchResult

    rows = [Row("int8_static_minmax", "Int8Static", "quantization", passed=True, screen_speedup=3.0),
            Row("int8_static_minmax.pc", "Int8Static", "quantization", passed=False),
            Row("int8_dynamic", "Int8Dynamic", "transform", status="failed", reason="ValueError: x"),
            Row("int8_dynamic.pc", "Int8Dynamic", "transform", status="skipped", reason="not tried: the budget"),
            Row("int8_dynamic.rr", "Int8Dynamic", "transform", status="skipped", reason="not tried: the budget"),
            Row("attention_fused", "attention_fused", "", reason="does not apply: no attention")]
    result = SearchResult(rows, [], {}, 60.0)

    assert result.coverage() == {
        "Int8Static": {"applied": 2, "checked": 2, "timed": 1, "not_reached": 0},
        "Int8Dynamic": {"applied": 3, "checked": 1, "timed": 0, "not_reached": 2}}
    assert result.coverage_line() == ("coverage: 3 of 5 candidates checked, 1 timed; the budget did not reach "
                                      "Int8Dynamic (2 of 3)")
    assert result.metrics()["search.not_reached"] == 2.0
