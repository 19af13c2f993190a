"""``store.using(conn)`` on PostgreSQL: what ``tests/test_using.py`` cannot say on every
backend. One round trip per bound commit; a claim race between two callers' transactions;
no self-deadlock on a row (or a lease) the caller's transaction holds; a lease takeover
ordered after a fenced commit the caller holds; REPEATABLE READ / SERIALIZABLE callers;
a signal handler's exception, Ctrl-C and task cancellation mid-statement; an aborted or
misconfigured caller's connection; SQLAlchemy's ``AsyncSession``.
"""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

import fencing
from fencing import (
    Committed,
    ConfigurationError,
    Duplicate,
    Fenced,
    Stale,
    StoreError,
    TransientStoreError,
)

from ._backends import TABLE_COLUMNS
from .backends_postgres import Setup, create_table, traced
from .test_postgres import in_thread, lock_waiters

psycopg = pytest.importorskip("psycopg")

TABLE = "orders_b"
ROWS = [{"id": 1, "status": "new", "total": 10}, {"id": 2, "status": "new", "total": 20}]


@pytest.fixture
def store(pg: Setup) -> Iterator[Any]:
    s = fencing.open(pg.url)
    s.migrate()
    create_table(s, TABLE, "id", "version", TABLE_COLUMNS, ROWS)
    yield s
    s.close()


def lend(store: Any, pg: Setup, *, app: str | None = None, **kwargs: Any) -> Any:
    """A connection of the caller's: the store's schema first on its search path."""
    return psycopg.connect(
        store.backend.conninfo,
        options=f"-c search_path={pg.schema},public",
        application_name=app or pg.app,
        **kwargs,
    )


async def alend(store: Any, pg: Setup, **kwargs: Any) -> Any:
    return await psycopg.AsyncConnection.connect(
        store.backend.conninfo,
        options=f"-c search_path={pg.schema},public",
        application_name=pg.app,
        **kwargs,
    )


def version(store: Any, key: int = 1) -> int:
    return int(store.table(TABLE).get(key).version)


# -- one round trip ----------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["in a transaction", "implicit", "autocommit"])
def test_a_bound_commit_is_one_round_trip(store: Any, pg: Setup, mode: str) -> None:
    conn = lend(store, pg, autocommit=mode == "autocommit")
    try:
        view = store.using(conn).table(TABLE)
        view.get(2)  # the connection's database checked once (its first use)
        conn.commit()
        if mode == "in a transaction":
            conn.execute("SELECT 1")
        intent = store.table(TABLE).intent(1, "ship")
        with traced(conn.pgconn) as traffic:
            assert isinstance(view.commit(intent, {"status": "shipped"}), Committed)
        (t,) = traffic
        # SAVEPOINT, the commit, RELEASE: one pipeline, one round trip. A connection not
        # in a transaction yet first gets psycopg's own BEGIN, synced on its own (as any
        # first statement of the caller's would); an autocommit connection with no
        # transaction: the commit alone, as on the store's own connections.
        expected = {"in a transaction": (3, 1), "implicit": (4, 2), "autocommit": (1, 1)}
        assert (t.statements, t.round_trips) == expected[mode]
        conn.commit()
        assert version(store) == 2
    finally:
        conn.close()


def test_a_failed_step_costs_one_more_round_trip_and_leaves_the_transaction(
    store: Any, pg: Setup
) -> None:
    conn = lend(store, pg)
    try:
        view = store.using(conn)
        view.collection("c").create("k", {})
        with traced(conn.pgconn) as traffic, pytest.raises(fencing.AlreadyExists):
            view.collection("c").create("k", {})
        (t,) = traffic
        assert t.round_trips == 1  # ON CONFLICT: a refusal, not a failed statement
        view.table(TABLE).get(1)  # its columns known
        intent = store.table(TABLE).intent(1, "ship")
        with traced(conn.pgconn) as traffic, pytest.raises(fencing.InvalidInput):
            view.table(TABLE).commit(intent, {"total": "many"})  # the server refuses it
        assert traffic[0].round_trips == 2  # and the savepoint is rolled back to
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        conn.commit()
        assert store.collection("c").get("k") is not None
    finally:
        conn.close()


