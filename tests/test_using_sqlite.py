"""``store.using(conn)`` on SQLite beyond the shared cases of ``tests/test_using.py``.

* aiosqlite: a step runs on the connection's own thread, queued after the caller's
  calls (the one reach inside aiosqlite, pinned here), and fails loudly if aiosqlite
  changes;
* a lease or a recorded effect through a view, while the caller's transaction holds
  SQLite's write lock, is refused at once with ``ConfigurationError`` (the store's own
  connection would wait ``busy_timeout`` for a commit the caller cannot make); before
  the caller writes, in a read-only transaction, or while another connection holds
  the lock for a moment, it is granted;
* a storm of timer signals (sync) or of cancellations (aiosqlite) over many calls of a
  view inside the caller's transactions: after each interruption no savepoint of
  fencing's is left open and the caller's own writes are all there; an interrupted
  commit retried answers ``Committed`` or ``Duplicate`` with all of its state; fencing
  never commits (a rolled-back transaction leaves the store as the last commit did).
"""

from __future__ import annotations

import asyncio
import random
import signal
import sqlite3
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

import fencing
from fencing import Committed, ConfigurationError, Duplicate, StoreError

from .test_interrupts import Interrupt, Scale, _finalizers, _interrupted, _timer

aiosqlite = pytest.importorskip("aiosqlite")

AUDIT = "audit_s"


@pytest.fixture
def path(tmp_path: Path) -> str:
    where = str(tmp_path / "app.sqlite")
    with fencing.open(f"sqlite:///{where}") as store:
        store.migrate()
        store.collection("c").create("k", {"n": 0})
    conn = sqlite3.connect(where)
    conn.execute(f"CREATE TABLE {AUDIT} (note TEXT)")
    conn.commit()
    conn.close()
    return where


def _savepoint_left(conn: sqlite3.Connection) -> bool:
    try:
        conn.execute("RELEASE fencing")
    except sqlite3.OperationalError as exc:
        return "no such savepoint" not in str(exc)
    return True


# -- aiosqlite: its own thread ---------------------------------------------------------
def test_a_step_runs_on_aiosqlites_thread_after_the_callers_calls(path: str) -> None:
    from fencing.backends.sqlite.abound import on_its_thread

    async def main() -> None:
        conn = await aiosqlite.connect(path)
        try:
            await conn.execute(f"INSERT INTO {AUDIT} VALUES ('mine')")  # not awaited apart
            seen = await on_its_thread(
                conn,
                lambda raw: (
                    threading.get_ident(),
                    raw.in_transaction,
                    raw.execute(f"SELECT COUNT(*) FROM {AUDIT}").fetchone()[0],
                ),
            )
            assert seen == (conn._thread.ident, True, 1)
            await conn.rollback()
        finally:
            await conn.close()
        with pytest.raises(StoreError, match="closed"):
            await on_its_thread(conn, lambda raw: None)

    asyncio.run(main())


def test_an_aiosqlite_without_its_queue_is_refused_loudly() -> None:
    from fencing.backends.sqlite.abound import on_its_thread

    class Connection:  # what a release of aiosqlite without _execute would look like
        _connection = None

    with pytest.raises(ConfigurationError, match=r"Connection\._execute"):
        asyncio.run(on_its_thread(Connection(), lambda raw: None))


def test_an_async_view_refuses_another_database_file(path: str, tmp_path: Path) -> None:
    async def main() -> None:
        other = await fencing.open_async(f"sqlite:///{tmp_path / 'other.sqlite'}")
        memory = await fencing.open_async("sqlite://:memory:")
        conn = await aiosqlite.connect(path)
        try:
            with pytest.raises(ConfigurationError, match="its own database only"):
                await other.using(conn).collection("c").get("k")
            with pytest.raises(ConfigurationError, match=":memory:"):
                await memory.using(conn).collection("c").get("k")
            with pytest.raises(fencing.InvalidInput, match="asyncio connection"):
                fencing.open(f"sqlite:///{path}").using(conn)
        finally:
            await conn.close()
            await other.close()
            await memory.close()

    asyncio.run(main())


