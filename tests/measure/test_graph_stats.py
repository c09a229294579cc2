"""Tests of tracker.measure.graph_stats on the in-memory EyeLike/Add/MatMul/Add model and its fused form."""

from __future__ import annotations

import onnx
import pytest

from tests.models import make_linear_model
from tracker.measure.graph_stats import ATTEMPT_COUNT, BASELINE_COUNT, DELTA, OP_TYPE, diff_graphs, graph_stats
from tracker.optimize.add_eyelike import DOMAIN, fuse_add_eyelike

N_FEATURES = 100
INITIALIZER_BYTES = (N_FEATURES * N_FEATURES + N_FEATURES) * 4  # A [100, 100] and B [1, 100], float32


@pytest.fixture(scope="module")
def model() -> onnx.ModelProto:
    return make_linear_model(n_features=N_FEATURES, seed=0)


def test_stats_count_the_nodes_op_types_and_weights_of_the_linear_model(model):
    stats = graph_stats(model)
    assert stats.node_count == 4
    assert stats.op_types == {"Add": 2, "EyeLike": 1, "MatMul": 1}
    assert stats.initializer_count == 2
    assert stats.initializer_bytes == INITIALIZER_BYTES == 40_400
    assert stats.opsets == {"": 18}
    assert stats.function_count == 0
    assert stats.ir_version == model.ir_version
    assert stats.size_bytes == model.ByteSize()
    assert stats.size_bytes > INITIALIZER_BYTES  # the weights are inside the protobuf


@pytest.mark.parametrize("opset", [17, 18, 20])
def test_opsets_report_the_default_domain_version(opset):
    stats = graph_stats(make_linear_model(n_features=4, opset=opset))
    assert stats.opsets == {"": opset}
    assert stats.params()["model.opsets"] == f"ai.onnx={opset}"


def test_a_given_size_on_disk_replaces_the_in_memory_size(model):
    assert graph_stats(model, size_bytes=123_456).size_bytes == 123_456


def test_metrics_and_params_use_dotted_keys(model):
    stats = graph_stats(model)
    assert stats.metrics() == {
        "graph.node_count": 4.0,
        "graph.op_type_count": 3.0,
        "graph.initializer_count": 2.0,
        "graph.initializer_bytes": float(INITIALIZER_BYTES),
        "graph.function_count": 0.0,
        "model.size_bytes": float(model.ByteSize()),
    }
    assert stats.params() == {"model.opsets": "ai.onnx=18", "model.ir_version": str(model.ir_version)}


@pytest.mark.parametrize("as_function", [False, True], ids=["custom-op", "custom-op-with-function"])
def test_stats_of_the_fused_model_name_the_custom_op_by_its_domain(model, as_function):
    stats = graph_stats(fuse_add_eyelike(model, as_function=as_function).model)
    assert stats.node_count == 3
    assert stats.op_types == {"Add": 1, "MatMul": 1, f"{DOMAIN}:AddEyeLike": 1}
    assert stats.opsets == {"": 18, DOMAIN: 1}
    assert stats.function_count == int(as_function)
    assert stats.initializer_bytes == INITIALIZER_BYTES


def test_diff_graphs_shows_the_fusion_as_op_count_changes(model):
    fused = fuse_add_eyelike(model).model
    diff = diff_graphs(graph_stats(model), graph_stats(fused))
    assert list(diff.columns) == [OP_TYPE, BASELINE_COUNT, ATTEMPT_COUNT, DELTA]
    rows = {r[OP_TYPE]: (r[BASELINE_COUNT], r[ATTEMPT_COUNT], r[DELTA]) for r in diff.to_dict("records")}
    assert rows == {
        "EyeLike": (1, 0, -1),
        "Add": (2, 1, -1),
        "tracker.fusions:AddEyeLike": (0, 1, 1),
        "MatMul": (1, 1, 0),
    }


def test_diff_graphs_lists_changed_op_types_first(model):
    fused = fuse_add_eyelike(model).model
    diff = diff_graphs(graph_stats(model), graph_stats(fused))
    assert diff[DELTA].abs().tolist() == [1, 1, 1, 0]
    assert diff[OP_TYPE].iloc[-1] == "MatMul"


def test_diff_graphs_of_a_model_with_itself_has_only_zero_deltas(model):
    diff = diff_graphs(graph_stats(model), graph_stats(model))
    assert (diff[DELTA] == 0).all()
    assert sorted(diff[OP_TYPE]) == ["Add", "EyeLike", "MatMul"]


def test_initializer_bytes_count_weights_stored_as_external_data(model, tmp_path):
    path = tmp_path / "model.onnx"
    # save_model with external data rewrites the tensors of the proto it is given: pass a copy.
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    onnx.save_model(copy, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="model.onnx.data", size_threshold=0)
    loaded = onnx.load(str(path), load_external_data=False)
    assert all(t.data_location == onnx.TensorProto.EXTERNAL for t in loaded.graph.initializer)
    assert all(not t.raw_data for t in loaded.graph.initializer)

    on_disk = path.stat().st_size + (tmp_path / "model.onnx.data").stat().st_size
    stats = graph_stats(loaded, size_bytes=on_disk)
    assert stats.initializer_bytes == INITIALIZER_BYTES
    assert stats.initializer_count == 2
    assert loaded.ByteSize() < INITIALIZER_BYTES  # the weights really are out of the protobuf
    assert stats.size_bytes == on_disk
    assert graph_stats(loaded).size_bytes == loaded.ByteSize()
    assert graph_stats(model).initializer_bytes == INITIALIZER_BYTES  # the original is untouched
