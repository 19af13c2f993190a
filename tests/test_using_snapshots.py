"""``store.using(conn)`` in a transaction that reads one snapshot: PostgreSQL's
REPEATABLE READ and SERIALIZABLE, MySQL/MariaDB's REPEATABLE READ (its default) and
SERIALIZABLE, SQLite's read transaction (a ``BEGIN`` of the caller's, then a read).

Two connections: the caller's takes its snapshot (a read), another commits after it,
then a *fresh* intent (decided against the row as it is now, on the store itself) goes
through the view. It commits, or raises ``SerializationFailure`` (run the transaction
again, and then it commits); it is never ``Stale`` nor ``Missing`` because the snapshot
cannot see the row yet. Refusals that hold whatever the snapshot's age (an intent that
is really stale, one refused by the caller's own uncommitted update or delete) are
still answered as such.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import fencing
from fencing import Committed, Missing, SerializationFailure, Stale

from .test_using import ASYNC, TABLE, Env, env, one, sql

pytestmark = pytest.mark.backends(only=lambda name: name in _LEVELS)
__all__ = ["env"]  # the fixture, shared with tests/test_using.py

#: The levels at which a caller's transaction reads one snapshot, per backend.
_LEVELS = {
    "postgresql": ["REPEATABLE READ", "SERIALIZABLE"],
    "mysql": ["REPEATABLE READ", "SERIALIZABLE"],
    "sqlite-file": ["BEGIN DEFERRED"],
}
#: What a fresh intent gets through the view: PostgreSQL cannot write a row its snapshot
#: does not show as the latest (nor see one created since); MySQL's commit (and, read
#: again with it, apply's probe) judges the latest row with locking reads; SQLite's read
#: transaction cannot write once another connection committed.
_FRESH = {
    "postgresql": SerializationFailure,
    "mysql": Committed,
    "sqlite-file": SerializationFailure,
}


def _begin(backend: str, conn: Any, level: str) -> None:
    """Open the caller's transaction at ``level``, and take its snapshot (a read of row 2,
    which nothing below changes: MySQL's SERIALIZABLE share-locks what it reads)."""
    if backend in ("postgresql", "mysql"):
        sql(conn, f"SET TRANSACTION ISOLATION LEVEL {level}")
    else:
        conn.execute("BEGIN DEFERRED")
    assert one(conn, f"SELECT id FROM {TABLE} WHERE id = ?", 2)[0] == 2


@pytest.fixture
def caller(env: Env) -> Iterator[Callable[[str], Any]]:
    """caller(level) -> a new connection of the caller's, its snapshot taken at level."""
    made: list[Any] = []

    def open_at(level: str) -> Any:
        conn = env.lender.connect(env.url)
        made.append(conn)
        _begin(env.backend, conn, level)
        return conn

    yield open_at
    for conn in made:
        try:
            conn.rollback()
        finally:
            conn.close()


def _fresh_after_snapshot(
    env: Env, caller: Callable[[str], Any], level: str, call: Callable[[Any, Any], Any]
) -> Any:
    """The caller's snapshot; another connection moves row 1 on; ``call(view, intent)``
    with an intent decided against row 1 as it is now. Its outcome, or the error; then
    (run again after the error, on a new snapshot) the caller commits."""
    conn = caller(level)
    moved = env.table.commit(env.table.intent(1, "pay"), {"status": "paid"})
    assert isinstance(moved, Committed)
    fresh = env.table.intent(1, "ship")
    assert fresh.expected_version == moved.record.version
    try:
        out = call(env.store.using(conn).table(TABLE), fresh)
    except SerializationFailure as exc:
        failure = exc
    else:
        conn.commit()
        return out
    assert "run it again" in str(failure)
    assert one(conn, "SELECT 1")[0] == 1  # the transaction is left usable
    conn.rollback()
    again = call(env.store.using(conn).table(TABLE), fresh)  # a new snapshot
    assert isinstance(again, Committed), again
    conn.commit()
    return failure


@pytest.mark.parametrize("how", ["commit", "apply", "commit_many"])
def test_a_fresh_intent_commits_or_the_transaction_runs_again(
    env: Env, caller: Callable[[str], Any], how: str
) -> None:
    def call(view: Any, intent: Any) -> Any:
        if how == "commit":
            return view.commit(intent, {"status": "shipped"})
        if how == "apply":
            return view.apply(intent, lambda record: {"status": "shipped"})
        return view.commit_many([(intent, {"status": "shipped"})])[0]

    for level in _LEVELS[env.backend]:
        before = env.table.get(1).version
        out = _fresh_after_snapshot(env, caller, level, call)
        assert not isinstance(out, Stale | Missing), (level, out)
        assert isinstance(out, _FRESH[env.backend]), (level, out)
        after = env.table.get(1)  # committed at once, or when run again
        assert (after.version, after.state["status"]) == (before + 2, "shipped")


