"""What fencing runs on its own PostgreSQL connections never waits without bound on a lock
(issue 18, item 5).

* The README's lease pattern around a fenced commit made through ``store.using(conn)``:
  the commit key-share-locks the lease row in the caller's transaction, and the
  heartbeat's renew and the release on leaving the ``with`` block (the store's own
  connections) do not conflict with that lock, so they finish while the caller's
  transaction is still open; a takeover still waits for that transaction.
* A commit through the store's own pool on a row the same thread's open transaction
  holds: refused after ``lock_timeout`` with ``SelfDeadlock`` naming the connection,
  instead of waiting forever; a row held by someone else: ``LockTimeout``, retryable.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest

import fencing
from fencing import Committed

from ._backends import TABLE_COLUMNS
from .backends_postgres import Setup, create_table
from .test_postgres import in_thread, lock_waiters
from .test_using_postgres import lend

psycopg = pytest.importorskip("psycopg")

TABLE = "orders_l"
ROWS = [{"id": 1, "status": "new", "total": 10}, {"id": 2, "status": "new", "total": 20}]
LEASE = "orders_l/1"


@pytest.fixture
def store(pg: Setup) -> Iterator[Any]:
    s = fencing.open(pg.url)
    s.migrate()
    create_table(s, TABLE, "id", "version", TABLE_COLUMNS, ROWS)
    yield s
    s.close()


def renewed(lease: Any, since: float) -> None:
    """Wait (bounded) until the heartbeat moved the lease's expiry past ``since``."""
    deadline = time.monotonic() + 30
    while lease.expires_at <= since:
        assert lease.lost_reason is None, lease.lost_reason
        assert time.monotonic() < deadline, "the heartbeat never renewed"
        time.sleep(0.05)


def cancelled_by_the_watchdog(error: BaseException, pid: int) -> None:
    """``error`` is the SelfDeadlock of a statement the watchdog cancelled (``PQcancel``:
    the server's query_canceled, 57014), not one that ran out its lock_timeout (55P03)."""
    assert type(error) is fencing.SelfDeadlock
    assert isinstance(error, fencing.LockTimeout)
    assert isinstance(error, fencing.TransientStoreError)
    assert error.pids == (pid,)
    cause = error.__cause__
    assert isinstance(cause, psycopg.errors.QueryCanceled), repr(cause)
    assert cause.sqlstate == "57014"


@pytest.mark.timeout(60)
def test_the_readme_lease_pattern_through_using(store: Any, pg: Setup) -> None:
    conn = lend(store, pg)  # not autocommit: the caller's transaction opens implicitly
    try:
        view = store.using(conn).table(TABLE)
        with store.lease(LEASE, owner="worker-7", ttl=1.5, heartbeat=True) as lease:
            first = lease.expires_at
            out = view.commit(view.intent(1, "pack"), {"status": "packed"}, lease=lease)
            assert isinstance(out, Committed)
            renewed(lease, first)  # the heartbeat renewed behind the caller's open commit
            lease.renew()  # and so does an explicit renew
        assert lease.released  # left the block before the caller's transaction ends
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        conn.commit()
        assert store.table(TABLE).get(1).state["status"] == "packed"
        again = store.acquire(LEASE, owner="worker-8", ttl=30)  # free: released, not expired
        assert again.token == lease.token + 1
        again.release()
    finally:
        conn.close()


@pytest.mark.timeout(60)
def test_a_takeover_still_waits_for_the_commit_after_the_release(store: Any, pg: Setup) -> None:
    """Released while a commit under its token is open in the caller's transaction: the
    next owner's acquire waits for that transaction, so no write under the old token is
    visible after the new token was granted."""
    conn = lend(store, pg)
    try:
        view = store.using(conn).table(TABLE)
        with store.lease(LEASE, owner="old", ttl=30) as lease:
            out = view.commit(view.intent(1, "pack"), {"status": "packed"}, lease=lease)
            assert isinstance(out, Committed)
        taker = fencing.open(pg.url)  # the store's app name: its wait is visible
        try:
            takeover = in_thread(lambda: taker.acquire(LEASE, owner="new", ttl=30))
            lock_waiters(pg.app, 1)
            assert not takeover.done()
            conn.commit()
            newer = takeover.result(timeout=30)
            assert newer.token == lease.token + 1
            assert store.table(TABLE).get(1).state["status"] == "packed"
            newer.release()
        finally:
            taker.close()
    finally:
        conn.close()


# -- 5a: the store's own connections wait for a lock at most lock_timeout -----------------
def test_the_lock_timeout_is_set_on_the_stores_own_connections(pg: Setup) -> None:
    from fencing._url import StoreURL
    from fencing.backends.postgres.settings import settings_from_url

    for query, shown in (("", "5s"), ("&lock_timeout=0.25", "250ms"), ("&lock_timeout=0", "0")):
        s = fencing.open(pg.url + query)
        try:
            with s.backend.pool.connection() as conn:
                assert conn.execute("SHOW lock_timeout").fetchone() == (shown,)
        finally:
            s.close()
    url = StoreURL.parse("postgresql://u@h/db")
    for bad in ("-1", "x", "0.0001"):
        with pytest.raises(fencing.ConfigurationError, match="lock_timeout"):
            settings_from_url(url, {"lock_timeout": bad})


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["update", "select for update"])
def test_a_commit_behind_your_own_transactions_lock_is_a_self_deadlock(
    store: Any, pg: Setup, how: str
) -> None:
    """The row is locked by the same thread's open transaction, on a connection given to
    store.using: the store's own commit on it is cancelled at once (well within the
    lock_timeout, which would be the alternative), naming that connection."""
    conn = lend(store, pg)
    try:
        store.using(conn)  # the connection is this thread's, fencing knows it
        if how == "update":
            conn.execute(f"UPDATE {TABLE} SET total = 11 WHERE id = 1")
        else:
            conn.execute(f"SELECT 1 FROM {TABLE} WHERE id = 1 FOR UPDATE")
        intent = store.table(TABLE).intent(1, "ship")
        with pytest.raises(fencing.SelfDeadlock, match=f"pid {conn.info.backend_pid}") as caught:
            store.table(TABLE).commit(intent, {"status": "shipped"})
        cancelled_by_the_watchdog(caught.value, conn.info.backend_pid)
        assert f'a row of "{TABLE}"' in str(caught.value)
        # the caller's transaction is untouched, and nothing of the commit was written
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        conn.rollback()
        assert isinstance(store.table(TABLE).commit(intent, {"status": "shipped"}), Committed)
    finally:
        conn.close()


