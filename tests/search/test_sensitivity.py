"""The sensitivity fallback turns a failing quantization into a passing one by keeping the fewest nodes in fp32."""

from __future__ import annotations

import onnx
import onnxruntime as ort
import pytest

from tests.search.conftest import SENSITIVE
from tracker.measure.accuracy.task_diff import task_tolerances
from tracker.measure.runtimes.ort_runtime import SessionConfig
from tracker.optimize import Context, get_entry
from tracker.search.screen import check_accuracy
from tracker.search.sensitivity import blocks_of, fallback

TOLERANCES = task_tolerances("regression")


def _baseline_outputs(path, feeds):
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)


def _check(feeds, baseline):
    return lambda candidate: check_accuracy(candidate, feeds, baseline, TOLERANCES, session=SessionConfig())


def test_per_tensor_int8_fails_on_the_planted_layer_and_keeping_it_in_fp32_alone_makes_it_pass(sensitive_mlp, tmp_path):
    path, feeds = sensitive_mlp
    baseline = _baseline_outputs(path, feeds)
    context = Context(feeds=feeds, work=tmp_path / "prepared")
    entry = get_entry("int8_dynamic")
    first = _check(feeds, baseline)(entry(path, tmp_path / "plain", context))
    assert not first.passed and first.margin < 0, first

    found = fallback(entry, path, tmp_path / "sensitivity", context, _check(feeds, baseline))

    assert [r["nodes"] for r in found.rows] == ["fc1", SENSITIVE, "fc3"]
    assert max(found.rows, key=lambda r: r["margin"])["nodes"] == SENSITIVE
    assert found.found is not None and found.kept == (SENSITIVE,), (found.tried, found.stopped)
    assert found.tried == [(1, found.tried[0][1], True)]
    assert found.found.name == "int8_dynamic.fp32-1"
    candidate = found.found(path, tmp_path / "found", context)
    assert _check(feeds, baseline)(candidate).passed
    assert candidate.params["quantization.nodes_to_exclude"] == SENSITIVE
    quantized = {n.name for n in onnx.load(str(candidate.path)).graph.node if n.op_type == "MatMulInteger"}
    assert SENSITIVE not in " ".join(quantized) and quantized, quantized
    assert any(f"kept in fp32: {SENSITIVE}" in note for note in candidate.notes)
    assert not any((tmp_path / "sensitivity" / "int8_dynamic").glob("block*")), "retries' models are removed"


def test_a_fallback_out_of_time_stops_with_the_reason_and_finds_nothing(sensitive_mlp, tmp_path):
    path, feeds = sensitive_mlp
    found = fallback(get_entry("int8_dynamic"), path, tmp_path, Context(feeds=feeds),
                     _check(feeds, _baseline_outputs(path, feeds)), out_of_time=lambda: True)
    assert found.found is None and found.rows == [] and "budget ran out after 0 of 3 blocks" in found.stopped


def test_an_entry_without_an_exclude_knob_cannot_fall_back(sensitive_mlp, tmp_path):
    path, feeds = sensitive_mlp
    with pytest.raises(ValueError, match="ort_opt_basic has no exclude knob"):
        fallback(get_entry("ort_opt_basic"), path, tmp_path, Context(feeds=feeds), lambda c: None)


@pytest.mark.parametrize(("count", "most", "sizes"), [(3, 48, [1, 1, 1]), (100, 48, [3] * 33 + [1]), (0, 48, [])])
def test_many_nodes_are_grouped_into_at_most_max_blocks_consecutive_blocks(count, most, sizes):
    nodes = [f"n{i}" for i in range(count)]
    blocks = blocks_of(nodes, most)
    assert [len(b) for b in blocks] == sizes and [n for b in blocks for n in b] == nodes
