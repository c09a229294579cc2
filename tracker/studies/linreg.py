"""Study `linreg`: scikit-learn LinearRegression on the diabetes data, and what ORT does at session start.

Attempts: the skl2onnx model with ORT's default session settings (baseline), then the registry's session
entries: ORT's graph optimizations disabled, and explicitly enabled (ORT_ENABLE_ALL, the default: an A/A
comparison that shows the noise floor of the speed-up).
"""

from __future__ import annotations

import numpy as np

from tracker.api import Study, StudySetup
from tracker.measure.attempt import MeasureConfig
from tracker.measure.runtimes.ort_runtime import SessionConfig

ATTEMPTS = ("ort_opt_disabled", "ort_opt_enabled")


def run(*, experiment: str | None = None, measure: MeasureConfig | None = None,
        session: SessionConfig | None = None, cluster: str | None = None, register: str | None = None) -> Study:
    """Trains the model, converts it with skl2onnx and logs the baseline and the session attempts (measured on the
    Ray cluster at `cluster`, if given); with `register`, the best becomes a version of that registered model."""
    from skl2onnx import to_onnx
    from sklearn.datasets import load_diabetes
    from sklearn.linear_model import LinearRegression
    from sklearn.model_selection import train_test_split

    X, y = load_diabetes(return_X_y=True)
    X_train, X_test, y_train, y_test = train_test_split(X, y, random_state=11)
    model = LinearRegression().fit(X_train, y_train)
    onx = to_onnx(model, X_train[:1].astype(np.float32), target_opset=18)
    feeds = {onx.graph.input[0].name: X_test.astype(np.float32)}  # the 111 test rows

    def quality(outputs: list[np.ndarray]) -> dict[str, float]:
        pred = outputs[0].ravel().astype(np.float64)
        return {"quality.mse": float(np.mean((pred - y_test) ** 2)), "quality.test_rows": float(len(y_test))}

    session = session or SessionConfig()
    with Study("linreg", feeds=feeds, experiment=experiment, config=measure, setup=StudySetup(evaluate=quality), register=register,
               cluster=cluster, params={"data": "sklearn diabetes", "split.random_state": "11", "model": "LinearRegression"}) as study:
        study.attempt("baseline", onx, session=session,
                      description="skl2onnx LinearRegression, ORT default session settings")
        for entry in ATTEMPTS:
            study.optimize(entry, onx, session=session)
    return study
