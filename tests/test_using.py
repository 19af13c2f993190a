"""``store.using(conn_or_session)``: fencing's writes inside the caller's transaction.

On every store that can join one (SQLite on a file, PostgreSQL, MySQL/MariaDB), with
driver connections and SQLAlchemy sessions, sync and async: a commit made through the
view is the caller's to commit or roll back; rolled back, nothing of it remains and the
same intent commits later (not ``Duplicate``); a refused commit leaves the caller's
transaction usable; reads see the caller's own uncommitted update (no self-deadlock on
a row the caller's transaction holds); leases and recorded effects are on the store's
own connections, committed at once; a connection to another database is refused.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import fencing
from fencing import (
    Committed,
    ConfigurationError,
    Duplicate,
    Fenced,
    InvalidInput,
    Missing,
    Stale,
    StoreClosed,
)

from ._backends import CASES, TABLE_COLUMNS
from ._lenders import DRIVERS, LENDERS, Lender, require_driver

pytestmark = pytest.mark.backends(only=lambda name: name in LENDERS)
#: an asyncio connection's test: once per case, with the lenders that have one
ASYNC = pytest.mark.lenders(only=lambda lender: lender.aconnect is not None)
ROWS = [{"id": 1, "status": "new", "total": 10}, {"id": 2, "status": "new", "total": 20}]
TABLE = "orders_u"
AUDIT = "audit_u"


def sql(conn: Any, text: str, *params: Any) -> Any:
    """Run ``text`` (``?`` placeholders) on a driver connection; the cursor."""
    if type(conn).__module__.split(".")[0] != "sqlite3":
        text = text.replace("?", "%s")
    cur = conn.cursor()
    cur.execute(text, params)
    return cur


def one(conn: Any, text: str, *params: Any) -> Any:
    return sql(conn, text, *params).fetchone()


@dataclass
class Env:
    store: Any
    conn: Any
    lender: Lender
    url: str
    backend: str

    @property
    def table(self) -> Any:
        return self.store.table(TABLE)

    def view(self, conn: Any = None) -> Any:
        return self.store.using(self.conn if conn is None else conn).table(TABLE)

    def audit(self, note: str, conn: Any = None) -> None:
        sql(self.conn if conn is None else conn, f"INSERT INTO {AUDIT} (note) VALUES (?)", note)

    def audited(self) -> int:
        """Audit rows as the store's database has them committed (a fresh connection)."""
        fresh = self.lender.connect(self.url)
        try:
            return int(one(fresh, f"SELECT COUNT(*) FROM {AUDIT}")[0])
        finally:
            fresh.rollback()
            fresh.close()


def _prepare(backend_name: str, url: str, lender: Lender | None = None) -> Any:
    store = fencing.open(url)
    store.migrate()
    create = CASES[backend_name].create_table
    assert create is not None
    create(store, TABLE, "id", "version", TABLE_COLUMNS, ROWS)
    conn = (lender or LENDERS[backend_name]).connect(url)
    sql(conn, f"CREATE TABLE {AUDIT} (note VARCHAR(200))")
    conn.commit()
    conn.close()
    return store


@pytest.fixture
def env(backend_name: str, lender_name: str, store_url: str) -> Iterator[Env]:
    """The case's store, and a connection of the caller's through the lender's driver
    (every test taking it runs once per driver: ``tests/_lenders.py``)."""
    lender = DRIVERS[backend_name][lender_name]
    require_driver(lender)
    store = _prepare(backend_name, store_url, lender)
    conn = lender.connect(store_url)
    yield Env(store, conn, lender, store_url, backend_name)
    conn.rollback()
    conn.close()
    store.close()


def test_a_commit_is_part_of_the_callers_transaction(env: Env) -> None:
    intent = env.table.intent(1, "ship")
    env.audit("shipping 1")
    out = env.view().commit(intent, {"status": "shipped"})
    assert isinstance(out, Committed) and out.record.version == 2
    assert env.table.get(1).version == 1  # not committed yet: the store's own connections
    assert env.audited() == 0
    env.conn.commit()
    record = env.table.get(1)
    assert (record.version, record.state["status"]) == (2, "shipped")
    assert env.audited() == 1


def test_rolled_back_nothing_remains_and_the_intent_commits_later(env: Env) -> None:
    intent = env.table.intent(1, "ship")
    env.audit("shipping 1")
    assert isinstance(env.view().commit(intent, {"status": "shipped"}), Committed)
    env.conn.rollback()
    assert env.table.get(1).version == 1 and env.audited() == 0
    again = env.view().commit(intent, {"status": "shipped"})  # not Duplicate: it never happened
    assert isinstance(again, Committed) and again.record.version == 2
    env.conn.commit()
    assert env.table.get(1).version == 2
    assert isinstance(env.view().commit(intent, {"status": "shipped"}), Duplicate)
    env.conn.commit()