# -- concurrency inside callers' transactions ----------------------------------------------
def test_a_claim_race_between_two_transactions(store: Any, pg: Setup) -> None:
    """The same intent committed in two callers' transactions: the second waits for the
    first's row lock; whichever way the first ends, exactly one commit holds."""
    for first_ends in ("commit", "rollback"):
        intent = store.table(TABLE).intent(1, "ship")
        a, b = lend(store, pg), lend(store, pg)
        try:
            assert isinstance(
                store.using(a).table(TABLE).commit(intent, {"status": "a"}), Committed
            )
            raced = in_thread(store.using(b).table(TABLE).commit, intent, {"status": "b"})
            lock_waiters(pg.app, 1)
            getattr(a, first_ends)()
            second = raced.result(timeout=30)
            b.commit()
        finally:
            a.close()
            b.close()
        record = store.table(TABLE).get(1)
        if first_ends == "commit":
            assert isinstance(second, Duplicate)
            assert record.state["status"] == "a"
        else:
            assert isinstance(second, Committed)
            assert record.state["status"] == "b"
        assert record.version == intent.expected_version + 1


def test_no_self_deadlock_on_a_row_or_lease_the_transaction_holds(store: Any, pg: Setup) -> None:
    conn = lend(store, pg)
    try:
        lease = store.acquire("job", owner="w", ttl=60)
        conn.execute(f"UPDATE {TABLE} SET status = 'packed', version = version + 1 WHERE id = 1")
        conn.execute("SELECT 1 FROM fencing_leases WHERE name = 'job' FOR SHARE")
        view = store.using(conn).table(TABLE)
        intent = view.intent(1, "ship")
        out = view.commit(intent, {"status": "shipped"}, lease=lease)
        assert isinstance(out, Committed) and out.record.version == 3
        conn.commit()
        assert version(store) == 3
        lease.release()
    finally:
        conn.close()


def test_a_takeover_waits_for_the_fenced_commit_the_caller_holds(store: Any, pg: Setup) -> None:
    """A fenced commit share-locks its live lease row in the caller's transaction: a
    takeover after the lease expired waits until that transaction ends, so no commit
    under the old token lands after the new token was granted."""
    lease = store.acquire("job", owner="old", ttl=1)
    conn = lend(store, pg)
    try:
        view = store.using(conn).table(TABLE)
        intent = store.table(TABLE).intent(1, "ship")
        assert isinstance(view.commit(intent, {"status": "shipped"}, lease=lease), Committed)
        time.sleep(1.2)  # the lease expires while the caller's transaction is open
        taker = fencing.open(pg.url)  # the store's app name: its wait is visible
        try:
            takeover = in_thread(lambda: taker.acquire("job", owner="new", ttl=60))
            lock_waiters(pg.app, 1)
            assert not takeover.done()
            conn.commit()
            newer = takeover.result(timeout=30)
            assert newer.token == lease.token + 1
            record = store.table(TABLE).get(1)
            assert (record.version, record.state["status"]) == (2, "shipped")
            # and the other way round: the takeover first, then the old holder's commit
            late = view.commit(store.table(TABLE).intent(2, "ship"), {"status": "x"}, lease=lease)
            assert isinstance(late, Fenced)
            conn.commit()
            assert version(store, 2) == 1
            newer.release()
        finally:
            taker.close()
    finally:
        conn.close()


def test_a_lease_is_judged_at_the_statement_not_at_the_transactions_start(
    store: Any, pg: Setup
) -> None:
    """``now()`` is the start of the caller's transaction; a lease that expired since
    must not look held to a commit made later in it."""
    conn = lend(store, pg)
    try:
        conn.execute("SELECT 1")  # the caller's transaction starts
        lease = store.acquire("job", owner="w", ttl=1)
        time.sleep(1.2)
        view = store.using(conn).table(TABLE)
        out = view.commit(store.table(TABLE).intent(1, "ship"), {"status": "x"}, lease=lease)
        assert isinstance(out, Fenced)
        conn.commit()
        assert version(store) == 1
    finally:
        conn.close()


