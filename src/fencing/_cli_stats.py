"""``fencing stats URL``: what a store holds, per collection and guarded table: records
(a table's rows; ``-`` when the table is gone), applied intents recorded (commits not
yet pruned), effects by state, leases held (named ``<name>/<key>``, the record-lease
convention), and the outbox's backlog. A table is listed once fencing committed to it or
guards it. Read-only; on every store (``memory://`` only sees its own process)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from ._url import URL_HELP

if TYPE_CHECKING:
    from ._store import Store

__all__ = ["add_arguments", "run", "stats"]


def add_arguments(parser: argparse.ArgumentParser, *, url: bool = True) -> None:
    """The arguments of ``fencing stats`` (``url=False``: all but the store's URL, for a
    command that knows its store: Django's ``manage.py fencing_stats``)."""
    if url:
        parser.add_argument("url", help="store URL, e.g. sqlite:///app.db" + URL_HELP)
    parser.add_argument(
        "--json", action="store_true", help="print JSON even on a terminal (always parseable)"
    )


def stats(store: Store) -> dict[str, Any]:
    """What ``fencing stats`` shows, as JSON values."""
    from ._errors import ConfigurationError

    found = store.backend.stats()
    try:
        backlog = store.outbox.stats()
    except ConfigurationError:  # a store without an outbox table (Redis)
        outbox = None
    else:
        outbox = {
            "pending": backlog.pending,
            "oldest_age": round(backlog.oldest_age, 3),
            "dead": backlog.dead,
            "superseded": backlog.superseded,
        }
    return {
        "store": store.backend.scheme,
        "collections": [
            {
                "kind": scope.kind,
                "name": scope.name,
                "records": scope.records,
                "applied": scope.applied,
                "effects": dict(scope.effects),
                "leases_held": scope.leases_held,
            }
            for scope in found.scopes
        ],
        "leases_held": found.leases_held,
        "outbox": outbox,
    }


def run(args: argparse.Namespace, store: Store | None = None) -> int:
    """``fencing stats``: on ``store`` (left open) if given, else on ``args.url``."""
    import fencing

    if store is not None:
        shown = stats(store)
    else:
        with fencing.open(args.url, migrate="check") as opened:
            shown = stats(opened)
    if args.json or not sys.stdout.isatty() or not _table(shown):
        print(json.dumps(shown, indent=2, sort_keys=True))
    return 0


def _table(shown: dict[str, Any]) -> bool:
    """Print ``shown`` as a rich table; False if rich is not installed."""
    try:
        from rich import box
        from rich.console import Console
        from rich.table import Table
    except ModuleNotFoundError:
        return False
    table = Table(
        title=f"fencing stats ({shown['store']})",
        title_justify="left",
        caption="pending, done, failed, reconcile: effects (reconcile: those needing it);"
        " leases: held, named <name>/<key>",
        caption_justify="left",
        box=box.SIMPLE_HEAD,
        padding=(0, 1),
        pad_edge=False,
        collapse_padding=True,
    )
    table.add_column("collection / table", overflow="fold", min_width=14)
    counts = ("records", "applied", "pending", "done", "failed", "reconcile", "leases")
    for header in counts:
        table.add_column(header, justify="right")
    for row in shown["collections"]:
        effects = row["effects"]
        table.add_row(
            row["name"] if row["kind"] == "collection" else f"{row['name']} (table)",
            "-" if row["records"] is None else str(row["records"]),
            str(row["applied"]),
            *(str(effects.get(s, 0)) for s in ("pending", "done", "failed", "reconcile")),
            str(row["leases_held"]),
        )
    if not shown["collections"]:
        table.add_row("(nothing recorded yet)", *[""] * len(counts))
    console = Console(highlight=False)
    console.print(table)
    outbox = shown["outbox"]
    backlog = (
        "no outbox on this store"
        if outbox is None
        else f"outbox: {outbox['pending']} pending, oldest {outbox['oldest_age']:g} s,"
        f" {outbox['dead']} dead, {outbox['superseded']} superseded"
    )
    console.print(f"leases held: {shown['leases_held']} in all; {backlog}")
    return True
