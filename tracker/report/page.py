"""Writes one self-contained HTML page of HTML parts and plotly figures that renders offline; and the pieces the
report's pages are made of: their style sheet (the verdicts' colours), tables, and cells that show a missing value."""

from __future__ import annotations

import html
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from tracker.base.vocabulary import Status, Verdict

if TYPE_CHECKING:
    import plotly.graph_objects as go

# The height of a figure whose layout sets none: a section of the page has no height for plotly's "100%" to fill.
_DEFAULT_HEIGHT_PX = 320

VERDICT_COLORS = {Verdict.BASELINE: "#4575b4", Verdict.BETTER: "#1a9850", Verdict.WORSE: "#e66101",
                  Verdict.SAME: "#5e3c99", Verdict.INCONCLUSIVE: "#878787", Verdict.REJECTED: "#a50026",
                  Status.FAILED: "#222222", "disturbed": "#b8860b"}
NA = '<span class="muted">&mdash;</span>'  # a missing value
PAGE_CSS = """
body{font-family:system-ui,-apple-system,sans-serif;margin:1em 2em;color:#222}
div.table{overflow-x:auto;margin:.5em 0 1.5em}table{border-collapse:collapse;font-size:13px}
p.legend{font-size:12px;line-height:1.9}
th,td{border-bottom:1px solid #ddd;padding:4px 10px;text-align:right;white-space:nowrap}
th{background:#f4f4f4}th:first-child,td:first-child{text-align:left}
tr.best td{background:#fff4c2;font-weight:600}
td.error{white-space:normal;max-width:32em;text-align:left;color:#a50026}
.verdict{color:#fff;border-radius:3px;padding:1px 7px;font-size:12px;font-weight:600}
.ok{color:#1a9850}.bad{color:#a50026;font-weight:600}.muted{color:#999}
section.figure{margin-bottom:1.5em}
""" + "".join(f".v-{v}{{background:{c}}}\nth.v-{v}{{border-bottom:4px solid {c};background:#f4f4f4}}\n"
              for v, c in VERDICT_COLORS.items())


def write_page(path: str | Path, *, title: str, parts: Sequence[str | go.Figure], css: str = "") -> Path:
    """Writes `parts` under a `title` heading, plotly.js inlined once, before the first figure.

    Inlined rather than from a CDN: MLflow's artifact viewer may have no network access.

    Args:
        path: the file to write; missing parent directories are created.
        title: the page's <title> and heading (escaped here).
        parts: in page order; a string is HTML, written as is, and a figure becomes
            `<section class="figure">` holding a `<div id="figure-N">` (N counts the figures from 0).
        css: the page's style sheet.

    Returns:
        The path written.
    """
    body, figures = [], 0
    for part in parts:
        if isinstance(part, str):
            body.append(part)
            continue
        div = part.to_html(full_html=False, include_plotlyjs=(figures == 0), div_id=f"figure-{figures}",
                           default_height=part.layout.height or _DEFAULT_HEIGHT_PX,
                           config={"displaylogo": False, "responsive": True})
        body.append(f'<section class="figure">\n{div}\n</section>')
        figures += 1
    escaped = html.escape(title)
    page = ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            f"<title>{escaped}</title>\n<style>{css}</style>\n</head>\n<body>\n<h1>{escaped}</h1>\n"
            + "\n".join(body) + "\n</body>\n</html>\n")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page, encoding="utf-8")
    return path


def frame_html(table: pd.DataFrame) -> str:
    """A table as it is: numbers to 3 significant digits, missing values as a dash."""
    body = ["<tr>" + "".join(f"<td>{num(v, '.3g') if isinstance(v, float) else (escape(v) if present(v) else NA)}"
                             "</td>" for v in row) + "</tr>" for row in table.itertuples(index=False)]
    return html_table(list(table.columns), body, classes=None)


def html_table(head: Sequence[str], body: Sequence[str], *, classes: Sequence[str] | None,
               escaped: bool = False) -> str:
    """A table of `head` (escaped here unless `escaped`, each with its class) and the rows of `body` (HTML)."""
    classes = classes or [""] * len(head)
    cells = "".join(f'<th class="{c}">{h if escaped else escape(h)}</th>' for h, c in zip(head, classes))
    return (f'<div class="table"><table>\n<thead><tr>{cells}</tr></thead>\n<tbody>\n' + "\n".join(body)
            + "\n</tbody>\n</table></div>")


def present(value) -> bool:
    """Whether a cell holds a value (not None, NaN or NA)."""
    return value is not None and not (pd.api.types.is_scalar(value) and pd.isna(value))


def num(value, spec: str) -> str:
    """A number formatted by `spec`, or the missing mark."""
    return format(float(value), spec) if present(value) else NA


def size_text(value) -> str:
    """A size in bytes as B, KB, MB or GB, or the missing mark."""
    if not present(value):
        return NA
    exponent = min(3, int(np.log(max(float(value), 1.0)) // np.log(1024)))
    return f"{float(value) / 1024 ** exponent:,.{0 if exponent == 0 else 1}f} {('B', 'KB', 'MB', 'GB')[exponent]}"


def escape(text) -> str:
    """`text` as HTML text."""
    return html.escape(str(text))
