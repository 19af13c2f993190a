"""A fenced task in the worker's own transaction (``transaction=``, ``then=``).

On every store that can join a transaction (SQLite on a file, PostgreSQL, MariaDB),
through SQLAlchemy's ``sessionmaker`` and ``async_sessionmaker``: the fenced commit, the
worker's own rows and the next step's outbox row commit together; a step that raises
leaves nothing (and the intent commits later, not ``Duplicate``); ``Stale`` and
``Duplicate`` run no step and write nothing; the next step's intent is taken at the
version the fenced commit produced (fresh on arrival); a worker killed between its own
write and the commit leaves nothing, and one killed after the commit, before the ack,
is answered ``Duplicate`` on redelivery with the next step sent exactly once.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import fencing
from fencing import Committed, ConfigurationError, Duplicate, Stale
from fencing.contrib._common import Action

from .._backends import CASES, TABLE_COLUMNS
from .._lenders import LENDERS, Lender

sqlalchemy = pytest.importorskip("sqlalchemy")
celery = pytest.importorskip("celery")

from sqlalchemy import text  # noqa: E402
from sqlalchemy.orm import sessionmaker  # noqa: E402

from fencing.contrib.celery import Step, fenced_task  # noqa: E402

pytestmark = [
    pytest.mark.backends(only=lambda name: name in LENDERS),
    pytest.mark.apis(only=["sync"]),
]
TABLE = "orders_w"
SHIPMENTS = "shipments_w"
ROWS = [{"id": 1, "status": "paid", "total": 10}, {"id": 2, "status": "paid", "total": 20}]


def _prepare(backend_name: str, url: str) -> Any:
    store = fencing.open(url)
    store.migrate()
    create = CASES[backend_name].create_table
    assert create is not None
    create(store, TABLE, "id", "version", TABLE_COLUMNS, ROWS)
    conn = LENDERS[backend_name].connect(url)
    conn.cursor().execute(f"CREATE TABLE {SHIPMENTS} (order_id INTEGER, tracking VARCHAR(40))")
    conn.commit()
    conn.close()
    return store


class World:
    def __init__(self, store: Any, lender: Lender, url: str) -> None:
        self.store, self.lender, self.url = store, lender, url
        self.engine = sqlalchemy.create_engine(lender.sa_url(url), **lender.sa_options(url))
        self.Session = sessionmaker(self.engine)
        self.app = celery.Celery("worker-tx", broker="memory://", set_as_current=False)
        self.table = store.table(TABLE)

    def shipments(self) -> list[tuple[int, str]]:
        with self.engine.connect() as conn:
            rows = conn.execute(text(f"SELECT order_id, tracking FROM {SHIPMENTS}"))
            return sorted((int(r[0]), str(r[1])) for r in rows)

    def close(self) -> None:
        self.engine.dispose()


@pytest.fixture
def world(backend_name: str, store_url: str) -> Iterator[World]:
    store = _prepare(backend_name, store_url)
    w = World(store, LENDERS[backend_name], store_url)
    yield w
    w.close()
    store.close()


def _tasks(w: World, then: Any, **options: Any) -> tuple[Any, Any]:
    @fenced_task(w.app, target=w.table, name="shop.notify")
    def notify(order: fencing.Record) -> dict[str, Any]:
        return {"note": "notified"}

    @fenced_task(
        w.app, target=w.table, name="shop.ship", transaction=w.Session, then=then, **options
    )
    def ship(order: fencing.Record) -> dict[str, Any]:
        return {"status": "shipped"}

    return ship, notify


def _ship_and_send(notify_box: list[Any]) -> Any:
    def then(step: Step) -> None:
        step.connection.execute(
            text(f"INSERT INTO {SHIPMENTS} (order_id, tracking) VALUES (:id, :t)"),
            {"id": int(step.record.key), "t": f"T{step.record.version}"},
        )
        step.send(notify_box[0], step.record, "notify")

    return then


def test_the_commit_its_rows_and_the_next_step_commit_together(world: World) -> None:
    box: list[Any] = []
    ship, notify = _tasks(world, _ship_and_send(box))
    box.append(notify)
    payload = ship.fencing.encode(world.table.get(1), "ship")

    report = ship.fencing.run(payload)
    assert report.action is Action.ACK and isinstance(report.outcome, Committed)
    order = world.table.get(1)
    assert (order.state["status"], order.version) == ("shipped", 2)
    assert world.shipments() == [(1, "T2")]
    (row,) = world.store.outbox.pending()
    sent = fencing.Intent.from_json(row.payload)
    assert (sent.transition, sent.key, sent.expected_version) == ("notify", 1, 2)
    # the next step arrives fresh: it commits
    assert isinstance(notify.fencing.run(row.payload).outcome, Committed)

    again = ship.fencing.run(payload)  # a redelivery after the commit
    assert isinstance(again.outcome, Duplicate)
    assert world.shipments() == [(1, "T2")] and len(world.store.outbox.pending()) == 1


def test_a_step_that_raises_leaves_nothing_and_the_intent_commits_later(world: World) -> None:
    box: list[Any] = []
    calls: list[int] = []

    def then(step: Step) -> None:
        _ship_and_send(box)(step)
        calls.append(step.record.version)
        if len(calls) == 1:
            raise RuntimeError("the carrier's API is down")

    ship, notify = _tasks(world, then)
    box.append(notify)
    payload = ship.fencing.encode(world.table.get(1), "ship")

    failed = ship.fencing.run(payload)
    assert failed.action is Action.FAIL and isinstance(failed.error, RuntimeError)
    assert world.table.get(1).version == 1 and world.table.get(1).state["status"] == "paid"
    assert world.shipments() == [] and world.store.outbox.pending() == []

    report = ship.fencing.run(payload, attempt=2)  # not Duplicate: nothing was applied
    assert isinstance(report.outcome, Committed) and calls == [2, 2]
    assert world.shipments() == [(1, "T2")] and len(world.store.outbox.pending()) == 1


def test_stale_runs_no_step_and_writes_nothing(world: World) -> None:
    ran: list[Step] = []
    ship, _ = _tasks(world, ran.append)
    payload = ship.fencing.encode(world.table.get(2), "ship")
    world.table.commit(world.table.intent(2, "cancel"), {"status": "cancelled"})

    report = ship.fencing.run(payload)
    assert report.action is Action.ACK and isinstance(report.outcome, Stale)
    assert ran == [] and world.shipments() == [] and world.store.outbox.pending() == []
    assert world.table.get(2).state["status"] == "cancelled"


def test_under_a_lease(world: World) -> None:
    box: list[Any] = []
    ship, notify = _tasks(
        world, _ship_and_send(box), lease=fencing.contrib.celery.LeaseSpec(ttl=30)
    )
    box.append(notify)
    report = ship.fencing.run(ship.fencing.encode(world.table.get(1), "ship"))
    assert isinstance(report.outcome, Committed) and report.token is not None
    assert report.outcome.record.fence == report.token
    assert world.shipments() == [(1, "T2")]


#: the store's clock, as each backend's SQL reads it (fencing_leases.expires_at is in it)
STORE_NOW = {
    "sqlite": "?",
    "postgresql": "extract(epoch from clock_timestamp())",
    "mysql": "UNIX_TIMESTAMP(NOW(6))",
}


def _lease_ran_out(w: World, name: str) -> bool:
    kind = next(k for k in STORE_NOW if w.url.startswith(k))
    now = STORE_NOW[kind]
    mark = "%s" if kind != "sqlite" else "?"
    conn = w.lender.connect_autocommit(w.url)
    try:
        cur = conn.cursor()
        query = f"SELECT COUNT(*) FROM fencing_leases WHERE name = {mark} AND expires_at < {now}"
        cur.execute(query, (name, time.time()) if kind == "sqlite" else (name,))
        return bool(cur.fetchone()[0])
    finally:
        conn.close()


def test_a_lease_that_ran_out_while_deciding_is_taken_again_inside_the_run(world: World) -> None:
    """Nobody took over: the refused commit (``Fenced(EXPIRED)``) leaves no lock of the
    worker's transaction behind (it began one: SQLite's write lock, MariaDB's row locks), so the
    lease is taken again on the store's own connection and the same decision commits,
    in the same run: it used to wait on that lock (SQLite's busy_timeout, MariaDB's
    innodb_lock_wait_timeout), then be retried."""
    box: list[Any] = []
    ship, notify = _tasks(
        world,
        _ship_and_send(box),
        lease=fencing.contrib.celery.LeaseSpec(ttl=0.5, heartbeat=False),
    )
    box.append(notify)
    name = world.table.lease_name(1)
    ship.fencing.decide = lambda order: (
        _wait(lambda: _lease_ran_out(world, name)) or {"status": "shipped"}
    )

    report = ship.fencing.run(ship.fencing.encode(world.table.get(1), "ship"))
    assert report.action is Action.ACK and isinstance(report.outcome, Committed)
    assert report.attempt == 1 and report.token == 2  # the lease taken again: token 2
    assert world.shipments() == [(1, "T2")] and len(world.store.outbox.pending()) == 1


def _wait(check: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "the lease never ran out"
        time.sleep(0.02)


@pytest.mark.backends(only=lambda name: name in LENDERS and LENDERS[name].sa_async_url)
def test_an_async_task_in_an_async_session(backend_name: str, store_url: str) -> None:
    from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine

    _prepare(backend_name, store_url).close()
    lender = LENDERS[backend_name]

    async def main() -> None:
        store = await fencing.open_async(store_url)
        engine = create_async_engine(lender.sa_async_url(store_url), **lender.sa_options(store_url))  # type: ignore[misc]
        table = store.table(TABLE)
        seen: list[int] = []

        async def then(step: Step) -> None:
            await step.connection.execute(
                text(f"INSERT INTO {SHIPMENTS} (order_id, tracking) VALUES (:id, 'A')"),
                {"id": int(step.record.key)},
            )
            seen.append(step.record.version)

        from fencing.contrib._common import FencedTask

        spec = FencedTask(
            name="shop.ship",
            target=table,
            decide=lambda r: {"status": "shipped"},
            transaction=async_sessionmaker(engine),
            then=then,
        )
        try:
            payload = spec.encode(await table.get(1), "ship")
            assert isinstance((await spec.arun(payload)).outcome, Committed)
            assert isinstance((await spec.arun(payload)).outcome, Duplicate)
            assert seen == [2] and (await table.get(1)).version == 2
            async with engine.connect() as conn:
                rows = (await conn.execute(text(f"SELECT order_id FROM {SHIPMENTS}"))).all()
            assert [int(r[0]) for r in rows] == [1]
        finally:
            await engine.dispose()
            await store.close()

    asyncio.run(main())


def decide_shipped(order: fencing.Record) -> dict[str, Any]:
    return {"status": "shipped"}


def test_configuration_is_checked_before_anything_runs(world: World) -> None:
    with pytest.raises(ConfigurationError, match="then runs inside the worker's transaction"):
        fenced_task(world.app, target=world.table, then=lambda step: None)(decide_shipped)
    with pytest.raises(ConfigurationError, match="transaction must be a SQLAlchemy"):
        fenced_task(world.app, target=world.table, transaction=42)(decide_shipped)
    with pytest.raises(ConfigurationError, match="then must be a function of the step"):
        fenced_task(world.app, target=world.table, transaction=world.Session, then=1)(
            decide_shipped
        )
    memory = fencing.open("memory://")
    try:
        with pytest.raises(ConfigurationError, match="a memory store has no transaction"):
            fenced_task(world.app, target=memory.collection("o"), transaction=world.Session)(
                decide_shipped
            )
    finally:
        memory.close()


def test_a_transaction_that_is_not_a_context_manager_is_refused(world: World) -> None:
    ship = fenced_task(world.app, target=world.table, transaction=lambda: object())(decide_shipped)
    report = ship.fencing.run(ship.fencing.encode(world.table.get(1), "ship"))
    assert report.action is Action.FAIL and isinstance(report.error, ConfigurationError)
    assert "must give a context manager" in str(report.error)
    assert world.table.get(1).version == 1


# -- a worker killed at the worst moments ---------------------------------------------
WORKER = textwrap.dedent(
    """
    import json, os, signal, sys
    import celery, sqlalchemy
    from sqlalchemy import text
    from sqlalchemy.orm import sessionmaker
    import fencing
    from fencing.contrib.celery import fenced_task

    url, sa_url, sa_options, payload, moment = sys.argv[1:6]
    store = fencing.open(url)
    engine = sqlalchemy.create_engine(sa_url, **json.loads(sa_options))
    app = celery.Celery("killed", broker="memory://", set_as_current=False)
    table = store.table("orders_w")

    @fenced_task(app, target=table, name="shop.notify")
    def notify(order):
        return {"note": "notified"}

    def then(step):
        step.connection.execute(
            text("INSERT INTO shipments_w (order_id, tracking) VALUES (:id, 'K')"),
            {"id": int(step.record.key)},
        )
        step.send(notify, step.record, "notify")
        if moment == "before-commit":
            os.kill(os.getpid(), signal.SIGKILL)

    def acked(report):
        if moment == "before-ack":
            os.kill(os.getpid(), signal.SIGKILL)

    @fenced_task(app, target=table, name="shop.ship", transaction=sessionmaker(engine),
                 then=then, on_outcome=acked)
    def ship(order):
        return {"status": "shipped"}

    print(ship.fencing.run(payload).kind, flush=True)
    """
)


@pytest.mark.parametrize("moment", ["before-commit", "before-ack"])
def test_a_worker_killed_at_the_worst_moment(world: World, moment: str, tmp_path: Path) -> None:
    box: list[Any] = []
    ship, notify = _tasks(world, _ship_and_send(box))
    box.append(notify)
    payload = ship.fencing.encode(world.table.get(1), "ship")
    options = world.lender.sa_options(world.url)
    args = [world.url, world.lender.sa_url(world.url), json.dumps(options), payload, moment]
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    done = subprocess.run(
        [sys.executable, "-W", "error", str(script), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
    )
    assert done.returncode == -signal.SIGKILL, done.stderr

    if moment == "before-commit":  # its own row, the commit and the next step: none
        assert world.table.get(1).version == 1 and world.shipments() == []
        assert world.store.outbox.pending() == []
        redelivered = ship.fencing.run(payload)
        assert isinstance(redelivered.outcome, Committed)
        assert world.shipments() == [(1, "T2")]
    else:  # all three committed; the redelivery is Duplicate and sends nothing more
        assert world.table.get(1).version == 2 and world.shipments() == [(1, "K")]
        redelivered = ship.fencing.run(payload)
        assert isinstance(redelivered.outcome, Duplicate)
        assert world.shipments() == [(1, "K")]
    (row,) = world.store.outbox.pending()  # the next step, exactly once
    assert fencing.Intent.from_json(row.payload).expected_version == 2


# -- the other transaction sources ------------------------------------------------------
def _book(step: Step) -> None:
    cur = step.connection.cursor()
    mark = "?" if type(step.connection).__module__.startswith("sqlite3") else "%s"
    cur.execute(
        f"INSERT INTO {SHIPMENTS} (order_id, tracking) VALUES ({mark}, {mark})",
        (int(step.record.key), f"T{step.record.version}"),
    )


@pytest.mark.backends(only=lambda name: name == "postgresql")
def test_a_psycopg_pool(world: World) -> None:
    psycopg_pool = pytest.importorskip("psycopg_pool")
    from tests.backends_postgres import _lend_conninfo, _lend_options

    pool = psycopg_pool.ConnectionPool(
        _lend_conninfo(world.url),
        kwargs={"options": _lend_options(world.url)},
        min_size=1,
        max_size=2,
        open=True,
    )
    try:
        ship = fenced_task(world.app, target=world.table, transaction=pool, then=_book)(
            decide_shipped
        )
        payload = ship.fencing.encode(world.table.get(1), "ship")
        assert isinstance(ship.fencing.run(payload).outcome, Committed)
        assert isinstance(ship.fencing.run(payload).outcome, Duplicate)
        assert world.shipments() == [(1, "T2")]
    finally:
        pool.close()


@pytest.mark.backends(only=lambda name: name == "sqlite-file")
def test_a_function_giving_a_sqlite3_transaction(world: World) -> None:
    import contextlib
    import sqlite3

    path = world.url.removeprefix("sqlite:///")

    @contextlib.contextmanager
    def transaction() -> Iterator[sqlite3.Connection]:
        conn = sqlite3.connect(path, timeout=30)
        try:
            with conn:  # commits on a clean exit, rolls back on an exception
                yield conn
        finally:
            conn.close()

    ship = fenced_task(world.app, target=world.table, transaction=transaction, then=_book)(
        decide_shipped
    )
    payload = ship.fencing.encode(world.table.get(1), "ship")
    assert isinstance(ship.fencing.run(payload).outcome, Committed)
    assert world.shipments() == [(1, "T2")] and world.table.get(1).version == 2
