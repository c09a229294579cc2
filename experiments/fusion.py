"""Study `fusion`: the hand-written EyeLike + Add -> AddEyeLike fusion, under both runtimes.

Model: Y = Add(MatMul(X, Add(A, EyeLike(A))), B), X 4x100, A 100x100 / 10, B 1x100. Attempts:
- reference_baseline / reference_fused: onnx.reference.ReferenceEvaluator, the fused op through a
  custom OpRun (prediction diff must be exactly 0);
- reference_fused_wrong: a deliberately wrong kernel (adds 2*I) that the diff check must reject;
- ort_baseline / ort_fused: ONNX Runtime, the fused op made runnable as a model-local function.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from tracker import EXACT, FP32, SessionConfig, Study
from tracker.experiment_args import add_measure_args, measure_config, session_kwargs, setup_logging
from tracker.termination import handle_sigterm
from tracker.fusions.add_eyelike import WRONG_ADD_EYELIKE, AddEyeLike, fuse_add_eyelike, make_linear_model


def run(args: argparse.Namespace) -> Study:
    model = make_linear_model(n_features=100, seed=args.seed)
    feeds = {"X": np.random.default_rng(args.seed).standard_normal((4, 100)).astype(np.float32)}
    fused = fuse_add_eyelike(model)
    runnable = fuse_add_eyelike(model, as_function=True)
    fusion = {"fusion.AddEyeLike": float(fused.count)}
    session = SessionConfig(**session_kwargs(args))
    with Study("fusion", feeds=feeds, experiment=args.experiment, config=measure_config(args),
               params={"model": "Add(MatMul(X, Add(A, EyeLike(A))), B)", "X.shape": "4x100"}) as study:
        study.attempt("reference_baseline", model, runtime="reference", tolerance=EXACT,
                      description="unfused model under onnx.reference.ReferenceEvaluator")
        study.attempt("reference_fused", fused.model, runtime="reference", new_ops=(AddEyeLike,), tolerance=EXACT,
                      metrics=fusion, params={"fusion.kernel": "AddEyeLike: X + I"},
                      description="EyeLike+Add fused into the custom op AddEyeLike (custom OpRun)")
        study.attempt("reference_fused_wrong", fused.model, runtime="reference", new_ops=(WRONG_ADD_EYELIKE,),
                      tolerance=EXACT, metrics=fusion, params={"fusion.kernel": "deliberately wrong: X + 2I"},
                      description="a wrong AddEyeLike kernel: the diff check must fail")
        # ORT and the reference evaluator differ by float rounding (~1e-6): fp32 tolerance across runtimes.
        study.attempt("ort_baseline", model, session=session, tolerance=FP32,
                      description="unfused model under ONNX Runtime (outputs checked against the reference)")
        study.attempt("ort_fused", runnable.model, session=session, tolerance=EXACT, metrics=fusion,
                      params={"fusion.kernel": "model-local function EyeLike+Add"},
                      description="fused model, AddEyeLike as a model-local function ORT inlines")
    return study


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_measure_args(parser)
    parser.add_argument("--seed", type=int, default=0, help="seed of A, B and X")
    args = parser.parse_args(argv)
    setup_logging()
    handle_sigterm()  # `timeout`, a CI cancel: runs end FAILED, work folders go, exit 143
    run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
