"""SQLite for asyncio: the async store, and its views on the caller's ``aiosqlite``
connection (``AsyncStore.using(conn)``, also a SQLAlchemy ``AsyncSession`` or
``AsyncConnection`` on ``sqlite+aiosqlite``).

The async store runs the sync backend in worker threads. An ``aiosqlite.Connection``
runs its ``sqlite3`` connection on a thread of its own, one call after another; a
view's step (``bound.run_step``: the same savepoint inside the caller's transaction as
the sync view) is queued there as one call, so it runs in order with the caller's own
statements and never beside them. aiosqlite offers no public way to queue a function:
``on_its_thread`` uses its ``Connection._execute`` and ``_connection``, and fails with
``ConfigurationError`` naming them if a release of aiosqlite drops either.

Cancelled while its step is queued or running, a call marks the step cancelled: the
step then rolls back to its savepoint (or its own transaction) instead of releasing it,
unless it has already released it, in which case the whole step is in the caller's
transaction, as if the call had returned just before the cancellation. Either way no
savepoint of fencing's is left open and the caller's own work is untouched.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import sqlite3
import sys
from collections.abc import Callable
from typing import Any, TypeVar

from ..._borrow import Borrowed
from ..._effects import Effect, EffectQuery, NewEffect
from ..._errors import ConfigurationError, InvalidInput, StoreError
from ..._flow import Flow
from ..._request import CommitRequest, CommitResult, LeaseAnswer
from .._abound import AsyncBoundBackend, snapshot_too_old
from .._contract import ThreadedAsyncBackend
from .bound import (
    Latest,
    behind_your_lock,
    holds_write_lock,
    identity,
    latest_flow,
    memory_refused,
    might_write,
    reads_a_snapshot,
    run_step,
    same_answer,
    upcoming,
    write_lock_free,
)
from .driver import SQLiteBackend
from .flows import Txn

__all__ = ["AsyncSQLiteBackend", "AsyncSQLiteBoundBackend", "on_its_thread"]

T = TypeVar("T")
R = TypeVar("R")


class AsyncSQLiteBackend(ThreadedAsyncBackend):
    """The async SQLite store: each call runs the sync backend in a worker thread."""

    sync: SQLiteBackend

    def __init__(self, sync: SQLiteBackend) -> None:
        super().__init__(sync)
        self.flows = sync.flows

    @property
    def memory(self) -> bool:
        return self.sync.memory

    @property
    def path(self) -> str:
        return self.sync.path

    async def _drive(self, flow: Flow[R]) -> R:
        return await self._call(self.sync._drive, flow)

    async def settle_later(self, scope: str, intent_id: str, outcome: str) -> None:
        self.sync.settle_later(scope, intent_id, outcome)  # (a queue: it never waits)

    def bind(self, borrowed: Borrowed) -> AsyncSQLiteBoundBackend:
        """This store's flows on the caller's ``aiosqlite`` connection (``store.using``)."""
        if borrowed.kind != "aiosqlite":
            raise InvalidInput(
                f"an async sqlite store joins aiosqlite connections, not {borrowed.kind}"
            )
        return AsyncSQLiteBoundBackend(self, borrowed)


def _changed(what: str) -> ConfigurationError:
    version = getattr(sys.modules.get("aiosqlite"), "__version__", "?")
    return ConfigurationError(
        f"sqlite: aiosqlite {version} has no {what}: fencing runs a step on an aiosqlite"
        " connection's own thread through Connection._execute and Connection._connection"
        " (aiosqlite has no public way to); use an aiosqlite release that has them"
    )


async def on_its_thread(conn: Any, fn: Callable[[sqlite3.Connection], T]) -> T:
    """``fn(sqlite3_connection)`` on the thread of the aiosqlite connection ``conn``,
    queued after the calls already made on it (the one place that reaches inside
    aiosqlite)."""
    execute = getattr(conn, "_execute", None)
    if not inspect.iscoroutinefunction(execute):
        raise _changed("Connection._execute coroutine")
    if not hasattr(conn, "_connection"):
        raise _changed("Connection._connection")
    if conn._connection is None:
        raise StoreError("sqlite: the aiosqlite connection given to store.using() is closed")

    def call() -> T:
        raw = conn._connection
        if raw is None:
            raise StoreError("sqlite: the aiosqlite connection given to store.using() is closed")
        if not isinstance(raw, sqlite3.Connection):
            raise _changed("sqlite3 connection in Connection._connection")
        return fn(raw)

    result: T = await execute(call)
    return result


class _Cancelled(BaseException):
    """Raised on aiosqlite's thread in a step whose call was cancelled: rolled back."""