@pytest.mark.parametrize("level", ["REPEATABLE READ", "SERIALIZABLE"])
def test_isolation_levels(store: Any, pg: Setup, level: str) -> None:
    """A commit whose row moved on after the caller's snapshot: a serialization failure,
    typed TransientStoreError telling the caller to run its transaction again; the
    transaction is left usable (rolled back to the savepoint)."""
    conn = lend(store, pg)
    try:
        conn.execute(f"SET TRANSACTION ISOLATION LEVEL {level}")
        view = store.using(conn).table(TABLE)
        intent = view.intent(1, "ship")  # the snapshot is taken here
        moved = store.table(TABLE).commit(store.table(TABLE).intent(1, "pay"), {"status": "p"})
        assert isinstance(moved, Committed)
        with pytest.raises(TransientStoreError, match="run it again"):
            view.commit(intent, {"status": "shipped"})
        assert conn.execute("SELECT 1").fetchone() == (1,)
        conn.rollback()
        # run again: a fresh snapshot, the intent is stale now, nothing to retry
        conn.execute(f"SET TRANSACTION ISOLATION LEVEL {level}")
        assert isinstance(view.commit(intent, {"status": "shipped"}), Stale)
        fresh = view.intent(1, "ship")
        assert isinstance(view.commit(fresh, {"status": "shipped"}), Committed)
        conn.commit()
        assert version(store) == 3
    finally:
        conn.close()


# -- interruptions -----------------------------------------------------------------------
class Alarm(Exception):
    """What a timer signal's handler raises."""


@pytest.fixture
def blocker(store: Any, pg: Setup) -> Iterator[Any]:
    """Another transaction holding row 1's lock (a bound commit on it waits)."""
    conn = lend(store, pg, app="blocker")
    conn.execute(f"SELECT 1 FROM {TABLE} WHERE id = 1 FOR UPDATE")
    yield conn
    conn.rollback()
    conn.close()


def _fire_when_waiting(app: str, action: Any) -> threading.Thread:
    def run() -> None:
        lock_waiters(app, 1)
        action()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


@pytest.mark.skipif(not hasattr(signal, "pthread_kill"), reason="needs POSIX signals")
@pytest.mark.parametrize("raised", [Alarm, KeyboardInterrupt])
def test_an_exception_from_a_signal_handler_mid_statement(
    store: Any, pg: Setup, blocker: Any, raised: type[BaseException]
) -> None:
    """The commit waits on a lock; a signal handler raises. The running statement is
    cancelled, the savepoint rolled back to: the caller's transaction holds what it
    did before, none of the step; the store's own pool is unaffected."""

    def handler(signum: int, frame: Any) -> None:
        raise raised("interrupted")

    conn = lend(store, pg)
    previous = signal.signal(signal.SIGUSR1, handler)
    main = threading.main_thread().ident
    assert main is not None
    try:
        conn.execute(f"INSERT INTO {TABLE} (id, status) VALUES (7, 'mine')")
        view = store.using(conn).table(TABLE)
        intent = store.table(TABLE).intent(1, "ship")
        thread = _fire_when_waiting(pg.app, lambda: signal.pthread_kill(main, signal.SIGUSR1))
        with pytest.raises(raised):
            view.commit(intent, {"status": "shipped"})
        thread.join()
        assert not conn.closed
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        assert conn.execute(f"SELECT status FROM {TABLE} WHERE id = 7").fetchone() == ("mine",)
        blocker.rollback()
        again = view.commit(intent, {"status": "shipped"})  # not Duplicate: it never happened
        assert isinstance(again, Committed)
        conn.commit()
        assert version(store) == 2 and store.table(TABLE).get(7) is not None
    finally:
        signal.signal(signal.SIGUSR1, previous)
        conn.close()


