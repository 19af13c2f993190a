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
