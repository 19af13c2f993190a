"""``fencing demo --report race.html``: the race as one self-contained HTML page.

The checker's verdict on both runs on top, then one timeline per key: a lane per run
(naive above, fencing below), a row per worker, time to the right. Each outcome is a
mark at the moment the store answered, joined by a line to the moment its decision
was taken (``decided_at``); a naive commit the checker flags is red, a fencing
refusal has its own shape per kind. Inline SVG only: no script, nothing fetched;
each mark's ``<title>`` is its tooltip.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from .._html import close, esc, num, page, shape, svg
from ..testing import ANOMALY_KINDS, LABELS, Report, iter_file

if TYPE_CHECKING:
    from .config import DemoConfig
    from .scenario import RunResult

__all__ = ["MAX_KEYS", "RunView", "race_html", "write_report"]

MAX_KEYS: Final = 6  # timelines drawn; the keys with the most to see come first
MAX_ROWS: Final = 16  # a row per worker up to this many workers in a lane

WIDTH: Final = 1340
GUTTER: Final = 118  # worker labels
RIGHT: Final = 16
ROW: Final = 15
LANE_HEAD: Final = 20
AXIS: Final = 26

TITLES: Final = {"naive": "naive read-modify-write", "fencing": "fencing"}
OK_COLOUR: Final = {"naive": "#607d8b", "fencing": "#2e7d32"}
#: How an anomaly is drawn (first kind of a commit's kinds in this order wins).
ANOMALY_STYLE: Final = {
    "stale_write": ("circle", "#d32f2f", 5.0),
    "fence_regression": ("down", "#ad1457", 5.0),
    "double_applied": ("cross", "#ef6c00", 4.0),
    "lost_update": ("ring", "#d32f2f", 4.5),
}
ANOMALY_ORDER: Final = ("stale_write", "fence_regression", "double_applied", "lost_update")
#: How an outcome other than a clean commit is drawn.
OUTCOME_STYLE: Final = {
    "stale": ("square", "#f9a825", 4.5),
    "duplicate": ("diamond", "#1565c0", 4.2),
    "fenced": ("triangle", "#6a1b9a", 5.0),
    "skipped": ("circle", "#9e9e9e", 3.0),
    "missing": ("circle", "#9e9e9e", 3.0),
    "contended": ("circle", "#9e9e9e", 3.0),
}
SINGULAR: Final = {
    "stale_write": "stale write: decided against an older version than it overwrote",
    "fence_regression": "fence regression: a zombie lease holder wrote after its successor",
    "double_applied": "double-applied: this intent was committed before",
    "lost_update": "lost update: acknowledged, then overwritten",
}
REFUSALS: Final = ("stale", "duplicate", "fenced")
REFUSAL_LABELS: Final = {
    "stale": "stale: refused, the record had moved on",
    "duplicate": "duplicate: refused, this intent was already committed",
    "fenced": "fenced: refused, a newer lease holder took over",
}


@dataclass(frozen=True, slots=True)
class Mark:
    """One outcome event of one key, ready to draw."""

    worker: str
    t: float
    decided: float | None
    outcome: str
    kinds: tuple[str, ...]  # the checker's anomaly kinds naming this event
    title: str


@dataclass
class RunView:
    """One run to draw: its events (``(line, event)``, as in the history file),
    the checker's report on them, and the account balance drift if known."""

    mode: str
    events: Sequence[tuple[int, Mapping[str, Any]]]
    report: Report
    drift: int | None = None
    marks: dict[tuple[str, str], list[Mark]] = field(default_factory=dict)
    start: float = 0.0
    end: float = 0.0

    def __post_init__(self) -> None:
        flagged: dict[int, list[str]] = {}
        for kind, found in self.report.anomalies.items():
            for anomaly in found:
                for line in anomaly.lines:
                    flagged.setdefault(line, []).append(kind)
        times: list[float] = []
        for line, ev in self.events:
            if ev.get("event") != "outcome" or not _finite(ev.get("t")):
                continue
            t = float(ev["t"])
            decided = float(ev["decided_at"]) if _finite(ev.get("decided_at")) else None
            if decided is not None and decided > t:
                decided = None
            kinds = tuple(k for k in ANOMALY_ORDER if k in flagged.get(line, ()))
            worker = _worker(str(ev.get("worker", "")), self.mode)
            mark = Mark(
                worker, t, decided, str(ev.get("outcome")), kinds, _title(ev, worker, kinds)
            )
            self.marks.setdefault(label(ev), []).append(mark)
            times += [t] if decided is None else [t, decided]
        if times:
            self.start, self.end = min(times), max(times)

    def score(self, key: tuple[str, str]) -> int:
        """How much there is to see on ``key``: anomalies, then refusals."""
        marks = self.marks.get(key, [])
        return sum(10 * bool(m.kinds) + (m.outcome in REFUSALS) for m in marks)