@pytest.mark.timeout(60)
def test_a_takeover_behind_your_own_fenced_commit_is_a_self_deadlock(store: Any, pg: Setup) -> None:
    conn = lend(store, pg)
    try:
        lease = store.acquire(LEASE, owner="old", ttl=30)
        view = store.using(conn).table(TABLE)
        assert isinstance(view.commit(view.intent(1, "a"), {"status": "a"}, lease=lease), Committed)
        lease.release()  # free now, but the commit under its token is not committed yet
        with pytest.raises(fencing.SelfDeadlock, match='a row of "fencing_leases"') as caught:
            store.acquire(LEASE, owner="new", ttl=30)
        cancelled_by_the_watchdog(caught.value, conn.info.backend_pid)
        conn.commit()
        assert store.acquire(LEASE, owner="new", ttl=30).token == lease.token + 1
    finally:
        conn.close()


@pytest.mark.timeout(60)
def test_async_a_commit_behind_your_own_transactions_lock(store: Any, pg: Setup) -> None:
    async def main() -> None:
        from .test_using_postgres import alend

        astore = await fencing.open_async(pg.url)
        conn = await alend(store, pg)
        try:
            view = astore.using(conn).table(TABLE)
            assert isinstance(
                await view.commit(await view.intent(1, "a"), {"status": "a"}), Committed
            )
            intent = await astore.table(TABLE).intent(2, "b")
            await conn.execute(f"UPDATE {TABLE} SET total = 21 WHERE id = 2")
            pid = conn.info.backend_pid
            with pytest.raises(fencing.SelfDeadlock, match=f"pid {pid}") as caught:
                await astore.table(TABLE).commit(intent, {"status": "b"})
            cancelled_by_the_watchdog(caught.value, pid)
            await conn.commit()
            assert isinstance(await astore.table(TABLE).commit(intent, {"status": "b"}), Committed)
        finally:
            await conn.close()
            await astore.close()

    asyncio.run(main())


@pytest.mark.timeout(60)
def test_a_lock_held_elsewhere_is_a_lock_timeout_retried_by_the_queues(pg: Setup) -> None:
    """Another session (not given to store.using in this thread) holds the row: the
    store's commit waits lock_timeout, then raises LockTimeout, which the queue
    integrations retry; it is not a SelfDeadlock."""
    from fencing.contrib._outcomes import Action, classify

    s = fencing.open(pg.url + "&lock_timeout=0.3")
    s.migrate()
    create_table(s, TABLE, "id", "version", TABLE_COLUMNS, ROWS)
    other = lend(s, pg)
    try:
        other.execute(f"SELECT 1 FROM {TABLE} WHERE id = 1 FOR UPDATE")  # never given to using
        intent = s.table(TABLE).intent(1, "ship")
        with pytest.raises(fencing.LockTimeout, match=f'a row of "{TABLE}"') as caught:
            s.table(TABLE).commit(intent, {"status": "shipped"})
        assert type(caught.value) is fencing.LockTimeout  # not a SelfDeadlock
        assert getattr(caught.value.__cause__, "sqlstate", None) == "55P03"  # lock_timeout
        assert "store.using(conn)" in str(caught.value)
        assert classify(caught.value) == (Action.RETRY, "transient")
        other.rollback()
        assert isinstance(s.table(TABLE).commit(intent, {"status": "shipped"}), Committed)
    finally:
        other.close()
        s.close()


@pytest.mark.timeout(60)
def test_psycopg2_a_commit_behind_your_own_transactions_lock_is_a_self_deadlock(
    store: Any, pg: Setup
) -> None:
    """The same on a psycopg2 connection (Django's on most projects)."""
    from ._lenders import require_module

    require_module("psycopg2")
    import psycopg2

    conn = psycopg2.connect(
        store.backend.conninfo,
        options=f"-c search_path={pg.schema},public",
        application_name=pg.app,
    )
    try:
        view = store.using(conn).table(TABLE)
        assert isinstance(view.commit(view.intent(2, "a"), {"status": "a"}), Committed)
        with conn.cursor() as cur:
            cur.execute(f"UPDATE {TABLE} SET total = 11 WHERE id = 1")
        intent = store.table(TABLE).intent(1, "ship")
        pid = conn.info.backend_pid
        with pytest.raises(fencing.SelfDeadlock, match=f"pid {pid}") as caught:
            store.table(TABLE).commit(intent, {"status": "shipped"})
        cancelled_by_the_watchdog(caught.value, pid)  # (the store's own: psycopg 3)
        conn.rollback()
        assert isinstance(store.table(TABLE).commit(intent, {"status": "shipped"}), Committed)
    finally:
        conn.close()
