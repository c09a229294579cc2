"""The sensitivity fallback per kind of projection (a language model judged on real text: one retry per kind, not per
node), on the tiny GPT-2's dynamo export and the real int4 entry; the check is an oracle whose answer is planted: a
variant passes exactly when the MLP's first products (`mlp.c_fc`) stay in fp32."""

from __future__ import annotations

import onnx
import pytest

from tracker.optimize import Context, get_entry
from tracker.optimize.base import float_weights
from tracker.optimize.quantize.prepare import quantizable_nodes
from tracker.search.screen import AccuracyCheck
from tracker.search.sensitivity import fallback, projection_groups

PLANTED = "mlp.c_fc"


@pytest.fixture
def export(tiny_gpt2_export):
    return tiny_gpt2_export("dynamo").path


def _float_products(path) -> set[str]:
    return {node.name for node in float_weights(onnx.load(str(path)), ("MatMul", "Gemm"))}


def test_the_products_are_grouped_by_the_module_kind_that_made_them(export, tmp_path):
    nodes = quantizable_nodes(get_entry("int4_block32"), export, tmp_path, Context())
    groups = projection_groups(export, nodes)
    assert groups is not None
    assert set(groups) == {"attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj", "model.lm_head"}
    assert all(len(groups[kind]) == 2 for kind in groups if kind != "model.lm_head")  # one per layer of two
    assert sorted(n for group in groups.values() for n in group) == sorted(nodes)


def test_an_int4_gemm_named_in_exclude_stays_in_fp32(export, tmp_path):
    nodes = quantizable_nodes(get_entry("int4_block32"), export, tmp_path, Context())
    kept = projection_groups(export, nodes)[PLANTED]
    candidate = get_entry("int4_block32").variant(exclude=kept)(export, tmp_path / "v", Context())
    # The Gemm is rewritten as MatMul + Add before quantization; its MatMul keeps the float weight.
    assert _float_products(candidate.path) == {f"{name}_MatMul" for name in kept}


def test_the_fallback_by_projection_finds_the_planted_kind_in_one_retry_per_kind(export, tmp_path):
    nodes = quantizable_nodes(get_entry("int4_block32"), export, tmp_path, Context())
    planted = {f"{name}_MatMul" for name in projection_groups(export, nodes)[PLANTED]}

    def oracle(candidate) -> AccuracyCheck:
        kept = len(planted & _float_products(candidate.path))
        return AccuracyCheck(kept == len(planted), kept / len(planted) - 0.5, {})

    found = fallback(get_entry("int4_block32"), export, tmp_path / "work", Context(), oracle, by_projection=True)

    assert [row["group"] for row in found.rows] == ["attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj",
                                                   "model.lm_head"]
    assert max(found.rows, key=lambda row: row["margin"])["group"] == PLANTED
    assert found.found is not None and {f"{n}_MatMul" for n in found.kept} == planted
    assert found.tried == [(1, 0.5, True)]