def test_a_cancelled_async_call_leaves_nothing_of_its_step(path: str) -> None:
    """Cancelled while its step waits in aiosqlite's queue: the step, when its turn
    comes, is rolled back to its savepoint; the caller's own row stays."""
    from fencing.backends.sqlite.abound import on_its_thread

    async def main() -> None:
        store = await fencing.open_async(f"sqlite:///{path}")
        conn = await aiosqlite.connect(path)
        try:
            col = store.using(conn).collection("c")
            intent = await col.intent("k", "bump")
            await conn.execute(f"INSERT INTO {AUDIT} VALUES ('mine')")
            gate = threading.Event()
            busy = asyncio.ensure_future(on_its_thread(conn, lambda raw: gate.wait(10)))
            commit = asyncio.ensure_future(col.commit(intent, {"n": 1}))
            for _ in range(50):  # until the commit's step is queued behind the gate
                await asyncio.sleep(0)
            commit.cancel()
            gate.set()
            await busy
            with pytest.raises(asyncio.CancelledError):
                await commit
            with pytest.raises(sqlite3.OperationalError, match="no such savepoint"):
                await conn.execute("RELEASE fencing")
            assert (await col.get("k")).version == 1  # not in the caller's transaction
            async with conn.execute(f"SELECT COUNT(*) FROM {AUDIT}") as cur:
                assert (await cur.fetchone()) == (1,)
            assert isinstance(await col.commit(intent, {"n": 1}), Committed)  # not Duplicate
            await conn.commit()
            assert (await store.collection("c").get("k")).version == 2
        finally:
            await conn.close()
            await store.close()

    asyncio.run(main())


# -- leases and effects behind the caller's write lock ---------------------------------
def test_a_lease_or_effect_behind_your_own_write_lock_is_refused_at_once(path: str) -> None:
    with fencing.open(f"sqlite:///{path}") as store:
        conn = sqlite3.connect(path, timeout=30)
        view = store.using(conn)
        col = view.collection("c")
        intent = col.intent("k", "pay")  # a read: the caller's transaction may read
        lease = view.acquire("job", owner="a", ttl=60)  # granted: nothing written yet
        conn.execute(f"INSERT INTO {AUDIT} VALUES ('mine')")  # now it holds the write lock
        for call in (
            lambda: view.acquire("job-2", owner="a", ttl=60),
            lease.renew,
            lease.release,
            lambda: col.effect(intent, "charge"),
        ):
            with pytest.raises(ConfigurationError, match="holds SQLite's write lock"):
                call()
        # refused before anything: the caller's transaction is as it was, and goes on
        assert not _savepoint_left(conn)
        assert conn.execute(f"SELECT COUNT(*) FROM {AUDIT}").fetchone()[0] == 1
        assert isinstance(col.commit(intent, {"n": 1}), Committed)
        conn.commit()
        assert store.collection("c").get("k").version == 2
        effect = col.effect(intent, "charge")  # after the commit: at once
        assert store.get_effect(effect.idempotency_key) is not None
        lease.release()
        conn.close()


def test_a_session_behind_its_own_write_lock_is_refused(path: str) -> None:
    sqlalchemy = pytest.importorskip("sqlalchemy")
    from sqlalchemy.orm import Session

    engine = sqlalchemy.create_engine(f"sqlite:///{path}")
    try:
        with fencing.open(f"sqlite:///{path}") as store, Session(engine) as session:
            view = store.using(session)
            lease = view.acquire("job", owner="a", ttl=60)  # nothing written yet
            session.execute(sqlalchemy.text(f"INSERT INTO {AUDIT} VALUES ('mine')"))
            with pytest.raises(ConfigurationError, match="holds SQLite's write lock"):
                lease.release()
            intent = view.collection("c").intent("k", "pay")
            assert isinstance(view.collection("c").commit(intent, {"n": 1}), Committed)
            session.commit()
            lease.release()
            assert store.collection("c").get("k").version == 2
    finally:
        engine.dispose()


