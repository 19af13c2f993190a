"""``fencing check HISTORY.jsonl [--json]``: judge a recorded history.

Exit status: 0 when the history is clean, 1 when it shows anomalies, 2 when it
cannot be read (malformed line, missing file).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from ._checker import ANOMALY_KINDS, LABELS, Report, check_file
from ._history import HistoryError

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["MEANINGS", "add_arguments", "render", "run"]

#: What each anomaly kind means, in a few words.
MEANINGS: dict[str, str] = {
    "lost_update": "acknowledged commits missing from the final state's history",
    "stale_write": "commits applied over a version other than the intent's",
    "double_applied": "intents committed more than once",
    "fence_regression": "a lower lease token wrote after a higher one",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("history", help="a JSON Lines history file")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument(
        "--examples",
        type=int,
        default=3,
        metavar="N",
        help="examples shown per anomaly kind (default 3)",
    )


def _examples(report: Report, kind: str, limit: int) -> str:
    found = report.anomalies[kind][:limit]
    lines = [f"{a.key}, line {', '.join(map(str, a.lines))}: {a.message}" for a in found]
    more = len(report.anomalies[kind]) - len(found)
    if more > 0:
        lines.append(f"... and {more} more")
    return "\n".join(lines)


def render(console: Console, report: Report, title: str, examples: int = 3) -> None:
    from rich.table import Table

    outcomes = ", ".join(f"{n} {name}" for name, n in report.outcomes.items() if n)
    console.print(
        f"[bold]{title}[/]: {report.events} events on {report.keys} keys"
        + (f"; outcomes: {outcomes}" if outcomes else "")
        + (f"; {report.errors} unknown (store errors)" if report.errors else "")
    )
    table = Table(show_lines=True)
    table.add_column("anomaly")
    table.add_column("count", justify="right")
    table.add_column("first examples", overflow="fold")
    for kind in ANOMALY_KINDS:
        n = len(report.anomalies[kind])
        name, meaning = LABELS[kind], MEANINGS[kind]
        style = "bold red" if n else "green"
        table.add_row(
            f"{name}\n[dim]{meaning}[/]",
            f"[{style}]{n}[/]",
            _examples(report, kind, examples) if n else "[dim]none[/]",
        )
    console.print(table)
    if report.ok:
        console.print("[bold green]clean[/]: no anomaly found")
    else:
        console.print(f"[bold red]{report.summary()}[/]")


def run(args: argparse.Namespace) -> int:
    try:
        report = check_file(args.history)
    except (HistoryError, OSError) as exc:
        if args.json:
            print(json.dumps({"ok": False, "error": str(exc)}))
        else:
            print(f"fencing check: {exc}", file=sys.stderr)
        return 2
    if args.json:
        data: dict[str, Any] = {"history": args.history, **report.to_dict(max(0, args.examples))}
        print(json.dumps(data, indent=2, sort_keys=True))
    else:
        from rich.console import Console

        render(Console(), report, args.history, max(0, args.examples))
    return 0 if report.ok else 1