def _finite(value: object) -> bool:
    """A number that can be placed on the axis (the history reader refuses inf and NaN)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and value == value


def label(ev: Mapping[str, Any]) -> tuple[str, str]:
    """A key's name shared by both runs: the demo's collections differ by run id and mode
    (``demo.<run>.<mode>.<kind>``), so the kind and the key name it."""
    collection = str(ev.get("collection", ""))
    if collection.startswith("demo.") and collection.count(".") >= 3:
        collection = collection.rsplit(".", 1)[1]
    return collection, str(ev.get("key"))


def _worker(name: str, mode: str) -> str:
    return name[len(mode) + 1 :] if name.startswith(f"{mode}-") else name or "?"


def _title(ev: Mapping[str, Any], worker: str, kinds: Iterable[str]) -> str:
    outcome = ev.get("outcome")
    parts = [f"{worker}: {ev.get('transition', '')} decided against v{ev.get('expected_version')}"]
    if outcome == "committed":
        parts.append(f"committed v{ev.get('version')} over v{ev.get('applied_over')}")
    else:
        parts.append(f"{outcome} (record at v{ev.get('version')})")
    if ev.get("token") is not None:
        parts.append(f"lease token {ev.get('token')}")
    if ev.get("reason"):
        parts.append(str(ev["reason"]).replace("_", " "))
    parts += [SINGULAR[k] for k in kinds]
    return "; ".join(parts)


# -- drawing -----------------------------------------------------------------------------
def _style(mark: Mark, mode: str) -> tuple[str, str, float]:
    if mark.kinds:
        return ANOMALY_STYLE[mark.kinds[0]]
    if mark.outcome == "committed":
        return ("circle", OK_COLOUR[mode], 3.6)
    return OUTCOME_STYLE.get(mark.outcome, ("circle", "#9e9e9e", 3.0))


def _draw_mark(mark: Mark, mode: str, x: float, y: float, xd: float | None) -> str:
    kind, colour, r = _style(mark, mode)
    out = ""
    bad = bool(mark.kinds)
    if xd is not None:
        line = "#e57373" if bad else "#b0bec5"
        out += (
            f'<line x1="{num(xd)}" y1="{num(y)}" x2="{num(x)}" y2="{num(y)}"'
            f' stroke="{line}" stroke-width="{1.6 if bad else 1}"/>'
            f'<circle cx="{num(xd)}" cy="{num(y)}" r="2.2" fill="#fff" stroke="#78909c"/>'
        )
    if "lost_update" in mark.kinds and kind != "ring":
        out += (
            f'<circle cx="{num(x)}" cy="{num(y)}" r="{num(r + 2.6)}" fill="none"'
            ' stroke="#d32f2f" stroke-width="1.4"/>'
        )
    title = f"<title>{esc(mark.title)}</title>"
    css = "mark anomaly" if bad else f"mark {esc(mark.outcome)}"
    return out + f'<g class="{css}">' + shape(kind, x, y, r, colour) + title + close(kind) + "</g>"


def _rows(marks: Sequence[Mark], scale: float) -> tuple[list[str], list[int], str]:
    """Row labels, each mark's row, and a note: a row per worker, or, when there are
    more workers than ``MAX_ROWS`` (RQ forks a process per job), marks packed into as
    few rows as keep them apart."""
    workers = sorted({m.worker for m in marks}, key=_natural)
    if len(workers) <= MAX_ROWS:
        index = {w: i for i, w in enumerate(workers)}
        return workers or ["-"], [index[m.worker] for m in marks], ""
    gap = 14 / scale  # seconds that 14 pixels stand for
    ends: list[float] = []
    placed = [0] * len(marks)
    for i in sorted(range(len(marks)), key=lambda i: _start(marks[i])):
        start = _start(marks[i])
        row = next((r for r, end in enumerate(ends) if end + gap <= start), len(ends))
        if row == len(ends):
            ends.append(0.0)
        ends[row] = marks[i].t
        placed[i] = row
    rows = f"{len(ends)} row{'s' if len(ends) > 1 else ''}"
    note = f" ({len(workers)} workers in {rows}: hover a mark for its worker)"
    return [""] * len(ends), placed, note


def _start(mark: Mark) -> float:
    return mark.t if mark.decided is None else mark.decided


def _lane(run: RunView, key: tuple[str, str], top: float, scale: float) -> tuple[str, float]:
    marks = run.marks.get(key, [])
    workers, placed, note = _rows(marks, scale)
    height = LANE_HEAD + ROW * len(workers)
    tint = "#fdecea" if any(m.kinds for m in marks) else "#eef5ee"
    out = [
        f'<g class="lane {esc(run.mode)}" data-lane="{esc(run.mode)}">',
        f'<rect x="0" y="{num(top)}" width="{WIDTH}" height="{LANE_HEAD - 2}" fill="{tint}"/>',
        f'<text x="6" y="{num(top + 14)}" font-size="13" font-weight="700">'
        f"{esc(TITLES.get(run.mode, run.mode))}</text>",
    ]
    counts = _lane_counts(run, key) + note
    out.append(
        f'<text x="{GUTTER + 110}" y="{num(top + 14)}" font-size="12" fill="#37414b">'
        f"{esc(counts)}</text>"
    )
    rows = [top + LANE_HEAD + ROW * i + ROW / 2 for i in range(len(workers))]
    for i, w in enumerate(workers):
        y = rows[i]
        if i % 2:
            out.append(
                f'<rect x="{GUTTER}" y="{num(y - ROW / 2)}" width="{WIDTH - GUTTER - RIGHT}"'
                f' height="{ROW}" fill="#f6f8fa"/>'
            )
        out.append(
            f'<text x="{GUTTER - 8}" y="{num(y + 4)}" font-size="11" fill="#5b6570"'
            f' text-anchor="end">{esc(w)}</text>'
        )
    order = sorted(range(len(marks)), key=lambda i: (bool(marks[i].kinds), marks[i].t))
    for i in order:  # anomalies drawn last: on top
        mark = marks[i]
        x = GUTTER + (mark.t - run.start) * scale
        xd = None if mark.decided is None else GUTTER + (mark.decided - run.start) * scale
        out.append(_draw_mark(mark, run.mode, x, rows[placed[i]], xd))
    out.append("</g>")
    return "".join(out), height


def _lane_counts(run: RunView, key: tuple[str, str]) -> str:
    marks = run.marks.get(key, [])
    kinds = [k for k in ANOMALY_KINDS if any(k in m.kinds for m in marks)]
    found = [f"{sum(k in m.kinds for m in marks)} {LABELS[k]}" for k in kinds]
    refused = [f"{n} {o}" for o in REFUSALS if (n := sum(m.outcome == o for m in marks))]
    commits = sum(m.outcome == "committed" for m in marks)
    text = f"{commits} commits"
    if refused:
        text += "; refused: " + ", ".join(refused)
    if found:
        text += "; checker: " + ", ".join(found)
    return text


def _axis(top: float, seconds: float, scale: float) -> str:
    step = next(
        s for s in (0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 60, 120, 300, 600, 1e9) if seconds / s <= 14
    )
    out = [
        f'<line x1="{GUTTER}" y1="{num(top)}" x2="{WIDTH - RIGHT}" y2="{num(top)}"'
        ' stroke="#90a4ae"/>'
    ]
    tick = 0.0
    while tick <= seconds + 1e-9:
        x = GUTTER + tick * scale
        out.append(
            f'<line x1="{num(x)}" y1="{num(top)}" x2="{num(x)}" y2="{num(top + 4)}"'
            ' stroke="#90a4ae"/>'
            f'<text x="{num(x)}" y="{num(top + 16)}" font-size="11" fill="#5b6570"'
            f' text-anchor="middle">{tick:g}s</text>'
        )
        tick += step
    return "".join(out)


def _timeline(runs: Sequence[RunView], key: tuple[str, str], seconds: float) -> str:
    scale = (WIDTH - GUTTER - RIGHT) / max(seconds, 1e-6)
    parts: list[str] = []
    top = 0.0
    for run in runs:
        lane, height = _lane(run, key, top, scale)
        parts.append(lane)
        top += height + 6
    parts.append(_axis(top, seconds, scale))
    name = f"{key[0]} {key[1]}"
    body = svg(WIDTH, top + AXIS, "".join(parts), label=f"timeline of {name}")
    return f'<section class="key"><h2>{esc(key[0])} <code>{esc(key[1])}</code></h2>{body}</section>'


def _natural(name: str) -> tuple[Any, ...]:
    digits = "".join(c for c in name if c.isdigit())
    return (
        name.rstrip("0123456789"),
        int(digits) if digits.isdigit() and len(digits) < 18 else 0,
        name,
    )


def _verdict(run: RunView) -> str:
    report = run.report
    refused = ", ".join(f"{report.outcomes.get(o, 0)} {o}" for o in REFUSALS)
    drift = "" if run.drift is None else f"<p>account balance drift: {run.drift:+d}</p>"
    outcomes = f"<p>{report.outcomes.get('committed', 0)} committed; refused: {esc(refused)}</p>"
    if report.ok:
        head = f"{esc(TITLES.get(run.mode, run.mode))}: PASS, no anomaly"
        return (
            f'<div class="verdict pass" data-run="{esc(run.mode)}"><h3>{head}</h3>'
            f"{outcomes}{drift}</div>"
        )
    found = ", ".join(f"{n} {LABELS[k]}" for k, n in report.counts.items() if n)
    head = f"{esc(TITLES.get(run.mode, run.mode))}: FAIL, {report.total} anomalies"
    return (
        f'<div class="verdict fail" data-run="{esc(run.mode)}"><h3>{head}</h3>'
        f"<p>{esc(found)}</p>{outcomes}{drift}</div>"
    )


def _legend() -> str:
    def item(kind: str, colour: str, r: float, text: str) -> str:
        mark = svg(18, 16, shape(kind, 9, 8, r, colour) + close(kind))
        return f"<span>{mark} {esc(text)}</span>"

    decision = (
        '<line x1="3" y1="8" x2="40" y2="8" stroke="#b0bec5"/>'
        '<circle cx="4" cy="8" r="2.2" fill="#fff" stroke="#78909c"/>'
        '<circle cx="37" cy="8" r="3.6" fill="#607d8b"/>'
    )
    items = [
        f"<span>{svg(44, 16, decision)} a decision (o), joined to its outcome (when the"
        " store answered)</span>",
        item("circle", OK_COLOUR["fencing"], 3.6, "committed (fencing)"),
        item("circle", OK_COLOUR["naive"], 3.6, "committed (naive)"),
    ]
    items += [item(*ANOMALY_STYLE[k], SINGULAR[k].split(":")[0]) for k in ANOMALY_ORDER]
    items += [item(*OUTCOME_STYLE[o], REFUSAL_LABELS[o]) for o in REFUSALS]
    return f'<div class="legend" id="legend">{"".join(items)}</div>'


def race_html(runs: Sequence[RunView], about: str = "", max_keys: int = MAX_KEYS) -> str:
    """The report page for ``runs`` (naive first, then fencing)."""
    keys = {key for run in runs for key in run.marks}
    order = sorted(keys, key=lambda k: (-sum(r.score(k) for r in runs), _natural(f"{k[0]} {k[1]}")))
    shown = order[:max_keys]
    seconds = max((r.end - r.start for r in runs), default=0.0) or 1.0
    banner = "".join(_verdict(run) for run in runs)
    fencing_ok = all(r.report.ok for r in runs if r.mode == "fencing")
    headline = "fencing run: no anomaly" if fencing_ok else "fencing run: ANOMALIES FOUND"
    body = [
        "<h1>fencing demo: the same race, naive and with fencing</h1>",
        f'<p class="sub">{esc(about)}</p>' if about else "",
        f'<section id="verdict" data-ok="{str(fencing_ok).lower()}">'
        f"<h2>The history checker's verdict: {esc(headline)}</h2>"
        f'<div class="verdicts">{banner}</div></section>',
        _legend(),
        f'<p class="sub" id="shown">Showing {len(shown)} of {len(keys)} keys, the ones with the'
        " most anomalies and refusals first. Time runs right from each run's first decision;"
        " hover a mark for its details.</p>",
        *(_timeline(runs, key, seconds) for key in shown),
    ]
    return page("fencing demo: race report", "\n".join(body))


def _about(config: DemoConfig, results: Mapping[str, RunResult]) -> str:
    where = f"through {config.queue}" if config.queue else "in one process"
    store = config.store or "a temporary SQLite file"
    tasks = next(iter(results.values())).tasks if results else config.tasks
    return (
        f"{tasks} tasks, {config.workers} workers {where}, over {config.keys} accounts and"
        f" {config.keys} orders; seed {config.seed}; store: {store}."
    )


def write_report(path: str, config: DemoConfig, results: Mapping[str, RunResult]) -> None:
    """Write the report of a finished demo (its histories must still be on disk)."""
    runs = []
    for mode, result in results.items():
        assert result.report is not None and result.history
        events = list(iter_file(result.history))
        runs.append(RunView(mode, events, result.report, result.drift))
    text = race_html(runs, _about(config, results))
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)