def test_task_cancellation_mid_statement(store: Any, pg: Setup, blocker: Any) -> None:
    async def main() -> None:
        astore = await fencing.open_async(pg.url)
        conn = await alend(store, pg)
        try:
            await conn.execute(f"INSERT INTO {TABLE} (id, status) VALUES (7, 'mine')")
            view = astore.using(conn).table(TABLE)
            intent = await astore.table(TABLE).intent(1, "ship")
            task = asyncio.ensure_future(view.commit(intent, {"status": "shipped"}))
            await asyncio.to_thread(lock_waiters, pg.app, 1)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
            cur = await conn.execute(f"SELECT status FROM {TABLE} WHERE id = 7")
            assert await cur.fetchone() == ("mine",)
            blocker.rollback()
            assert isinstance(await view.commit(intent, {"status": "shipped"}), Committed)
            await conn.commit()
            assert (await astore.table(TABLE).get(1)).version == 2  # the pool is fine
        finally:
            await conn.close()
            await astore.close()

    asyncio.run(main())


# -- the caller's connection as fencing finds it ----------------------------------------------
def test_an_aborted_transaction_is_refused_untouched(store: Any, pg: Setup) -> None:
    conn = lend(store, pg)
    try:
        with pytest.raises(psycopg.errors.UndefinedTable):
            conn.execute("SELECT * FROM no_such_table")
        with pytest.raises(StoreError, match="aborted"):
            store.using(conn).table(TABLE).get(1)
        conn.rollback()
        assert store.using(conn).table(TABLE).get(1) is not None
    finally:
        conn.close()


def test_a_table_name_must_resolve_as_on_the_stores_connections(store: Any, pg: Setup) -> None:
    """A user table's name is not qualified: on the caller's connection it must name the
    table it names on the store's own (whose search path starts with the schema)."""
    conn = psycopg.connect(store.backend.conninfo)  # the server's default search path
    try:
        with pytest.raises(ConfigurationError, match="search path") as refused:
            store.using(conn).table(TABLE).get(1)
        assert "no table (search path" in str(refused.value)
        assert f"{pg.schema}.{TABLE}" in str(refused.value)
        # named with its schema, it is the same table on both
        assert store.using(conn).table(f"{pg.schema}.{TABLE}").get(1) is not None
        # fencing's own tables are always the store's: collections work
        assert store.using(conn).collection("c").get("k") is None
        conn.rollback()
    finally:
        conn.close()
    # only the schema on the search path (not public after it): the same tables
    conn = psycopg.connect(store.backend.conninfo, options=f"-c search_path={pg.schema}")
    try:
        assert store.using(conn).table(TABLE).get(1) is not None
        conn.rollback()
    finally:
        conn.close()


def test_a_connection_to_another_database_is_refused(store: Any, pg: Setup) -> None:
    from fencing._url import StoreURL
    from fencing.backends.postgres.settings import settings_from_url

    url = pg.url.split("?")[0].rsplit("/", 1)[0] + "/postgres"  # always there
    conn = psycopg.connect(settings_from_url(StoreURL.parse(url), {}).conninfo)
    try:
        with pytest.raises(ConfigurationError, match=r"'postgres'.*its own database only"):
            store.using(conn).collection("c").get("k")
        conn.rollback()
    finally:
        conn.close()


def test_the_callers_row_factory_does_not_matter(store: Any, pg: Setup) -> None:
    from psycopg.rows import dict_row

    conn = lend(store, pg, row_factory=dict_row)
    try:
        view = store.using(conn).table(TABLE)
        assert isinstance(view.commit(view.intent(1, "ship"), {"status": "x"}), Committed)
        assert conn.execute(f"SELECT version FROM {TABLE} WHERE id = 1").fetchone() == {
            "version": 2
        }
        conn.commit()
    finally:
        conn.close()


