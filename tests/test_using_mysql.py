"""``store.using(conn)`` on MySQL / MariaDB: what only a server with row locks shows.

One round trip per bound commit, framed by a savepoint inside the caller's transaction;
a claim race between two callers' transactions (one Committed, once both commit); a
fenced commit holds the lease row (shared) until the caller commits, so no takeover
slips in between; a caller's own locked row does not block its fenced commit; a real
InnoDB deadlock between two callers reaches the victim as ``TransactionRolledBack`` (not
retried inside a transaction the server rolled back); a failed statement or a lock wait
timeout leaves the caller's transaction as it was; interrupts (a timer's signal handler,
asyncio cancellation) leave the caller's connection either usable with its transaction
intact or closed, with a note; a SQLAlchemy ``AsyncSession``.
"""

from __future__ import annotations

import asyncio
import random
import signal
import threading
from collections.abc import Callable
from typing import Any

import pytest

import fencing
from fencing import Committed, Duplicate, InvalidState, Stale, TransientStoreError
from fencing.backends.mysql.errors import TransactionRolledBack

from .test_interrupts import Interrupt, _finalizers, _timer
from .test_using import AUDIT, TABLE, Env, env, one, sql

# PyMySQL's connections only: these tests count its round trips and interrupt its reads
# (mysqlclient's connections run test_using.py, _snapshots, _effects and _linear)
pytestmark = [
    pytest.mark.backends(only=lambda name: name == "mysql"),
    pytest.mark.lenders(only=lambda lender: lender.driver == "pymysql"),
]
__all__ = ["env"]  # the fixture, shared with tests/test_using.py


def _counting(conn: Any) -> list[str]:
    """The statements sent on ``conn`` from now on, one entry per round trip."""
    sent: list[str] = []
    command = conn._execute_command

    def execute_command(kind: int, text: Any) -> Any:
        sent.append(text.decode() if isinstance(text, bytes) else str(text))
        return command(kind, text)

    conn._execute_command = execute_command
    return sent


def _in_lock_wait(env: Env, conn: Any) -> bool:
    """Whether ``conn``'s transaction waits for a row lock now (a state, not a timing)."""
    fresh = env.lender.connect_autocommit(env.url)
    try:
        trx = (
            "SELECT COUNT(*) FROM information_schema.INNODB_TRX"
            " WHERE trx_state = 'LOCK WAIT' AND trx_mysql_thread_id = ?"
        )
        return int(one(fresh, trx, conn.thread_id())[0]) > 0
    finally:
        fresh.close()


def _wait_until(done: Callable[[], bool], thread: threading.Thread) -> None:
    """Poll until ``done()`` or the thread ended (whichever first; no time asserted)."""
    event = threading.Event()
    while thread.is_alive() and not done():
        event.wait(0.01)


def test_one_round_trip_per_bound_commit(env: Env) -> None:
    view = env.view()
    view.get(1)  # the connection is checked once (its database, multi-statements on)
    sent = _counting(env.conn)
    env.audit("before")
    out = view.commit(env.table.intent(1, "ship"), {"status": "shipped"})
    assert isinstance(out, Committed)
    commit = sent[1:]
    assert len(commit) == 1  # SAVEPOINT, the commit's statements, RELEASE: one round trip
    assert commit[0].startswith("SAVEPOINT fencing;")
    assert commit[0].endswith("RELEASE SAVEPOINT fencing")
    assert "START TRANSACTION" not in commit[0] and "COMMIT" not in commit[0]
    sent.clear()
    outs = view.commit_many([(env.table.intent(2, "ship"), {"status": "shipped"})])
    assert isinstance(outs[0], Committed) and len(sent) == 1
    env.conn.commit()
    auto = env.lender.connect_autocommit(env.url)
    try:
        auto_view = env.store.using(auto).table(TABLE)
        auto_view.get(1)
        sent = _counting(auto)
        out = auto_view.commit(env.table.intent(1, "pay"), {"status": "paid"})
        assert isinstance(out, Committed) and len(sent) == 1
        assert sent[0].startswith("START TRANSACTION;") and sent[0].endswith("COMMIT")
    finally:
        auto.close()


def test_a_claim_race_between_two_callers_transactions(env: Env) -> None:
    other = env.lender.connect(env.url)
    intent = env.table.intent(1, "ship")
    rival = env.table.intent(1, "pay")  # another intent at the same version
    outcomes: dict[str, Any] = {}
    try:
        assert isinstance(env.view().commit(intent, {"status": "shipped"}), Committed)

        def second() -> None:
            # waits for the first caller's locks (the claim, the row) until it commits
            outcomes["same"] = env.view(other).commit(intent, {"status": "again"})
            outcomes["rival"] = env.view(other).commit(rival, {"status": "paid"})
            other.commit()

        thread = threading.Thread(target=second)
        thread.start()
        _wait_until(lambda: _in_lock_wait(env, other), thread)
        env.conn.commit()
        thread.join()
    finally:
        other.close()
    assert isinstance(outcomes["same"], Duplicate)
    assert isinstance(outcomes["rival"], Stale)
    record = env.table.get(1)
    assert (record.version, record.state["status"]) == (2, "shipped")


