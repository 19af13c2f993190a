"""What the chain demo's workers run (``fencing demo --queue Q --outbox --chain``).

Two steps per order, ship then notify, each a fenced task of the queue's integration on
a table of orders in the demo's SQLite file (``chain_orders_<run>_<mode>``; ``paid`` ->
``shipped`` -> ``notified``). Ship books a row in ``chain_shipments_<run>`` and sends
notify, decided against the version ship's commit produced; notify books a row in
``chain_notifications_<run>`` (in its own worker transaction, the same in both runs).
What differs is how ship does its three writes:

- ``chain``: one worker transaction (``transaction=``, ``then=``): the fenced commit,
  the shipment row and ``outbox.send`` of notify commit together; a relay publishes it;
- ``naive``: the shipment row on the worker's own connection (committed at once), then
  today's fenced commit on the store's connection, then notify enqueued directly.

The seed picks orders whose first ship delivery is SIGKILLed between its own write and
its commit (``before``), and orders whose first ship delivery is SIGKILLed after its
commit, before the enqueue of notify and the queue's acknowledgement (``after``). Every
delivery's end is appended to ``chain-events.jsonl`` in the control directory, for the
demo to follow. Each queue's module registers its notify tasks and how it enqueues one
directly (:func:`register`).
"""

from __future__ import annotations

import contextlib
import functools
import os
import random
import signal
import sqlite3
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any, Final

import fencing

from ..._values import Committed, Intent, Record
from ...contrib._common import Action, Step, TaskReport, current_intent
from ._tasks import _writer, claim_first, settings

MODES: Final = ("naive", "chain")
#: The share of orders whose first ship delivery is killed at each of the two moments.
CRASH_RATE: Final = 0.1
EVENTS: Final = "chain-events.jsonl"
MOMENTS: Final = ("before", "after")


def orders_table(run_id: str, mode: str) -> str:
    return f"chain_orders_{run_id}_{mode}"


def shipments_table(run_id: str) -> str:
    return f"chain_shipments_{run_id}"


def notifications_table(run_id: str) -> str:
    return f"chain_notifications_{run_id}"


def task_name(step: str, mode: str) -> str:
    return f"fencing_demo.chain.{step}_{mode}"


def chain_crashes(seed: int, orders: int) -> tuple[frozenset[int], frozenset[int]]:
    """The orders (1..orders) whose first ship delivery is killed before its commit and
    after it (seeded, disjoint, at least one each)."""
    rng = random.Random(f"fencing-demo-chain-crash-{seed}")
    before: set[int] = set()
    after: set[int] = set()
    for order in range(1, orders + 1):
        roll = rng.random()
        if roll < CRASH_RATE:
            before.add(order)
        elif roll < 2 * CRASH_RATE:
            after.add(order)
    if not before:
        before.add(rng.choice([o for o in range(1, orders + 1) if o not in after]))
    if not after:
        after.add(rng.choice([o for o in range(1, orders + 1) if o not in before]))
    return frozenset(before), frozenset(after)


def create_tables(path: str, run_id: str, orders: int) -> None:
    """The runs' tables of orders (every order ``paid``), shipments and notifications."""
    conn = sqlite3.connect(path, timeout=30)
    try:
        with conn:
            for mode in MODES:
                name = orders_table(run_id, mode)
                conn.execute(
                    f"CREATE TABLE {name} (id INTEGER PRIMARY KEY,"
                    " version INTEGER NOT NULL DEFAULT 1, status TEXT NOT NULL)"
                )
                rows = [(order, "paid") for order in range(1, orders + 1)]
                conn.executemany(f"INSERT INTO {name} (id, status) VALUES (?, ?)", rows)
            for name in (shipments_table(run_id), notifications_table(run_id)):
                conn.execute(
                    f"CREATE TABLE {name} (mode TEXT NOT NULL, order_id INTEGER NOT NULL,"
                    " pid INTEGER NOT NULL)"
                )
    finally:
        conn.close()


# -- in a worker process ---------------------------------------------------------------
def _path() -> str:
    return settings().store.removeprefix("sqlite:///")


@functools.cache
def _crashes() -> tuple[frozenset[int], frozenset[int]]:
    s = settings()
    if not s.crash:
        return frozenset(), frozenset()
    return chain_crashes(s.seed, s.tasks)


def which(intent: Intent) -> tuple[str, int]:
    """The run (mode) and the order an intent is about."""
    mode = intent.collection.rsplit("_", 1)[-1]
    return mode, int(intent.key)


def event(mode: str, step: str, order: int, what: str, detail: str = "") -> None:
    line = {"mode": mode, "step": step, "order": order, "what": what, "pid": os.getpid()}
    if detail:
        line["detail"] = detail
    _writer(EVENTS).write(line)


def crash_point(moment: str, mode: str, order: int) -> None:
    """SIGKILL this process if the seed picked ``order`` for ``moment`` (its first time)."""
    before, after = _crashes()
    chosen = before if moment == "before" else after
    if order in chosen and claim_first(f"chain-{moment}-{mode}", order):
        event(mode, "ship", order, f"crash-{moment}")
        os.kill(os.getpid(), signal.SIGKILL)


_lock = threading.Lock()
_own: dict[int, sqlite3.Connection] = {}


def _own_connection() -> sqlite3.Connection:
    """The worker's own connection (autocommit: each statement commits at once)."""
    with _lock:
        pid = os.getpid()
        if pid not in _own:
            _own[pid] = sqlite3.connect(
                _path(), timeout=30, isolation_level=None, check_same_thread=False
            )
        return _own[pid]