class _Gate:
    """Whether the call running a step was cancelled, as the step sees it on aiosqlite's
    thread: a cancellation requested of the calling task (``Task.cancelling()`` grows
    at once, before the task wakes up to its ``CancelledError``), or seen by the call."""

    __slots__ = ("base", "cancelled", "task")

    def __init__(self) -> None:
        self.task = asyncio.current_task()
        self.base = self.task.cancelling() if self.task is not None else 0
        self.cancelled = False

    def closed(self) -> bool:
        task = self.task
        return self.cancelled or (task is not None and task.cancelling() > self.base)

    def guard(self, body: Callable[[sqlite3.Connection, float], Any]) -> Callable[..., Any]:
        def guarded(conn: sqlite3.Connection, now: float) -> Any:
            if self.closed():
                raise _Cancelled
            result = body(conn, now)
            if self.closed():  # finished, not yet released: roll it back instead
                raise _Cancelled
            return result

        return guarded


class AsyncSQLiteBoundBackend(AsyncBoundBackend):
    """The SQLite flows on the caller's ``aiosqlite`` connection, inside its transaction."""

    parent: AsyncSQLiteBackend

    def identity_flow(self) -> Flow[object]:
        return identity()

    async def _check(self, conn: Any) -> None:
        if self.parent.memory:
            raise memory_refused()
        await super()._check(conn)

    def latest(
        self, request: CommitRequest, result: CommitResult, probing: bool
    ) -> Flow[CommitResult]:
        return latest_flow(request, result)

    async def _step(self, conn: Any, step: Txn | Latest) -> Any:
        if isinstance(step, Latest):
            return await self._judge_latest(conn, step)
        if not step.begin:  # one statement, no transaction: nothing to roll back
            return await on_its_thread(conn, lambda raw: run_step(raw, step))
        gate = _Gate()
        guarded = dataclasses.replace(step, body=gate.guard(step.body))
        try:
            return await on_its_thread(conn, lambda raw: run_step(raw, guarded))
        except asyncio.CancelledError:
            gate.cancelled = True
            raise
        except _Cancelled:  # (its cancellation was taken back meanwhile: still undone)
            raise asyncio.CancelledError from None

    async def _judge_latest(self, conn: Any, step: Latest) -> CommitResult:
        """As the sync view's: the refusal, if the caller's transaction reads the latest
        rows or the store's own reading agrees; else ``SerializationFailure``."""
        path = self.parent.path
        if not await on_its_thread(conn, lambda raw: reads_a_snapshot(raw, path)):
            return step.result
        if same_answer(step.result, await self.parent.probe(step.request)):
            return step.result
        raise snapshot_too_old("sqlite", step.request)

    # -- leases and recorded effects: on the store's own connection ---------------------
    async def acquire(self, name: str, owner: str, ttl: float) -> LeaseAnswer:
        await self._not_behind_your_lock()
        return await super().acquire(name, owner, ttl)

    async def renew(self, name: str, token: int, ttl: float) -> LeaseAnswer:
        await self._not_behind_your_lock()
        return await super().renew(name, token, ttl)

    async def release(self, name: str, token: int) -> LeaseAnswer:
        await self._not_behind_your_lock()
        return await super().release(name, token)

    async def record_effect(self, row: NewEffect) -> Effect:
        await self._not_behind_your_lock()
        return await super().record_effect(row)

    async def mark_effect(
        self, idempotency_key: str, status: str | None, detail_json: str | None, reconcile: bool
    ) -> Effect | None:
        await self._not_behind_your_lock()
        return await super().mark_effect(idempotency_key, status, detail_json, reconcile)

    async def settle_effects(self, scope: str, intent_id: str, outcome: str) -> list[Effect]:
        if not await self._behind_your_lock():
            return await super().settle_effects(scope, intent_id, outcome)
        # read where the latest rows are (a write transaction's); written later
        found: list[Effect] = await self._drive(upcoming(scope, intent_id, outcome))
        await self.parent.settle_later(scope, intent_id, outcome)
        return found

    async def list_effects(self, query: EffectQuery) -> list[Effect]:
        if await self._behind_your_lock():  # (the store's connection may be waiting for it)
            found: list[Effect] = await self._drive(self.flows.list_effects(query))
            return found
        return await super().list_effects(query)

    async def _not_behind_your_lock(self) -> None:
        """As the sync view's: refused at once if the caller's transaction holds the
        write lock the store's connection would wait for (not from a lease's heartbeat
        task, which may wait: the caller's task goes on and commits meanwhile)."""
        if await self._behind_your_lock():
            raise behind_your_lock()

    async def _behind_your_lock(self) -> bool:
        task = asyncio.current_task()
        if task is not None and task.get_name().startswith("fencing-heartbeat-"):
            return False
        if not might_write(self.borrowed.source) or self.parent.memory:
            return False
        # On the connection's own thread, never in a worker of the event loop's: those
        # may all be taken by calls waiting for the write lock this transaction holds.
        conn = await self.borrowed.aconnection()
        path = self.parent.path
        held: bool = await on_its_thread(
            conn, lambda raw: not write_lock_free(path) and holds_write_lock(raw)
        )
        return held
