"""What a user sees of a study in the MLflow UI, checked in headless Chromium against a real `mlflow server`."""

from __future__ import annotations

import json
import urllib.parse

import numpy as np
import pytest

from tests.browser.conftest import EXPERIMENT
from tests.conftest import FAST_SPEEDUP, isolate_mlflow
from tests.models import make_linear_model
from tracker import MeasureConfig, SessionConfig, Study, StudySetup, TimingConfig

ASSISTANT_CLOSE = '[data-component-id="mlflow.assistant.chat_panel.close"]'


def open_ui(page, url: str, *, wait_for: str) -> None:
    """Opens a UI page and waits for a text (the UI polls: the network never goes idle)."""
    page.goto(url, wait_until="domcontentloaded")
    page.get_by_text(wait_for, exact=True).first.wait_for()
    close = page.locator(ASSISTANT_CLOSE)  # the assistant side panel covers a third of a screenshot
    if close.count():
        close.first.click()


def html_artifact(page):
    """The iframe in which the artifact viewer renders an HTML artifact."""
    page.locator("iframe.mlflow-html-iframe").wait_for()
    return page.frame_locator("iframe.mlflow-html-iframe")


def assert_plotly_drew(frame, *, charts: int) -> None:
    plots = frame.locator(".js-plotly-plot")
    plots.nth(charts - 1).locator(".main-svg").first.wait_for()  # plotly draws the figures one by one
    for i in range(charts):
        box = plots.nth(i).bounding_box()
        assert box is not None and box["height"] > 100 and box["width"] > 100, f"chart {i} is empty: {box}"
        assert plots.nth(i).locator(".main-svg").count() >= 1


def test_the_runs_table_lists_the_study_run_and_its_nested_attempt_runs(page, server, study, shots):
    open_ui(page, f"{server}/#/experiments/{study.experiment_id}/runs", wait_for=study.name)
    page.get_by_text(f"{1 + len(study.attempts)} matching runs").wait_for()
    for name in study.attempts:  # nested runs are folded under their parent until it is expanded
        assert not page.get_by_role("link", name=name, exact=True).is_visible()
    name_cell = page.locator('[col-id*="Run Name"]').filter(has=page.get_by_role("link", name=study.name, exact=True))
    name_cell.locator("button").first.click()
    for name in study.attempts:
        page.get_by_role("link", name=name, exact=True).wait_for()
    page.screenshot(path=shots / "runs_table.png")


def test_an_attempt_run_page_shows_its_latency_and_verdict(page, server, study, shots):
    run_id = study.attempt_run_ids["ort_opt_disabled"]
    open_ui(page, f"{server}/#/experiments/{study.experiment_id}/runs/{run_id}", wait_for="latency.p50_ms")
    row = page.locator('[role="row"]').filter(has=page.get_by_text("latency.p50_ms", exact=True))
    shown = float(row.locator('[role="cell"]').nth(1).inner_text())
    assert shown == pytest.approx(study.p50_ms["ort_opt_disabled"], rel=1e-6)
    page.get_by_text("tracker.verdict", exact=True).wait_for()
    page.get_by_role("link", name=study.name, exact=True).wait_for()  # its parent run
    page.screenshot(path=shots / "attempt_run.png")


def test_the_compare_page_shows_the_attempts_their_verdicts_and_speedups(page, server, study, shots):
    runs = urllib.parse.quote(json.dumps([study.attempt_run_ids[n] for n in study.attempts]))
    experiments = urllib.parse.quote(json.dumps([study.experiment_id]))
    open_ui(page, f"{server}/#/compare-runs?runs={runs}&experiments={experiments}",
            wait_for=f"Comparing {len(study.attempts)} Runs from 1 Experiment")
    for name in study.attempts:
        page.get_by_text(name, exact=True).first.wait_for()
    verdicts = page.locator("tr").filter(has=page.get_by_text("tracker.verdict", exact=True)).inner_text()
    assert verdicts.split() == ["tracker.verdict", *(study.verdicts[n] for n in study.attempts)]
    page.get_by_text("diff.max_abs", exact=True).first.wait_for()
    # The metrics list is two virtual grids side by side, names and values, of the same height.
    page.locator("div.ReactVirtualized__Grid").evaluate_all("""gs => {
        const names = gs.find(g => g.innerText.includes("diff.max_abs"));
        gs.filter(g => g.scrollHeight === names.scrollHeight).forEach(g => { g.dataset.metricsGrid = "1"; });
    }""")
    for key in ("diff.passed", "latency.p50_ms", "latency.speedup", "latency.speedup_ci_low"):  # sorted
        reveal_metric(page, key)
    # the section heading, not a metric: scrolling a row into view would scroll the names grid alone
    page.get_by_text("Metrics", exact=True).first.scroll_into_view_if_needed()
    page.screenshot(path=shots / "compare_runs_metrics.png")
    page.get_by_text("tracker.verdict", exact=True).first.scroll_into_view_if_needed()
    page.screenshot(path=shots / "compare_runs_tags.png")


