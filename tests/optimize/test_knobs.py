"""Entries with knobs: variants named after what differs, values checked with the allowed ones listed, the
framework's checks around `make` (requires, ensures), variants spelled on the command line, and chains."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import onnx
import pytest

from tracker.optimize import REGISTRY, Chain, Context, EntryError, get_entry
from tracker.optimize.base import Candidate
from tracker.optimize.entry import FunctionEntry
from tracker.optimize.quantize.int4 import Int4
from tracker.optimize.quantize.int8 import Int8Dynamic
from tracker.optimize.quantize.int8_static import Int8Static
from tracker.search.space import candidates, expand


def test_a_variant_is_named_after_the_knobs_that_differ_and_logs_every_knob_as_a_quantization_param():
    variant = REGISTRY["int8_dynamic"].variant(per_channel=True, weight_type="QUInt8", op_types="MatMul,Gemm")
    assert variant.name == "int8_dynamic.pc.w-quint8.ops-matmul_gemm"
    assert variant.knob_params() == {
        "quantization.per_channel": "true", "quantization.reduce_range": "false", "quantization.weight_type": "QUInt8",
        "quantization.op_types": "MatMul,Gemm", "quantization.nodes_to_exclude": "none"}
    assert REGISTRY["int8_dynamic"].variant(per_channel=False) is REGISTRY["int8_dynamic"]
    assert REGISTRY["int4_block32"].variant(exclude=("a", "b")).name == "int4_block32.fp32-2"


@pytest.mark.parametrize(("make", "message"), [
    (lambda: REGISTRY["int8_dynamic"].variant(weight_type="QInt4"),
     "int8_dynamic.w-qint4: weight_type=QInt4 is not allowed; expected one of QInt8, QUInt8"),
    (lambda: REGISTRY["int8_dynamic"].variant(turbo=True), "int8_dynamic has no knob turbo; its knobs: per_channel"),
    (lambda: Int4(block_size=48), "int4_block32: block_size=48 is not allowed; expected one of 16, 32, 64, 128"),
    (lambda: Int8Static(calibration="kl"),
     "calibration=kl is not allowed; expected one of minmax, entropy, percentile"),
    (lambda: Int8Dynamic(exclude=["fc1"]), "exclude must be a tuple of node names"),
    (lambda: get_entry("int8_dynamic:per_channel=maybe"),
     "per_channel=maybe is not allowed; expected one of false, true"),
    (lambda: get_entry("int8_dynamic:per_channel"), "expected ENTRY:KNOB=VALUE:KNOB=VALUE"),
    (lambda: get_entry("ort_opt_basic:level=3"), "ort_opt_basic has no knob 'level'; its knobs: none"),
    (lambda: get_entry("int9+int8_dynamic"), "unknown optimization 'int9'; registered: ort_opt_disabled"),
], ids=["value", "knob", "int4-block", "calibration", "exclude-type", "spec-value", "spec-form", "spec-knob", "chain"])
def test_a_bad_knob_is_refused_with_what_is_allowed(make, message):
    with pytest.raises(ValueError, match=message.replace("+", r"\+").replace(".", r"\.")):
        make()


def test_a_spelled_variant_is_the_same_entry_as_one_made_in_code():
    spelled = get_entry("int8_dynamic:per_channel=true:weight_type=quint8:exclude=fc1;fc2")
    assert spelled == REGISTRY["int8_dynamic"].variant(per_channel=True, weight_type="QUInt8", exclude=("fc1", "fc2"))
    assert get_entry("int4_block32:block_size=128").block_size == 128


def test_the_registered_static_and_int4_entries_are_knob_values_of_one_entry_each():
    assert REGISTRY["int8_static_percentile"] == dataclasses.replace(
        REGISTRY["int8_static_minmax"], name="int8_static_percentile", calibration="percentile")
    assert REGISTRY["int4_block128"] == dataclasses.replace(REGISTRY["int4_block32"], name="int4_block128",
                                                            block_size=128)


def test_a_space_is_enumerated_default_first_and_a_variant_equal_to_a_registered_entry_takes_its_name(small_models):
    variants = expand(REGISTRY["int4_block32"])
    # blocks of 32 or 128 x accuracy level 0 or 4 x symmetric, asymmetric, asymmetric with block_bias: the
    # combinations the entry refuses (block_bias on symmetric blocks) are not candidates
    assert variants[0] is REGISTRY["int4_block32"] and len(variants) == 12
    assert len({v.name for v in variants}) == 12
    assert not any(v.block_bias and v.symmetric for v in variants)
    source = small_models("mlp")
    graph = onnx.load_model(str(source.path), load_external_data=False)
    found, refused = candidates(graph, Context(feeds=source.feeds[0]), entries=("int4_block32", "int4_block128"))
    names = [e.name for e in found]
    assert names.count("int4_block128") == 1 and "int4_block32.b-128" not in names and len(names) == 12
    assert refused == {}


def test_an_entry_that_writes_outside_its_folder_or_changes_its_source_is_stopped_by_name(small_models, tmp_path):
    source = small_models("mlp").path

    def outside(src: Path, target_dir: Path, context: Context) -> Candidate:
        path = tmp_path / "elsewhere.onnx"
        onnx.save_model(onnx.load(str(src)), str(path))
        return Candidate(path=path, applied=True, fusions={}, fully_optimized=None, precision="fp32")

    def scribbles(src: Path, target_dir: Path, context: Context) -> Candidate:
        Path(src).write_bytes(Path(src).read_bytes())  # same bytes, a new write: the source was touched
        return outside(src, target_dir, context)

    copy = tmp_path / "src" / "model.onnx"
    copy.parent.mkdir()
    copy.write_bytes(Path(source).read_bytes())
    with pytest.raises(EntryError, match=r"^bad wrote its model to .*elsewhere.onnx, not under"):
        FunctionEntry("bad", "transform", "writes elsewhere", outside)(copy, tmp_path / "out", Context())
    with pytest.raises(EntryError, match=r"^scribbler changed its source"):
        FunctionEntry("scribbler", "transform", "writes its source", scribbles)(copy, tmp_path / "out2", Context())


def test_a_chain_runs_each_step_on_the_model_before_it_and_adds_up_what_they_did(small_models, tmp_path):
    source = small_models("bert_dynamo")
    chain = get_entry("attention_fused+int8_dynamic:per_channel=true+ort_threads_1")
    assert isinstance(chain, Chain) and chain.name == "attention_fused+int8_dynamic.pc+ort_threads_1"
    assert chain.parent == "attention_fused+int8_dynamic.pc" and chain.kind == "transform"
    candidate = chain(source.path, tmp_path, Context(feeds=source.feeds[0]))

    assert candidate.precision == "int8" and candidate.applied
    assert candidate.fusions["Attention"] == 2, candidate.fusions  # attention_fused's, counted again by int8's step
    assert candidate.session == {"intra_op_num_threads": 1}
    assert candidate.params["pipeline"] == chain.name and candidate.params["quantization.per_channel"] == "true"
    assert tmp_path in candidate.path.parents and candidate.path.parent.name == "1-int8_dynamic.pc"
    assert any(note.startswith("attention_fused: ") for note in candidate.notes)
    ops = {n.op_type for n in onnx.load_model(str(candidate.path), load_external_data=False).graph.node}
    assert "Attention" in ops and ops & {"DynamicQuantizeMatMul", "MatMulInteger"}, ops


def test_session_settings_go_last_in_a_chain():
    with pytest.raises(ValueError, match="session settings go last in a chain"):
        get_entry("ort_threads_1+int8_dynamic")