def test_a_refused_commit_leaves_the_transaction_usable(env: Env) -> None:
    old = env.table.intent(1, "ship")
    done = env.table.commit(env.table.intent(1, "pay"), {"status": "paid"})  # moves it on
    assert isinstance(done, Committed)
    env.audit("before")
    assert isinstance(env.view().commit(old, {"status": "shipped"}), Stale)
    assert isinstance(env.view().commit(done.intent, {"status": "paid"}), Duplicate)
    env.audit("after")
    fresh = env.view().intent(2, "ship")
    assert isinstance(env.view().commit(fresh, {"status": "shipped"}), Committed)
    env.conn.commit()
    assert env.audited() == 2
    assert env.table.get(2).version == 2 and env.table.get(1).version == 2


def test_reads_see_the_callers_own_update(env: Env) -> None:
    sql(env.conn, f"UPDATE {TABLE} SET status = ?, version = version + 1 WHERE id = ?", "paid", 1)
    view = env.view()
    assert view.get(1).version == 2 and view.get(1).state["status"] == "paid"
    assert env.table.get(1).version == 1  # the store's own connections: not yet
    intent = view.intent(1, "ship")
    assert intent.expected_version == 2
    # the caller's transaction holds the row: the view commits on that same transaction
    out = view.commit(intent, {"status": "shipped"})
    assert isinstance(out, Committed) and out.record.version == 3
    env.conn.commit()
    assert env.table.get(1).version == 3


def test_commit_many_and_collections_in_the_transaction(env: Env) -> None:
    orders = env.store.using(env.conn).collection("carts")
    orders.create("c1", {"n": 1})
    batch = [(env.table.intent(k, "ship"), {"status": "shipped"}) for k in (1, 2)]
    outs = env.view().commit_many(batch)
    assert [type(o) for o in outs] == [Committed, Committed]
    env.conn.rollback()
    assert env.store.collection("carts").get("c1") is None
    assert env.table.get(1).version == 1 and env.table.get(2).version == 1
    orders.create("c1", {"n": 1})
    outs = env.view().commit_many(batch)
    assert [type(o) for o in outs] == [Committed, Committed]
    assert orders.delete("c1") is True
    env.conn.commit()
    assert env.store.collection("carts").get("c1") is None
    assert env.table.get(2).version == 2


def test_leases_are_the_stores_and_fence_commits_in_the_transaction(env: Env) -> None:
    view_store = env.store.using(env.conn)
    lease = view_store.acquire("job-1", owner="a", ttl=60)
    # granted at once on the store's own connections, whatever the caller's transaction does
    assert env.store.try_acquire("job-1", owner="b", ttl=60) is None
    intent = env.table.intent(1, "ship")
    out = view_store.table(TABLE).commit(intent, {"status": "shipped"}, lease=lease)
    assert isinstance(out, Committed)
    env.conn.commit()
    lease.release()
    newer = env.store.acquire("job-1", owner="b", ttl=60)
    assert newer.token > lease.token
    env.audit("late")
    late = view_store.table(TABLE).commit(env.table.intent(2, "ship"), {"status": "x"}, lease=lease)
    assert isinstance(late, Fenced)
    env.audit("still usable")
    env.conn.commit()
    assert env.audited() == 2 and env.table.get(2).version == 1
    newer.release()


def test_recorded_effects_are_on_record_at_once(env: Env) -> None:
    intent = env.table.intent(1, "charge")
    effect = env.view().effect(intent, "charge-card")
    env.conn.rollback()
    found = env.store.get_effect(effect.idempotency_key)
    assert found is not None and found.status == "pending"


def test_store_only_operations_and_closing(env: Env) -> None:
    view = env.store.using(env.conn)
    for call in (view.migrate, view.prune, lambda: view.guard_table(TABLE)):
        with pytest.raises(ConfigurationError, match="runs on the store itself"):
            call()
    view.close()
    with pytest.raises(StoreClosed):
        view.table(TABLE).get(1)
    assert one(env.conn, f"SELECT COUNT(*) FROM {TABLE}")[0] == 2  # still the caller's, open
    other = env.store.using(env.conn)
    env.store.close()
    with pytest.raises(StoreClosed):
        other.table(TABLE).get(1)


def test_an_autocommit_connection_has_no_transaction_to_join(env: Env) -> None:
    conn = env.lender.connect_autocommit(env.url)
    try:
        out = env.view(conn).commit(env.table.intent(1, "ship"), {"status": "shipped"})
        assert isinstance(out, Committed)
        assert env.table.get(1).version == 2  # committed on its own, at once
    finally:
        conn.close()