def test_a_fenced_commit_holds_the_lease_until_the_caller_commits(env: Env) -> None:
    """A takeover waits for the caller's COMMIT: the fence the commit checked holds."""
    view = env.store.using(env.conn)
    lease = view.acquire("job-1", owner="a", ttl=60)
    out = view.table(TABLE).commit(env.table.intent(1, "ship"), {"status": "x"}, lease=lease)
    assert isinstance(out, Committed)
    events: list[str] = []
    other = fencing.open(env.url)

    fresh = env.lender.connect_autocommit(env.url)

    def take_over() -> None:
        # the lease expires (as by another process's clock), then another owner takes it
        sql(fresh, "UPDATE fencing_leases SET expires_at = 0 WHERE name = ?", "job-1")
        newer = other.acquire("job-1", owner="b", ttl=60)
        events.append(f"taken over {newer.token > lease.token}")

    thread = threading.Thread(target=take_over)
    thread.start()
    _wait_until(lambda: _in_lock_wait(env, fresh), thread)
    events.append("caller commits")
    env.conn.commit()
    thread.join()
    fresh.close()
    other.close()
    assert events == ["caller commits", "taken over True"]
    assert env.table.get(1).version == 2


def test_the_callers_own_locked_row_does_not_block_a_fenced_commit(env: Env) -> None:
    bound = env.store.using(env.conn)
    lease = bound.acquire("job-2", owner="a", ttl=60)
    sql(env.conn, f"UPDATE {TABLE} SET total = total + 1, version = version + 1 WHERE id = 1")
    view = bound.table(TABLE)
    intent = view.intent(1, "ship")  # reads the caller's own update
    assert intent.expected_version == 2
    out = view.commit(intent, {"status": "shipped"}, lease=lease)
    assert isinstance(out, Committed) and out.record.version == 3
    env.conn.commit()
    assert env.table.get(1).version == 3
    lease.release()


