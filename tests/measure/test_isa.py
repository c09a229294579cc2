"""The CPU's instruction sets: read from the CPU's flags, logged on the study run
(`machine.isa.*`) and on each attempt (`env.isa`), and printed by `--dry-run`."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from mlflow import MlflowClient

from tests.conftest import FAST_SPEEDUP, seed_sqlite_store
from tests.models import make_linear_model
from tracker import MeasureConfig, Study, TimingConfig
from tracker.cli import main
from tracker.measure.environment import ISA_FLAGS, fingerprint, isa


@pytest.mark.parametrize("flags, expected", [
    ("fpu avx avx2 fma", {"avx2"}),  # an AVX2-only x86 (FACTS: some of the project's VMs)
    ("avx2 avx512f avx512bw avx512_vnni avx_vnni", {"avx2", "avx512", "avx512_vnni", "avx_vnni"}),
    ("avx2 avx512f avx512_vnni amx_tile amx_int8 amx_bf16", {"avx2", "avx512", "avx512_vnni", "amx_int8"}),
    ("fp asimd asimddp i8mm sve", {"arm_dotprod", "arm_i8mm"}),  # Linux on an Arm Neoverse
    ("hw.optional.arm.FEAT_DotProd hw.optional.arm.FEAT_I8MM", {"arm_dotprod", "arm_i8mm"}),  # macOS on Apple M2
    ("", set()),
])
def test_each_instruction_set_is_read_from_its_flags(flags, expected):
    found = isa(frozenset(flags.split()))
    assert set(found) == set(ISA_FLAGS)
    assert {name for name, has in found.items() if has} == expected


def test_this_machine_is_read_from_its_own_cpuinfo_flags():
    cpuinfo = Path("/proc/cpuinfo")
    if not cpuinfo.is_file():
        pytest.skip("no /proc/cpuinfo")
    line = next((line for line in cpuinfo.read_text().splitlines() if line.startswith(("flags", "Features"))), "")
    flags = set(line.partition(":")[2].split())
    found = isa()
    assert found["avx2"] == ("avx2" in flags) and found["avx512"] == ("avx512f" in flags)
    assert found["avx512_vnni"] == ("avx512_vnni" in flags) and found["amx_int8"] == ("amx_int8" in flags)
    listed = fingerprint()["env.isa"]
    assert listed == (",".join(name for name, has in found.items() if has) or "none known")


@pytest.mark.slow
def test_the_study_run_holds_each_instruction_set_and_dry_run_prints_them(tmp_path, monkeypatch, tmp_path_factory,
                                                                          capsys):
    uri = seed_sqlite_store(tmp_path / "mlflow.db", tmp_path_factory)
    monkeypatch.setenv("TRACKER_OUTBOX", str(tmp_path / "outbox"))
    monkeypatch.chdir(tmp_path)
    feeds = {"X": np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)}
    config = MeasureConfig(profile_runs=3, speedup=FAST_SPEEDUP,
                           timing=TimingConfig(warmup_runs=1, min_runs=3, min_seconds=0.0), trace_levels=(1,))
    with Study("isa", feeds=feeds, config=config, tracking_uri=uri, experiment="isa", log_models=False) as study:
        study.attempt("baseline", make_linear_model(n_features=4))
    params = MlflowClient(uri).get_run(study.run.info.run_id).data.params
    assert {k: v for k, v in params.items() if k.startswith("machine.isa.")} == {
        f"machine.isa.{name}": str(has).lower() for name, has in isa().items()}

    import onnx

    onnx.save(make_linear_model(n_features=4), str(tmp_path / "linear.onnx"))
    assert main(["optimize", str(tmp_path / "linear.onnx"), "--dry-run"]) == 0
    machine = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("machine: "))
    assert machine.endswith("instruction sets: " + (", ".join(n for n, has in isa().items() if has) or "none known"))
