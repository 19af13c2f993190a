"""``fencing bench --report bench.html``: the run's rows as one self-contained HTML page.

On top, the ratio of fencing's time per call to the hand-written baseline's, per
operation, one bar per store and setting (the median of per-round ratios, the lowest
and highest round as a whisker, 1.0 marked). Below, per store and setting, the
latency distribution of every operation, fencing beside its baseline, on a log axis:
a box from p25 to p75, the median as a bar, whiskers from p10 to p99 (p90 ticked).
Inline SVG only; each bar and box has a ``<title>`` tooltip with its numbers.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Any, Final

from .._html import esc, num, page, svg
from ._report import NOTES, QUICK_NOTE, group_rows, target_lines

__all__ = ["bench_html", "write_report"]

Row = dict[str, Any]

WIDTH: Final = 1340
LABELS_W: Final = 330
RIGHT: Final = 70
PALETTE: Final = (
    "#1565c0",
    "#2e7d32",
    "#ef6c00",
    "#6a1b9a",
    "#00838f",
    "#ad1457",
    "#5d4037",
    "#455a64",
)
#: (row prefix, name, line colour, box fill) per side.
SIDES: Final = (
    ("fencing", "fencing", "#00897b", "#80cbc4"),
    ("baseline", "hand-written", "#78909c", "#cfd8dc"),
)
RATIO_CAP: Final = 6.0
HALO: Final = {"paint_order": "stroke", "stroke": "#fff", "stroke_width": "3"}  # text over lines


def _label(row: Row) -> str:
    baseline = str(row.get("baseline", ""))
    op = str(row["operation"])
    return op if baseline == "hand-written" else f"{op} (vs {baseline})"


def _where(store: str, setting: str) -> str:
    return f"{store}: {setting}" if setting else store


def _text(x: float, y: float, text: str, **attrs: str) -> str:
    extra = "".join(f' {k.replace("_", "-")}="{v}"' for k, v in attrs.items())
    return f'<text x="{num(x)}" y="{num(y)}"{extra}>{esc(text)}</text>'


def _row_label(y: float, label: str) -> str:
    """An operation's name, right-aligned before the plot; on two lines when long."""
    if len(label) <= 44 or " " not in label:
        return _text(LABELS_W - 10, y + 4, label, font_size="12", text_anchor="end")
    cut = label.rfind(" (") if " (" in label else label.rfind(" ", 0, 44)
    first, second = label[:cut], label[cut + 1 :]
    return (
        f'<text x="{LABELS_W - 10}" y="{num(y - 2)}" font-size="12" text-anchor="end">'
        f'{esc(first)}<tspan x="{LABELS_W - 10}" dy="13">{esc(second)}</tspan></text>'
    )


# -- ratios --------------------------------------------------------------------------------
def _ratio_chart(groups: list[tuple[str, str, list[Row]]]) -> str:
    wheres = [_where(store, setting) for store, setting, _ in groups]
    colours = {w: PALETTE[i % len(PALETTE)] for i, w in enumerate(wheres)}
    rows: dict[str, list[tuple[str, Row]]] = {}
    for (_, _, items), where in zip(groups, wheres, strict=True):
        for row in items:
            if row["kind"] == "pair":
                rows.setdefault(str(row["operation"]), []).append((where, row))
    if not rows:
        return "<p>No operation was measured.</p>"
    highest = max(float(r["ratio_high"]) for pairs in rows.values() for _, r in pairs)
    top_ratio = min(RATIO_CAP, max(1.5, highest * 1.08))
    plot = WIDTH - LABELS_W - RIGHT
    scale = plot / top_ratio
    bar, gap = 11, 10
    out: list[str] = []
    y = 8.0
    for i, (label, pairs) in enumerate(rows.items()):
        height = max(bar * len(pairs) + 4, 28 if len(label) > 44 else 0)
        if i % 2 == 0:
            out.append(
                f'<rect x="0" y="{num(y - 3)}" width="{WIDTH}" height="{num(height + 6)}"'
                ' fill="#f6f8fa"/>'
            )
        out.append(_row_label(y + height / 2, label))
        for j, (where, row) in enumerate(pairs):
            by = y + 2 + (height - 4 - bar * len(pairs)) / 2 + j * bar
            ratio = float(row["ratio"])
            width = min(ratio, top_ratio) * scale
            tip = (
                f"{label} on {where}: {ratio:.2f}x (rounds {row['ratio_low']:.2f}x to"
                f" {row['ratio_high']:.2f}x); fencing {row['fencing_ops_per_s']:,.0f} ops/s,"
                f" {row['baseline']} {row['baseline_ops_per_s']:,.0f} ops/s"
            )
            out.append(
                f'<g class="ratio"><rect x="{LABELS_W}" y="{num(by)}" width="{num(width)}"'
                f' height="{bar - 2}" fill="{colours[where]}"/>'
                f"<title>{esc(tip)}</title></g>"
            )
            low = LABELS_W + min(float(row["ratio_low"]), top_ratio) * scale
            high = LABELS_W + min(float(row["ratio_high"]), top_ratio) * scale
            mid = by + (bar - 2) / 2
            out.append(
                f'<line x1="{num(low)}" y1="{num(mid)}" x2="{num(high)}" y2="{num(mid)}"'
                ' stroke="#263238" stroke-width="1"/>'
            )
            shown = f"{ratio:.2f}x" + (" >" if ratio > top_ratio else "")
            if row.get("baseline") != "hand-written":
                shown += f" vs {row.get('baseline')}"
            at = min(max(high, LABELS_W + width) + 4, WIDTH - 4 - 5.6 * len(shown))
            out.append(_text(at, mid + 4, shown, font_size="10", **HALO))
            target = row.get("target_ratio")
            if target is not None:
                tx = LABELS_W + min(float(target), top_ratio) * scale
                out.append(
                    f'<line x1="{num(tx)}" y1="{num(by - 1)}" x2="{num(tx)}"'
                    f' y2="{num(by + bar)}" stroke="#c62828" stroke-width="2"'
                    ' stroke-dasharray="2 1"/>'
                )
        y += height + gap
    out.append(_ratio_axis(y, top_ratio, scale))
    legend = "".join(
        f'<span><svg width="14" height="12"><rect width="14" height="12" fill="{c}"/></svg>'
        f" {esc(w)}</span>"
        for w, c in colours.items()
    )
    note = (
        '<span><svg width="20" height="12"><line x1="0" y1="6" x2="20" y2="6"'
        ' stroke="#263238"/></svg> lowest to highest round</span>'
        '<span><svg width="8" height="12"><line x1="4" y1="0" x2="4" y2="12" stroke="#c62828"'
        ' stroke-width="2" stroke-dasharray="2 1"/></svg> target</span>'
    )
    chart = svg(WIDTH, y + 30, "".join(out), label="ratio of time per call")
    return f'<div class="legend">{legend}{note}</div>{chart}'


