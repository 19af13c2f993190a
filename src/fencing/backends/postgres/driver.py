"""PostgreSQL's drivers: they carry out a flow's steps (``steps.Query``, ``steps.Pipeline``)
on a pooled autocommit connection, fencing's tables put in the store's schema
(``statements.qualified``), and translate the driver's errors (``errors.translate``).

* ``PostgresBackend`` (sync) over ``backends._pool.Pool``, which no exception can
  deplete: a connection the server refused a statement on is reused only if it is back
  at rest; after anything else (a signal handler's exception mid-statement) it is
  closed. A forked child (RQ, Celery prefork) never touches its parent's connections:
  it opens its own pool.
* ``AsyncPostgresBackend`` over ``psycopg_pool.AsyncConnectionPool``: a connection a
  cancellation interrupted is closed, and every connection goes back to the pool,
  shielded from a second cancellation.
"""

from __future__ import annotations

import asyncio
import os
import threading
import weakref
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg.pq import TransactionStatus
from psycopg_pool import AsyncConnectionPool

from ..._borrow import Borrowed
from ..._errors import ConfigurationError, FencingError, TransientStoreError
from .._abase import AsyncFlowBackend
from .._base import FlowBackend
from .._contract import AsyncBackend, Backend, Flows
from .._pool import Pool
from . import bound, psycopg2_bound
from .errors import CONFIG_STATES, CONFIG_TEXT, self_deadlock, translate
from .flows import PostgresFlows
from .listen import AsyncPostgresWaker, PostgresWaker
from .settings import Settings
from .statements import qualified
from .steps import Answer, Query, Step, answer, has_rows
from .watch import Watched, held_here, watchdog

__all__ = ["AsyncPostgresBackend", "PostgresBackend"]


class _Postgres:
    """What both drivers share: the settings and the flows built from them."""

    scheme = "postgresql"

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.flows: Flows = PostgresFlows(settings.schema)

    @property
    def conninfo(self) -> str:
        """The libpq connection string (tests use it for setup connections)."""
        return self.settings.conninfo

    @property
    def schema(self) -> str | None:
        return self.settings.schema

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.settings.where} schema={self.settings.schema}>"

    def _unreachable(self, exc: psycopg.Error) -> FencingError:
        """The error for a failed connect: ``ConfigurationError`` if the server refused
        the URL's database or credentials, else ``TransientStoreError`` (a server that is
        down). Raised outside the driver's handler, so not chained: the driver's error
        holds the connection's conninfo, password included."""
        text, where = str(exc), self.settings.where
        if exc.sqlstate in CONFIG_STATES or CONFIG_TEXT.search(text):
            return ConfigurationError(
                f"postgresql: {where} refused the URL's database or credentials: {text}"
            )
        return TransientStoreError(f"postgresql: cannot connect to {where}: {text}")


def _close(conn: psycopg.Connection[Any]) -> None:
    conn.close()


def _idle(conn: psycopg.Connection[Any]) -> bool:
    """Whether a connection is at rest: open, not broken, no transaction, no result due."""
    return not conn.closed and conn.info.transaction_status == TransactionStatus.IDLE


# A forked child must never use (nor close) its parent's sockets: the pools it inherits
# are kept here, untouched, and it opens its own on first use.
_INHERITED: list[object] = []


