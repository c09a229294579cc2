"""Fixtures of tests/report: studies logged as a cluster logs them (`cluster_runs`), on sqlite stores of their own."""

from __future__ import annotations

import pytest

from tests.report.cluster_runs import LOCAL_RUNS, NODES, ONE_TYPE_RUNS, RUNS, LoggedStudy, log_cluster_study


@pytest.fixture(scope="module")
def two_node_types(tmp_path_factory) -> LoggedStudy:
    """RUNS on three nodes of two node types (NODES)."""
    return log_cluster_study(tmp_path_factory, "two_types", RUNS, NODES)


@pytest.fixture(scope="module")
def one_node_type(tmp_path_factory) -> LoggedStudy:
    """ONE_TYPE_RUNS on two nodes of node type cpu-a."""
    return log_cluster_study(tmp_path_factory, "one_type", ONE_TYPE_RUNS, NODES)


@pytest.fixture(scope="module")
def no_node_tags(tmp_path_factory) -> LoggedStudy:
    """LOCAL_RUNS as a local study logs them: no node tags."""
    return log_cluster_study(tmp_path_factory, "local", LOCAL_RUNS, None)
