"""Writes one self-contained HTML page of HTML parts and plotly figures that renders offline."""

from __future__ import annotations

import html
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import plotly.graph_objects as go

# The height of a figure whose layout sets none: a section of the page has no height for plotly's "100%" to fill.
_DEFAULT_HEIGHT_PX = 320


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