@contextlib.contextmanager
def transaction() -> Iterator[sqlite3.Connection]:
    """The worker's transaction: a ``sqlite3`` connection, committed on a clean exit."""
    conn = sqlite3.connect(_path(), timeout=30)
    try:
        with conn:
            yield conn
    finally:
        conn.close()


@contextlib.asynccontextmanager
async def atransaction() -> AsyncIterator[Any]:
    """The same on ``aiosqlite`` (arq's async tasks)."""
    import aiosqlite

    conn = await aiosqlite.connect(_path(), timeout=30)
    try:
        try:
            yield conn
        except BaseException:
            await conn.rollback()
            raise
        await conn.commit()
    finally:
        await conn.close()


def target(mode: str) -> Callable[[], fencing.Table]:
    def table() -> fencing.Table:
        from ._tasks import store

        return store().table(orders_table(settings().run_id, mode))

    return table


def atarget(mode: str) -> Callable[[], Awaitable[Any]]:
    async def table() -> Any:
        astore = await fencing.open_async(settings().store, migrate=False)
        return astore.table(orders_table(settings().run_id, mode))

    return table


# -- the queue's notify tasks and its direct enqueue (``register``) -------------------
_NOTIFY: dict[str, Any] = {}
_OPTIONS: dict[str, Any] = {}
_SEND: list[Callable[[Any, Intent], Any]] = []


def register(notify: dict[str, Any], send: Callable[[Any, Intent], Any], **options: Any) -> None:
    """The queue module's notify task per mode, its direct enqueue ``send(task, intent)``
    (the naive run's; a coroutine function on arq) and the options of ``outbox.send``."""
    _NOTIFY.update(notify)
    _OPTIONS.clear()
    _OPTIONS.update(options)
    _SEND[:] = [send]


# -- the steps --------------------------------------------------------------------------
def decide_ship(record: Record) -> Any:
    intent = current_intent()
    assert intent is not None, "decide runs inside a fenced task"
    mode, order = which(intent)
    if record.state.get("status") != "paid":
        return fencing.SKIP
    if mode == "naive":  # the worker's own write, committed before the fenced commit
        book(_own_connection(), shipments_table(settings().run_id), mode, order)
        crash_point("before", mode, order)
    return {"status": "shipped"}


def decide_notify(record: Record) -> Any:
    if record.state.get("status") != "shipped":
        return fencing.SKIP
    return {"status": "notified"}


def book(conn: Any, table: str, mode: str, order: int) -> Any:
    return conn.execute(f"INSERT INTO {table} VALUES (?, ?, ?)", (mode, order, os.getpid()))


def ship_then(step: Step) -> None:
    """The chain run's ship, in its worker transaction after the fenced commit."""
    mode, order = which(step.intent)
    book(step.connection, shipments_table(settings().run_id), mode, order)
    step.send(_NOTIFY[mode], step.record, "notify", **_OPTIONS)
    crash_point("before", mode, order)  # killed here: none of the three remains


async def aship_then(step: Step) -> None:
    mode, order = which(step.intent)
    await book(step.connection, shipments_table(settings().run_id), mode, order)
    await step.send(_NOTIFY[mode], step.record, "notify", **_OPTIONS)
    crash_point("before", mode, order)


def notify_then(step: Step) -> None:
    mode, order = which(step.intent)
    book(step.connection, notifications_table(settings().run_id), mode, order)


async def anotify_then(step: Step) -> None:
    mode, order = which(step.intent)
    await book(step.connection, notifications_table(settings().run_id), mode, order)


def _noted(report: TaskReport) -> tuple[str, int, Record] | None:
    """Note the delivery's end, but a naive committed ship's: its record is returned (to
    enqueue notify at its new version, then note it), after the seeded crash after commit."""
    intent = report.intent
    if intent is None:  # a message the demo did not send
        return None
    mode, order = which(intent)
    step = intent.transition
    if report.action is not Action.ACK:
        event(mode, step, order, report.action.value, f"{report.kind}: {report.error}")
        return None
    committed = report.kind == "committed"
    if committed and step == "ship":
        crash_point("after", mode, order)  # committed, not acknowledged (nor sent: naive)
    if committed and step == "ship" and mode == "naive":
        assert isinstance(report.outcome, Committed)
        return mode, order, report.outcome.record
    event(mode, step, order, report.kind)
    return None


def on_outcome(report: TaskReport) -> None:
    found = _noted(report)
    if found is not None:
        mode, order, record = found
        _SEND[0](_NOTIFY[mode], record.intent("notify"))
        event(mode, "notify", order, "sent")  # before the ship's end: the demo waits for it
        event(mode, "ship", order, "committed")


async def aon_outcome(report: TaskReport) -> None:
    found = _noted(report)
    if found is not None:
        mode, order, record = found
        await _SEND[0](_NOTIFY[mode], record.intent("notify"))
        event(mode, "notify", order, "sent")
        event(mode, "ship", order, "committed")


def options(step: str, mode: str, asynchronous: bool = False) -> dict[str, Any]:
    """A chain task's keyword arguments for the queue's decorator (but its name)."""
    from ._tasks import BACKOFF, MAX_RETRIES

    out: dict[str, Any] = {
        "target": atarget(mode) if asynchronous else target(mode),
        "max_retries": MAX_RETRIES,
        "backoff": BACKOFF,
        "on_outcome": aon_outcome if asynchronous else on_outcome,
    }
    if step == "notify" or mode == "chain":
        out["transaction"] = atransaction if asynchronous else transaction
        if step == "notify":
            out["then"] = anotify_then if asynchronous else notify_then
        else:
            out["then"] = aship_then if asynchronous else ship_then
    return out


DECIDE: Final = {"ship": decide_ship, "notify": decide_notify}
STEPS: Final = ("ship", "notify")