def test_a_transaction_begun_on_an_autocommit_connection_is_joined(env: Env) -> None:
    """Autocommit on, then ``BEGIN`` (Django outside ``atomic()``, then a transaction of
    the caller's own): the view joins it (mysqlclient keeps no status: the server is asked)."""
    conn = env.lender.connect_autocommit(env.url)
    try:
        sql(conn, "BEGIN")
        out = env.view(conn).commit(env.table.intent(1, "ship"), {"status": "shipped"})
        assert isinstance(out, Committed)
        assert env.table.get(1).version == 1  # not committed: the caller's to end
        conn.rollback()
        assert env.table.get(1).version == 1
    finally:
        conn.close()


def test_a_connection_to_another_database_is_refused(env: Env, tmp_path: Path) -> None:
    (tmp_path / "other").mkdir()
    other_url = CASES[env.backend].url(tmp_path / "other")
    other = _prepare(env.backend, other_url)
    try:
        # (PostgreSQL: another schema of the same database, whose fencing tables are
        # named with their schema; the table name resolves elsewhere: refused for that)
        with pytest.raises(ConfigurationError, match=r"its own database only|search path"):
            other.using(env.conn).table(TABLE).get(1)
        env.audit("still usable")
        env.conn.commit()
        assert env.audited() == 1
    finally:
        other.close()
        cleanup = CASES[env.backend].cleanup
        if cleanup is not None:
            cleanup(other_url)


def test_what_cannot_be_borrowed(env: Env) -> None:
    with pytest.raises(InvalidInput, match=r"store\.using"):
        env.store.using(object())
    memory = fencing.open("memory://")
    with pytest.raises(ConfigurationError, match="no transaction of yours"):
        memory.using(env.conn)


def test_a_sqlalchemy_session(env: Env) -> None:
    sqlalchemy = pytest.importorskip("sqlalchemy")
    from sqlalchemy.orm import Session

    engine = sqlalchemy.create_engine(env.lender.sa_url(env.url), **env.lender.sa_options(env.url))
    insert = sqlalchemy.text(f"INSERT INTO {AUDIT} (note) VALUES (:note)")
    intent = env.table.intent(1, "ship")
    try:
        with Session(engine) as session:
            session.execute(insert, {"note": "in session"})
            out = env.store.using(session).table(TABLE).commit(intent, {"status": "shipped"})
            assert isinstance(out, Committed)
            session.rollback()
        assert env.table.get(1).version == 1 and env.audited() == 0
        with Session(engine) as session:
            session.execute(insert, {"note": "in session"})
            out = env.store.using(session).table(TABLE).commit(intent, {"status": "shipped"})
            assert isinstance(out, Committed)
            session.commit()
        assert env.table.get(1).version == 2 and env.audited() == 1
        with engine.connect() as conn:  # a Connection: begun for the caller, who commits
            view = env.store.using(conn).table(TABLE)
            assert isinstance(view.commit(view.intent(2, "ship"), {"status": "x"}), Committed)
            conn.commit()
        assert env.table.get(2).version == 2
    finally:
        engine.dispose()


@ASYNC
def test_async_commit_rollback_and_refusal(env: Env) -> None:
    aconnect = env.lender.aconnect
    assert aconnect is not None

    async def main() -> None:
        store = await fencing.open_async(env.url)
        conn = await aconnect(env.url)
        try:
            table = store.table(TABLE)
            view = store.using(conn).table(TABLE)
            intent = await table.intent(1, "ship")
            assert isinstance(await view.commit(intent, {"status": "shipped"}), Committed)
            await conn.rollback()
            assert (await table.get(1)).version == 1
            assert isinstance(await view.commit(intent, {"status": "shipped"}), Committed)
            assert isinstance(await view.commit(intent, {"status": "again"}), Duplicate)
            await conn.commit()
            assert (await table.get(1)).version == 2
            stale = await table.intent(2, "x")  # then moved on by the store itself
            assert (await table.commit(await table.intent(2, "y"), {"status": "paid"})).committed
            assert isinstance(await view.commit(intent, {"status": "shipped"}), Duplicate)
            assert isinstance(await view.commit(stale, {"status": "x"}), Stale)
            await conn.commit()
            carts = store.collection("carts")
            gone = await carts.create("c-1", {"n": 1})
            assert await carts.delete("c-1")  # deleted by the store before the view commits
            bound_carts = store.using(conn).collection("carts")
            assert isinstance(await bound_carts.commit(gone.intent("x"), {"n": 2}), Missing)
            await conn.commit()
            with pytest.raises(InvalidInput, match="synchronous connection"):
                store.using(env.conn)
        finally:
            await conn.close() if asyncio.iscoroutinefunction(conn.close) else conn.close()
            await store.close()

    asyncio.run(main())