def _ratio_axis(y: float, top_ratio: float, scale: float) -> str:
    out = [
        f'<line x1="{LABELS_W}" y1="{num(y)}" x2="{num(LABELS_W + top_ratio * scale)}"'
        f' y2="{num(y)}" stroke="#90a4ae"/>',
        f'<line x1="{num(LABELS_W + scale)}" y1="0" x2="{num(LABELS_W + scale)}" y2="{num(y)}"'
        ' stroke="#37474f" stroke-dasharray="4 3"/>',
    ]
    step = 0.25 if top_ratio <= 2 else 0.5 if top_ratio <= 4 else 1.0
    tick = 0.0
    while tick <= top_ratio + 1e-9:
        x = LABELS_W + tick * scale
        out.append(
            f'<line x1="{num(x)}" y1="{num(y)}" x2="{num(x)}" y2="{num(y + 4)}" stroke="#90a4ae"/>'
        )
        out.append(_text(x, y + 16, f"{tick:g}x", font_size="11", text_anchor="middle"))
        tick += step
    out.append(
        _text(
            LABELS_W - 16,
            y + 16,
            "fencing's time per call / hand-written's",
            font_size="11",
            text_anchor="end",
            fill="#5b6570",
        )
    )
    return "".join(out)


# -- latencies -----------------------------------------------------------------------------
def _quantiles(row: Row, side: str) -> dict[int, float]:
    found = {}
    for q in (10, 25, 50, 75, 90, 99):
        value = row.get(f"{side}_p{q}_us")
        if isinstance(value, int | float) and value > 0:
            found[q] = float(value)
    return found


