"""What fencing runs on its own MySQL / MariaDB connections never waits on a lock of the
same thread's own transaction (given to ``store.using``), on PyMySQL's and mysqlclient's
(Django's) connections: refused at once with ``SelfDeadlock`` naming the connection, where
it waited ``innodb_lock_wait_timeout`` and was retried into the same wait (a Django
``TestCase`` on mysqlclient looked hung); a row held by someone else is still the
retryable lock wait timeout, not a SelfDeadlock."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import fencing
from fencing import Committed

from ._backends import TABLE_COLUMNS, require_server
from ._lenders import require_module

backends_mysql = pytest.importorskip("tests.backends_mysql")

TABLE = "orders_l"
ROWS = [{"id": 1, "status": "new", "total": 10}, {"id": 2, "status": "new", "total": 20}]
LEASE = "orders_l/1"
DRIVERS: dict[str, Callable[[str], Any]] = {
    "pymysql": backends_mysql.lend,
    "mysqlclient": backends_mysql.lend_mysqlclient,
}


@pytest.fixture
def url(tmp_path: Path) -> Iterator[str]:
    require_server("MariaDB", backends_mysql.HOST, backends_mysql.PORT)
    made = backends_mysql.make_url(tmp_path)
    try:
        yield made
    finally:
        backends_mysql.cleanup(made)


@pytest.fixture
def store(url: str) -> Iterator[Any]:
    s = fencing.open(url)
    backends_mysql.create_table(s, TABLE, "id", "version", TABLE_COLUMNS, ROWS)
    yield s
    s.close()


@pytest.fixture(params=sorted(DRIVERS))
def lend(request: pytest.FixtureRequest, url: str) -> Callable[[], Any]:
    if request.param == "mysqlclient":
        require_module("MySQLdb")
    return lambda: DRIVERS[request.param](url)


def thread_of(conn: Any) -> int:
    cur = conn.cursor()
    try:
        cur.execute("SELECT CONNECTION_ID()")
        return int(cur.fetchone()[0])
    finally:
        cur.close()


def killed_by_the_watchdog(error: BaseException, thread: int) -> None:
    """``error`` is the SelfDeadlock of a statement the watchdog killed (``KILL QUERY``:
    the server's 1317, query execution was interrupted), not one that ran out
    innodb_lock_wait_timeout (1205)."""
    assert type(error) is fencing.SelfDeadlock
    assert isinstance(error, fencing.LockTimeout)
    assert isinstance(error, fencing.TransientStoreError)
    assert error.pids == (thread,)
    cause = error.__cause__
    assert cause is not None and cause.args and cause.args[0] == 1317, repr(cause)


@pytest.mark.timeout(60)
def test_a_commit_behind_your_own_transactions_lock_is_a_self_deadlock(
    store: Any, lend: Callable[[], Any]
) -> None:
    conn = lend()  # autocommit off: the caller's transaction opens implicitly
    try:
        view = store.using(conn).table(TABLE)
        assert isinstance(view.commit(view.intent(1, "a"), {"status": "a"}), Committed)
        intent = store.table(TABLE).intent(2, "b")
        cur = conn.cursor()
        cur.execute(f"UPDATE {TABLE} SET total = 21 WHERE id = 2")  # the caller's row lock
        cur.close()
        with pytest.raises(fencing.SelfDeadlock, match=f"thread id {thread_of(conn)}") as caught:
            store.table(TABLE).commit(intent, {"status": "b"})  # the store's own connection
        killed_by_the_watchdog(caught.value, thread_of(conn))
        conn.commit()
        assert isinstance(store.table(TABLE).commit(intent, {"status": "b"}), Committed)
        assert store.table(TABLE).get(2).state["total"] == 21  # nothing of the refused one
    finally:
        conn.close()


@pytest.mark.timeout(60)
def test_a_takeover_behind_your_own_fenced_commit_is_a_self_deadlock(
    store: Any, lend: Callable[[], Any]
) -> None:
    conn = lend()
    try:
        lease = store.acquire(LEASE, owner="old", ttl=30)
        view = store.using(conn).table(TABLE)
        assert isinstance(view.commit(view.intent(1, "a"), {"status": "a"}, lease=lease), Committed)
        # InnoDB: the commit share-locked the lease row in the caller's transaction; the
        # release and a takeover write it (on PostgreSQL a release does not conflict)
        with pytest.raises(fencing.SelfDeadlock) as released:
            lease.release()
        killed_by_the_watchdog(released.value, thread_of(conn))
        with pytest.raises(fencing.SelfDeadlock) as taken:
            store.acquire(LEASE, owner="new", ttl=30)
        killed_by_the_watchdog(taken.value, thread_of(conn))
        conn.commit()
        lease.release()
        assert store.acquire(LEASE, owner="new", ttl=30).token == lease.token + 1
    finally:
        conn.close()


@pytest.mark.timeout(60)
def test_a_lock_held_elsewhere_is_a_lock_wait_timeout_not_a_self_deadlock(
    url: str, lend: Callable[[], Any]
) -> None:
    """Another session, not given to store.using in this thread, holds the row: the
    store's commit waits innodb_lock_wait_timeout (1 s here), then raises the retryable
    error; it is not a SelfDeadlock, even while this thread has a transaction of its own
    open through store.using."""
    from fencing.contrib._outcomes import Action, classify

    s = fencing.open(url + "?lock_wait_timeout=1")
    backends_mysql.create_table(s, TABLE, "id", "version", TABLE_COLUMNS, ROWS)
    other, mine = lend(), lend()
    try:
        cur = other.cursor()
        cur.execute(f"SELECT 1 FROM {TABLE} WHERE id = 1 FOR UPDATE")  # never given to using
        cur.close()
        view = s.using(mine).table(TABLE)
        assert isinstance(view.commit(view.intent(2, "a"), {"status": "a"}), Committed)
        intent = s.table(TABLE).intent(1, "ship")
        with pytest.raises(fencing.TransientStoreError) as caught:
            s.table(TABLE).commit(intent, {"status": "shipped"})
        assert not isinstance(caught.value, fencing.SelfDeadlock)
        cause = caught.value.__cause__
        assert cause is not None and cause.args[0] == 1205, repr(cause)  # ran out its wait
        assert classify(caught.value) == (Action.RETRY, "transient")
        other.rollback()
        mine.commit()
        assert isinstance(s.table(TABLE).commit(intent, {"status": "shipped"}), Committed)
    finally:
        other.close()
        mine.close()
        s.close()


def _self_deadlock_on(url: str) -> None:
    """A store on ``url`` whose own commit waits on the same thread's lent connection."""
    s = fencing.open(url)
    try:
        backends_mysql.create_table(s, TABLE, "id", "version", TABLE_COLUMNS, ROWS)
        conn = backends_mysql.lend(url)
        try:
            intent = s.table(TABLE).intent(2, "b")
            view = s.using(conn).table(TABLE)
            assert isinstance(view.commit(view.intent(1, "a"), {"status": "a"}), Committed)
            cur = conn.cursor()
            cur.execute(f"UPDATE {TABLE} SET total = 21 WHERE id = 2")
            cur.close()
            with pytest.raises(fencing.SelfDeadlock) as caught:
                s.table(TABLE).commit(intent, {"status": "b"})
            killed_by_the_watchdog(caught.value, thread_of(conn))
        finally:
            conn.rollback()
            conn.close()
    finally:
        s.close()


@pytest.mark.timeout(120)
def test_the_watchdog_outlives_the_store_and_the_database_it_began_with(
    tmp_path: Path,
) -> None:
    """The process's watchdog is made by the first store that needs it; once that store
    is closed, its database dropped and the watchdog's connection lost (a server
    restart), a later store's self-deadlock is still found (the watchdog reconnected with
    the first store's database, which no longer exists, and every later wait ran out
    ``innodb_lock_wait_timeout``: seen in a whole-suite run)."""
    require_server("MariaDB", backends_mysql.HOST, backends_mysql.PORT)
    first = backends_mysql.make_url(tmp_path)
    try:
        _self_deadlock_on(first)
    finally:
        backends_mysql.cleanup(first)
    database = first.rsplit("/", 1)[1]
    admin = backends_mysql._admin()
    try:
        with admin.cursor() as cur:  # the watchdog's connection still names it
            cur.execute("SELECT ID FROM information_schema.PROCESSLIST WHERE DB = %s", (database,))
            for (ident,) in cur.fetchall():
                cur.execute(f"KILL {int(ident)}")
    finally:
        admin.close()
    second = backends_mysql.make_url(tmp_path)
    try:
        _self_deadlock_on(second)
    finally:
        backends_mysql.cleanup(second)