def _orm(env: Env) -> tuple[Any, Any]:
    sqlalchemy = pytest.importorskip("sqlalchemy")
    from sqlalchemy import Integer, String
    from sqlalchemy.orm import DeclarativeBase, mapped_column

    class Base(DeclarativeBase):
        pass

    class Order(Base):
        __tablename__ = TABLE
        id = mapped_column(Integer, primary_key=True)
        version = mapped_column(Integer, nullable=False)
        status = mapped_column(String(40))
        total = mapped_column(Integer)
        __mapper_args__ = {"version_id_col": version}  # noqa: RUF012

    engine = sqlalchemy.create_engine(env.lender.sa_url(env.url), **env.lender.sa_options(env.url))
    return engine, Order


def test_intent_for_carries_the_version_the_row_has_once_committed(env: Env) -> None:
    from sqlalchemy.orm import Session

    engine, Order = _orm(env)
    try:
        with Session(engine) as session:
            order = session.get(Order, 1)
            order.status = "paid"  # the business step bumps the version at flush
            view = env.store.using(session).table(Order)
            intent = view.intent_for(order, "ship")  # flushed first, read in the session
            assert intent.expected_version == 2 and order.version == 2
            # a plain store table reads through the object's session too (sync)
            assert env.store.table(Order).intent_for(order, "ship").expected_version == 2
            session.commit()
        out = env.table.commit(intent, {"status": "shipped"})  # the worker, after commit
        assert isinstance(out, Committed) and out.record.version == 3
        with Session(engine) as session:
            row = session.execute(
                __import__("sqlalchemy").text(f"SELECT id, version FROM {TABLE} WHERE id = 2")
            ).one()
            assert env.store.using(session).table(TABLE).intent_for(row, "x").expected_version == 1
            new = Order(id=7, version=1, status="new", total=1)
            session.add(new)  # pending: intent_for flushes it first
            assert env.store.using(session).table(Order).intent_for(new, "x").expected_version == 1
            session.rollback()
        assert env.table.get(7) is None
        with pytest.raises(InvalidInput, match="no column"):
            env.table.intent_for({"nope": 1}, "x")
        assert env.table.intent_for({"id": 2}, "x").expected_version == 1
    finally:
        engine.dispose()


def test_the_after_commit_pattern_without_a_view_sends_a_stale_intent(env: Env) -> None:
    """Why ``intent_for``/``using`` exist: an intent read on the store's own connections
    while the business transaction is open predates that transaction's bump."""
    from sqlalchemy.orm import Session

    engine, Order = _orm(env)
    try:
        with Session(engine) as session:
            order = session.get(Order, 1)
            order.status = "paid"
            session.flush()
            early = env.table.intent(1, "ship")  # the store's own connection: version 1
            session.commit()
        assert isinstance(env.table.commit(early, {"status": "shipped"}), Stale)
    finally:
        engine.dispose()


@ASYNC
def test_a_sqlalchemy_async_session(env: Env) -> None:
    pytest.importorskip("sqlalchemy")
    from sqlalchemy import text
    from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

    assert env.lender.sa_async_url is not None
    insert = text(f"INSERT INTO {AUDIT} (note) VALUES (:note)")

    async def main() -> None:
        store = await fencing.open_async(env.url)
        engine = create_async_engine(
            env.lender.sa_async_url(env.url), **env.lender.sa_options(env.url)
        )
        table = store.table(TABLE)
        try:
            intent = await table.intent(1, "ship")
            async with AsyncSession(engine) as session:
                await session.execute(insert, {"note": "in session"})
                out = await store.using(session).table(TABLE).commit(intent, {"status": "shipped"})
                assert isinstance(out, Committed)
                await session.rollback()
            assert (await table.get(1)).version == 1 and env.audited() == 0
            async with AsyncSession(engine) as session:
                await session.execute(insert, {"note": "in session"})
                view = store.using(session).table(TABLE)
                assert isinstance(await view.commit(intent, {"status": "shipped"}), Committed)
                assert isinstance(await view.commit(intent, {"status": "again"}), Duplicate)
                await session.commit()
            assert (await table.get(1)).version == 2 and env.audited() == 1
            async with engine.connect() as conn:  # begun for the caller, who commits
                view = store.using(conn).table(TABLE)
                fresh = await view.intent(2, "ship")
                assert isinstance(await view.commit(fresh, {"status": "x"}), Committed)
                await conn.commit()
            assert (await table.get(2)).version == 2
        finally:
            await engine.dispose()
            await store.close()

    asyncio.run(main())