def test_repeatable_read_a_snapshot_for_reads_the_latest_row_for_the_check(env: Env) -> None:
    """In a REPEATABLE READ transaction, reads through the view see its snapshot (and its
    own writes); a commit's check reads the latest committed row (locking reads)."""
    sql(env.conn, "SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
    view = env.view()
    old = view.intent(1, "ship")  # the first read: the snapshot is taken here
    moved = env.table.commit(env.table.intent(1, "pay"), {"status": "paid"})  # another writer
    assert isinstance(moved, Committed)
    assert view.get(1).version == 1  # the snapshot
    assert view.intent(1, "ship").expected_version == 1  # an intent at the snapshot's version
    assert isinstance(view.commit(old, {"status": "shipped"}), Stale)  # judged on the latest
    latest = env.table.intent(1, "ship")  # from the store: the latest committed version
    out = view.commit(latest, {"status": "shipped"})
    assert isinstance(out, Committed) and out.record.version == 3
    assert view.get(1).version == 3  # its own update, seen over the snapshot
    env.conn.commit()
    assert env.table.get(1).state["status"] == "shipped"


def test_a_deadlock_between_two_callers_is_their_transaction_to_retry(env: Env) -> None:
    other = env.lender.connect(env.url)
    outcomes: dict[str, Any] = {}
    try:
        sql(env.conn, f"UPDATE {TABLE} SET total = total + 1 WHERE id = 1")
        sql(other, f"UPDATE {TABLE} SET total = total + 1 WHERE id = 2")
        mine = env.table.intent(2, "ship")
        theirs = env.table.intent(1, "ship")

        def first() -> None:
            try:
                outcomes["first"] = env.view().commit(mine, {"status": "shipped"})
            except TransientStoreError as exc:
                outcomes["first"] = exc

        thread = threading.Thread(target=first)
        thread.start()
        _wait_until(lambda: _in_lock_wait(env, env.conn), thread)
        try:
            outcomes["second"] = env.view(other).commit(theirs, {"status": "shipped"})
        except TransientStoreError as exc:
            outcomes["second"] = exc
        if isinstance(outcomes["second"], Committed):
            other.commit()  # the victim was the first: its thread has its answer
        thread.join()
        kinds = sorted(type(o).__name__ for o in outcomes.values())
        assert kinds == ["Committed", "TransactionRolledBack"]
        winner, loser = (
            ("first", "second") if isinstance(outcomes["first"], Committed) else ("second", "first")
        )
        assert "run it again" in str(outcomes[loser])
        conns = {"first": env.conn, "second": other}
        conns[winner].commit()
        victim = conns[loser]
        victim.rollback()  # its transaction is gone; the connection is usable
        assert one(victim, f"SELECT COUNT(*) FROM {TABLE}")[0] == 2
        retry = mine if loser == "first" else theirs
        again = env.view(victim).commit(env.table.intent(retry.key, "ship"), {"status": "s"})
        assert isinstance(again, Committed)  # the whole transaction, run again
        victim.commit()
        assert env.table.get(1).version == 2 and env.table.get(2).version == 2
    finally:
        other.close()


def test_a_failed_statement_leaves_the_callers_transaction_as_it_was(env: Env) -> None:
    sql(env.conn, "SET time_zone = '+05:00'")  # the caller's; fencing's flows run in UTC
    env.audit("before")
    with pytest.raises(InvalidState):  # VARCHAR(40): too long, the statement fails
        env.view().commit(env.table.intent(1, "ship"), {"status": "x" * 100})
    assert one(env.conn, "SELECT @@session.time_zone")[0] == "+05:00"
    env.audit("after")
    assert isinstance(env.view().commit(env.table.intent(1, "ship"), {"status": "ok"}), Committed)
    assert one(env.conn, "SELECT @@session.time_zone")[0] == "+05:00"
    env.conn.commit()
    assert env.audited() == 2 and env.table.get(1).state["status"] == "ok"


def test_a_lock_wait_timeout_leaves_the_callers_transaction_as_it_was(env: Env) -> None:
    holder = env.lender.connect(env.url)
    try:
        sql(holder, f"UPDATE {TABLE} SET total = total + 1 WHERE id = 1")
        sql(env.conn, "SET SESSION innodb_lock_wait_timeout = 1")
        env.audit("before")
        with pytest.raises(TransientStoreError) as caught:
            env.view().commit(env.table.intent(1, "ship"), {"status": "shipped"})
        assert not isinstance(caught.value, TransactionRolledBack)
        holder.rollback()
        again = env.view().commit(env.table.intent(1, "ship"), {"status": "shipped"})
        assert isinstance(again, Committed)
        env.conn.commit()
        assert env.audited() == 1 and env.table.get(1).version == 2
    finally:
        holder.close()


def _storm_rows(env: Env, count: int) -> None:
    conn = env.lender.connect(env.url)
    values = ", ".join(f"({k}, 'new', 0, 1)" for k in range(10, 10 + count))
    sql(conn, f"INSERT INTO {TABLE} (id, status, total, version) VALUES {values}")
    conn.commit()
    conn.close()


def _closed_by_fencing(exc: BaseException) -> bool:
    return any("connection was closed" in n for n in getattr(exc, "__notes__", []))


def test_a_timers_signal_mid_commit(env: Env) -> None:
    """Interrupted anywhere, the caller's connection is usable with its transaction whole
    (its own write there, fencing's all or nothing), or closed (never left mid-protocol:
    its next use raises)."""
    if not hasattr(signal, "setitimer"):
        pytest.skip("needs setitimer")
    pymysql = pytest.importorskip("pymysql")
    count = 200
    _storm_rows(env, count)
    rng = random.Random(20261203)
    conn = env.lender.connect(env.url)
    seen = {"closed": 0, "noted": 0, "intact": 0, "done": 0}
    with _finalizers(), _timer() as arm:
        try:
            for key in range(10, 10 + count):
                intent = env.table.intent(key, "ship")
                view = env.store.using(conn).table(TABLE)
                env.audit(f"k{key}", conn)
                try:
                    arm(rng.uniform(0.00005, 0.004))
                    view.commit(intent, {"status": "shipped"})
                    arm(0)
                    seen["done"] += 1
                except Interrupt as exc:
                    arm(0)
                    if not conn.open:
                        seen["closed"] += 1
                        seen["noted"] += _closed_by_fencing(exc)
                        with pytest.raises(pymysql.err.InterfaceError):
                            one(conn, "SELECT 1")  # raises, never reads stale results
                        conn = env.lender.connect(env.url)
                        again = env.store.table(TABLE).commit(intent, {"status": "shipped"})
                        assert isinstance(again, Committed)  # nothing of it was committed
                        continue
                    seen["intact"] += 1
                # the caller's transaction is whole: its own write is there
                found = one(conn, f"SELECT COUNT(*) FROM {AUDIT} WHERE note = ?", f"k{key}")
                assert found[0] == 1
                conn.commit()
                again = env.store.table(TABLE).commit(intent, {"status": "shipped"})
                assert isinstance(again, Committed | Duplicate)
                assert env.table.get(key).state["status"] == "shipped"
        finally:
            arm(0)
            if conn.open:
                conn.rollback()
                conn.close()
    assert seen["done"] > 0, seen


def test_asyncio_cancellation_mid_commit(env: Env) -> None:
    count = 150
    _storm_rows(env, count)
    aconnect = env.lender.aconnect
    assert aconnect is not None

    async def main() -> dict[str, int]:
        rng = random.Random(7)
        store = await fencing.open_async(env.url)
        table = store.table(TABLE)
        conn = await aconnect(env.url)
        seen = {"closed": 0, "noted": 0, "intact": 0, "done": 0}
        try:
            for key in range(10, 10 + count):
                intent = await table.intent(key, "ship")
                async with conn.cursor() as cur:
                    await cur.execute(f"INSERT INTO {AUDIT} (note) VALUES (%s)", f"k{key}")
                view = store.using(conn).table(TABLE)
                try:
                    async with asyncio.timeout(rng.uniform(0.00005, 0.004)):
                        await view.commit(intent, {"status": "shipped"})
                    seen["done"] += 1
                except TimeoutError as exc:
                    noted = _closed_by_fencing(exc.__context__ or exc) or _closed_by_fencing(exc)
                    if conn.closed:
                        seen["noted"] += noted
                        seen["closed"] += 1
                        conn = await aconnect(env.url)
                        again = await table.commit(intent, {"status": "shipped"})
                        assert isinstance(again, Committed)
                        continue
                    seen["intact"] += 1
                async with conn.cursor() as cur:
                    await cur.execute(f"SELECT COUNT(*) FROM {AUDIT} WHERE note = %s", f"k{key}")
                    assert (await cur.fetchone())[0] == 1
                await conn.commit()
                again = await table.commit(intent, {"status": "shipped"})
                assert isinstance(again, Committed | Duplicate)
        finally:
            conn.close()
            await store.close()
        return seen

    seen = asyncio.run(main())
    assert seen["done"] > 0 and seen["noted"] == seen["closed"], seen


def test_a_sqlalchemy_async_session(env: Env) -> None:
    pytest.importorskip("sqlalchemy")
    from sqlalchemy import text
    from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

    assert env.lender.sa_async_url is not None
    url = env.lender.sa_async_url(env.url)

    async def main() -> None:
        engine = create_async_engine(url)
        store = await fencing.open_async(env.url)
        insert = text(f"INSERT INTO {AUDIT} (note) VALUES (:note)")
        try:
            intent = await store.table(TABLE).intent(1, "ship")
            async with AsyncSession(engine) as session:
                await session.execute(insert, {"note": "in session"})
                view = store.using(session).table(TABLE)
                assert isinstance(await view.commit(intent, {"status": "shipped"}), Committed)
                assert (await view.get(1)).version == 2  # its own update, seen
                await session.rollback()
            assert (await store.table(TABLE).get(1)).version == 1 and env.audited() == 0
            async with AsyncSession(engine) as session:
                await session.execute(insert, {"note": "in session"})
                view = store.using(session).table(TABLE)
                assert isinstance(await view.commit(intent, {"status": "shipped"}), Committed)
                await session.commit()
            assert (await store.table(TABLE).get(1)).version == 2 and env.audited() == 1
        finally:
            await store.close()
            await engine.dispose()

    asyncio.run(main())


def test_a_guarded_collection_commit_in_two_batches_of_one_savepoint(env: Env) -> None:
    carts = env.store.collection("carts")
    carts.create("c1", {"status": "open", "n": 1})
    view = env.store.using(env.conn).collection("carts")
    intent = view.intent("c1", "close", guard={"status": "open"})
    sent = _counting(env.conn)
    out = view.commit(intent, {"status": "closed", "n": 1})
    assert isinstance(out, Committed)
    assert len(sent) == 2  # the guard judged on the record read FOR UPDATE, then the write
    assert sent[0].startswith("SAVEPOINT fencing;") and sent[1].endswith(
        "RELEASE SAVEPOINT fencing"
    )
    env.conn.rollback()
    assert carts.get("c1").version == 1
    env.audit("before")
    wrong = view.commit(view.intent("c1", "close", guard={"status": "closed"}), {"status": "x"})
    assert not wrong.committed
    env.audit("after")
    env.conn.commit()
    assert env.audited() == 2 and carts.get("c1").version == 1


def test_only_pymysql_and_aiomysql_connections(env: Env, tmp_path: Any) -> None:
    import sqlite3

    other = sqlite3.connect(tmp_path / "x.db")
    try:
        with pytest.raises(fencing.InvalidInput, match="PyMySQL"):
            env.store.using(other)
    finally:
        other.close()
