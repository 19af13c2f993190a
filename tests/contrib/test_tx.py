"""Enqueue after commit, against the real PostgreSQL (psycopg 3, and SQLAlchemy on top of it)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from fencing.contrib.tx import (
    EnqueueFailed,
    TransactionStateError,
    after_commit,
    async_after_commit,
    on_commit,
)

from .._backends import require_server

psycopg = pytest.importorskip("psycopg")

PG_URL = "postgresql://root@127.0.0.1:5432/test"


@pytest.fixture
def table() -> Iterator[str]:
    require_server("PostgreSQL", "127.0.0.1", 5432)
    name = f"tx_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {name} (id INTEGER PRIMARY KEY, status TEXT NOT NULL)")
    yield name
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {name}")


def visible(table: str, row_id: int) -> str | None:
    """The row as another connection sees it: only what has committed."""
    with psycopg.connect(PG_URL, autocommit=True) as other:
        row = other.execute(f"SELECT status FROM {table} WHERE id = %s", (row_id,)).fetchone()
        return None if row is None else str(row[0])


@pytest.mark.parametrize("autocommit", [True, False])
def test_deferred_calls_run_once_the_block_has_committed(table: str, autocommit: bool) -> None:
    seen: list[str | None] = []
    with psycopg.connect(PG_URL, autocommit=autocommit) as conn:
        with after_commit(conn) as defer:
            conn.execute(f"INSERT INTO {table} VALUES (1, 'packed')")
            defer(lambda: seen.append(visible(table, 1)))
            assert seen == []  # nothing runs inside the transaction
        assert seen == ["packed"]  # ran after COMMIT: another connection saw the row
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


def test_a_rolled_back_block_drops_its_calls(table: str) -> None:
    calls: list[int] = []
    with psycopg.connect(PG_URL, autocommit=True) as conn:

        def failing_request() -> None:
            with after_commit(conn) as defer:
                conn.execute(f"INSERT INTO {table} VALUES (1, 'packed')")
                defer(calls.append, 1)
                raise RuntimeError("the request failed")

        with pytest.raises(RuntimeError):
            failing_request()
        with after_commit(conn) as defer:
            conn.execute(f"INSERT INTO {table} VALUES (2, 'packed')")
            defer(calls.append, 2)
            raise psycopg.Rollback()  # psycopg's quiet rollback: no error, no call
    assert calls == []
    assert visible(table, 1) is None and visible(table, 2) is None


def test_nested_blocks_wait_for_the_outermost_commit(table: str) -> None:
    calls: list[str] = []
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        with after_commit(conn) as outer:
            outer(calls.append, "outer")
            with after_commit(conn) as inner:  # a savepoint
                conn.execute(f"INSERT INTO {table} VALUES (1, 'packed')")
                inner(calls.append, "kept")
            assert calls == []  # released the savepoint, not committed

            def rolled_back_savepoint() -> None:
                with after_commit(conn) as inner:
                    conn.execute(f"INSERT INTO {table} VALUES (2, 'packed')")
                    inner(calls.append, "dropped")
                    raise ValueError("savepoint rolled back")

            with pytest.raises(ValueError, match="savepoint"):
                rolled_back_savepoint()
        assert calls == ["outer", "kept"]
    assert visible(table, 1) == "packed" and visible(table, 2) is None


def test_a_transaction_it_did_not_open_is_refused(table: str) -> None:
    with psycopg.connect(PG_URL) as conn:  # not autocommit: the SELECT opens a transaction
        conn.execute("SELECT 1")
        with pytest.raises(TransactionStateError), after_commit(conn):
            pytest.fail("the block must not run")
        conn.rollback()
        with conn.transaction(), pytest.raises(TransactionStateError), after_commit(conn):
            pytest.fail("the block must not run")


def test_a_failing_call_is_reported_after_the_others_ran(table: str) -> None:
    calls: list[int] = []

    def broker_down() -> None:
        raise ConnectionError("broker unreachable")

    with psycopg.connect(PG_URL, autocommit=True) as conn:

        def request() -> None:
            with after_commit(conn) as defer:
                conn.execute(f"INSERT INTO {table} VALUES (1, 'packed')")
                defer(broker_down)
                defer(calls.append, 2)

        with pytest.raises(EnqueueFailed) as failed:
            request()
        assert isinstance(failed.value.errors[0], ConnectionError)
    assert calls == [2]
    assert visible(table, 1) == "packed"  # the transaction committed all the same


def test_defer_is_checked(table: str) -> None:
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        with after_commit(conn) as defer, pytest.raises(ValueError, match="callable"):
            defer("not callable")  # type: ignore[arg-type]
        with pytest.raises(TransactionStateError):
            defer(print)


def test_async_connection(table: str) -> None:
    async def scenario() -> list[Any]:
        calls: list[Any] = []

        async def enqueue(value: str) -> None:
            calls.append((value, visible(table, 1)))

        async with await psycopg.AsyncConnection.connect(PG_URL, autocommit=True) as conn:

            async def rolled_back() -> None:
                async with async_after_commit(conn) as defer:
                    await conn.execute(f"INSERT INTO {table} VALUES (1, 'lost')")
                    defer(enqueue, "dropped")
                    raise KeyError("rolled back")

            with pytest.raises(KeyError):
                await rolled_back()
            async with async_after_commit(conn) as defer:
                await conn.execute(f"INSERT INTO {table} VALUES (1, 'packed')")
                defer(enqueue, "sent")  # a coroutine function is awaited
                defer(calls.append, "sync too")
        return calls

    assert asyncio.run(scenario()) == [("sent", "packed"), "sync too"]


# -- SQLAlchemy -------------------------------------------------------------------------------
@pytest.fixture
def session_factory(table: str) -> Iterator[Any]:
    sqlalchemy = pytest.importorskip("sqlalchemy")
    from sqlalchemy.orm import sessionmaker

    engine = sqlalchemy.create_engine(PG_URL.replace("postgresql://", "postgresql+psycopg://"))
    yield sessionmaker(engine)
    engine.dispose()


def _insert(session: Any, table: str, row_id: int) -> None:
    from sqlalchemy import text

    session.execute(text(f"INSERT INTO {table} VALUES (:id, 'packed')"), {"id": row_id})


def test_on_commit_runs_after_the_session_commits(session_factory: Any, table: str) -> None:
    seen: list[str | None] = []
    with session_factory() as session:
        _insert(session, table, 1)
        on_commit(session, lambda: seen.append(visible(table, 1)))
        assert seen == []
        session.commit()
        assert seen == ["packed"]
        _insert(session, table, 2)  # the next transaction starts with nothing pending
        session.commit()
        assert seen == ["packed"]


def test_on_commit_drops_calls_on_rollback_and_on_close(session_factory: Any, table: str) -> None:
    calls: list[int] = []
    with session_factory() as session:
        _insert(session, table, 1)
        on_commit(session, calls.append, 1)
        session.rollback()
        _insert(session, table, 2)
        on_commit(session, calls.append, 2)
        session.close()  # ends the transaction without a commit
        _insert(session, table, 3)  # the same session, a new transaction
        session.commit()
    assert calls == []
    assert visible(table, 3) == "packed"
    assert visible(table, 1) is None and visible(table, 2) is None


def test_on_commit_follows_savepoints(session_factory: Any, table: str) -> None:
    calls: list[str] = []
    with session_factory() as session:
        _insert(session, table, 1)
        on_commit(session, calls.append, "outer")
        with session.begin_nested():
            _insert(session, table, 2)
            on_commit(session, calls.append, "released")
        savepoint = session.begin_nested()
        _insert(session, table, 3)
        on_commit(session, calls.append, "rolled back")
        savepoint.rollback()
        assert calls == []
        session.commit()
    assert calls == ["outer", "released"]
    assert visible(table, 2) == "packed" and visible(table, 3) is None


def test_on_commit_needs_a_transaction(session_factory: Any) -> None:
    with session_factory() as session:
        with pytest.raises(TransactionStateError):
            on_commit(session, print)
        with pytest.raises(ValueError, match="callable"):
            on_commit(session, 42)