def test_a_sqlalchemy_async_session(store: Any, pg: Setup) -> None:
    sqlalchemy = pytest.importorskip("sqlalchemy")
    from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

    url = pg.url.split("?")[0].replace("postgresql://", "postgresql+psycopg_async://")
    options = {"options": f"-c search_path={pg.schema},public"}
    audit = sqlalchemy.text(f"UPDATE {TABLE} SET note = :note WHERE id = 2")

    async def main() -> None:
        astore = await fencing.open_async(pg.url)
        engine = create_async_engine(url, connect_args=options)
        try:
            intent = await astore.table(TABLE).intent(1, "ship")
            async with AsyncSession(engine) as session:
                await session.execute(audit, {"note": "rolled back"})
                out = await astore.using(session).table(TABLE).commit(intent, {"status": "x"})
                assert isinstance(out, Committed)
                await session.rollback()
            assert (await astore.table(TABLE).get(1)).version == 1
            async with AsyncSession(engine) as session:
                await session.execute(audit, {"note": "kept"})
                out = await astore.using(session).table(TABLE).commit(intent, {"status": "x"})
                assert isinstance(out, Committed)
                again = await astore.using(session).table(TABLE).commit(intent, {"status": "x"})
                assert isinstance(again, Duplicate)
                await session.commit()
            assert (await astore.table(TABLE).get(1)).version == 2
            assert (await astore.table(TABLE).get(2)).state["note"] == "kept"
        finally:
            await engine.dispose()
            await astore.close()

    asyncio.run(main())


def test_the_identity_check_is_once_per_connection(store: Any, pg: Setup) -> None:
    conn = lend(store, pg)
    try:
        store.using(conn).table(TABLE).get(1)
        with traced(conn.pgconn) as traffic:
            store.using(conn).table(TABLE).get(1)  # another view, the same connection
        assert traffic[0].round_trips == 1
        conn.rollback()
    finally:
        conn.close()


def test_undoing_a_step_that_stopped_without_a_server_error(store: Any, pg: Setup) -> None:
    """After an interruption the transaction may not be aborted: the step's savepoint
    may hold part of it (rolled back to), or be released already (the step ran whole:
    kept, and nothing of the caller's is lost to a "no such savepoint" error)."""
    from fencing.backends.postgres.bound import _undo

    conn = lend(store, pg)
    try:
        conn.execute(f"INSERT INTO {TABLE} (id, status) VALUES (7, 'mine')")
        conn.execute("SAVEPOINT fencing_step")
        conn.execute(f"UPDATE {TABLE} SET status = 'half' WHERE id = 1")
        assert _undo(conn, "fencing_step") is None
        assert conn.execute(f"SELECT status FROM {TABLE} WHERE id = 1").fetchone() == ("new",)
        conn.execute(f"UPDATE {TABLE} SET status = 'whole' WHERE id = 2")  # no savepoint
        assert _undo(conn, "fencing_step") is None
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        rows = conn.execute(f"SELECT id, status FROM {TABLE} ORDER BY id").fetchall()
        assert rows == [(1, "new"), (2, "whole"), (7, "mine")]
        conn.rollback()
    finally:
        conn.close()


def test_a_lost_connection_says_the_transaction_went_with_it(store: Any, pg: Setup) -> None:
    from .backends_postgres import admin

    conn = lend(store, pg)
    try:
        view = store.using(conn).table(TABLE)
        intent = view.intent(1, "ship")
        with admin() as other:
            other.execute("SELECT pg_terminate_backend(%s)", [conn.info.backend_pid])
        with pytest.raises(TransientStoreError) as lost:
            view.commit(intent, {"status": "shipped"})
        assert "your transaction with it" in " ".join(getattr(lost.value, "__notes__", []))
        with pytest.raises(StoreError, match="closed; nothing was run"):
            view.get(1)
        assert version(store) == 1  # nothing committed; the store's pool unaffected
    finally:
        conn.close()
