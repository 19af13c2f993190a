"""``fencing outbox URL``: the outbox's pending rows with their age, for people and monitors."""

from __future__ import annotations

import argparse
import json
import sys

from .._outbox import QUEUE_KINDS, OutboxRow

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("url", help="store URL, e.g. sqlite:///app.db")
    parser.add_argument(
        "--kind", choices=QUEUE_KINDS, default=None, help="only rows of this queue kind"
    )
    parser.add_argument("--limit", type=int, default=100, help="list at most this many (100)")
    parser.add_argument(
        "--json",
        action="store_true",
        help="print JSON lines: one per pending row, then one with the backlog's totals",
    )
    parser.add_argument(
        "--fail-if-older",
        type=float,
        default=None,
        metavar="SECONDS",
        help="exit 1 if the oldest pending row is older than this (a monitor's check)",
    )


def _row_dict(row: OutboxRow, now: float) -> dict[str, object]:
    return {
        "id": row.id,
        "kind": row.kind,
        "task": row.task,
        "queue": row.queue,
        "key": row.key,
        "age": round(row.age(now), 3),
        "attempts": row.attempts,
        "last_error": row.last_error,
        "claimed_by": row.claimed_by,
        "claimed_for": None
        if row.claimed_until is None
        else round(max(0.0, row.claimed_until - now), 3),
    }


def run(args: argparse.Namespace) -> int:
    import fencing

    with fencing.open(args.url) as store:
        stats = store.outbox.stats(kind=args.kind)
        rows = store.outbox.pending(kind=args.kind, limit=args.limit)
    now = stats.now
    late = (
        args.fail_if_older is not None and stats.pending and stats.oldest_age > args.fail_if_older
    )
    if args.json:
        for row in rows:
            print(json.dumps(_row_dict(row, now), sort_keys=True))
        print(
            json.dumps(
                {"pending": stats.pending, "oldest_age": round(stats.oldest_age, 3)},
                sort_keys=True,
            )
        )
    else:
        _show(rows, now, stats.pending, stats.oldest_age)
    if late:
        print(
            f"fencing outbox: the oldest pending row is {stats.oldest_age:.1f}s old"
            f" (more than {args.fail_if_older:g}s)",
            file=sys.stderr,
        )
        return 1
    return 0


def _show(rows: list[OutboxRow], now: float, pending: int, oldest: float) -> None:
    if not rows:
        print("no pending outbox row")
        return
    headers = ("id", "kind", "task", "queue", "key", "age", "attempts", "claimed by", "last error")
    lines = [
        (
            str(r.id),
            r.kind,
            r.task,
            r.queue or "",
            r.key,
            f"{r.age(now):.1f}s",
            str(r.attempts),
            r.claimed_by or "" if r.claimed_until is None or r.claimed_until > now else "",
            (r.last_error or "")[:80],
        )
        for r in rows
    ]
    title = f"{pending} pending outbox row(s), the oldest {oldest:.1f}s old"
    try:
        from rich.console import Console
        from rich.table import Table
    except ModuleNotFoundError:
        print(title)
        print("\t".join(headers))
        for line in lines:
            print("\t".join(line))
    else:
        table = Table(title=title, title_justify="left")
        for header in headers:
            table.add_column(header, overflow="fold")
        for line in lines:
            table.add_row(*line)
        width = None if sys.stdout.isatty() else 200
        Console(highlight=False, width=width).print(table)
    if len(rows) < pending:
        print(f"(showing the oldest {len(rows)}; --limit N for more)", file=sys.stderr)
