"""Browser-test fixtures: a small real study in a temporary store, `mlflow server` on it, headless Chromium.

Chromium is Debian's (`apt-get install chromium`), driven by Python playwright through
`executable_path`: no browser download. Without them the tests skip, except under CI (`CI` set), where
a missing browser is a failure: the UI must be checked there.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import mlflow
import numpy as np
import pytest

from tests.conftest import FAST_SPEEDUP, isolate_mlflow, new_sqlite_store
from tracker.server.mlflow_server import LocalMlflowServer

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
EXPERIMENT = "browser-ui"
STUDY = "tiny-linear"
SERVER_START_S = 120  # `mlflow server` takes 20-30 s to answer on a busy 2-core machine


@dataclass(frozen=True)
class StudyStore:
    """The store a study wrote: where it is and the ids a test navigates to."""

    name: str
    uri: str
    folder: Path
    experiment_id: str
    study_run_id: str
    attempt_run_ids: dict[str, str]
    p50_ms: dict[str, float]
    verdicts: dict[str, str]

    @property
    def attempts(self) -> list[str]:
        return list(self.attempt_run_ids)


def chromium_path() -> str | None:
    """`TRACKER_CHROMIUM`, else Debian's `chromium` on PATH."""
    found = os.environ.get("TRACKER_CHROMIUM") or shutil.which("chromium")
    return found if found and Path(found).exists() else None


def _unavailable(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"{reason}; CI is set, so the browser test must run (.ci/run installs chromium)", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="module", autouse=True)
def _browser_available() -> None:
    """Skips (or fails under CI) before anything slow runs."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        _unavailable("Python playwright is not installed (pip install playwright; no `playwright install` needed)")
    if chromium_path() is None:
        _unavailable("Chromium is not installed (apt-get install chromium, or set TRACKER_CHROMIUM)")


@pytest.fixture(scope="session")
def shots() -> Path:
    """Where screenshots go: `TRACKER_TEST_ARTIFACTS`, default `test-artifacts/` in the repository."""
    folder = Path(os.environ.get("TRACKER_TEST_ARTIFACTS") or ROOT / "test-artifacts")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> tuple[Path, str, str]:
    """(folder, tracking URI, experiment id) of a new sqlite store."""
    return new_sqlite_store(tmp_path_factory, EXPERIMENT)


@pytest.fixture(scope="module")
def server_process(store) -> LocalMlflowServer:
    """`mlflow server` on the store, starting. It takes longer to answer than the study takes to run, so
    the study runs while it starts."""
    folder, uri, _ = store
    server = LocalMlflowServer(uri, folder / "served-artifacts", log_path=folder / "server.log")
    server.start(wait=False)
    try:
        yield server
    finally:
        server.stop(timeout_s=5)


@pytest.fixture(scope="module")
def study(store, server_process) -> StudyStore:
    """A study of a tiny linear model, logged to the store: two ORT attempts, then three under the
    reference runtime (its baseline, the AddEyeLike fusion, and a fusion with a wrong kernel)."""
    from tests.models import make_linear_model
    from tracker import EXACT, FP32, MeasureConfig, SessionConfig, Study, StudySetup, TimingConfig
    from tracker.optimize.add_eyelike import WRONG_ADD_EYELIKE, AddEyeLike, fuse_add_eyelike

    folder, uri, experiment_id = store
    config = MeasureConfig(profile_runs=3, speedup=FAST_SPEEDUP,
                           timing=TimingConfig(warmup_runs=1, min_runs=3, min_seconds=0),
                           trace_levels=(1,))
    model = make_linear_model(n_features=8)
    feeds = {"X": np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)}
    with pytest.MonkeyPatch.context() as mp:
        isolate_mlflow(mp)
        with Study(STUDY, feeds=feeds, experiment=EXPERIMENT, config=config, tracking_uri=uri,
                   log_models=False, setup=StudySetup(workdir=folder / "work")) as s:
            s.attempt("baseline", model)
            s.attempt("ort_opt_disabled", model, session=SessionConfig(graph_optimization_level="disable"))
            s.attempt("reference_runtime", model, runtime="reference", tolerance=FP32)
            fused = fuse_add_eyelike(model).model
            s.attempt("reference_fused", fused, runtime="reference", new_ops=(AddEyeLike,), tolerance=EXACT)
            # a wrong kernel (X + 2I): its accuracy check fails, so its verdict is "rejected"
            s.attempt("reference_fused_wrong", fused, runtime="reference", new_ops=(WRONG_ADD_EYELIKE,),
                      tolerance=EXACT)
        logged = {a.path for a in mlflow.MlflowClient(tracking_uri=uri).list_artifacts(s.run.info.run_id, "report")}
        assert "report/study_report.html" in logged, "Study logs its report on the parent run"
    assert all(r.ok for r in s.results), [r.error for r in s.results]
    return StudyStore(STUDY, uri, folder, experiment_id, s.run.info.run_id,
                      {r.attempt.name: r.run_id for r in s.results},
                      {r.attempt.name: r.latency.p50_ms for r in s.results},
                      {r.attempt.name: r.verdict for r in s.results})


@pytest.fixture(scope="module")
def server(server_process, study) -> str:
    """The base URL of `mlflow server` on the study's store, once it answers."""
    server_process.wait_healthy(SERVER_START_S)
    return server_process.uri


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture(scope="module")
def context(server, browser):
    """One browser context for the module: its HTTP cache spares each test reloading the UI's bundle."""
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    yield context
    context.close()


@pytest.fixture
def page(server, context):
    """A fresh page; `page.external_requests` lists every request that left 127.0.0.1."""
    page = context.new_page()
    page.set_default_timeout(60_000)  # the UI's first load parses megabytes of JS on a slow machine
    page.external_requests = []
    page.on("request", lambda r: None if r.url.startswith((server, "blob:", "data:", "about:"))
            else page.external_requests.append(r.url))
    yield page
    page.close()
