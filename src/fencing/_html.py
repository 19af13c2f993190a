"""Self-contained HTML pages with inline SVG, for ``fencing demo --report`` and
``fencing bench --report``: escaping, a page shell, and a few SVG shapes.

Nothing here fetches anything: no script, stylesheet, font or image is loaded from
anywhere, so a page opens the same offline, in a mail attachment, or in CI.
"""

from __future__ import annotations

import html
import os
import re
from typing import Final

from ._errors import InvalidInput

__all__ = ["check_report_path", "close", "esc", "num", "page", "shape", "svg"]

_CONTROL: Final = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")

STYLE: Final = """
body{font:14px/1.4 system-ui,-apple-system,'Segoe UI',Roboto,'DejaVu Sans',sans-serif;
 margin:20px;color:#1d232a;background:#fff}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:22px 0 6px}
.sub{color:#5b6570;margin:0 0 12px}
.verdicts{display:flex;gap:14px;margin:10px 0 6px}
.verdict{flex:1;border-radius:8px;padding:10px 14px;border:2px solid}
.verdict h3{margin:0 0 4px;font-size:16px}
.verdict p{margin:2px 0}
.fail{border-color:#c62828;background:#fdecea}.fail h3{color:#b71c1c}
.pass{border-color:#2e7d32;background:#e8f5e9}.pass h3{color:#1b5e20}
.note{border-color:#9e9e9e;background:#f5f5f5}
.legend{display:flex;flex-wrap:wrap;gap:4px 16px;align-items:center;margin:6px 0;
 color:#37414b;font-size:13px}
.legend svg{vertical-align:middle}
svg text{font-family:inherit}
svg.chart{display:block;max-width:100%;height:auto}
table{border-collapse:collapse;font-size:13px}
td,th{padding:2px 8px;text-align:right}th{color:#5b6570;font-weight:600}
td:first-child,th:first-child{text-align:left}
"""


def esc(value: object) -> str:
    """``value`` as text safe in HTML content, attributes and inline SVG.

    Control characters (which some parsers refuse) become U+FFFD.
    """
    return _CONTROL.sub("\ufffd", html.escape(str(value), quote=True))


def num(value: float) -> str:
    """A coordinate: at most two decimals, no trailing zeros."""
    text = f"{value:.2f}".rstrip("0").rstrip(".")
    return "0" if text == "-0" else text


def page(title: str, body: str) -> str:
    """A whole HTML document: ``title`` is escaped here, ``body`` must already be."""
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{esc(title)}</title>"
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<style>{STYLE}</style></head>\n<body>\n{body}\n</body></html>\n"
    )


def svg(width: float, height: float, content: str, label: str = "") -> str:
    """An inline SVG; one with a ``label`` is a chart: it shrinks to fit a narrow window."""
    aria = f' class="chart" role="img" aria-label="{esc(label)}"' if label else ""
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{num(width)}" height="{num(height)}"'
        f' viewBox="0 0 {num(width)} {num(height)}"{aria}>{content}</svg>'
    )


def shape(kind: str, x: float, y: float, r: float, fill: str, stroke: str = "none") -> str:
    """One mark centred on ``(x, y)``: ``circle``, ``ring``, ``square``, ``diamond``,
    ``triangle``, ``down`` or ``cross``; no closing tag, so a ``<title>`` can follow."""
    paint = f' fill="{fill}" stroke="{stroke}"'
    if kind == "circle":
        return f'<circle cx="{num(x)}" cy="{num(y)}" r="{num(r)}"{paint}>'
    if kind == "ring":
        return (
            f'<circle cx="{num(x)}" cy="{num(y)}" r="{num(r)}" fill="#fff"'
            f' stroke="{fill}" stroke-width="1.6">'
        )
    if kind == "square":
        return (
            f'<rect x="{num(x - r)}" y="{num(y - r)}" width="{num(2 * r)}"'
            f' height="{num(2 * r)}"{paint}>'
        )
    if kind == "diamond":
        d = r * 1.3
        return _polygon([(x, y - d), (x + d, y), (x, y + d), (x - d, y)], paint)
    if kind in ("triangle", "down"):
        d = r * 1.35 * (1 if kind == "triangle" else -1)  # "down" points down
        return _polygon([(x, y - d), (x + d, y + d * 0.8), (x - d, y + d * 0.8)], paint)
    if kind == "cross":
        d = r * 1.1
        path = (
            f"M{num(x - d)} {num(y - d)}L{num(x + d)} {num(y + d)}"
            f"M{num(x - d)} {num(y + d)}L{num(x + d)} {num(y - d)}"
        )
        return f'<path d="{path}" stroke="{fill}" stroke-width="2.6" fill="none">'
    raise ValueError(f"unknown shape {kind!r}")


def _polygon(points: list[tuple[float, float]], paint: str) -> str:
    return f'<polygon points="{" ".join(f"{num(x)},{num(y)}" for x, y in points)}"{paint}>'


def close(kind: str) -> str:
    """The closing tag of a :func:`shape` of this kind."""
    return {
        "circle": "</circle>",
        "ring": "</circle>",
        "square": "</rect>",
        "diamond": "</polygon>",
        "triangle": "</polygon>",
        "down": "</polygon>",
        "cross": "</path>",
    }[kind]


def check_report_path(path: str, option: str) -> None:
    """A file a report can be written to: its directory exists, it is not a directory."""
    if not path or "\x00" in path:
        raise InvalidInput(f"{option} needs a file name, not {path!r}")
    if os.path.isdir(path):
        raise InvalidInput(f"{option} {path!r} is a directory: name a file (race.html)")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise InvalidInput(f"{option} {path!r}: the directory {parent!r} does not exist")
    if not os.access(parent, os.W_OK):
        raise InvalidInput(f"{option} {path!r}: the directory {parent!r} is not writable")