def _latency_chart(where: str, items: list[Row]) -> str:
    pairs = [r for r in items if r["kind"] == "pair"]
    if not pairs:
        return ""
    values = [v for r in pairs for side, _, _, _ in SIDES for v in _quantiles(r, side).values()]
    if not values:
        return ""
    low = 10 ** math.floor(math.log10(min(values)))
    high = 10 ** math.ceil(math.log10(max(values) * 1.001))
    plot = WIDTH - LABELS_W - RIGHT
    span = math.log10(high) - math.log10(low)

    def x(value: float) -> float:
        return LABELS_W + (math.log10(value) - math.log10(low)) / span * plot

    out: list[str] = []
    box, row_h = 9, 28
    y = 6.0
    for i, row in enumerate(pairs):
        if i % 2 == 0:
            out.append(
                f'<rect x="0" y="{num(y - 2)}" width="{WIDTH}" height="{row_h}" fill="#f6f8fa"/>'
            )
        out.append(_row_label(y + 10, _label(row)))
        for j, (side, name, colour, fill) in enumerate(SIDES):
            q = _quantiles(row, side)
            if 50 not in q:
                continue
            by = y + 1 + j * (box + 2)
            mid = by + box / 2
            parts = []
            if 10 in q and 99 in q:
                parts.append(
                    f'<line x1="{num(x(q[10]))}" y1="{num(mid)}" x2="{num(x(q[99]))}"'
                    f' y2="{num(mid)}" stroke="{colour}" stroke-width="1.2"/>'
                )
                for end in (q[10], q[99]):
                    parts.append(
                        f'<line x1="{num(x(end))}" y1="{num(by + 1)}" x2="{num(x(end))}"'
                        f' y2="{num(by + box - 1)}" stroke="{colour}"/>'
                    )
            if 25 in q and 75 in q:
                left, right = x(q[25]), max(x(q[75]), x(q[25]) + 1)
                parts.append(
                    f'<rect x="{num(left)}" y="{num(by)}" width="{num(right - left)}"'
                    f' height="{box}" fill="{fill}" stroke="{colour}"/>'
                )
            if 90 in q:
                parts.append(
                    f'<line x1="{num(x(q[90]))}" y1="{num(by + 2)}" x2="{num(x(q[90]))}"'
                    f' y2="{num(by + box - 2)}" stroke="#263238"/>'
                )
            parts.append(
                f'<line x1="{num(x(q[50]))}" y1="{num(by - 1)}" x2="{num(x(q[50]))}"'
                f' y2="{num(by + box + 1)}" stroke="#263238" stroke-width="2.2"/>'
            )
            numbers = ", ".join(f"p{k} {_us(v)}" for k, v in q.items())
            tip = f"{_label(row)}, {name} ({where}): {numbers}"
            out.append(f'<g class="latency {side}">{"".join(parts)}<title>{esc(tip)}</title></g>')
            out.append(
                _text(WIDTH - RIGHT + 6, mid + 4, f"p50 {_us(q[50])}", font_size="10", fill=colour)
            )
        y += row_h
    out.append(_latency_axis(y, low, high, x))
    return svg(WIDTH, y + 30, "".join(out), label=f"latency per call, {where}")


def _us(value: float) -> str:
    """Microseconds, in the unit that keeps three significant digits readable."""
    for unit, size in (("s", 1e6), ("ms", 1e3)):
        if value >= size:
            return f"{_digits(value / size)} {unit}"
    return f"{_digits(value)} µs"


def _digits(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def _latency_axis(y: float, low: float, high: float, x: Any) -> str:
    out = [
        f'<line x1="{LABELS_W}" y1="{num(y)}" x2="{num(x(high))}" y2="{num(y)}" stroke="#90a4ae"/>'
    ]
    decade = low
    while decade <= high * 1.0001:
        for m in (1, 2, 5):
            value = decade * m
            if value > high * 1.0001:
                break
            px = x(value)
            out.append(
                f'<line x1="{num(px)}" y1="{num(y)}" x2="{num(px)}"'
                f' y2="{num(y + (5 if m == 1 else 3))}"'
                ' stroke="#90a4ae"/>'
            )
            if m == 1 or (high / low) <= 1000:
                out.append(_text(px, y + 16, _us(value), font_size="11", text_anchor="middle"))
        decade *= 10
    out.append(
        _text(
            LABELS_W - 28,
            y + 16,
            "latency per call (log)",
            font_size="11",
            text_anchor="end",
            fill="#5b6570",
        )
    )
    return "".join(out)


# -- the page ------------------------------------------------------------------------------
def bench_html(rows: Sequence[Row], *, quick: bool = False) -> str:
    groups = group_rows(rows)
    body = [
        "<h1>fencing bench: fencing beside hand-written code with the same guarantee</h1>",
        f'<p class="sub">{esc(NOTES)}</p>',
    ]
    if quick:
        body.append(f'<p class="verdict fail" id="quick">{esc(QUICK_NOTE)}</p>')
    body += ['<section id="ratios"><h2>Ratio of time per call, per operation and store</h2>']
    body += [_ratio_chart(groups), "</section>"]
    legend = "".join(
        f'<span><svg width="14" height="12"><rect width="14" height="12" fill="{c}"'
        f' stroke="{line}"/></svg> {esc(name)}</span>'
        for _, name, line, c in SIDES
    )
    body.append(
        '<section id="latencies"><h2>Latency per call</h2><div class="legend">'
        f"{legend}<span>box: p25 to p75; thick bar: p50; tick: p90; whiskers: p10 to p99"
        "</span></div>"
    )
    for store, setting, items in groups:
        where = _where(store, setting)
        lines = target_lines(items) + [
            f"skipped {r['operation'] or 'store'}: {r['reason']}"
            for r in items
            if r["kind"] == "skipped"
        ]
        lines += [
            f"{r['operation']}: {r['ratio']:.1f}x the commits/s"
            for r in items
            if r["kind"] == "speedup" and r.get("target_ratio") is None
        ]
        notes = "".join(f"<li>{esc(line)}</li>" for line in lines)
        body.append(
            f'<div class="store" data-store="{esc(store)}"><h3>{esc(where)}</h3>'
            f"{_latency_chart(where, items)}{f'<ul>{notes}</ul>' if notes else ''}</div>"
        )
    body.append("</section>")
    return page("fencing bench report", "\n".join(body))


def write_report(path: str, rows: Sequence[Row], *, quick: bool = False) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(bench_html(rows, quick=quick))
    os.replace(tmp, path)
