"""``fencing outbox URL``: the outbox's pending rows with their age, for people and monitors;
its dead rows (``--dead``, ``--fail-if-dead``), put back (``--retry ID...``) or dropped
(``--drop ID...``)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from .._errors import OutboxRowError
from .._outbox import QUEUE_KINDS, OutboxRow
from .._url import URL_HELP

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("url", help="store URL, e.g. sqlite:///app.db" + URL_HELP)
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
    parser.add_argument(
        "--dead",
        action="store_true",
        help="list the dead rows (given up by a relay's --dead-after) instead of the pending",
    )
    parser.add_argument(
        "--fail-if-dead",
        action="store_true",
        help="exit 1 if any row is dead (a monitor's check)",
    )
    act = parser.add_mutually_exclusive_group()
    act.add_argument(
        "--retry",
        type=int,
        nargs="+",
        metavar="ID",
        help="put these dead rows back to pending (attempts reset): all of them or none",
    )
    act.add_argument(
        "--drop",
        type=int,
        nargs="+",
        metavar="ID",
        help="delete these dead rows (never published): all of them or none",
    )


def _row_dict(row: OutboxRow, now: float) -> dict[str, object]:
    if row.dead:
        return {
            "id": row.id,
            "kind": row.kind,
            "task": row.task,
            "queue": row.queue,
            "key": row.key,
            "age": round(row.age(now), 3),
            "attempts": row.attempts,
            "strikes": row.strikes,
            "last_error": row.last_error,
            "dead_for": round(max(0.0, now - (row.dead_at or now)), 3),
            "payload": row.payload,
            "options": dict(row.options),
        }
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
        "due_in": None if row.due_at is None else round(max(0.0, row.due_at - now), 3),
    }


def _change(store: Any, args: argparse.Namespace) -> int:
    """``--retry`` / ``--drop``: all the rows or none (a typed error names the others)."""
    ids, verb = (args.retry, "put back") if args.retry else (args.drop, "dropped")
    try:
        done = store.outbox.retry(ids) if args.retry else store.outbox.drop(ids)
    except OutboxRowError as exc:
        print(f"fencing outbox: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"ids": sorted(set(ids)), verb.replace(" ", "_"): done}))
    else:
        print(f"{verb} {done} dead outbox row(s)")
    return 0


def run(args: argparse.Namespace) -> int:
    import fencing

    with fencing.open(args.url, migrate="check") as store:
        if args.retry or args.drop:
            return _change(store, args)
        stats = store.outbox.stats(kind=args.kind)
        if args.dead:
            rows = store.outbox.dead(kind=args.kind, limit=args.limit)
        else:
            rows = store.outbox.pending(kind=args.kind, limit=args.limit)
    now = stats.now
    late = (
        args.fail_if_older is not None and stats.pending and stats.oldest_age > args.fail_if_older
    )
    if args.json:
        for row in rows:
            print(json.dumps(_row_dict(row, now), sort_keys=True))
        totals = {"pending": stats.pending, "oldest_age": round(stats.oldest_age, 3)}
        counts = {"dead": stats.dead, "superseded": stats.superseded}
        print(json.dumps({**totals, **counts}, sort_keys=True))
    elif args.dead:
        _show_dead(rows, now, stats.dead)
    else:
        _show(rows, now, stats.pending, stats.oldest_age, stats.dead, stats.superseded)
    failed = 0
    if late:
        print(
            f"fencing outbox: the oldest pending row is {stats.oldest_age:.1f}s old"
            f" (more than {args.fail_if_older:g}s)",
            file=sys.stderr,
        )
        failed = 1
    if args.fail_if_dead and stats.dead:
        print(
            f"fencing outbox: {stats.dead} dead row(s): `fencing outbox URL --dead` lists"
            " them, --retry ID puts one back, --drop ID deletes it",
            file=sys.stderr,
        )
        failed = 1
    return failed


def _table(title: str, headers: tuple[str, ...], lines: Sequence[tuple[str, ...]]) -> None:
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


def _show_dead(rows: list[OutboxRow], now: float, dead: int) -> None:
    if not rows:
        print("no dead outbox row")
        return
    headers = ("id", "kind", "task", "queue", "key", "age", "dead for", "attempts", "last error")
    lines = [
        (
            str(r.id),
            r.kind,
            r.task,
            r.queue or "",
            r.key,
            f"{r.age(now):.1f}s",
            f"{max(0.0, now - (r.dead_at or now)):.1f}s",
            str(r.attempts),
            (r.last_error or "")[:80],
        )
        for r in rows
    ]
    _table(
        f"{dead} dead outbox row(s): --retry ID puts one back, --drop ID deletes it", headers, lines
    )
    if len(rows) < dead:
        print(f"(showing the oldest {len(rows)}; --limit N for more)", file=sys.stderr)


def _show(
    rows: list[OutboxRow], now: float, pending: int, oldest: float, dead: int, superseded: int
) -> None:
    if dead:
        print(f"{dead} dead outbox row(s): `--dead` lists them", file=sys.stderr)
    if superseded:
        print(f"{superseded} superseded outbox row(s) (never published; pruned like sent ones)")
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
    _table(f"{pending} pending outbox row(s), the oldest {oldest:.1f}s old", headers, lines)
    if len(rows) < pending:
        print(f"(showing the oldest {len(rows)}; --limit N for more)", file=sys.stderr)