def test_from_another_thread_a_lease_waits_for_your_commit(path: str) -> None:
    """A heartbeat renews from its own thread: it waits for the caller's commit, which
    the caller's thread is free to make, instead of being refused."""
    with fencing.open(f"sqlite:///{path}") as store:
        conn = sqlite3.connect(path, timeout=30)
        view = store.using(conn)
        lease = view.acquire("job", owner="a", ttl=60)
        conn.execute(f"INSERT INTO {AUDIT} VALUES ('mine')")
        answers: list[object] = []
        renewer = threading.Thread(target=lambda: answers.append(lease.renew()))
        renewer.start()
        time.sleep(0.1)  # (not a timing assertion: the renewal may start before or after)
        conn.commit()
        renewer.join()
        assert len(answers) == 1
        lease.release()
        conn.close()


def test_a_read_only_transaction_or_another_writer_is_waited_for(path: str) -> None:
    with fencing.open(f"sqlite:///{path}") as store:
        conn = sqlite3.connect(path, timeout=30, isolation_level=None)
        conn.execute("BEGIN")
        assert conn.execute(f"SELECT COUNT(*) FROM {AUDIT}").fetchone()[0] == 0
        view = store.using(conn)
        held = view.acquire("job", owner="a", ttl=60)  # a reader holds no write lock
        other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        other.execute("BEGIN IMMEDIATE")  # another connection's write lock, for a moment
        timer = threading.Timer(0.2, other.execute, ("COMMIT",))
        timer.start()
        try:
            held.release()  # waits for it, as on the store itself: not refused
        finally:
            timer.join()
            other.close()
        assert not _savepoint_left(conn)
        conn.execute("COMMIT")
        again = store.try_acquire("job", owner="b", ttl=60)  # it was released
        assert again is not None and again.token > held.token
        conn.close()


def test_async_a_lease_or_effect_behind_your_write_lock_is_refused(path: str) -> None:
    from sqlalchemy import text
    from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

    async def main() -> None:
        store = await fencing.open_async(f"sqlite:///{path}")
        engine = create_async_engine(f"sqlite+aiosqlite:///{path}")
        conn = await aiosqlite.connect(path)
        try:
            view = store.using(conn)
            lease = await view.acquire("job", owner="a", ttl=60)
            await conn.execute(f"INSERT INTO {AUDIT} VALUES ('mine')")
            with pytest.raises(ConfigurationError, match="holds SQLite's write lock"):
                await view.acquire("job-2", owner="a", ttl=60)
            intent = await view.collection("c").intent("k", "pay")
            with pytest.raises(ConfigurationError, match="holds SQLite's write lock"):
                await view.collection("c").effect(intent, "charge")
            await conn.commit()
            await lease.release()
            async with AsyncSession(engine) as session:
                await session.execute(text(f"INSERT INTO {AUDIT} VALUES ('mine')"))
                with pytest.raises(ConfigurationError, match="holds SQLite's write lock"):
                    await store.using(session).acquire("job", owner="b", ttl=60)
                await session.commit()
            assert (await store.acquire("job", owner="b", ttl=60)).token > lease.token
        finally:
            await conn.close()
            await engine.dispose()
            await store.close()

    asyncio.run(main())


