"""Bound views under concurrency: 8 threads (and 8 asyncio tasks), each in its own
application transaction, churn hot keys through ``store.using(conn)``
(create/get/commit/delete, batches, guarded table commits, fenced commits under short
leases), judged linearizable.

Each data operation runs in a transaction of the thread's own connection: the view's
call, then the caller's COMMIT, both inside the recorded interval (so the COMMIT, where
the operation takes effect, is too). About one transaction in five is rolled back
instead, and then it is *not recorded at all*: the history claims it had no effect, so
a rolled-back commit that left anything behind (a version bump, an applied-intent claim
that would make a later commit ``Duplicate``) makes the history non-linearizable.
Leases go through the view to the store's own connections, as ``using`` promises.
"""

from __future__ import annotations

import asyncio
import random
import threading
from pathlib import Path
from typing import Any

import pytest

import fencing
from fencing import TransientStoreError
from fencing.testing import HistoryWriter, check_linearizable, read_lin_file

from ._lenders import DRIVERS, LENDERS, Lender, require_driver
from ._lin_churn import AsyncDriver, Call, SyncDriver, Unrecorded, plan
from .test_linearizability import _config, _judge, _prepare, _verdict

pytestmark = pytest.mark.backends(only=lambda name: name in LENDERS)
THREADS = 8
JOIN = 300.0  # a bound on waiting for workers, never a timing assertion
DATA = {"get", "create", "delete", "commit", "commit_many"}


ASYNC = pytest.mark.backends(only=lambda name: name in LENDERS and LENDERS[name].aconnect)


class TxDriver(SyncDriver):
    """A churn worker whose data operations each run in its own application
    transaction on ``conn``, through ``store.using(conn)``."""

    def __init__(self, store: Any, conn: Any, seed: int, *args: Any) -> None:
        super().__init__(store, *args)
        self.base = store
        self.conn = conn
        self.random = random.Random(seed)
        self.rolled_back = 0

    def _do(self, call: Call) -> Any:
        if call.op not in DATA:
            return super()._do(call)
        return self._in_transaction(call)

    def _in_transaction(self, call: Call) -> Any:
        self.store = self.base.using(self.conn)
        try:
            value = super()._do(call)
        except BaseException:
            self.conn.rollback()
            raise
        finally:
            self.store = self.base
        if self.random.random() < 0.2:
            self.conn.rollback()
            self.rolled_back += 1
            raise Unrecorded  # it had no effect: left out of the history
        try:
            self.conn.commit()
        except Exception as exc:  # the server's answer to COMMIT: unknown to us
            raise TransientStoreError(f"COMMIT failed: {exc}") from exc
        return value


def test_transactions_through_bound_views_are_linearizable(
    backend_name: str, lender_name: str, store_url: str, tmp_path: Path
) -> None:
    """Once per driver lending the connections (psycopg 3 and psycopg2, PyMySQL and
    mysqlclient, sqlite3)."""
    lender = DRIVERS[backend_name][lender_name]
    require_driver(lender)
    path = tmp_path / "history.jsonl"
    drivers = _churn(backend_name, store_url, path, seed=11, lender=lender)
    assert sum(d.rolled_back for d in drivers) > 0  # the rollbacks were exercised
    _verdict(_judge(f"{backend_name}-using-{lender_name}", path), path)


@pytest.mark.backends(only=lambda name: name == "sqlite-file")
def test_a_bound_view_that_commits_for_the_caller_is_caught(
    backend_name: str, store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The harness fails on a planted bug: a bound step that commits the caller's work."""
    from fencing.backends.sqlite.bound import SQLiteBoundBackend

    step = SQLiteBoundBackend._step

    def committing(self: Any, conn: Any, txn: Any) -> Any:
        result = step(self, conn, txn)
        if conn.in_transaction:
            conn.commit()
        return result

    monkeypatch.setattr(SQLiteBoundBackend, "_step", committing)
    path = tmp_path / "history.jsonl"
    _churn(backend_name, store_url, path, seed=11)
    ops, init = read_lin_file(path)
    report = check_linearizable(ops, init=init)
    assert report.ok is False, report.summary()


def _churn(
    backend_name: str, store_url: str, path: Path, seed: int, lender: Lender | None = None
) -> list[TxDriver]:
    config = _config(backend_name, seed=seed)
    store = fencing.open(store_url)
    lender = lender or LENDERS[backend_name]
    errors: list[BaseException] = []
    drivers: list[TxDriver] = []
    try:
        _prepare(store, backend_name, config, path)
        sink = HistoryWriter(path)
        for i in range(THREADS):
            drivers.append(TxDriver(store, None, 100 + i, sink, "p0", f"t{i}", config.batch_atomic))

        def work(driver: TxDriver) -> None:
            try:  # its own connection, made in its thread (sqlite3 wants that)
                driver.conn = lender.connect(store_url)
                driver.run(plan(config, driver.thread))
            except BaseException as exc:
                errors.append(exc)
            finally:
                if driver.conn is not None:
                    driver.conn.close()

        workers = [threading.Thread(target=work, args=(d,)) for d in drivers]
        for t in workers:
            t.start()
        for t in workers:
            t.join(JOIN)
        sink.close()
        assert not any(t.is_alive() for t in workers), "a worker hung"
    finally:
        store.close()
    assert not errors, errors
    return drivers


class AsyncTxDriver(AsyncDriver):
    """``TxDriver`` for the async API: each task its own asyncio connection."""

    def __init__(self, store: Any, conn: Any, seed: int, *args: Any) -> None:
        super().__init__(store, *args)
        self.base = store
        self.conn = conn
        self.random = random.Random(seed)
        self.rolled_back = 0

    async def _do(self, call: Call) -> Any:
        if call.op not in DATA:
            return await super()._do(call)
        return await self._in_transaction(call)

    async def _in_transaction(self, call: Call) -> Any:
        self.store = self.base.using(self.conn)
        try:
            value = await super()._do(call)
        except BaseException:
            await self.conn.rollback()
            raise
        finally:
            self.store = self.base
        if self.random.random() < 0.2:
            await self.conn.rollback()
            self.rolled_back += 1
            raise Unrecorded
        try:
            await self.conn.commit()
        except Exception as exc:
            raise TransientStoreError(f"COMMIT failed: {exc}") from exc
        return value


@ASYNC
def test_async_transactions_through_bound_views_are_linearizable(
    backend_name: str, store_url: str, tmp_path: Path
) -> None:
    config = _config(backend_name, seed=12)
    path = tmp_path / "history.jsonl"
    aconnect = LENDERS[backend_name].aconnect
    assert aconnect is not None
    drivers: list[AsyncTxDriver] = []

    async def main() -> None:
        store = await fencing.open_async(store_url)
        conns: list[Any] = []
        try:
            _prepare(store, backend_name, config, path)
            sink = HistoryWriter(path)
            for i in range(THREADS):
                conns.append(await aconnect(store_url))
                drivers.append(
                    AsyncTxDriver(
                        store, conns[-1], 200 + i, sink, "p0", f"a{i}", config.batch_atomic
                    )
                )
            await asyncio.gather(*(d.run(plan(config, d.thread)) for d in drivers))
            sink.close()
        finally:
            for conn in conns:
                closing = conn.close()
                if asyncio.iscoroutine(closing):
                    await closing
            await store.close()

    asyncio.run(main())
    assert sum(d.rolled_back for d in drivers) > 0
    _verdict(_judge(backend_name + "-using-async", path), path)
