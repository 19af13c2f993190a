"""MySQL's drivers: the sync backend over a pool of PyMySQL connections, the async one
over aiomysql's pool. Both run the same flows (``flows.MySQLFlows``).

One connection per flow: ``_drive(flow)`` checks one connection out and carries every
step of the flow out on it, in order, then gives it back; a ``commit_many`` whose
transaction spans several batches therefore meets one connection, and no flow ever
names or holds a connection itself. A flow's transaction is framed here: a batch that
begins it is sent after ``START TRANSACTION``, one that ends it before ``COMMIT``, in
the same round trip (``steps.framed``); ``bound`` frames the same flows inside a
caller's transaction instead. The rules after an exception are
``connection.Hold``'s: an error the server sent is rolled back at once and thrown into
the flow, which may start its transaction again (``restart``; if its connection was
dropped meanwhile, the next batch gets a fresh one); an exception landing mid-batch
drops the connection; any other exception out of a flow rolls back before the
connection goes back to the pool.
"""

from __future__ import annotations

import asyncio
import os
import time
import weakref
from typing import Any, TypeVar

from ..._borrow import Borrowed
from ..._errors import StoreClosed, TransientStoreError
from ..._flow import Flow, Sleep, adrive, drive
from .._abase import AsyncFlowBackend
from .._base import FlowBackend
from .._pool import Pool, Slot
from .bound import AsyncMySQLBoundBackend, MySQLBoundBackend, bind, bind_async
from .connection import Hold, _connect, aexecute, arollback, execute, new_pool, rollback
from .errors import driver_module, translated
from .flows import MySQLFlows
from .settings import Settings
from .steps import Batch, Result, framed, unframed
from .watch import held_here, self_deadlock, watchdog

__all__ = ["AsyncMySQLBackend", "MySQLBackend"]

R = TypeVar("R")
_FLOWS = MySQLFlows()
#: A flow's transaction on the store's own (autocommit) connections.
_FRAME = ("START TRANSACTION", "COMMIT")


def _alone(step: Any) -> Flow[Any]:
    """A flow of one step."""
    return (yield step)


def _get(pool: Pool[Any]) -> Slot[Any]:
    """A pooled connection; driver errors translated."""
    try:
        return pool.get()
    except Exception as exc:
        raise translated(exc) from exc


class _Lent(Hold):
    """One flow's connection from the sync pool."""

    __slots__ = ("pool", "settings", "slot")

    def __init__(self, pool: Pool[Any], settings: Settings) -> None:
        super().__init__()
        self.pool = pool
        self.settings = settings
        self.slot = _get(pool)

    def run(self, step: Batch | Sleep) -> list[Result] | None:
        if isinstance(step, Sleep):
            time.sleep(step.seconds)
            return None
        if self.slot.conn is None:  # dropped after an error: the flow started again
            self.slot = _get(self.pool)
        conn = self.slot.conn
        self.sending()
        where = self.settings.server
        mine = held_here(where)
        # this thread has a transaction open through store.using: the statement is
        # watched, and killed if it waits for that transaction's own lock (watch.py)
        dog = watchdog(where, lambda: _connect(self.settings)) if mine else None
        watched = None if dog is None else dog.watch(conn, mine)
        try:
            results = unframed(step, execute(conn, framed(step, *_FRAME)))
        except Exception as exc:
            error = self.failed(exc, self.may_keep(exc) and rollback(conn))
            if watched is not None and watched.blocker is not None:
                raise self_deadlock(watched.blocker) from exc
            raise error from exc
        finally:
            if dog is not None:
                dog.done(watched)
        self.io = False
        return results

    def lose(self) -> None:
        self.pool.discard(self.slot)

    def give_back(self, keep: bool) -> None:
        if keep and self.slot.conn is not None:
            self.pool.put(self.slot)
        else:
            self.pool.discard(self.slot)


# A forked child must not use (nor close) its parent's sockets: the pools it inherits
# are kept here, untouched, and it opens its own.
_INHERITED: list[object] = []


def _forget_after_fork(ref: weakref.ReferenceType[MySQLBackend]) -> None:
    backend = ref()
    if backend is not None:
        _INHERITED.append(backend._pool)
        backend._pool = new_pool(backend.settings)


