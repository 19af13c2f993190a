"""The ``worktx`` contest's fencing side: one delivery of a fenced task that ships an
order, books a shipment row and sends the next step through the outbox, in the worker's
transaction or as today's fenced task followed by the row's and the send's own."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, Final

import fencing

from .._values import Committed, Intent, Record
from ._harness import BenchFailed, Block, Side

#: the baseline's label: today's fenced task, then the row's and the send's own transactions
WORKTX_SEPARATE: Final = "fenced_task, separate"

if TYPE_CHECKING:
    from ..contrib._common import Step


def _paramstyle(conn: Any) -> str:
    """The DB-API paramstyle of a driver connection (``qmark`` for sqlite3)."""
    module = sys.modules.get(type(conn).__module__.split(".")[0])
    return str(getattr(module, "paramstyle", "format"))


def notify_task(name: str, table: fencing.Table) -> Any:
    """A fenced task ``outbox.send`` accepts, without a queue: rows routed as Celery's."""
    from ..contrib._common import FencedTask

    spec = FencedTask(name=name, target=table, decide=lambda record: {"status": "notified"})

    def route(task: Any, options: dict[str, Any]) -> tuple[str, str, str | None, dict[str, Any]]:
        return "celery", name, None, options

    spec.outbox_route = route
    return SimpleNamespace(fencing=spec, name=name)


def worker_task(
    ops: Any,
    table: fencing.Table,
    conn: Any,
    shipments: str,
    cursor: Any,
    new_id: Callable[[], str],
    joined: bool,
) -> Side:
    """One delivery of a fenced task that ships an order, books a shipment row and
    sends the next step through the outbox. ``joined``: all three in the worker's
    transaction on ``conn`` (``transaction=``, ``then=``); else today's fenced task
    (its commit on the store's own connection), then the row on ``conn`` and its
    COMMIT, then ``store.outbox.send`` on the store's own connection."""

    from ..contrib._common import FencedTask

    mark = "?" if _paramstyle(conn) == "qmark" else "%s"
    book = f"INSERT INTO {shipments} (order_id, note) VALUES ({mark}, {mark})"
    notify = notify_task(f"bench.notify-{ops.suffix}", table)

    def ship(record: Record) -> dict[str, Any]:
        return {"status": "shipped", "total": int(record.state.get("total") or 0) + 1}

    @contextlib.contextmanager
    def transaction() -> Iterator[Any]:
        try:
            yield conn
        except BaseException:
            conn.rollback()
            raise
        conn.commit()

    def then(step: Step) -> None:
        step.connection.cursor().execute(book, (int(step.record.key), "shipped"))
        step.send(notify, step.record, "notify")

    options: dict[str, Any] = {"transaction": transaction, "then": then} if joined else {}
    name = f"bench.ship-{ops.suffix}"
    spec = FencedTask(name=name, target=table, decide=ship, **options)
    send = ops.store.outbox.send

    def prepare(n: int) -> Block:
        payloads = [
            Intent(new_id(), table.name, key, version, "ship", kind="table").to_json()
            for key, version in cursor.take(n)
        ]

        def op(i: int) -> None:
            outcome = spec.run(payloads[i]).outcome
            if not isinstance(outcome, Committed):
                raise BenchFailed(f"a measured fenced task did not commit: {outcome!r}")
            if not joined:
                conn.cursor().execute(book, (int(outcome.record.key), "shipped"))
                conn.commit()
                send(notify, outcome.record, "notify")

        return Block([op])

    if joined:
        return Side(
            "fencing, worker transaction",
            "fenced task with transaction= and then=: commit, row, outbox.send, one COMMIT",
            prepare,
        )
    return Side(
        WORKTX_SEPARATE,
        "fenced task on the store's connection; then INSERT + COMMIT; then outbox.send",
        prepare,
    )