# -- interrupted anywhere, inside the caller's transaction -----------------------------
class Caller:
    """The caller's transactions and what must hold of them across a storm."""

    def __init__(self, store: Any, rng: random.Random) -> None:
        self.store = store
        self.rng = rng
        self.keys = ["k"]
        self.notes = 0  # the caller's own rows in its open transaction
        self.committed: dict[str, int] = {"k": 1}  # versions as the last commit left them
        self.retry: list[tuple[fencing.Intent, dict[str, Any]]] = []

    def versions(self) -> dict[str, int]:
        col = self.store.collection("c")
        found = {k: col.get(k) for k in self.keys}
        return {k: r.version for k, r in found.items() if r is not None}

    def judge_retry(self, outcome: Any, state: dict[str, Any]) -> None:
        if isinstance(outcome, Duplicate):
            assert dict(outcome.record.state) == state, "a commit applied in part"
        else:
            assert isinstance(outcome, Committed), outcome


def _ops(view: Any, caller: Caller) -> list[Callable[[], Any]]:
    col = view.collection("c")

    def create() -> None:
        key = f"k-{uuid.uuid4().hex[:8]}"
        col.create(key, {"n": 0})
        caller.keys.append(key)

    def commit() -> None:
        rec = col.get(caller.rng.choice(caller.keys))
        if rec is not None:
            intent, state = rec.intent("bump"), {"tag": uuid.uuid4().hex}
            try:
                col.commit(intent, state)
            except BaseException as exc:
                if _interrupted(exc):
                    caller.retry.append((intent, state))
                raise

    def commit_many() -> None:
        recs = [col.get(k) for k in {caller.rng.choice(caller.keys) for _ in range(2)}]
        col.commit_many([(r.intent("many"), {"m": 1}) for r in recs if r is not None])

    return [create, commit, commit, commit_many, lambda: col.get("k")]


@pytest.mark.skipif(not hasattr(signal, "setitimer"), reason="needs setitimer")
@pytest.mark.parametrize("mode", ["implicit", "explicit", "autocommit"])
def test_signal_storm_inside_the_callers_transaction(path: str, mode: str) -> None:
    """``implicit``: sqlite3's default (a transaction opened before the caller's first
    write); ``explicit``: ``isolation_level=None`` and the caller's own ``BEGIN``;
    ``autocommit``: no transaction, each call its own (none may stay open)."""
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signal handlers run in the main thread")
    rng = random.Random(f"using-sqlite-storm-{mode}")
    with fencing.open(f"sqlite:///{path}") as store:
        level = "" if mode == "implicit" else None
        conn = sqlite3.connect(path, timeout=30, isolation_level=level)
        caller = Caller(store, rng)
        view = store.using(conn)
        ops = _ops(view, caller)
        started = time.perf_counter()
        for _ in range(50):
            rng.choice(ops)()
        conn.commit()
        caller.committed = caller.versions()
        scale = Scale((time.perf_counter() - started) / 50)
        landed = calls = 0
        # (the storm's exception may land in a finalizer that runs inside a call, where
        # Python can only report it: _finalizers takes it, as the other storms do)
        with _finalizers(), _timer() as arm:
            for _ in range(40):  # transactions of the caller
                if mode == "explicit":
                    conn.execute("BEGIN")
                if mode != "autocommit":
                    conn.execute(f"INSERT INTO {AUDIT} VALUES ('mine')")
                    caller.notes += 1
                for _ in range(20):
                    calls += 1
                    op = rng.choice(ops)
                    try:
                        try:
                            arm(scale.delay(rng))
                            op()
                        finally:
                            arm(0)
                        scale.missed()
                    except Interrupt:
                        landed += 1
                        scale.landed()
                    except Exception as exc:
                        if not _interrupted(exc):
                            raise
                        landed += 1
                        scale.landed()
                    assert not _savepoint_left(conn), "fencing's savepoint left open"
                    assert conn.in_transaction == (mode != "autocommit")
                    mine = conn.execute(f"SELECT COUNT(*) FROM {AUDIT}").fetchone()[0]
                    assert mine == caller.notes, "the caller's own writes were undone"
                    while caller.retry:
                        intent, state = caller.retry.pop()
                        caller.judge_retry(view.collection("c").commit(intent, state), state)
                if mode != "autocommit" and rng.random() < 0.5:
                    conn.rollback()
                    caller.notes -= 1
                    caller.keys = [k for k in caller.keys if k in caller.committed]
                    assert caller.versions() == caller.committed, "fencing committed"
                else:
                    conn.commit()
                    caller.committed = caller.versions()
                caller.notes = conn.execute(f"SELECT COUNT(*) FROM {AUDIT}").fetchone()[0]
        print(f"sqlite using ({mode}): {landed} of {calls} calls interrupted")
        assert landed >= calls // 10, "the storm hardly landed: it proves nothing"
        conn.close()
        # no transaction left open anywhere: another connection writes at once
        other = sqlite3.connect(path, timeout=0)
        other.execute(f"INSERT INTO {AUDIT} VALUES ('other')")
        other.commit()
        other.close()


