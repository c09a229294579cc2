"""`tracker upload` finishing a cluster study whose end the store missed: the study run gets the same best per node
type as a study that ended itself (`tracker.best_attempt.node_type.<type>`)."""

from __future__ import annotations

import mlflow
import pytest

from tests.conftest import isolate_mlflow
from tests.report.cluster_runs import BEST, NODES, RUNS, log_cluster_study
from tracker.base.keys import TAG_BEST, TAG_UPLOADED_LATER


@pytest.fixture(autouse=True)
def _outbox(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACKER_OUTBOX", str(tmp_path / "outbox"))


def test_an_uploaded_cluster_study_names_the_best_of_each_node_type(tmp_path_factory, monkeypatch):
    from tracker.upload import _end_study

    study = log_cluster_study(tmp_path_factory, "unfinished", RUNS, NODES, summary=False)
    isolate_mlflow(monkeypatch)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", study.uri)
    assert TAG_BEST not in mlflow.MlflowClient().get_run(study.study_run_id).data.tags  # its end was missed
    assert _end_study(study.study_run_id, saved_metrics={})
    tags = mlflow.MlflowClient().get_run(study.study_run_id).data.tags
    assert tags[TAG_UPLOADED_LATER] == "true"
    per_type = {k.rsplit(".", 1)[-1]: v for k, v in tags.items() if k.startswith(f"{TAG_BEST}.node_type.")}
    assert per_type == BEST, tags
