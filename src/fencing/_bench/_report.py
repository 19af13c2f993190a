"""Rows to text: a rich table per store and setting, Markdown, or JSON.

A row is a flat dict (see ``_harness.rows_for``). ``kind`` is ``"pair"`` (fencing beside
a baseline), ``"speedup"`` (commit_many's throughput over single commits, both fencing)
or ``"skipped"`` (an operation or store that could not run here, with ``reason``).
rich is imported only by :func:`print_rich`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

__all__ = ["group_rows", "modes_markdown", "print_rich", "to_json", "to_markdown"]

Row = dict[str, Any]

NOTES = (
    "ratio = fencing's time per call / the baseline's (below 1: fencing is faster): the"
    " median over rounds of the ratio within each round, the lowest and highest in"
    " brackets; the sides ran alternately, block by block, in the same process."
    " ops/s counts commits (100 per commit_many call);"
    " p50/p99 are per call, in microseconds. Peak KiB: tracemalloc peak of Python"
    " allocations during one untimed block per side (the driver's C memory is not seen)."
)


def group_rows(rows: Sequence[Row]) -> list[tuple[str, str, list[Row]]]:
    """Rows grouped by (store, setting), in order of first appearance."""
    groups: dict[tuple[str, str], list[Row]] = {}
    for row in rows:
        groups.setdefault((row["store"], row["setting"]), []).append(row)
    return [(store, setting, items) for (store, setting), items in groups.items()]


def _rate(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:,.1f}"


def _us(value: float) -> str:
    if value >= 10_000:
        return f"{value / 1000:,.1f}ms"
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}"


def _ratio(row: Row) -> str:
    return f"{row['ratio']:.2f}x ({row['ratio_low']:.2f}-{row['ratio_high']:.2f})"


def _pair_cells(row: Row) -> list[str]:
    return [
        row["operation"],
        _rate(row["fencing_ops_per_s"]),
        _rate(row["baseline_ops_per_s"]),
        _ratio(row),
        f"{_us(row['fencing_p50_us'])} / {_us(row['baseline_p50_us'])}",
        f"{_us(row['fencing_p99_us'])} / {_us(row['baseline_p99_us'])}",
        f"{row['fencing_peak_kib']:,.1f} / {row['baseline_peak_kib']:,.1f}",
    ]


HEADERS = [
    "operation",
    "fencing ops/s",
    "hand-written ops/s",
    "ratio (time/op)",
    "p50 µs f / hw",
    "p99 µs f / hw",
    "peak KiB f / hw",
]
QUICK_NOTE = "quick run: far too few calls for the numbers to mean anything; it only checks"
QUICK_NOTE += " that every operation runs"


def _baselines(items: Sequence[Row]) -> list[str]:
    seen: dict[str, None] = {}
    for row in items:
        if row["kind"] == "pair":
            seen.setdefault(row["baseline"])
    return list(seen)


def target_lines(items: Sequence[Row]) -> list[str]:
    """One sentence per row that carries a target."""
    lines = []
    for row in items:
        if row.get("target_ratio") is None:
            continue
        verdict = "met" if row["target_met"] else "MISSED"
        if row["kind"] == "speedup":
            lines.append(
                f"target: commit_many at least {row['target_ratio']:.0f}x the commits/s of"
                f" single commits: {verdict} ({row['ratio']:.1f}x)"
            )
        else:
            lines.append(
                f"target: {row['operation']} within {row['target_ratio']:.2f}x of"
                f" {row['baseline']}: {verdict} ({row['ratio']:.2f}x)"
            )
    return lines


def _other_lines(items: Sequence[Row]) -> list[str]:
    lines = []
    for row in items:
        if row["kind"] == "skipped":
            what = row["operation"] or "store"
            lines.append(f"skipped {what}: {row['reason']}")
        elif row["kind"] == "speedup" and row.get("target_ratio") is None:
            lines.append(
                f"commit_many: {row['ratio']:.1f}x the commits/s of single"
                f" collection.commit calls ({_rate(row['fencing_ops_per_s'])} vs"
                f" {_rate(row['baseline_ops_per_s'])})"
            )
    return lines


def _methods(items: Sequence[Row]) -> list[str]:
    """What each baseline runs, once per operation (a lease cycle is one line)."""
    seen: dict[tuple[str, str], str] = {}
    for row in items:
        if row["kind"] == "pair":
            op = row["operation"].replace("lease acquire", "lease acquire/renew/release")
            if not row["operation"].startswith(("lease renew", "lease release")):
                seen.setdefault((row["baseline"], row["baseline_method"]), op)
    return [f"{op} ({label}): {method}" for (label, method), op in seen.items()]


def print_rich(rows: Sequence[Row], *, quick: bool = False) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if not console.is_terminal:
        console = Console(width=max(console.width, 150))  # a file or a pipe: do not wrap
    for store, setting, items in group_rows(rows):
        labels = _baselines(items)
        table = Table(title=f"{store}: {setting}", title_justify="left")
        if len(labels) > 1:
            table.add_column("hand-written", no_wrap=True)
        for i, header in enumerate(HEADERS):
            table.add_column(header, justify="left" if i == 0 else "right", no_wrap=True)
        for row in items:
            if row["kind"] != "pair":
                continue
            cells = _pair_cells(row)
            if len(labels) > 1:
                cells.insert(0, row["baseline"])
            style = None
            if row.get("target_met") is False:
                style = "red"
            table.add_row(*cells, style=style)
        if table.row_count:
            console.print(table)
        for line in target_lines(items):
            console.print(line, style="bold green" if "met (" in line else "bold red")
        for line in _other_lines(items):
            console.print(line)
        for line in _methods(items):
            console.print(f"  [dim]{line}[/dim]", highlight=False)
        console.print()
    console.print(NOTES, style="dim", highlight=False)
    if quick:
        console.print(QUICK_NOTE, style="bold yellow")


def to_markdown(rows: Sequence[Row], *, quick: bool = False) -> str:
    out: list[str] = [f"> {QUICK_NOTE}", ""] if quick else []
    for store, setting, items in group_rows(rows):
        labels = _baselines(items)
        out.append(f"**{store}: {setting}**")
        out.append("")
        headers = (["hand-written"] if len(labels) > 1 else []) + HEADERS
        pairs = [r for r in items if r["kind"] == "pair"]
        if pairs:
            out.append("| " + " | ".join(headers) + " |")
            out.append("|" + "|".join(["---"] + ["---:"] * (len(headers) - 1)) + "|")
            for row in pairs:
                cells = _pair_cells(row)
                if len(labels) > 1:
                    cells.insert(0, row["baseline"])
                out.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
            out.append("")
        for line in target_lines(items) + _other_lines(items):
            out.append(f"- {line}")
        out.append("")
    out += [NOTES, "", "Hand-written baselines:", ""]
    out += [f"- {line}" for line in _methods(rows)]
    return "\n".join(out) + "\n"


def to_json(rows: Sequence[Row]) -> str:
    return json.dumps(list(rows), indent=2, sort_keys=True)


def _n(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:,.1f}"


def modes_markdown(rows: Sequence[Row]) -> str:
    """Markdown for ``--contention``, ``--server-cost`` and ``--scale`` rows."""
    out: list[str] = []
    cont = [r for r in rows if r["kind"] == "contention"]
    if cont:
        out += [
            "| store | workers | keys, decide | fencing ops/s | baseline | baseline ops/s"
            " | goodput ratio | target | client CPU µs/op fencing / baseline | fencing gave up |",
            "|---|---|---|---:|---|---:|---:|---|---:|---:|",
        ]
        for r in cont:
            calls = r["fencing_completed"] + r["fencing_gave_up"]
            out.append(
                f"| {r['store']} | {r['setting']} | {r['operation']} | {_n(r['fencing_goodput'])}"
                f" | {r['baseline']} | {_n(r['baseline_goodput'])} | {r['goodput_ratio']:.2f}x"
                f" | ≥ {r['goodput_target']:.1f}x {'met' if r['goodput_met'] else 'MISSED'}"
                f" | {_n(r['fencing_cpu_us_per_op'])} / {_n(r['baseline_cpu_us_per_op'])}"
                f" | {r['fencing_gave_up']:,.0f} of {calls:,.0f} |"
            )
        out.append("")
    single = [r for r in rows if r["kind"] == "single"]
    if single:
        out += ["| one call at a time | wall µs/op | client CPU µs/op |", "|---|---:|---:|"]
        for r in single:
            out.append(
                f"| {r['operation']} | {_n(r['wall_us_per_op'])} | {_n(r['cpu_us_per_op'])} |"
            )
        out.append("")
    server = [r for r in rows if r["kind"] == "server"]
    if server:
        out += [
            "| store | measured | fencing | same answer | ratio | wall µs fencing / same answer |",
            "|---|---|---:|---:|---:|---:|",
        ]
        for r in server:
            out.append(
                f"| {r['store']} | {r['setting']} | {r['fencing_server_us']:.1f}"
                f" | {r['baseline_server_us']:.1f} | {r['ratio']:.2f}x"
                f" | {_n(r['fencing_wall_us'])} / {_n(r['baseline_wall_us'])} |"
            )
        out.append("")
    scale = [r for r in rows if r["kind"] == "scale"]
    if scale:
        out += [
            "| store | records = applied ids | commit p50 µs | p99 µs |",
            "|---|---:|---:|---:|",
        ]
        for r in scale:
            out.append(
                f"| {r['store']} | {r['records']:,} | {_n(r['p50_us'])} | {_n(r['p99_us'])} |"
            )
        out.append("")
    for r in rows:
        if r["kind"] == "prune":
            during = (
                f"p50 {_n(r['during_p50_us'])} µs, p99 {_n(r['during_p99_us'])} µs,"
                f" max {_n(r['during_max_us'])} µs"
                if "during_p50_us" in r
                else "none completed"
            )
            out.append(
                f"- {r['store']}: prune() of {r['applied']:,} applied ids removed"
                f" {r['removed']:,} rows in {r['prune_s']:.2f} s; {r['commits_during']} commits"
                f" meanwhile ({during}) against p50 {_n(r['before_p50_us'])} µs,"
                f" p99 {_n(r['before_p99_us'])} µs just before"
            )
    for r in rows:
        if r["kind"] == "skipped":
            out.append(f"- skipped ({r['store']}, {r['operation']}): {r['reason']}")
    return "\n".join(out) + "\n"
