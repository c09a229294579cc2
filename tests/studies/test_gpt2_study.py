"""The GPT-2 study on a tiny config: `mlflow run -e gpt2` end to end, and a corrupted model rejected."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from mlflow import MlflowClient

from tests.conftest import FAST_SPEEDUP, use_sqlite_store
from tests.studies.conftest import study_runs
from tests.studies.test_studies import artifact_paths
from tracker import MeasureConfig, Study, TimingConfig
from tracker.measure.accuracy.lm_diff import LOGITS_FP32
from tracker.studies.gpt2 import DEFAULT_ATTEMPTS

pytest.importorskip("torch")
pytest.importorskip("transformers")



@pytest.mark.slow
@pytest.mark.subprocess
def test_the_gpt2_study_logs_the_baseline_and_every_attempt_with_its_evidence(main_store):
    client = main_store
    runs = study_runs(client, "gpt2")
    assert set(runs) == {"gpt2", "baseline", *DEFAULT_ATTEMPTS}
    parent = runs["gpt2"]
    assert parent.data.tags["tracker.weights"] == "random (seeded), not pretrained"
    assert parent.data.tags["tracker.best_attempt"] in runs
    assert parent.data.params["export.exporter"] == "dynamo"
    baseline = runs["baseline"].data
    assert baseline.metrics["export.torch_passed"] == 1.0
    assert baseline.metrics["export.torch_max_abs"] < 1e-4
    for name in ("baseline", *DEFAULT_ATTEMPTS):
        run = runs[name]
        assert run.info.status == "FINISHED", run.data.tags.get("tracker.error")
        assert run.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert run.data.tags["tracker.weights"] == "random (seeded), not pretrained"
        metrics = run.data.metrics
        for key in ("latency.s8.p50_ms", "latency.s16.p50_ms", "latency.p50_ms", "latency.speedup",
                    "latency.speedup_ci_low", "latency.speedup_ci_high", "diff.max_abs", "diff.top1_agreement",
                    "diff.kl_divergence", "diff.passed", "graph.node_count", "graph.reshape_removed",
                    "model.size_bytes"):
            assert key in metrics, f"{name} lacks {key}"
        assert run.data.tags["tracker.verdict"] in ("baseline", "better", "worse", "same", "inconclusive", "rejected")
    basic = runs["ort_opt_basic"].data
    assert basic.metrics["fusion.SkipLayerNormalization"] == 4  # 2 layers x 2
    assert basic.metrics["fusion.FastGelu"] == 2
    assert basic.metrics["graph.delta.com.microsoft:SkipLayerNormalization.nodes"] == 4
    assert basic.params["diff.tolerance"] == "fp32"
    assert runs["attention_fused"].data.metrics["fusion.MultiHeadAttention"] == 2
    assert runs["ort_opt_fp16"].data.params["diff.tolerance"] == "fp16"
    assert runs["int8_dynamic"].data.params["diff.tolerance"] == "int8"
    paths = artifact_paths(client, runs["attention_fused"].info.run_id)
    assert {"tables/op_diff.csv", "tables/ops_by_layer.csv", "tables/graph_diff.csv", "charts/profile.html",
            "profile/ort_profile.json"} <= paths


@pytest.fixture(scope="module")
def tiny_export(tiny_gpt2_export):
    return tiny_gpt2_export("dynamo")


@pytest.mark.slow
def test_a_corrupted_model_fails_the_accuracy_check_and_is_rejected(tiny_export, tmp_path, monkeypatch,
                                                                     tmp_path_factory):
    uri = use_sqlite_store(tmp_path, monkeypatch, tmp_path_factory)
    corrupted = onnx.load(str(tiny_export.path))
    largest = max(corrupted.graph.initializer, key=lambda t: np.prod(t.dims))
    weights = onnx.numpy_helper.to_array(largest)
    largest.CopyFrom(onnx.numpy_helper.from_array(weights * 1.5, largest.name))
    tokens = {"input_ids": np.random.default_rng(0).integers(0, 1000, (1, 8), dtype=np.int64)}
    config = MeasureConfig(profile_runs=3, speedup=FAST_SPEEDUP,
                           timing=TimingConfig(warmup_runs=1, min_runs=3, min_seconds=0))
    with Study("gpt2", feeds=tokens, experiment="corrupt", config=config, log_models=False) as study:
        study.attempt("baseline", tiny_export.path, tolerance=LOGITS_FP32)
        bad = study.attempt("corrupted", corrupted, tolerance=LOGITS_FP32)
    assert bad.ok and not bad.diff.passed
    assert bad.diff.max_abs > LOGITS_FP32.max_abs
    client = MlflowClient(tracking_uri=uri)
    run = client.get_run(bad.run_id)
    assert run.data.metrics["diff.passed"] == 0.0
    assert run.data.tags["tracker.verdict"] == "rejected"
    assert client.get_run(study.run.info.run_id).data.tags["tracker.best_attempt"] == "baseline"


# --- the generation scenario ----------------------------------------------------------------------


def _generation_study(**overrides):
    from tracker.measure.generation.generation import GenerationConfig
    from tracker.studies.gpt2 import GPT2StudyConfig

    timing = TimingConfig(warmup_runs=1, min_runs=3, min_seconds=0)
    fields = dict(
        size="tiny", seq_lens=(8, 16), headline_seq=8, attempts=("ort_opt_basic", "attention_fused"),
        scenarios=("forward", "generation"),
        measure=MeasureConfig(profile_runs=3, speedup=FAST_SPEEDUP, timing=timing),
        generation=GenerationConfig(prefill_lens=(8, 32), decode_past_lens=(8, 32), prompt_len=8, new_tokens=16,
                                    generation_runs=1, speedup_past_len=32, speedup_prefill_len=32, roofline_runs=3,
                                    timing=timing),
    )
    return GPT2StudyConfig(**{**fields, **overrides})


@pytest.mark.slow
def test_the_generation_scenario_adds_gen_metrics_to_the_baseline_and_to_every_attempt(tmp_path, monkeypatch,
                                                                                       tmp_path_factory):
    from tracker.studies.gpt2 import run_gpt2_study

    uri = use_sqlite_store(tmp_path, monkeypatch, tmp_path_factory)
    study = run_gpt2_study(_generation_study(), experiment="gen", workdir=tmp_path / "work")
    client = MlflowClient(tracking_uri=uri)
    runs = {r.info.run_name: r.data for r in client.search_runs([client.get_experiment_by_name("gen").experiment_id])}
    assert set(runs) == {"gpt2", "baseline", "ort_opt_basic", "attention_fused"}
    assert runs["gpt2"].params["scenarios"] == "forward,generation"
    assert runs["gpt2"].params["gen.decode_past_lens"] == "8,32"
    baseline = runs["baseline"].metrics
    assert baseline["export.decoder_torch_passed"] == 1.0 and baseline["export.decoder_torch_max_abs"] < 1e-3
    assert baseline["gen.token_agreement"] == 1.0 and baseline["gen.first_step_kl"] == pytest.approx(0, abs=1e-12)
    assert "gen.decode.past32.speedup" not in baseline  # the baseline is not timed against itself
    # the machine's memory bandwidth read beside every generation: a memory-bound ratio moves with it
    assert all(runs[name].metrics["gen.machine_bandwidth_gbps"] > 0.5 for name in ("baseline", "ort_opt_basic",
                                                                                     "attention_fused"))
    assert baseline["gen.diff.passed"] == 1.0
    for name in ("baseline", "ort_opt_basic", "attention_fused"):
        metrics = runs[name].metrics
        for key in ("gen.prefill.s8.p50_ms", "gen.prefill.s32.p50_ms", "gen.decode.past8.p50_ms",
                    "gen.decode.past32.p50_ms", "gen.ttft_ms", "gen.tokens_per_s", "latency.p50_ms"):
            assert metrics[key] > 0, f"{name}: {key}"
    for name in ("ort_opt_basic", "attention_fused"):
        metrics = runs[name].metrics
        assert "gen.error" not in runs[name].params, runs[name].params.get("gen.error")
        assert metrics["gen.token_agreement"] == 1.0  # fp32 fusions do not change a greedy token
        for prefix in ("gen.decode.past32.", "gen.prefill.s32."):
            assert metrics[prefix + "speedup_ci_low"] <= metrics[prefix + "speedup"] <= metrics[prefix + "speedup_ci_high"]
            assert metrics[prefix + "roofline.matmuls.pct_peak"] > 0  # each phase costed against the study's roofs
        assert metrics["gen.diff.passed"] == 1.0 and runs[name].params["gen.diff.tolerance"] == "fp32"
    assert runs["ort_opt_basic"].metrics["gen.fusion.SkipLayerNormalization"] == 4  # 2 layers x 2, as forward
    assert runs["attention_fused"].metrics["gen.fusion.MultiHeadAttention"] >= 1
    # The study names the best attempt of each scenario, and its report shows the phases.
    bests = study.scenario_bests
    assert set(bests) == {"forward", "prefill", "decode"} and bests["forward"] == study.best.attempt.name
    tags = runs["gpt2"].tags
    for phase in ("prefill", "decode"):
        assert tags[f"tracker.best_attempt.{phase}"] == bests[phase]
        assert bests[phase] in {"baseline", "ort_opt_basic", "attention_fused"}
    parent = client.get_run(study.run.info.run_id)
    folder = client.download_artifacts(parent.info.run_id, "report", str(tmp_path / "report"))
    page = (Path(folder) / "study_report.html").read_text()
    assert "Scenarios: forward, prefill and decode" in page and "Prefill and decode: the 3 slowest op types" in page
    scenarios = json.loads((Path(folder) / "scenarios.json").read_text())
    assert [row[0] for row in scenarios["data"]] == ["forward", "prefill", "decode"]
    generation = json.loads((Path(folder) / "generation.json").read_text())
    assert len(generation["data"]) == 2 * 3  # three attempts, two phases
    # `tracker compare` reads the same bests back from the runs.
    from tracker.compare import format_table, load_comparison

    text = format_table(load_comparison(study_run_id=study.run.info.run_id))
    assert f"decode (one token after a past of 32): best {bests['decode']}" in text
    assert f"prefill (the prompt pass of 32 tokens): best {bests['prefill']}" in text


@pytest.mark.slow
def test_a_family_the_rewrites_do_not_know_gets_the_forward_attempts_and_the_reason_there_is_no_generation(
        tmp_path, monkeypatch, tmp_path_factory):
    from tests.gpt2.test_families import TINY_GEMMA3
    from tracker.studies.gpt2 import run_gpt2_study

    uri = use_sqlite_store(tmp_path, monkeypatch, tmp_path_factory)
    config_path = tmp_path / "gemma3.json"
    config_path.write_text(json.dumps({"model_type": "gemma3_text", **TINY_GEMMA3}))
    study = run_gpt2_study(_generation_study(size="small", config_path=str(config_path),
                                             attempts=("ort_opt_basic", "int8_dynamic")),
                           experiment="gemma", workdir=tmp_path / "work")
    client = MlflowClient(tracking_uri=uri)
    runs = {r.info.run_name: r.data for r in client.search_runs([client.get_experiment_by_name("gemma").experiment_id])}
    assert set(runs) == {"gpt2", "baseline", "ort_opt_basic", "int8_dynamic"}
    params = runs["gpt2"].params
    assert params["lm.family"] == "gemma3_text" and params["lm.family_known"] == "false"
    assert "generation scenario does not apply" in params["gen.skipped"] and "attention_fused" in params["gen.skipped"]
    assert "gen.decode_past_lens" not in params
    for name in ("baseline", "int8_dynamic"):  # the generic attempts are measured, on the forward pass only
        metrics = runs[name].metrics
        assert metrics["latency.p50_ms"] > 0 and not any(key.startswith("gen.") for key in metrics), name
    assert runs["baseline"].metrics["export.torch_passed"] == 1.0
    # ORT's transformer optimizer was written for other graphs: its attempt fails, saying so
    assert "ORT's transformer optimizer has no fusions" in runs["ort_opt_basic"].tags["tracker.error"]
    assert set(study.scenario_bests) == {"forward"}


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        pytest.param({"scenarios": ("generation",)}, "forward included", id="no-forward"),
        pytest.param({"scenarios": ("forward", "chat")}, "some of", id="unknown-scenario"),
        pytest.param({"scenarios": ("forward",), "search": True}, "add --scenarios forward,generation",
                     id="search-without-generation"),
        pytest.param({"budget_s": 60.0}, "add --search", id="budget-without-search"),
    ],
)
def test_the_study_config_refuses_scenarios_it_cannot_run(overrides, match):
    with pytest.raises(ValueError, match=match):
        _generation_study(**overrides)


def test_a_past_longer_than_the_model_holds_is_refused_before_anything_is_exported(tmp_path, monkeypatch):
    from tracker.measure.generation.generation import GenerationConfig
    from tracker.studies.gpt2 import run_gpt2_study

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    config = _generation_study(generation=GenerationConfig(speedup_past_len=None))  # past 512 > tiny's 256
    with pytest.raises(ValueError, match="256 positions"):
        run_gpt2_study(config, experiment="gen", workdir=tmp_path / "work")
    assert not (tmp_path / "work" / "baseline").exists()


def test_the_command_line_chooses_scenarios_and_past_lengths():
    import argparse

    from experiments.gpt2 import add_gpt2_args, gpt2_config
    from tracker.experiment_args import add_measure_args

    parser = argparse.ArgumentParser()
    add_measure_args(parser)
    add_gpt2_args(parser)
    default = gpt2_config(parser.parse_args([]))
    assert default.scenarios == ("forward",)
    assert default.generation.decode_past_lens == (32, 128, 512) and default.generation.speedup_past_len == 512
    chosen = gpt2_config(parser.parse_args(["--scenarios", "generation,forward", "--gen-past-lens", "8,32"]))
    assert chosen.scenarios == ("forward", "generation")
    assert chosen.generation.decode_past_lens == (8, 32) and chosen.generation.speedup_past_len == 32
    assert default.search is False and default.budget_s is None
    searched = gpt2_config(parser.parse_args(["--scenarios", "forward,generation", "--search", "--budget", "20m"]))
    assert searched.search is True and searched.budget_s == 1200.0 and searched.attempt_names == ()
    assert gpt2_config(parser.parse_args(["--search", "false", "--budget", ""])).search is False  # MLproject's


@pytest.mark.slow
def test_the_decode_search_logs_its_leaders_as_attempts_and_the_rest_as_candidate_runs(tmp_path, monkeypatch,
                                                                                       tmp_path_factory):
    from tracker.search.decode import DecodeSpace
    from tracker.studies.gpt2 import run_gpt2_study

    uri = use_sqlite_store(tmp_path, monkeypatch, tmp_path_factory)
    config = _generation_study(attempts=None, search=True,
                               decode_space=DecodeSpace(weights=("int4_block32",), sessions=("io_binding", "")))

    study = run_gpt2_study(config, experiment="gen", workdir=tmp_path / "work")

    client = MlflowClient(tracking_uri=uri)
    runs = client.search_runs([client.get_experiment_by_name("gen").experiment_id])
    attempts = {r.info.run_name: r.data for r in runs if r.data.tags.get("tracker.role") != "candidate"}
    candidates = [r.data for r in runs if r.data.tags.get("tracker.role") == "candidate"]
    rows = study.search_result.rows
    assert len(rows) == 2 * 2  # cache x settings
    leaders = {r.name for r in rows if r.status == "timed"}
    assert 1 <= len(leaders) <= 3 and set(attempts) == {"gpt2", "baseline", *leaders}
    for name in leaders:  # measured in full: the forward pass, and the decode against the baseline's
        assert attempts[name].metrics["gen.decode.past32.speedup_ci_low"] > 0
        assert attempts[name].tags["tracker.search.stage"] == "speed_screen"
    assert len(candidates) == sum(r.screen_speedup is not None and r.status != "timed" for r in rows) > 0
    assert all("gen.token_agreement" in c.metrics and c.metrics["search.screen_speedup"] > 0 for c in candidates)
    study_run = attempts["gpt2"]
    assert study_run.metrics["search.considered"] == 4.0
    assert "report/search.html" in artifact_paths(client, study.run.info.run_id, "report")
    assert study.scenario_bests["decode"] in leaders | {"baseline"}


# --- a LLaMA-family folder ------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_study_runs_on_a_local_llama_folder_with_generation(tmp_path, monkeypatch, tmp_path_factory):
    from tests.gpt2.tiny_llama import save_tiny_llama
    from tracker.studies.gpt2 import run_gpt2_study

    folder = save_tiny_llama(tmp_path / "tiny-llama")
    uri = use_sqlite_store(tmp_path, monkeypatch, tmp_path_factory)
    config = _generation_study(model=str(folder), attempts=("int4_block32",))
    run_gpt2_study(config, experiment="llama", workdir=tmp_path / "work")
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("llama")
    runs = {r.info.run_name: r for r in client.search_runs([experiment.experiment_id])}
    assert set(runs) == {"gpt2", "baseline", "int4_block32"}
    parent = runs["gpt2"].data
    assert parent.params["lm.family"] == "llama" and parent.params["lm.kv_heads"] == "2"
    assert parent.params["lm.source"] == f"local:{folder}" and parent.tags["tracker.weights"] == "pretrained"
    baseline = runs["baseline"].data.metrics
    assert baseline["export.torch_passed"] == 1.0 and baseline["export.decoder_torch_passed"] == 1.0
    assert baseline["export.decoder_tokens_match"] == 1.0
    int4 = runs["int4_block32"].data
    assert runs["int4_block32"].info.status == "FINISHED", int4.tags.get("tracker.error")
    assert "gen.error" not in int4.params, int4.params.get("gen.error")
    for key in ("gen.decode.past32.p50_ms", "gen.decode.past32.speedup", "gen.tokens_per_s", "latency.p50_ms"):
        assert int4.metrics[key] > 0, key


@pytest.mark.parametrize(
    ("case", "fragments"),
    [
        pytest.param("bert", ["holds a bert model (BertForMaskedLM)", "supported: gpt2", "llama"], id="bert-folder"),
        pytest.param("no-config", ["no causal LM config is available offline", "config.json"], id="no-config"),
        pytest.param("long-seq", ["the model has 256 positions", "seq_lens (8, 300)"], id="seq-longer-than-positions"),
        pytest.param("long-past", ["the model has 256 positions", "the longest past plus one token"],
                     id="past-longer-than-positions"),
    ],
)
def test_the_command_line_refuses_a_model_it_cannot_run_in_one_line_before_any_work(tmp_path, monkeypatch, capsys,
                                                                                    case, fragments):
    from transformers import BertConfig

    from experiments.gpt2 import main
    from tests.gpt2.tiny_llama import save_tiny_llama

    folder = tmp_path / "model"
    folder.mkdir()
    argv = ["--model", str(folder)]
    if case == "bert":
        BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                   architectures=["BertForMaskedLM"]).save_pretrained(folder)
    elif case != "no-config":
        save_tiny_llama(folder, weights=False)  # the config alone: the lengths are checked before any weight is read
        argv += ["--seq-lens", "8,300", "--headline-seq", "8"] if case == "long-seq" else ["--scenarios", "forward,generation"]
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    code = main(argv)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error: ")]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    for fragment in fragments:
        assert fragment in lines[0]
    assert not (tmp_path / "mlflow.db").exists()  # no store opened, no run started