class MySQLBackend(FlowBackend):
    """The synchronous MySQL / MariaDB backend: a small thread-safe pool of PyMySQL
    connections (``backends._pool``)."""

    scheme = "mysql"

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.flows = _FLOWS
        self._pool = new_pool(settings)
        ref = weakref.ref(self)
        os.register_at_fork(after_in_child=lambda: _forget_after_fork(ref))

    def _drive(self, flow: Flow[R]) -> R:
        lent = _Lent(self._pool, self.settings)
        try:
            value = drive(flow, lent.run)
        except Exception:
            conn = lent.slot.conn
            lent.give_back(lent.clean or (lent.needs_rollback(conn is not None) and rollback(conn)))
            raise
        except BaseException:
            lent.give_back(False)
            raise
        lent.give_back(True)
        return value

    def _run(self, step: Batch | Sleep) -> Any:
        """One step on a connection of its own (a flow's steps all run in ``_drive``)."""
        return self._drive(_alone(step))

    def bind(self, borrowed: Borrowed) -> MySQLBoundBackend:
        """This store's flows on the caller's PyMySQL connection (``store.using``)."""
        return bind(self, borrowed)

    def close(self) -> None:
        self._pool.close()


class _AsyncLent(Hold):
    """One flow's connection from aiomysql's pool."""

    __slots__ = ("backend", "conn")

    def __init__(self, backend: AsyncMySQLBackend, conn: Any) -> None:
        super().__init__()
        self.backend = backend
        self.conn: Any = conn

    async def run(self, step: Batch | Sleep) -> list[Result] | None:
        if isinstance(step, Sleep):
            await asyncio.sleep(step.seconds)
            return None
        if self.conn is None:  # dropped after an error: the flow started again
            self.conn = await self.backend._checkout()
        conn = self.conn
        self.sending()
        try:
            results = unframed(step, await aexecute(conn, framed(step, *_FRAME)))
        except Exception as exc:
            raise self.failed(exc, self.may_keep(exc) and await arollback(conn)) from exc
        self.io = False
        return results

    def lose(self) -> None:
        self.give_back(False)

    def give_back(self, keep: bool) -> None:
        conn, self.conn = self.conn, None
        if conn is not None:
            if not keep:
                conn.close()  # cancelled or broken mid-batch: never reuse it
            self.backend._pool.release(conn)


class AsyncMySQLBackend(AsyncFlowBackend):
    """The asynchronous MySQL / MariaDB backend, over aiomysql's pool."""

    scheme = "mysql"

    def __init__(self, settings: Settings, pool: Any) -> None:
        self.settings = settings
        self.flows = _FLOWS
        self._pool = pool
        self._ready: weakref.WeakSet[Any] = weakref.WeakSet()
        self._closed = False

    @classmethod
    async def open(cls, settings: Settings) -> AsyncMySQLBackend:
        aiomysql = driver_module("aiomysql")
        try:
            pool = await aiomysql.create_pool(
                minsize=0,
                maxsize=settings.pool_size,
                pool_recycle=settings.pool_recycle,
                **settings.driver_kwargs("db"),
            )
        except Exception as exc:
            raise translated(exc) from exc
        return cls(settings, pool)

    async def _acquire(self) -> Any:
        if self._closed:
            raise StoreClosed("mysql: this store is closed")
        try:
            async with asyncio.timeout(self.settings.pool_timeout):
                conn = await self._pool.acquire()
        except TimeoutError:
            raise TransientStoreError(
                f"mysql: no free connection within {self.settings.pool_timeout}s"
                f" (pool_size={self.settings.pool_size})"
            ) from None
        if conn not in self._ready:
            try:
                await aexecute(conn, self.settings.session_setup())
            except BaseException:
                conn.close()
                self._pool.release(conn)
                raise
            self._ready.add(conn)
        return conn

    async def _checkout(self) -> Any:
        """A pooled connection, set up for fencing's sessions; driver errors translated."""
        try:
            return await self._acquire()
        except Exception as exc:
            raise translated(exc) from exc

    async def _drive(self, flow: Flow[R]) -> R:
        lent = _AsyncLent(self, await self._checkout())
        keep = False
        try:
            value = await adrive(flow, lent.run)
            keep = True
            return value
        except Exception:
            conn = lent.conn
            keep = lent.clean or (lent.needs_rollback(conn is not None) and await arollback(conn))
            raise
        finally:
            lent.give_back(keep)

    async def _run(self, step: Batch | Sleep) -> Any:
        """One step on a connection of its own (a flow's steps all run in ``_drive``)."""
        return await self._drive(_alone(step))

    def bind(self, borrowed: Borrowed) -> AsyncMySQLBoundBackend:
        """This store's flows on the caller's aiomysql connection (``store.using``)."""
        return bind_async(self, borrowed)

    async def close(self) -> None:
        self._closed = True
        self._pool.close()
        await self._pool.wait_closed()
