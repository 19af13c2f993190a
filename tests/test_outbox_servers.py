"""The outbox on the servers (PostgreSQL, MariaDB / MySQL): concurrent claimers over
10,000 rows take disjoint claims that cover every row, never split a key and never
deadlock; a send through ``store.using(conn)`` on a driver connection and on a
SQLAlchemy session is the caller's to commit or roll back; PostgreSQL's notification
reaches a listener only when the writer commits, and its waker wakes a relay."""

from __future__ import annotations

import asyncio
import threading
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

import fencing
from fencing import OutboxMessage

from ._backends import CASES
from ._lenders import LENDERS
from .test_outbox import TASK, _records

SERVERS = ("postgresql", "mysql")
pytestmark = [
    pytest.mark.backends(only=lambda name: name in SERVERS),
    pytest.mark.apis(only=["sync"]),
]

ROWS, KEYS, CLAIMERS = 10_000, 100, 4


def _fill(store: Any, rows: int, keys: int) -> None:
    for i in range(rows):
        message = OutboxMessage("celery", "shop.ship", f'{{"n":{i}}}', f"k{i % keys}")
        store.backend.outbox_add(message)


def test_concurrent_claimers_take_disjoint_claims_in_key_order(store: Any) -> None:
    _fill(store, ROWS, KEYS)
    claims: list[tuple[int, tuple[int, ...]]] = []  # (token, row ids)
    key_of: dict[int, str] = {}
    lock = threading.Lock()
    errors: list[BaseException] = []

    def claimer(n: int) -> None:
        try:
            while store.outbox.stats().pending:
                claim = store.outbox.claim(f"r{n}", "celery", limit=1 + (n * 37) % 64, ttl=300)
                with lock:
                    claims.append((claim.token, tuple(r.id for r in claim.rows)))
                    key_of.update((r.id, r.key) for r in claim.rows)
                if not claim.rows:
                    continue  # every key with rows left is another claimer's just now
                assert store.outbox.done(claim, claim.rows) == len(claim.rows)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=claimer, args=(n,)) for n in range(CLAIMERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert not any(t.is_alive() for t in threads), "a claimer never finished (deadlock?)"
    assert errors == []
    taken = [i for _, ids in claims for i in ids]
    assert len(taken) == len(set(taken))  # disjoint
    assert set(taken) == set(range(min(taken), min(taken) + ROWS))  # every row
    assert store.outbox.stats().pending == 0
    # Per key, rows are claimed in id order: a claim of a key's later row began after the
    # claim of its earlier rows was marked done, so it drew a later token
    token_of = {i: token for token, ids in claims for i in ids}
    by_key: dict[str, list[int]] = defaultdict(list)
    for i in sorted(token_of):
        by_key[key_of[i]].append(token_of[i])
    assert all(tokens == sorted(tokens) for tokens in by_key.values())
    assert len(by_key) == KEYS


def test_two_claims_never_split_a_key_while_one_is_in_flight(store: Any, store_url: str) -> None:
    """Claim A holds row 1 of key K locked (its transaction still open, as in flight);
    claim B must skip K whole, not take K's row 2."""
    (a, b) = _records(store, "a", "b")
    first = store.outbox.send(TASK, a, "ship")
    store.outbox.send(TASK, a, "bill")
    other = store.outbox.send(TASK, b, "ship")
    lender = LENDERS["postgresql" if store_url.startswith("postgresql") else "mysql"]
    holder = lender.connect(store_url)
    try:
        cur = holder.cursor()
        cur.execute("SELECT id FROM fencing_outbox WHERE id = %s FOR UPDATE", (first.id,))
        claim = store.outbox.claim("r", "celery", limit=10, ttl=30)
        assert [r.id for r in claim.rows] == [other.id]  # key a skipped whole
    finally:
        holder.rollback()
        holder.close()
    claim = store.outbox.claim("r", "celery", limit=10, ttl=30)
    assert [r.id for r in claim.rows] == [first.id, first.id + 1]


def test_a_send_through_a_driver_connection_is_the_callers(store: Any, store_url: str) -> None:
    lender = LENDERS["postgresql" if store_url.startswith("postgresql") else "mysql"]
    (a,) = _records(store, "a")
    conn = lender.connect(store_url)
    try:
        view = store.using(conn)
        view.outbox.send(TASK, a, "ship")
        assert store.outbox.stats().pending == 0  # not committed yet
        conn.rollback()
        assert store.outbox.stats().pending == 0  # rolled back: no row
        row = view.outbox.send(TASK, a, "ship")
        conn.commit()
        assert [r.id for r in store.outbox.pending()] == [row.id]
    finally:
        conn.close()
    auto = lender.connect_autocommit(store_url)
    try:  # no transaction to join: the row is written at once
        store.using(auto).outbox.send(TASK, a, "bill")
        assert store.outbox.stats().pending == 2
    finally:
        auto.close()


def test_a_send_through_a_sqlalchemy_session_is_the_sessions(store: Any, store_url: str) -> None:
    sqlalchemy = pytest.importorskip("sqlalchemy")
    from sqlalchemy.orm import Session

    lender = LENDERS["postgresql" if store_url.startswith("postgresql") else "mysql"]
    engine = sqlalchemy.create_engine(lender.sa_url(store_url), **lender.sa_options(store_url))
    (a,) = _records(store, "a")
    try:
        with Session(engine) as session:
            store.using(session).outbox.send(TASK, a, "ship")
            session.rollback()
        assert store.outbox.stats().pending == 0
        with Session(engine) as session:
            store.using(session).outbox.send(TASK, a, "ship")
            session.commit()
        assert store.outbox.stats().pending == 1
    finally:
        engine.dispose()


def test_an_async_send_through_a_driver_connection(store_url: str) -> None:
    lender = LENDERS["postgresql" if store_url.startswith("postgresql") else "mysql"]
    assert lender.aconnect is not None

    async def main() -> None:
        store = await fencing.open_async(store_url)
        await store.migrate()
        orders = store.collection("orders")
        a = await orders.create("a", {"n": 0})
        conn = await lender.aconnect(store_url)
        try:
            await store.using(conn).outbox.send(TASK, a, "ship")
            await conn.rollback()
            assert (await store.outbox.stats()).pending == 0
            await store.using(conn).outbox.send(TASK, a, "ship")
            await conn.commit()
            assert (await store.outbox.stats()).pending == 1
        finally:
            closing = conn.close()  # aiomysql's close() is not a coroutine
            if closing is not None:
                await closing
            await store.close()

    asyncio.run(main())


@pytest.mark.backends(only=lambda name: name == "postgresql")
def test_a_listener_hears_a_row_only_when_its_transaction_commits(
    store: Any, store_url: str
) -> None:
    lender = LENDERS["postgresql"]
    (a,) = _records(store, "a")
    waker = store.backend.outbox_waiter(kind="celery")
    other = store.backend.outbox_waiter(kind="rq")
    try:
        waker.listen()
        other.listen()
        assert waker.wait(0.05) is False  # nothing yet
        conn = lender.connect(store_url)
        try:
            store.using(conn).outbox.send(TASK, a, "ship")
            assert waker.wait(0.2) is False  # written, not committed: no notification
            conn.rollback()
            assert waker.wait(0.2) is False  # rolled back: none, ever
            store.using(conn).outbox.send(TASK, a, "ship")
            conn.commit()
            assert waker.wait(30) is True  # committed: heard
            assert waker.wait(0.05) is False  # once
            assert other.wait(0.05) is False  # another queue kind's waker: not woken
        finally:
            conn.close()
        threading.Timer(0.1, waker.wake).start()
        assert waker.wait(30) is True  # wake() from another thread ends a wait
    finally:
        waker.close()
        other.close()


@pytest.mark.backends(only=lambda name: name == "postgresql")
def test_a_listener_hears_its_own_stores_rows_not_another_schemas(
    store: Any, tmp_path: Path
) -> None:
    """Stores in two schemas of one database share the channel, not their wake-ups."""
    case = CASES["postgresql"]
    url = case.url(tmp_path)
    neighbour = fencing.open(url)
    try:
        neighbour.migrate()
        (a,) = _records(store, "a")
        (b,) = _records(neighbour, "b")
        waker = store.backend.outbox_waiter(kind="celery")
        anyone = store.backend.outbox_waiter()
        try:
            waker.listen()
            anyone.listen()
            neighbour.outbox.send(TASK, b, "ship")
            assert waker.wait(0.3) is False and anyone.wait(0.05) is False
            store.outbox.send(TASK, a, "ship")
            assert waker.wait(30) is True and anyone.wait(30) is True
        finally:
            waker.close()
            anyone.close()
    finally:
        neighbour.close()
        assert case.cleanup is not None
        case.cleanup(url)


@pytest.mark.backends(only=lambda name: name == "postgresql")
def test_the_async_waker(store_url: str) -> None:
    async def main() -> None:
        store = await fencing.open_async(store_url)
        await store.migrate()
        a = await store.collection("orders").create("a", {"n": 0})
        waker = store.backend.outbox_waiter()
        try:
            await waker.listen()
            assert await waker.wait(0.05) is False
            await store.outbox.send(TASK, a, "ship")
            assert await waker.wait(30) is True
            asyncio.get_running_loop().call_later(0.1, waker.wake)
            assert await waker.wait(30) is True
            assert await waker.wait(0.05) is False
        finally:
            await waker.close()
            await store.close()

    asyncio.run(main())


@pytest.mark.backends(only=lambda name: name == "postgresql")
def test_an_idle_relay_on_the_listen_waker_publishes_a_committed_row(
    store: Any, store_url: str
) -> None:
    """A relay polling once a minute, waiting on PostgreSQL's waker: a row committed
    through the caller's connection is published long before the poll would come."""
    from fencing.contrib.relay import Relay

    sent: list[Any] = []

    class Publisher:
        kind = "celery"

        def publish(self, row: Any) -> None:
            sent.append(row)

        def close(self) -> None:
            pass

    (a,) = _records(store, "a")
    relay = Relay(store, Publisher(), poll=600.0, waker=store.backend.outbox_waiter("celery"))
    relay.waker.listen()
    runner = threading.Thread(target=relay.run)
    runner.start()
    try:
        conn = LENDERS["postgresql"].connect(store_url)
        try:
            row = store.using(conn).outbox.send(TASK, a, "ship")
            conn.commit()
        finally:
            conn.close()
        done = threading.Event()
        for _ in range(3000):
            if sent:
                done.set()
                break
            threading.Event().wait(0.01)
        assert done.is_set() and [r.id for r in sent] == [row.id]
    finally:
        relay.stop()
        runner.join(30)
        relay.close()
    assert not runner.is_alive()  # stop() woke the waker's wait
