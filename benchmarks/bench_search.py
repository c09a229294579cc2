"""Is the search's answer the exhaustive one, and how much sooner? For a MiniLM-shaped encoder (24 candidates), a
ResNet-18-shaped CNN at batch 4 (26) and tiny GPT-2 (8), each candidate of the space is also measured in full by an
exhaustive study. Prints how many candidates the search considered, screened out and timed, its seconds per stage,
its best against the exhaustive best, its wall time against the exhaustive one's, and when the eventual winner
first led the search's screen.

    python benchmarks/bench_search.py                      # all three models, about 35 minutes on 2 cores
    python benchmarks/bench_search.py --models cnn --keep  # one model; keep the sqlite store to look at

The found best agrees when it is the exhaustive best, or when its own full speed-up (measured by the exhaustive
study) lies inside the exhaustive best's interval: within the noise, the two are the same answer. It ties when the two
intervals overlap: the exhaustive study cannot tell them apart either (variants that differ only in their scales'
values, as calibration methods do, run the same graph). The search must take at most 40 % of the exhaustive time
(issue 33); the exit code is 1 when a model disagrees or is slower.
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from tracker.api import Study
from tracker.measure.accuracy.task_diff import task_tolerances
from tracker.measure.inputs.feeds import make_feeds
from tracker.optimize.model_info import detect
from tracker.report.rows import pick_best
from tracker.run.content import rows_from_results
from tracker.search import SearchConfig
from tracker.search.space import candidates

# Every candidate of each space is measured in full by the exhaustive study.
SPACES = {
    "encoder": {"int8_dynamic": {"per_channel": (False, True), "weight_type": ("QInt8", "QUInt8"),
                                 "reduce_range": (False, True), "op_types": ("all", "MatMul")},
                "int4_block32": {"block_size": (32, 128), "accuracy_level": (0, 4), "symmetric": (True, False)}},
    # The static int8 entry's own search space (3 calibrations x per-channel x QDQ/QOperator x S8S8/U8S8, after
    # quant_pre_process), and dynamic int8, which loses on a CNN.
    "cnn": {"int8_static_minmax": {"calibration": ("minmax", "entropy", "percentile"), "per_channel": (False, True),
                                   "format": ("QDQ", "QOperator"), "activation_type": ("QInt8", "QUInt8")},
            "int8_dynamic": {"per_channel": (False, True), "weight_type": ("QInt8",), "reduce_range": (False,),
                             "op_types": ("all",)}},
    "gpt2": {"int8_dynamic": {"per_channel": (False, True), "weight_type": ("QInt8",), "reduce_range": (False, True),
                              "op_types": ("all",)},
             "int4_block32": {"block_size": (32,), "accuracy_level": (0, 4), "symmetric": (True,)}},
}
TASKS = {"encoder": "embedding", "cnn": "classification", "gpt2": "lm"}


@dataclass
class Outcome:
    model: str
    found: str | None
    found_speedup: float | None
    found_interval: tuple[float, float] | None  # the found best's, measured by the exhaustive study
    exhaustive: str | None
    exhaustive_interval: tuple[float, float] | None
    counts: dict[str, int]
    stage_seconds: dict[str, float]
    search_s: float
    exhaustive_s: float
    first_led_s: float | None  # seconds into the search when the found best first led its screen

    @property
    def quick(self) -> bool:
        return self.search_s <= 0.4 * self.exhaustive_s

    @property
    def agrees(self) -> bool:
        if self.found == self.exhaustive:
            return True
        if self.found_speedup is None or self.exhaustive_interval is None:
            return False
        low, high = self.exhaustive_interval
        return low <= self.found_speedup <= high

    @property
    def ties(self) -> bool:
        """The found best's interval and the exhaustive best's overlap: the exhaustive study itself cannot tell them
        apart (two variants that differ only in their scales' values, as calibration methods do, time alike)."""
        if self.found_interval is None or self.exhaustive_interval is None:
            return False
        return self.found_interval[0] <= self.exhaustive_interval[1] and self.exhaustive_interval[0] <= self.found_interval[1]

    @property
    def judgement(self) -> str:
        if self.found == self.exhaustive:
            return "AGREES (the same candidate)"
        if self.agrees:
            return "AGREES (inside the exhaustive best's interval)"
        return "TIES (the intervals overlap)" if self.ties else "DISAGREES"


def make_encoder(folder: Path) -> Path:
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536)
    model = BertModel(config, add_pooling_layer=False).eval()

    class Hidden(torch.nn.Module):
        def forward(self, input_ids, attention_mask, token_type_ids):
            return model(input_ids=input_ids, attention_mask=attention_mask,
                         token_type_ids=token_type_ids).last_hidden_state

    names = ("input_ids", "attention_mask", "token_type_ids")
    example = (torch.randint(0, 1000, (1, 16)), torch.ones(1, 16, dtype=torch.int64),
               torch.zeros(1, 16, dtype=torch.int64))
    seq = torch.export.Dim("seq", max=512)
    program = torch.onnx.export(Hidden(), example, dynamo=True, input_names=list(names),
                                output_names=["last_hidden_state"], dynamic_shapes={n: {1: seq} for n in names})
    path = folder / "encoder.onnx"
    program.save(str(path), external_data=True)
    return path


