"""What `--cluster` refuses before any work, without a cluster: a malformed address, an unreachable one, Ray not
installed, and what a cluster does not measure yet (a search, a generation scenario)."""

from __future__ import annotations

import socket
import sys

import mlflow
import onnx
import pytest

from tests.models import make_linear_model
from tracker.api import GenerationScenario, Study, StudySetup
from tracker.cli import main
from tracker.cluster import INSTALL_HINT, Address, ClusterError, ray_missing_message
from tracker.cluster.address import import_ray
from tracker.measure.generation.text_scoring import TextCheck
from tracker.studies.own_plan import OwnModelConfig


@pytest.fixture
def model_path(tmp_path):
    path = tmp_path / "linear.onnx"
    onnx.save_model(make_linear_model(n_features=8, seed=0), str(path))
    return path


def _closed_port() -> int:
    with socket.socket() as s:  # a loopback port nothing listens on once the socket is closed
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("text", ["", "localhost", "127.0.0.1:", "127.0.0.1:99999", "http://h:6379", "a b:1"],
                         ids=["empty", "no port", "empty port", "port out of range", "http", "space"])
def test_a_malformed_address_is_refused_naming_it_and_the_forms_expected(text):
    with pytest.raises(ClusterError) as caught:
        Address.parse(text)
    message = str(caught.value)
    assert repr(text) in message and "HOST:PORT" in message and "ray://HOST:PORT" in message
    assert "\n" not in message


@pytest.mark.parametrize(("text", "host", "port"), [
    ("127.0.0.1:6379", "127.0.0.1", 6379), ("ray://head-svc.ns.svc:10001", "head-svc.ns.svc", 10001),
    ("[::1]:6379", "::1", 6379), ("auto", None, None)])
def test_the_addresses_ray_init_takes_are_read(text, host, port):
    assert Address.parse(text) == Address(text, host=host, port=port)


@pytest.mark.parametrize("unreachable", [True, False], ids=["unreachable", "malformed"])
def test_a_cluster_that_cannot_be_used_is_one_error_line_and_no_run(model_path, store, capsys, unreachable):
    address = f"127.0.0.1:{_closed_port()}" if unreachable else "127.0.0.1"

    code = main(["optimize", str(model_path), "--cluster", address, "--experiment", "unreachable"])

    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    if unreachable:
        assert err[0].startswith(f"error: cannot reach the Ray cluster at {address} (") and "ray start --head" in err[0]
    else:
        assert err[0].startswith("error: --cluster '127.0.0.1' is not a Ray address; expected HOST:PORT")
    assert store.search_runs([e.experiment_id for e in store.search_experiments()]) == []  # no work was done


def test_without_ray_the_cluster_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # as if not installed: `import ray` raises ImportError

    with pytest.raises(ClusterError) as caught:
        import_ray()

    assert str(caught.value) == ray_missing_message()
    assert INSTALL_HINT == "pip install 'onnx-optimization-tracker[cluster]'" and INSTALL_HINT in str(caught.value)


def test_a_search_on_a_cluster_is_taken_and_a_malformed_address_still_refused_before_any_work(model_path):
    assert OwnModelConfig(model=model_path, search=True, cluster="127.0.0.1:6379").search
    with pytest.raises(ClusterError, match="127.0.0.1:port"):
        OwnModelConfig(model=model_path, search=True, cluster="127.0.0.1:port")


def test_a_generation_scenario_or_a_text_check_on_a_cluster_is_refused_before_any_work(feeds):
    scenario = GenerationScenario.__new__(GenerationScenario)  # never used: refused before it is read
    check = TextCheck.__new__(TextCheck)
    with pytest.raises(ValueError, match=r"^a generation scenario is not supported on a cluster yet: run it on one"):
        Study("gen", feeds=feeds, setup=StudySetup(generation=scenario), cluster="127.0.0.1:6379")
    with pytest.raises(ValueError, match=r"^a check on real text is not supported on a cluster yet: run it on one"):
        Study("text", feeds=feeds, setup=StudySetup(quality=check), cluster="127.0.0.1:6379")
    assert mlflow.active_run() is None
