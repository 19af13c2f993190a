"""``fencing reconcile URL``: effects made for decisions that never committed.

It lists, oldest first, the recorded effects of intents that ended stale, fenced,
contended or missing, or whose task failed and abandoned them, and are not yet
reconciled: a charge for an order that had
been cancelled meanwhile, an email about a state that was overwritten. Someone (or
a job) undoes or accepts each one, then marks it: ``--mark KEY``. Marking is
idempotent. Exit status: 0, or 1 with ``--fail-if-any`` when something is listed
(for a monitoring check).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import TYPE_CHECKING, Any

from ._url import URL_HELP

if TYPE_CHECKING:
    from ._effects import Effect

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser, *, url: bool = True) -> None:
    """The arguments of ``fencing reconcile`` (``url=False``: all but the store's URL, for
    a command that knows its store: Django's ``manage.py fencing_reconcile``)."""
    if url:
        parser.add_argument("url", help="store URL, e.g. sqlite:///app.db" + URL_HELP)
    parser.add_argument(
        "--mark",
        action="append",
        default=[],
        metavar="KEY",
        help="mark the effect with this idempotency key reconciled (repeatable; idempotent)",
    )
    parser.add_argument("--limit", type=int, default=100, help="list at most this many")
    parser.add_argument(
        "--pending-for",
        type=float,
        default=None,
        metavar="SECONDS",
        help="also list effects whose work has neither committed nor ended for this long"
        " (a task that vanished after its call)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON lines, one per effect")
    parser.add_argument(
        "--fail-if-any",
        action="store_true",
        help="exit 1 if any effect still needs reconciling (after --mark)",
    )


def run(args: argparse.Namespace, store: Any = None) -> int:
    """``fencing reconcile``: on ``store`` (left open) if given, else on ``args.url``."""
    import fencing

    if store is None:
        with fencing.open(args.url, migrate="check") as opened:
            return run(args, opened)
    marked = []
    for key in args.mark:
        before = store.get_effect(key)
        effect = store.mark_reconciled(key)
        marked.append((effect, before is not None and before.reconciled))
    settled = store.effects_to_reconcile(limit=args.limit)
    stuck = []
    if args.pending_for is not None:
        stuck = store.pending_effects(older_than=args.pending_for, limit=args.limit)
    if args.json:
        for effect, already in marked:
            print(json.dumps({"marked": effect.to_dict(), "already": already}, sort_keys=True))
        for effect in [*settled, *stuck]:
            print(json.dumps(effect.to_dict(), sort_keys=True))
    else:
        for effect, already in marked:
            state = "was already reconciled" if already else "marked reconciled"
            print(f"{effect.idempotency_key} {state}")
        _show(settled, args.limit, "need reconciling", "no effect needs reconciling")
        if args.pending_for is not None:
            title = f"pending for {args.pending_for:g} s or more, work neither committed nor ended"
            _show(stuck, args.limit, title, f"no effect {title}")
    return 1 if args.fail_if_any and (settled or stuck) else 0


def _show(effects: list[Effect], limit: int, what: str, empty: str) -> None:
    if not effects:
        print(empty)
        return
    headers = ("idempotency key", "where", "intent", "effect", "status", "outcome", "age", "detail")
    rows = [_row(e) for e in effects]
    try:
        from rich.console import Console
        from rich.table import Table
    except ModuleNotFoundError:
        print("\t".join(headers))
        for row in rows:
            print("\t".join(row))
    else:
        table = Table(title=f"{len(effects)} effect(s) {what}", title_justify="left")
        table.add_column(headers[0], no_wrap=True, min_width=43)
        for header in headers[1:]:
            table.add_column(header, overflow="fold")
        for row in rows:
            table.add_row(*row)
        # a pipe or a file gets every column in full; a terminal, its own width
        width = None if sys.stdout.isatty() else 200
        Console(highlight=False, width=width).print(table)
    if len(effects) == limit:
        print(f"(showing the oldest {limit}; --limit N for more)", file=sys.stderr)


def _row(effect: Effect) -> tuple[str, ...]:
    where = f"{effect.collection}/{effect.key}"
    detail = "" if effect.detail is None else json.dumps(effect.detail, sort_keys=True)
    return (
        effect.idempotency_key,
        where,
        f"{effect.transition} {effect.intent_id}",
        effect.name,
        effect.status,
        effect.outcome or "",
        _age(effect),
        detail[:80],
    )


def _age(effect: Effect) -> str:
    # The store's clock is wall time on SQLite and the servers; memory:// is process-local.
    seconds = time.time() - effect.recorded_at
    if not 0 <= seconds < 10 * 365 * 86400:
        return ""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"