@pytest.mark.parametrize("how", ["commit", "apply"])
def test_a_record_created_after_the_snapshot_is_not_missing(
    env: Env, caller: Callable[[str], Any], how: str
) -> None:
    for n, level in enumerate(_LEVELS[env.backend]):
        conn = caller(level)
        key = f"new-{how}-{n}"
        created = env.store.collection("carts").create(key, {"n": 1})
        view = env.store.using(conn).collection("carts")
        intent = created.intent("fill")

        def call(view: Any = view, intent: Any = intent) -> Any:
            if how == "commit":
                return view.commit(intent, {"n": 2})
            return view.apply(intent, lambda record: {"n": record.state["n"] + 1})

        try:
            out = call()
        except SerializationFailure:
            assert _FRESH[env.backend] is SerializationFailure
            conn.rollback()
            out = call()
        assert isinstance(out, Committed), (level, out)
        conn.commit()
        assert env.store.collection("carts").get(key).version == 2


def test_a_guarded_intent_on_a_moved_record(env: Env, caller: Callable[[str], Any]) -> None:
    """A collection's guard is judged on the record as read (SQLite: before its write)."""
    for n, level in enumerate(_LEVELS[env.backend]):
        carts = env.store.collection("carts")
        record = carts.create(f"g-{n}", {"status": "new"})
        conn = caller(level)
        moved = carts.commit(record.intent("pay"), {"status": "paid"})
        assert isinstance(moved, Committed)
        fresh = moved.record.intent("ship", guard={"status": "paid"})
        view = env.store.using(conn).collection("carts")
        try:
            out = view.commit(fresh, {"status": "shipped"})
        except SerializationFailure:
            assert _FRESH[env.backend] is SerializationFailure
            conn.rollback()
            out = view.commit(fresh, {"status": "shipped"})
        assert isinstance(out, Committed), (level, out)
        conn.commit()


def test_refusals_that_hold_whatever_the_snapshot_are_answered(
    env: Env, caller: Callable[[str], Any]
) -> None:
    """Stale at a version above the intent's; the caller's own update and delete."""
    for n, level in enumerate(_LEVELS[env.backend]):
        old = env.table.intent(1, "ship")
        assert env.table.commit(env.table.intent(1, "pay"), {"status": f"paid {n}"}).committed
        conn = caller(level)  # its snapshot shows the newer row
        view = env.store.using(conn)
        out = view.table(TABLE).commit(old, {"status": "shipped"})
        assert isinstance(out, Stale) and out.current.version == old.expected_version + 1
        assert isinstance(view.table(TABLE).apply(old, lambda r: {"status": "x"}), Stale)
        conn.rollback()

        if env.backend == "sqlite-file":
            continue  # (a write of the caller's takes the write lock: no snapshot then)
        record = env.store.collection("carts").create(f"own-{n}", {"n": 1})
        conn = caller(level)
        mine = env.table.intent(2, "ship")  # decided before the caller's own update
        sql(conn, f"UPDATE {TABLE} SET version = version + 1 WHERE id = ?", 2)
        out = view_of(env, conn).commit(mine, {"status": "shipped"})
        assert isinstance(out, Stale) and out.current.version == mine.expected_version + 1
        carts = env.store.using(conn).collection("carts")
        assert carts.delete(record.key)  # the caller's own delete
        assert isinstance(carts.commit(record.intent("x"), {"n": 2}), Missing)
        conn.rollback()


def view_of(env: Env, conn: Any) -> Any:
    return env.store.using(conn).table(TABLE)


@pytest.mark.backends(only=lambda name: name == "sqlite-file")
def test_a_sqlite_write_transaction_reads_the_latest_rows(env: Env) -> None:
    """A caller's transaction that holds SQLite's write lock has no old snapshot: its
    refusals are its own (no check against the store's rows is needed)."""
    conn = env.lender.connect(env.url)
    try:
        conn.execute("BEGIN IMMEDIATE")
        view = view_of(env, conn)
        mine = view.intent(1, "ship")
        sql(conn, f"UPDATE {TABLE} SET version = version + 1 WHERE id = ?", 1)
        assert isinstance(view.apply(mine, lambda r: {"status": "x"}), Stale)
        fresh = view.intent(1, "ship")
        assert isinstance(view.commit(fresh, {"status": "shipped"}), Committed)
        conn.commit()
    finally:
        conn.close()


