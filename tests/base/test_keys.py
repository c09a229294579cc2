"""Tests of tracker.base.keys: every derived metric key passes MLflow's own validator; file names are safe; an
experiment name over MLflow's limit is refused before any work, by the commands and by `Study`."""

from __future__ import annotations

import itertools

import mlflow.utils.validation
import pytest
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException

from tests.commands import assert_one_line_error, run_cli, run_names
from tests.conftest import seed_sqlite_store
from tracker.api import Study
from tracker.base.keys import MAX_EXPERIMENT_NAME_LENGTH, MAX_KEY_LENGTH, metric_keys, sanitize_key

NAMES = [
    pytest.param("/transformer/h.0/attn/MatMul", id="torch-export-path"),
    pytest.param("/transformer/h.0/attn/MatMul_1", id="torch-export-path-suffixed"),
    pytest.param("a+b", id="plus"),
    pytest.param("a=b", id="equals"),
    pytest.param("x[0]", id="brackets"),
    pytest.param("a,b@c#d%e", id="comma-at-hash-percent"),
    pytest.param("..", id="dot-dot"),
    pytest.param("../../etc/passwd", id="parent-traversal"),
    pytest.param("a/../b", id="dot-dot-segment"),
    pytest.param(".", id="dot"),
    pytest.param("a/./b", id="dot-segment"),
    pytest.param("./x", id="leading-dot-segment"),
    pytest.param("x/.", id="trailing-dot-segment"),
    pytest.param("a//b", id="double-slash"),
    pytest.param("/", id="slash"),
    pytest.param("a/", id="trailing-slash"),
    pytest.param("", id="empty"),
    pytest.param("   ", id="spaces"),
    pytest.param("Gemm:fused", id="colon"),
    pytest.param("naïve_矩阵", id="non-ascii"),
    pytest.param("tab\there\nnewline", id="control-characters"),
    pytest.param("n" * 300, id="300-valid-chars"),
    pytest.param("/" + "layer/" * 50 + "MatMul", id="300-char-path"),
    pytest.param("a+" * 150, id="300-rejected-chars"),
]


@pytest.fixture(scope="module")
def mlflow_accepts(tmp_path_factory):
    """Whether MLflow takes a metric key (its name characters, path normalization and length): logged to a run of a
    real sqlite store."""
    client = MlflowClient(seed_sqlite_store(tmp_path_factory.mktemp("keys") / "mlflow.db", tmp_path_factory))
    run_id = client.create_run(client.create_experiment("keys")).info.run_id

    def accepts(key: str) -> bool:
        try:
            client.log_metric(run_id, key, 1.0)
        except MlflowException:
            return False
        return True
    return accepts


def test_the_validator_rejects_what_the_facts_say_it_rejects(mlflow_accepts):
    # Guards the helper: if MLflow stopped rejecting these, the tests below would prove nothing.
    for bad in ["/a", "a//b", "..", "a/./b", ".", "a+b", "a=b", "x[0]", "n" * 251]:
        assert not mlflow_accepts(bad), bad
    assert mlflow_accepts("op.MatMul.pct")


@pytest.mark.parametrize("name", NAMES)
def test_sanitized_keys_are_accepted_by_mlflow(name, mlflow_accepts):
    key = sanitize_key(name)
    assert mlflow_accepts(key), key
    assert 0 < len(key) <= MAX_KEY_LENGTH


@pytest.mark.parametrize(
    "name", ["MatMul", "op.MatMul.pct", "latency.p50_ms", "a/b/c", "Gemm:fused", "has space", "h.0-x"]
)
def test_valid_names_are_kept_as_they_are(name):
    assert sanitize_key(name) == name


def test_a_torch_node_name_keeps_its_readable_path():
    key = sanitize_key("/transformer/h.0/attn/MatMul")
    assert key.startswith("transformer/h.0/attn/MatMul_")


@pytest.mark.parametrize(
    "group",
    [
        pytest.param(["a+b", "a=b", "a[b", "a,b", "a_b", "a@b"], id="one-rejected-character"),
        pytest.param(["..", ".", "", "/", "//", " ", "_"], id="names-that-clean-to-nothing"),
        pytest.param(["a/./b", "a/_/b", "a//b", "a/../b"], id="path-segments"),
        pytest.param(["n" * 300, "n" * 299 + "m", "n" * 260], id="long-names-differing-at-the-end"),
    ],
)
def test_names_that_differ_only_in_rejected_characters_do_not_collide(group):
    keys = [sanitize_key(name) for name in group]
    assert len(set(keys)) == len(group), dict(zip(group, keys))


def test_sanitize_key_is_deterministic():
    assert sanitize_key("a+b") == sanitize_key("a+b")


@pytest.mark.parametrize(
    ("prefix", "suffix"),
    [("op", "pct"), ("node", "us_per_run"), ("node.by_run", "calls_per_run")],
    ids=["op-pct", "node-time", "long-prefix-and-suffix"],
)
def test_metric_keys_are_accepted_and_keep_under_250_chars(prefix, suffix, mlflow_accepts):
    names = [p.values[0] for p in NAMES]
    keys = metric_keys(prefix, names, suffix)
    assert list(keys) == names
    for name, key in keys.items():
        assert len(key) <= MAX_KEY_LENGTH, name
        assert key.startswith(f"{prefix}.") and key.endswith(f".{suffix}")
        assert mlflow_accepts(key), key
    assert len(set(keys.values())) == len(names)


def test_metric_keys_of_long_names_that_differ_at_the_end_do_not_collide():
    names = ["/model/" + "block/" * 40 + f"MatMul_{i}" for i in range(3)]
    keys = metric_keys("node", names, "us_per_run")
    assert len(set(keys.values())) == 3
    assert all(len(k) <= MAX_KEY_LENGTH for k in keys.values())


FILE_NAMES = [*NAMES, pytest.param("...", id="three-dots"), pytest.param("a/b\\c", id="both-separators")]


def test_every_pair_of_listed_names_gets_distinct_keys():
    names = [p.values[0] for p in NAMES]
    for a, b in itertools.combinations(names, 2):
        assert sanitize_key(a) != sanitize_key(b), (a, b)


LONG_NAME = "e" * 501  # MLflow's limit is 500 (mlflow.utils.validation.MAX_EXPERIMENT_NAME_LENGTH)


@pytest.mark.parametrize("command", ["profile", "optimize"])
def test_an_experiment_name_over_mlflows_limit_is_refused_before_any_work(store_uri, linear_file, temp_root, capsys,
                                                                          command):
    code, _, err = run_cli(capsys, command, str(linear_file), "--dim", "N=2", "--experiment", LONG_NAME)
    assert_one_line_error(code, err, "experiment name must be at most 500 characters (MLflow's limit), got 501")
    assert run_names(store_uri) == [] and list(temp_root.iterdir()) == []


def test_a_study_refuses_a_long_experiment_name_when_made(temp_root):
    with pytest.raises(ValueError, match="experiment name must be at most 500 characters"):
        Study("s", feeds={}, experiment=LONG_NAME)
    assert list(temp_root.iterdir()) == []


def test_the_experiment_name_limit_is_mlflows():
    assert MAX_EXPERIMENT_NAME_LENGTH == mlflow.utils.validation.MAX_EXPERIMENT_NAME_LENGTH
