"""The study page's sections that show only with their figures: the attempts against the machine's limits (their
rooflines), and the scenarios (forward, prefill, decode) when some attempt was measured generating."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pandas as pd

from tracker.measure.costmodel import roofline as R
from tracker.report.charts import roofline_chart, step_split_chart
from tracker.report.page import escape, frame_html, html_table, num
from tracker.report.rows import AttemptRow
from tracker.report.scenarios import SPLIT_NOTE, decode_splits, generation_table, roof_sentences, scenarios_table

_ROOFLINE_OPS = 5  # op types per attempt in the study's roofline chart, the slowest with FLOPs
_PHASE_OPS = 3  # op types per attempt and phase in the scenarios' roofline chart, the slowest with FLOPs


def roofline_section(rooflines: Mapping[str, R.Roofline]) -> list:
    """The roofline section: the machine's roofs, each attempt's FLOPs, and its main op types on one chart."""
    if not rooflines:
        return []
    machine = next((r.machine for r in rooflines.values() if r.machine is not None), None)
    chart = _rooflines_chart(rooflines, top=_ROOFLINE_OPS, title=(
        f"The {_ROOFLINE_OPS} slowest op types with FLOPs of each attempt, against the roofs"))
    if machine is None:
        roofs = "The machine was not measured: no roofs."
    else:
        roofs = (f"Measured once for the study: peak {machine.peak_gflops:,.1f} GFLOP/s (an fp32 "
                 f"{machine.gemm_size}&sup3; MatMul in ONNX Runtime, {machine.threads} threads) and bandwidth "
                 f"{machine.bandwidth_gbps:,.1f} GB/s (the better of a {machine.copy_mb} MiB copy, bytes read + "
                 f"written, and a sum, bytes read), in "
                 f"{machine.seconds:.1f} s. Op types below {machine.ridge_flop_per_byte:,.1f} FLOP per byte are "
                 "bound by memory, above it by compute. A point's height against the roof above it is its share "
                 "of what the machine allows at its intensity.")
    head = ("attempt", "GFLOP per run", "GFLOP per token", "achieved GFLOP/s", "MB moved per run",
            "kernel time with known FLOPs")
    body = [f"<tr><td>{escape(name)}</td><td>{r.gflop_per_run:.4g}</td>"
            f"<td>{num(r.gflop_per_token, '.4g')}</td><td>{num(r.gflops, ',.1f')}</td>"
            f"<td>{r.mb_per_run:.4g}</td><td>{r.covered_time_pct:.1f} %</td></tr>"
            for name, r in rooflines.items()]
    return ["<h2>Against the machine's limits (roofline)</h2>", f"<p>{roofs}</p>",
            html_table(head, body, classes=None), chart]


def _rooflines_chart(rooflines: Mapping[str, R.Roofline], *, top: int, title: str):
    """The `top` slowest op types with FLOPs of each roofline on one chart, a series per label."""
    machine = next((r.machine for r in rooflines.values() if r.machine is not None), None)
    main = [roofline.table[roofline.table[R.GFLOP_PER_RUN] > 0].head(top).assign(series=label)
            for label, roofline in rooflines.items()]
    return roofline_chart(pd.concat(main, ignore_index=True), machine=machine, series="series", title=title)


def scenario_section(rows: Sequence[AttemptRow], rooflines: Mapping[str, R.Roofline],
                    phase_rooflines: Mapping[str, Mapping[str, R.Roofline]]) -> tuple[list, dict[str, pd.DataFrame]]:
    """The scenarios section (HTML, a chart of each attempt's prefill and decode), its tables; nothing without."""
    generation = generation_table(rows)
    if generation.empty:
        return [], {}
    scenarios = scenarios_table(rows, rooflines)
    parts = ["<h2>Scenarios: forward, prefill and decode</h2>",
             "<p>Each scenario's best attempt is the largest speed-up among those faster than the baseline beyond "
             "the noise, whose accuracy check passed (forward: the attempt's check; prefill and decode: the "
             "generation check, the attempt's next-token logits along the baseline's tokens within the bounds of "
             "its precision), else the baseline. Its roof is the one most of its kernel time sits under.</p>",
             frame_html(scenarios), "<p>" + escape(" ".join(roof_sentences(scenarios))) + "</p>",
             "<h3>Every attempt in each phase</h3>", frame_html(generation)]
    length, splits = decode_splits(rows)
    if splits:
        parts += ["<h3>Where a decode step's time goes</h3>", f"<p>{escape(SPLIT_NOTE)}</p>", step_split_chart(
            splits, title=f"Where a decode step's time goes, at a past of {length} (ms per step)")]
    by_phase = {f"{attempt} · {phase}": roofline
                for attempt, phases in phase_rooflines.items() for phase, roofline in phases.items()}
    if by_phase:
        parts.append(_rooflines_chart(by_phase, top=_PHASE_OPS, title=(
            f"Prefill and decode: the {_PHASE_OPS} slowest op types with FLOPs of each attempt")))
    return parts, {"scenarios": scenarios, "generation": generation}