def make_cnn(folder: Path) -> Path:
    """A ResNet-18-shaped CNN from torch.nn (torchvision's layout: BasicBlocks [2, 2, 2, 2], 64 to 512 channels,
    11.7 M parameters; torchvision's wheel does not load against the CPU torch here), batch 4, 224 x 224."""
    import torch
    from torch import nn

    torch.manual_seed(0)

    class Block(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int) -> None:
            super().__init__()
            self.c1, self.b1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout)
            self.c2, self.b2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout)
            self.down = None if stride == 1 and cin == cout else nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x):
            y = self.b2(self.c2(torch.relu(self.b1(self.c1(x)))))
            return torch.relu(y + (x if self.down is None else self.down(x)))

    layers, cin = [], 64
    for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        layers += [Block(cin, cout, stride), Block(cout, cout, 1)]
        cin = cout
    net = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(3, 2, 1),
                        *layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, 1000)).eval()
    for module in net.modules():  # BatchNorm statistics that look trained
        if isinstance(module, nn.BatchNorm2d):
            module.running_mean.uniform_(-0.1, 0.1)
            module.running_var.uniform_(0.5, 1.5)
    path = folder / "cnn.onnx"
    torch.onnx.export(net, (torch.randn(4, 3, 224, 224),), str(path), input_names=["image"], output_names=["logits"],
                      dynamo=True, external_data=False)
    return path


def make_gpt2(folder: Path) -> Path:
    from tracker.gpt2.export import export_gpt2
    from tracker.gpt2.model import load_gpt2

    return export_gpt2(load_gpt2(size="tiny", seed=0), folder / "gpt2.onnx", exporter="dynamo").path


MAKERS = {"encoder": make_encoder, "cnn": make_cnn, "gpt2": make_gpt2}
DIMS = {"encoder": {"seq": 128}, "cnn": {}, "gpt2": {"batch": 1, "seq": 32}}


def bench(name: str, folder: Path) -> Outcome:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        path = MAKERS[name](folder)
    graph = onnx.load_model(str(path), load_external_data=False)
    feeds = make_feeds(graph, dims=DIMS[name], seed=0)
    info = detect(graph).info
    tolerance = task_tolerances(TASKS[name])
    space = SPACES[name]
    config = SearchConfig(entries=tuple(space), knobs=space, max_chains=0)

    start = time.perf_counter()
    with Study(f"{name}-search", feeds=feeds, experiment="bench-search", log_models=False) as study:
        result = study.search(path, config=config, info=info, tolerance=tolerance)
        found = study.best
    search_s = time.perf_counter() - start

    start = time.perf_counter()
    from tracker.optimize import Context

    every, _ = candidates(graph, Context(info=info, feeds=feeds), entries=tuple(space), knobs=space)
    with Study(f"{name}-exhaustive", feeds=feeds, experiment="bench-search", log_models=False) as exhaustive:
        exhaustive.attempt("baseline", path, tolerance=tolerance["fp32"])
        for entry in every:
            exhaustive.optimize(entry, path, info=info, tolerance=tolerance)
        rows = rows_from_results(exhaustive.results, tables=False)
    exhaustive_s = time.perf_counter() - start
    best_name = pick_best(rows)
    by_name = {r.attempt: r for r in rows}
    best = by_name.get(best_name)
    found_name = found.attempt.name if found is not None else None
    # A fallback variant is not in the exhaustive space: its own full speed-up, from the search, stands in.
    found_row = by_name.get(found_name) or next(
        (r for r in rows_from_results(study.results, tables=False) if r.attempt == found_name), None)
    return Outcome(
        model=name, found=found_name,
        found_speedup=found_row.speedup if found_row is not None else None,
        found_interval=(found_row.speedup_ci_low, found_row.speedup_ci_high)
        if found_row is not None and found_row.speedup_ci_low is not None else None,
        exhaustive=best_name,
        exhaustive_interval=(best.speedup_ci_low, best.speedup_ci_high) if best is not None and best.speedup else None,
        counts=result.counts(), stage_seconds={k: v for k, v in result.stage_seconds.items() if v},
        search_s=search_s, exhaustive_s=exhaustive_s,
        first_led_s=result.first_led(found_name) if found_name is not None else None,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="encoder,cnn,gpt2", help="comma-separated: encoder, cnn, gpt2")
    parser.add_argument("--keep", action="store_true", help="keep the work folder and its sqlite store")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    logging.getLogger("tracker.search").setLevel(logging.INFO)
    folder = Path(tempfile.mkdtemp(prefix="bench-search-"))
    import os

    os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{folder / 'mlflow.db'}"
    outcomes = []
    for name in args.models.split(","):
        work = folder / name
        work.mkdir()
        outcomes.append(bench(name.strip(), work))
        o = outcomes[-1]
        interval = (f"[{o.exhaustive_interval[0]:.3f}, {o.exhaustive_interval[1]:.3f}]"
                    if o.exhaustive_interval else "-")
        speed = f"{o.found_speedup:.3f}" if o.found_speedup is not None else "-"
        print(f"{o.model}: considered {o.counts['considered']}, screened out {o.counts['screened_out']}, "
              f"timed {o.counts['timed']}; search {o.search_s:.0f} s "
              f"({', '.join(f'{k} {v:.0f} s' for k, v in o.stage_seconds.items())}), exhaustive {o.exhaustive_s:.0f} s: "
              f"{o.search_s / o.exhaustive_s:.0%} of it ({'within' if o.quick else 'OVER'} 40 %)")
        led = "never led the screen" if o.first_led_s is None else f"first led the screen {o.first_led_s:.0f} s in"
        found_interval = (f" [{o.found_interval[0]:.3f}, {o.found_interval[1]:.3f}]" if o.found_interval else "")
        print(f"  found {o.found} ({speed}x{found_interval} in the exhaustive study; {led}); exhaustive best "
              f"{o.exhaustive} {interval}: {o.judgement}", flush=True)
    if args.keep:
        print(f"store: sqlite:///{folder / 'mlflow.db'}")
    else:
        import shutil

        shutil.rmtree(folder, ignore_errors=True)
    raise SystemExit(0 if all((o.agrees or o.ties) and o.quick for o in outcomes) else 1)


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
