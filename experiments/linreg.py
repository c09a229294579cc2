"""Study `linreg`: scikit-learn LinearRegression on the diabetes data, and what ORT does at session start.

Attempts: the skl2onnx model with ORT's default session settings (baseline), the same model with
ORT's graph optimizations disabled, and explicitly enabled (ORT_ENABLE_ALL, the default: an A/A
comparison that shows the noise floor of the speed-up).
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
from sklearn.datasets import load_diabetes
from sklearn.linear_model import LinearRegression
from sklearn.model_selection import train_test_split
from skl2onnx import to_onnx

from tracker import SessionConfig, Study
from tracker.experiment_args import add_measure_args, measure_config, session_kwargs, setup_logging
from tracker.termination import handle_sigterm


def run(args: argparse.Namespace) -> Study:
    X, y = load_diabetes(return_X_y=True)
    X_train, X_test, y_train, y_test = train_test_split(X, y, random_state=11)
    model = LinearRegression().fit(X_train, y_train)
    onx = to_onnx(model, X_train[:1].astype(np.float32), target_opset=18)
    feeds = {onx.graph.input[0].name: X_test.astype(np.float32)}  # the 111 test rows

    def quality(outputs: list[np.ndarray]) -> dict[str, float]:
        pred = outputs[0].ravel().astype(np.float64)
        return {"quality.mse": float(np.mean((pred - y_test) ** 2)), "quality.test_rows": float(len(y_test))}

    threads = session_kwargs(args)
    with Study("linreg", feeds=feeds, experiment=args.experiment, config=measure_config(args), evaluate=quality,
               params={"data": "sklearn diabetes", "split.random_state": "11", "model": "LinearRegression"}) as study:
        study.attempt("baseline", onx, session=SessionConfig(**threads),
                      description="skl2onnx LinearRegression, ORT default session settings")
        study.attempt("ort_opt_disabled", onx, session=SessionConfig(graph_optimization_level="disable", **threads),
                      description="ORT graph optimizations off (ORT_DISABLE_ALL)")
        study.attempt("ort_opt_enabled", onx, session=SessionConfig(graph_optimization_level="all", **threads),
                      description="ORT graph optimizations on (ORT_ENABLE_ALL)")
    return study


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_measure_args(parser)
    args = parser.parse_args(argv)
    setup_logging()
    handle_sigterm()  # `timeout`, a CI cancel: runs end FAILED, work folders go, exit 143
    run(args)  # a failed attempt is logged on its own run; the study itself still succeeded
    return 0


if __name__ == "__main__":
    sys.exit(main())