# -- asyncio ----------------------------------------------------------------------------
async def _aexec(conn: Any, text: str) -> None:
    module = type(conn).__module__.split(".")[0]
    if module == "aiomysql":
        async with conn.cursor() as cur:
            await cur.execute(text)
        return
    cursor = await conn.execute(text)
    if module == "aiosqlite":
        await cursor.close()


async def _abegin(backend: str, conn: Any, level: str) -> None:
    if backend == "sqlite-file":
        await _aexec(conn, "BEGIN DEFERRED")
    else:
        await _aexec(conn, f"SET TRANSACTION ISOLATION LEVEL {level}")
    await _aexec(conn, f"SELECT id FROM {TABLE} WHERE id = 2")


async def _acall(how: str, view: Any, intent: Any, state: dict[str, Any]) -> Any:
    if how == "apply":
        return await view.apply(intent, lambda record: state)
    return await view.commit(intent, state)


@ASYNC
def test_async_a_fresh_intent_commits_or_the_transaction_runs_again(env: Env) -> None:
    aconnect = env.lender.aconnect
    assert aconnect is not None

    async def main() -> None:
        store = await fencing.open_async(env.url)
        table = store.table(TABLE)
        try:
            for n, level in enumerate(_LEVELS[env.backend]):
                for how in ("commit", "apply", "created"):
                    conn = await aconnect(env.url)
                    try:
                        await _abegin(env.backend, conn, level)
                        if how == "created":
                            made = await store.collection("carts").create(f"a-{n}", {"n": 1})
                            intent, view = made.intent("x"), store.using(conn).collection("carts")
                            state: dict[str, Any] = {"n": 2}
                        else:
                            pay = await table.intent(1, "pay")
                            assert isinstance(await table.commit(pay, {"status": "p"}), Committed)
                            intent, view = (
                                await table.intent(1, how),
                                store.using(conn).table(TABLE),
                            )
                            state = {"status": how}
                        try:
                            out = await _acall(how, view, intent, state)
                        except SerializationFailure:
                            assert _FRESH[env.backend] is SerializationFailure, (level, how)
                            await conn.rollback()
                            out = await _acall(how, view, intent, state)
                        assert isinstance(out, Committed), (level, how, out)
                        await conn.commit()
                    finally:
                        closing = conn.close()
                        if asyncio.iscoroutine(closing):
                            await closing
        finally:
            await store.close()

    asyncio.run(main())


def test_the_postgresql_visibility_of_a_row_s_creator() -> None:
    """``committed_after``: a 32-bit ``xmin`` against a 64-bit snapshot."""
    from fencing.backends.postgres.snapshot import committed_after

    epoch = 3 << 32
    snapshot = f"{epoch + 100}:{epoch + 110}:{epoch + 104},{epoch + 107}"
    low = (epoch + 100) & 0xFFFFFFFF
    assert not committed_after(snapshot, str(low - 5), str(epoch + 120))  # before
    assert committed_after(snapshot, str(low + 4), str(epoch + 120))  # running then
    assert not committed_after(snapshot, str(low + 5), str(epoch + 120))  # done by then
    assert committed_after(snapshot, str(low + 10), str(epoch + 120))  # began after
    assert committed_after(snapshot, str(low + 19), str(epoch + 120))
    assert not committed_after(snapshot, "2", str(epoch + 120))  # frozen
    # an epoch boundary between the creator and the snapshot's xmax
    edge = f"{epoch + 5}:{epoch + 6}:"
    assert not committed_after(edge, str(0xFFFFFFF0), str(epoch + 9))  # the epoch before
    assert committed_after(edge, "7", str(epoch + 9))
    # an id frozen long ago, its 32 bits now "ahead" of the snapshot: seen as before
    assert not committed_after(edge, str((epoch + 6 + 2**31 - 10) & 0xFFFFFFFF), str(epoch + 9))


@pytest.mark.backends(only=lambda name: name == "sqlite-file")
def test_a_read_transaction_of_sqlite_is_a_snapshot(env: Env) -> None:
    """The SQLite view tells a read transaction (an old snapshot possible) from a write
    transaction (the latest rows) without taking the write lock for the caller."""
    from fencing.backends.sqlite.bound import reads_a_snapshot

    path = env.store.backend.path
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        assert not reads_a_snapshot(conn, path)  # no transaction
        conn.execute("BEGIN")
        conn.execute(f"SELECT * FROM {TABLE}").fetchall()
        assert reads_a_snapshot(conn, path)
        assert reads_a_snapshot(conn, path)  # and still no write lock of its own
        conn.execute(f"UPDATE {TABLE} SET status = status WHERE id = 1")
        assert not reads_a_snapshot(conn, path)
        conn.execute("ROLLBACK")
    finally:
        conn.close()
