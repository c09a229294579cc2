import re

import numpy as np
import pandas as pd
import pytest

from tracker.measure.costmodel import roofline as R
from tracker.measure.costmodel.machine import MachinePeaks
from tracker.report.charts import roofline_chart, write_html
from tracker.report.rows import AttemptRow
from tracker.report.study import build_study_report

MACHINE = MachinePeaks(peak_gflops=200.0, bandwidth_gbps=20.0, threads=2)


def table() -> pd.DataFrame:
    """Three op types: compute-bound MatMul, memory-bound Add, Reshape without FLOPs."""
    rows = [("MatMul", 800.0, 150.0, 30.0, 50.0), ("Add", 150.0, 2.0, 24.0, 0.083), ("Reshape", 50.0, 0.0, 10.0, 0.0)]
    frame = pd.DataFrame(rows, columns=[R.OP_TYPE, R.US_PER_RUN, R.GFLOPS, R.GBPS, R.INTENSITY])
    frame[R.TIME_PCT] = 100 * frame[R.US_PER_RUN] / frame[R.US_PER_RUN].sum()
    frame[R.GFLOP_PER_RUN] = frame[R.GFLOPS] * frame[R.US_PER_RUN] / 1e6
    frame[R.ROOF_GFLOPS] = MACHINE.roof_gflops(frame[R.INTENSITY].where(frame[R.INTENSITY] > 0))
    frame[R.PCT_PEAK] = 100 * frame[R.GFLOPS] / frame[R.ROOF_GFLOPS]
    return frame


def test_the_chart_puts_op_types_with_flops_under_both_roofs_on_log_axes():
    fig = roofline_chart(table(), machine=MACHINE, title="baseline")
    points, slope, ceiling = fig.data

    assert (fig.layout.xaxis.type, fig.layout.yaxis.type) == ("log", "log")
    assert list(points.text) == ["MatMul", "Add"]  # Reshape has no FLOPs: it cannot sit on a log axis
    np.testing.assert_allclose(points.x, [50.0, 0.083])
    np.testing.assert_allclose(points.y, [150.0, 2.0])
    assert points.marker.size[0] > points.marker.size[1]  # sized by time
    assert slope.x[1] == ceiling.x[0] == MACHINE.ridge_flop_per_byte  # the roofs meet at the ridge
    np.testing.assert_allclose(slope.y, [MACHINE.bandwidth_gbps * slope.x[0], 200.0])
    np.testing.assert_allclose(ceiling.y, [200.0, 200.0])
    assert slope.x[0] < min(points.x) and ceiling.x[1] > max(points.x)
    assert "20.0 GB/s" in slope.name and "200.0 GFLOP/s" in ceiling.name
    assert "1 op types without FLOPs" in fig.layout.title.text


def test_without_a_machine_the_chart_draws_the_points_alone():
    fig = roofline_chart(table(), machine=None, title="baseline")
    assert [trace.name for trace in fig.data] == ["op types"]


def test_the_chart_refuses_a_table_that_is_not_a_roofline_table():
    with pytest.raises(ValueError, match="roofline table lacks columns"):
        roofline_chart(pd.DataFrame({"op_type": ["MatMul"]}), machine=MACHINE, title="x")


def test_the_chart_page_renders_offline(tmp_path):
    path = write_html([roofline_chart(table(), machine=MACHINE, title="baseline")], tmp_path / "r.html", title="r")
    page = path.read_text(encoding="utf-8")

    assert not re.search(r"<script[^>]+src=", page)  # plotly.js inlined, nothing from a CDN
    assert "Plotly.newPlot" in page


def test_the_study_report_shows_every_attempt_main_ops_against_the_roofs(tmp_path):
    rooflines = {name: R.Roofline(table=table(), gflop_per_run=0.12, mb_per_run=3.0, gflops=100.0,
                                  covered_time_pct=95.0, tokens_per_run=40, machine=MACHINE)
                 for name in ("baseline", "int8")}
    rows = [AttemptRow(attempt="baseline", runtime="onnxruntime", verdict="baseline"),
            AttemptRow(attempt="int8", runtime="onnxruntime", verdict="better", speedup=2.0)]

    report = build_study_report(rows, tmp_path, study="s", best="int8", rooflines=rooflines)
    page = report.html.read_text(encoding="utf-8")

    assert "Against the machine&#x27;s limits (roofline)" in page or "Against the machine's limits" in page
    assert "200.0 GFLOP/s" in page and "20.0 GB/s" in page
    assert "<td>0.003</td>" in page  # 0.12 GFLOP per run over 40 tokens
    assert not re.search(r"<script[^>]+src=", page)