def reveal_metric(page, key: str) -> None:
    """Scrolls the compare page's metrics list down (it renders only the rows in view) until `key` shows.

    Both grids (names, values) are scrolled to the same offset so that the rows stay aligned.
    """
    grids = page.locator("div[data-metrics-grid]")
    for _ in range(50):
        if page.get_by_text(key, exact=True).count():
            page.get_by_text(key, exact=True).first.wait_for()
            return
        grids.evaluate_all("gs => { const top = gs[0].scrollTop + 150; gs.forEach(g => { g.scrollTop = top; }); }")
        page.wait_for_timeout(100)
    raise AssertionError(f"metric {key} is not listed on the compare page")


def test_an_attempt_profile_chart_artifact_renders_offline(page, server, study, shots):
    run_id = study.attempt_run_ids["ort_opt_disabled"]
    open_ui(page, f"{server}/#/experiments/{study.experiment_id}/runs/{run_id}/artifacts/charts/profile.html",
            wait_for="charts/profile.html")
    frame = html_artifact(page)
    assert_plotly_drew(frame, charts=4)  # time, calls, share, treemap
    frame.locator(".main-svg").get_by_text("MatMul").first.wait_for()  # ORT optimizations off: no Gemm
    page.screenshot(path=shots / "profile_chart.png")
    assert page.external_requests == []


def test_the_study_report_on_the_parent_run_renders_offline(page, server, study, shots):
    url = f"{server}/#/experiments/{study.experiment_id}/runs/{study.study_run_id}/artifacts/report/study_report.html"
    page.set_viewport_size({"width": 1500, "height": 1100})  # this screenshot is the README's
    open_ui(page, url, wait_for="report")
    frame = html_artifact(page)
    frame.get_by_text(f"Study {study.name}", exact=True).wait_for()
    assert_plotly_drew(frame, charts=2)  # speed-up with intervals, per-op stacked bars
    cells = [row.split("\t") for row in frame.locator("table").first.locator("tbody tr").all_inner_texts()]
    shown = {c[0].removeprefix("\u2605").strip(): c[2].strip() for c in cells}  # attempt -> verdict badge
    assert shown == study.verdicts
    assert shown["reference_fused_wrong"] == "rejected"
    # The table under the "Graph changes" heading (the roofline's comes after it).
    graph_changes = frame.locator("h2", has_text="Graph changes").locator("xpath=following::table[1]").inner_text()
    assert "tracker.fusions:AddEyeLike" in graph_changes and "EyeLike" in graph_changes
    page.screenshot(path=shots / "study_report.png")
    assert page.external_requests == []


def test_the_link_a_study_logs_opens_its_run_in_the_runs_view_and_attempts_show_their_feeds(
    page, server, study, shots, monkeypatch
):
    import mlflow

    from tests.conftest import isolate_mlflow
    from tracker.store import write

    isolate_mlflow(monkeypatch)
    client = mlflow.MlflowClient(study.uri)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", server)  # the link as a study logging to this server writes it
    link = write.run_link(client.get_run(study.study_run_id))
    assert link.endswith("?workflowType=machine_learning")
    open_ui(page, link, wait_for=study.name)
    # The model-training view: the sidebar has the model registry, not the GenAI overview's observability pages.
    page.get_by_role("link", name="Model registry").first.wait_for()
    assert page.get_by_text("Observability", exact=True).count() == 0
    page.screenshot(path=shots / "study_run_link.png")

    open_ui(page, write.run_link(client.get_run(study.attempt_run_ids["baseline"])),
            wait_for="session.create_ms")
    page.get_by_text(f"{study.name}.feeds").first.wait_for()  # the run's dataset input
    page.screenshot(path=shots / "attempt_run_dataset.png")


def test_the_models_tab_lists_each_attempts_logged_model_with_its_speedup(page, server, study, shots):
    """A second study, its models logged, in the same store: the experiment's Models tab (model training view) shows
    each attempt's speed-up in its feeds' column group, the value the attempt measured."""

    config = MeasureConfig(profile_runs=2, speedup=FAST_SPEEDUP,
                           timing=TimingConfig(warmup_runs=1, min_runs=3, min_seconds=0))
    feeds = {"X": np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)}
    with pytest.MonkeyPatch.context() as mp:
        isolate_mlflow(mp)
        with Study("with-models", feeds=feeds, experiment=EXPERIMENT, config=config, tracking_uri=study.uri,
                   setup=StudySetup(workdir=study.folder / "work-models")) as s:
            s.attempt("baseline", make_linear_model(n_features=8))
            measured = s.attempt("ort_opt_disabled", make_linear_model(n_features=8),
                                 session=SessionConfig(graph_optimization_level="disable"))
    assert measured.ok and measured.speedup is not None

    open_ui(page, f"{server}/#/experiments/{study.experiment_id}/models?workflowType=machine_learning",
            wait_for="with-models-ort_opt_disabled")
    # The grid draws only the columns in view: the metrics' groups start right of the model attributes.
    page.locator(".ag-center-cols-viewport").evaluate("grid => { grid.scrollLeft = 1000; }")
    page.locator('[role="columnheader"]').filter(has_text="latency.speedup").first.wait_for()
    page.get_by_text(repr(measured.speedup.speedup), exact=True).wait_for()  # the grid prints the float as logged
    page.screenshot(path=shots / "models_tab.png")