def test_cancellation_storm_on_an_aiosqlite_connection(path: str) -> None:
    rng = random.Random("using-aiosqlite-storm")

    async def main() -> tuple[int, int]:
        store = await fencing.open_async(f"sqlite:///{path}")
        conn = await aiosqlite.connect(path, timeout=30)
        view = store.using(conn)
        col = view.collection("c")
        keys = ["k"]
        retry: list[tuple[fencing.Intent, dict[str, Any]]] = []

        async def commit() -> None:
            rec = await col.get(rng.choice(keys))
            if rec is not None:
                intent, state = rec.intent("bump"), {"tag": uuid.uuid4().hex}
                try:
                    await col.commit(intent, state)
                except asyncio.CancelledError:
                    retry.append((intent, state))
                    raise

        async def create() -> None:
            key = f"k-{uuid.uuid4().hex[:8]}"
            await col.create(key, {"n": 0})
            keys.append(key)

        async def count() -> int:
            async with conn.execute(f"SELECT COUNT(*) FROM {AUDIT}") as cur:
                row = await cur.fetchone()
            assert row is not None
            return int(row[0])

        async def committed() -> dict[str, int]:
            own = store.collection("c")
            found = [(k, await own.get(k)) for k in keys]
            return {k: r.version for k, r in found if r is not None}

        ops: list[Callable[[], Awaitable[None]]] = [commit, commit, create]
        started = time.perf_counter()
        for _ in range(30):
            await rng.choice(ops)()
        await conn.commit()
        last = await committed()
        scale = Scale((time.perf_counter() - started) / 30)
        landed = calls = notes = 0
        try:
            for _ in range(40):
                await conn.execute(f"INSERT INTO {AUDIT} VALUES ('mine')")
                notes += 1
                for _ in range(15):
                    calls += 1
                    try:
                        await asyncio.wait_for(rng.choice(ops)(), scale.delay(rng))
                        scale.missed()
                    except TimeoutError:
                        landed += 1
                        scale.landed()
                    # queued after the cancelled step, whatever it still does
                    with pytest.raises(sqlite3.OperationalError, match="no such savepoint"):
                        await conn.execute("RELEASE fencing")
                    assert conn.in_transaction
                    assert await count() == notes, "the caller's own writes were undone"
                    while retry:
                        intent, state = retry.pop()
                        out = await col.commit(intent, state)
                        if isinstance(out, Duplicate):
                            assert dict(out.record.state) == state, "a commit applied in part"
                        else:
                            assert isinstance(out, Committed), out
                if rng.random() < 0.5:
                    await conn.rollback()
                    notes -= 1
                    keys[:] = [k for k in keys if k in last]
                    assert await committed() == last, "fencing committed"
                else:
                    await conn.commit()
                    last = await committed()
            return landed, calls
        finally:
            await conn.close()
            await store.close()

    landed, calls = asyncio.run(main())
    print(f"aiosqlite using: {landed} of {calls} calls cancelled")
    assert landed >= calls // 10, "the storm hardly landed: it proves nothing"