class PostgresBackend(_Postgres, FlowBackend):
    """The synchronous driver over fencing's interrupt-safe ``Pool``."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self._lock = threading.Lock()
        self._pool: Pool[psycopg.Connection[Any]] | None = None
        ref = weakref.ref(self)
        os.register_at_fork(after_in_child=lambda: _forget_after_fork(ref))

    def _connect(self) -> psycopg.Connection[Any]:
        settings = self.settings
        conn = psycopg.connect(settings.conninfo, autocommit=True, **settings.connect_kwargs)
        try:
            conn.execute(*settings.session())
        except BaseException:
            conn.close()
            raise
        return conn

    @property
    def pool(self) -> Pool[psycopg.Connection[Any]]:
        pool = self._pool
        if pool is None:
            with self._lock:
                if self._pool is None:
                    self._pool = Pool(
                        "postgresql",
                        self._connect,
                        size=self.settings.max_size,
                        timeout=self.settings.pool_timeout,
                        close=_close,
                        usable=_idle,
                    )
                pool = self._pool
        return pool

    def connect(self) -> None:
        """Check that the server answers (with its own error if not), then keep that
        connection in the pool."""
        pool = self.pool
        error: FencingError | None = None
        try:
            slot = pool.get()
        except psycopg.Error as exc:
            error = self._unreachable(exc)
        if error is not None:
            raise error  # not chained: see _unreachable
        pool.put(slot)

    def outbox_waiter(self, kind: str | None = None) -> PostgresWaker:
        """A relay's waker: a dedicated connection that ``LISTEN``s for committed outbox
        rows (of queue ``kind``, or any), ``listen.PostgresWaker``."""
        return PostgresWaker(
            self.settings.conninfo,
            kind=kind,
            schema=self.settings.schema,
            connect_kwargs=dict(self.settings.connect_kwargs),
        )

    def bind(self, borrowed: Borrowed) -> bound.PostgresBoundBackend:
        """The store's flows on the caller's psycopg connection (``store.using``)."""
        if borrowed.kind == "psycopg2":
            return psycopg2_bound.Psycopg2BoundBackend(self, borrowed)
        found: bound.PostgresBoundBackend = bound.bind(self, borrowed)
        return found

    def _run(self, step: Step) -> Answer | list[Answer]:
        pool = self.pool
        watched: Watched | None = None
        try:
            slot = pool.get()
            conn = slot.conn
            assert conn is not None
            try:
                mine = held_here(conn.info)
                if not mine:
                    found = self._execute(conn, step)
                else:  # this thread has a transaction open through store.using: watched
                    dog = watchdog(self.settings.conninfo)
                    watched = dog.watch(conn, mine)
                    try:
                        found = self._execute(conn, step)
                    finally:
                        dog.done(watched)
            except (psycopg.Error, UnicodeError):
                # The server refused a statement: the connection is reused only if it is
                # back at rest (a broken one, or one left in a transaction, is closed).
                if _idle(conn):
                    pool.put(slot)
                else:
                    pool.discard(slot)
                raise
            except BaseException:
                # Anything else (a signal handler's exception, a bug) may have landed
                # mid-statement or mid-pipeline: the connection's state is unknown.
                pool.discard(slot)
                raise
            pool.put(slot)
            return found
        except (psycopg.Error, UnicodeError) as exc:
            if watched is not None and watched.blocker is not None:
                raise self_deadlock(exc, watched.blocker) from exc
            raise translate(exc) from exc

    def _execute(self, conn: psycopg.Connection[Any], step: Step) -> Answer | list[Answer]:
        schema = self.settings.schema
        if isinstance(step, Query):
            cur = conn.execute(qualified(step.text, schema), step.params)
            return answer(step, cur, cur.fetchall() if has_rows(cur) else [])
        with conn.pipeline():
            curs = [conn.execute(qualified(q.text, schema), q.params) for q in step.queries]
        return [
            answer(q, c, c.fetchall() if has_rows(c) else [])
            for q, c in zip(step.queries, curs, strict=True)
        ]

    def close(self) -> None:
        with self._lock:
            if self._pool is not None:
                self._pool.close()


def _forget_after_fork(ref: weakref.ReferenceType[PostgresBackend]) -> None:
    backend = ref()
    if backend is not None and backend._pool is not None:
        _INHERITED.append(backend._pool)
        backend._pool = None
        backend._lock = threading.Lock()


class AsyncPostgresBackend(_Postgres, AsyncFlowBackend):
    """The asyncio driver over a ``psycopg_pool.AsyncConnectionPool``."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self.pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
            **settings.pool_kwargs(), configure=self._configure
        )

    async def _configure(self, conn: psycopg.AsyncConnection[Any]) -> None:
        await conn.execute(*self.settings.session())

    async def connect(self) -> None:
        """Check that the server answers (with its own error if not), then open the pool."""
        error: FencingError | None = None
        try:
            conn = await psycopg.AsyncConnection.connect(self.settings.conninfo, autocommit=True)
            await conn.close()
        except psycopg.Error as exc:
            error = self._unreachable(exc)
        if error is not None:
            raise error  # not chained: see _unreachable
        await self.pool.open(wait=False)

    def outbox_waiter(self, kind: str | None = None) -> AsyncPostgresWaker:
        """A relay's waker on the event loop (``listen.AsyncPostgresWaker``)."""
        return AsyncPostgresWaker(
            self.settings.conninfo,
            kind=kind,
            schema=self.settings.schema,
            connect_kwargs=dict(self.settings.connect_kwargs),
        )

    def bind(self, borrowed: Borrowed) -> bound.AsyncPostgresBoundBackend:
        """The store's flows on the caller's psycopg ``AsyncConnection`` (``store.using``)."""
        found: bound.AsyncPostgresBoundBackend = bound.bind(self, borrowed)
        return found

    async def _run(self, step: Step) -> Answer | list[Answer]:
        watched: Watched | None = None
        try:
            # psycopg_pool gives a connection it handed to a cancelled waiter back itself.
            conn = await self.pool.getconn()
            try:
                mine = held_here(conn.info)
                if not mine:
                    return await self._execute(conn, step)
                # this task has a transaction open through store.using: watched
                dog = watchdog(self.settings.conninfo)
                watched = dog.watch(conn, mine)
                try:
                    return await self._execute(conn, step)
                finally:
                    dog.done(watched)
            except (psycopg.Error, UnicodeError):
                raise
            except BaseException:
                # Cancelled (or anything else) at an await mid-statement or mid-pipeline:
                # the connection's state is unknown, so it is closed; the pool replaces it.
                await conn.close()  # (no await inside: a pool's connection closes at once)
                raise
            finally:
                # Shielded: a cancellation landing here must not keep the connection from
                # its pool (putconn rolls back a transaction left open, discards a closed one).
                await asyncio.shield(self.pool.putconn(conn))
        except (psycopg.Error, UnicodeError) as exc:
            if watched is not None and watched.blocker is not None:
                raise self_deadlock(exc, watched.blocker) from exc
            raise translate(exc) from exc

    async def _execute(
        self, conn: psycopg.AsyncConnection[Any], step: Step
    ) -> Answer | list[Answer]:
        schema = self.settings.schema
        if isinstance(step, Query):
            cur = await conn.execute(qualified(step.text, schema), step.params)
            return answer(step, cur, await cur.fetchall() if has_rows(cur) else [])
        async with conn.pipeline():
            curs = [await conn.execute(qualified(q.text, schema), q.params) for q in step.queries]
        return [
            answer(q, c, await c.fetchall() if has_rows(c) else [])
            for q, c in zip(step.queries, curs, strict=True)
        ]

    async def close(self) -> None:
        await self.pool.close()


if TYPE_CHECKING:  # both drivers keep the contract

    def _conforms(sync: PostgresBackend, aio: AsyncPostgresBackend) -> tuple[Backend, AsyncBackend]:
        return sync, aio
