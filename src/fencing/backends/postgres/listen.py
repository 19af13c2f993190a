"""Wake-ups for an outbox relay on PostgreSQL: ``LISTEN fencing_outbox``.

``outbox_add`` queues ``pg_notify('fencing_outbox', kind)`` in the writer's
transaction, so the server delivers it when that transaction commits (never for a
rolled-back row). A waker holds one dedicated autocommit connection that only listens
(``store.backend.outbox_waiter()``), and a relay waits on it instead of sleeping a
polling interval:

* ``wait(timeout) -> bool`` (sync; ``await wait(timeout)`` on the async waker) returns
  True as soon as a row of the waker's queue kind (any kind when ``kind`` is None) was
  committed since the last wait, or ``wake()`` was called (from any thread; the async
  waker's from the loop's thread or via ``loop.call_soon_threadsafe``); False after
  ``timeout`` seconds without either. A notification that came while the relay was
  busy is not lost: the next ``wait`` returns True at once.
* A lost connection is reconnected on the next ``wait``; until then ``wait`` answers
  True once (the relay claims once, as a poll would), then sleeps its timeout, so a
  server that is down is polled, never spun on.

The channel is the database's; a notification's payload names the store's schema and
the queue kind (``outbox.wake_prefix``), so a relay is woken by its own store's rows
only, not by a store in another schema of the same database.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import select
import threading
import time
from typing import Any, Final

import psycopg

from .outbox import CHANNEL, wake_prefix

__all__ = ["AsyncPostgresWaker", "PostgresWaker"]

_LISTEN: Final = f"LISTEN {CHANNEL}"


def _drain(conn: Any, prefix: str, kind: str | None) -> bool:
    """Read what the server sent; whether a notification for ``kind`` (any kind when
    None) of the store whose payloads start with ``prefix`` was in it."""
    pgconn = conn.pgconn
    pgconn.consume_input()
    found = False
    while (note := pgconn.notifies()) is not None:
        payload = note.extra.decode(errors="replace")
        if payload.startswith(prefix) and (kind is None or payload[len(prefix) :] == kind):
            found = True
    return found


class PostgresWaker:
    """A relay's :class:`fencing.contrib.relay.Waker` that listens on PostgreSQL."""

    def __init__(
        self,
        conninfo: str,
        *,
        kind: str | None = None,
        schema: str | None = None,
        connect_kwargs: dict[str, Any] | None = None,
    ) -> None:
        self.conninfo = conninfo
        self.kind = kind
        self.schema = schema
        self._prefix = wake_prefix(schema)
        self._kwargs = dict(connect_kwargs or {})
        self._conn: psycopg.Connection[Any] | None = None
        self._lost = False
        self._r, self._w = os.pipe()
        os.set_blocking(self._r, False)
        os.set_blocking(self._w, False)
        self._lock = threading.Lock()
        self._closed = False

    def __repr__(self) -> str:
        return f"<PostgresWaker channel={CHANNEL} schema={self.schema} kind={self.kind}>"

    def _connection(self) -> psycopg.Connection[Any] | None:
        if self._conn is None or self._conn.closed:
            try:
                self._conn = psycopg.connect(self.conninfo, **{**self._kwargs, "autocommit": True})
                self._conn.execute(_LISTEN)
            except psycopg.Error:
                self._forget()
                return None
        return self._conn

    def _forget(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()
        self._conn = None

    def listen(self) -> None:
        """Start listening now (``wait`` does it otherwise): rows committed from here on
        wake the next ``wait``. Raises the driver's error if the server cannot be reached."""
        with self._lock:
            if self._connection() is None:
                psycopg.connect(self.conninfo, **self._kwargs).close()  # its error

    def _woken(self) -> bool:
        try:
            return bool(os.read(self._r, 4096))
        except BlockingIOError:
            return False

    def wait(self, timeout: float) -> bool:
        with self._lock:
            conn = self._connection()
            if conn is None:  # down: one claim now, then poll
                if not self._lost:
                    self._lost = True
                    return True
                select.select([self._r], [], [], max(0.0, timeout))
                return self._woken()
            self._lost = False
            try:
                if _drain(conn, self._prefix, self.kind) or self._woken():
                    return True
                deadline = time.monotonic() + max(0.0, timeout)
                while (left := deadline - time.monotonic()) > 0:
                    ready, _, _ = select.select([conn.fileno(), self._r], [], [], left)
                    if self._woken() or (
                        conn.fileno() in ready and _drain(conn, self._prefix, self.kind)
                    ):
                        return True  # (a notification of another kind waits on)
                return False
            except (psycopg.Error, OSError, ValueError):
                self._forget()
                return True

    def wake(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):
            os.write(self._w, b"w")

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._forget()
            os.close(self._r)
            os.close(self._w)


class AsyncPostgresWaker:
    """A relay's :class:`fencing.contrib.relay.AsyncWaker` that listens on PostgreSQL."""

    def __init__(
        self,
        conninfo: str,
        *,
        kind: str | None = None,
        schema: str | None = None,
        connect_kwargs: dict[str, Any] | None = None,
    ) -> None:
        self.conninfo = conninfo
        self.kind = kind
        self.schema = schema
        self._prefix = wake_prefix(schema)
        self._kwargs = dict(connect_kwargs or {})
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._event = asyncio.Event()
        self._readable = asyncio.Event()
        self._reader: int | None = None
        self._lost = False

    def __repr__(self) -> str:
        return f"<AsyncPostgresWaker channel={CHANNEL} schema={self.schema} kind={self.kind}>"

    async def _connection(self) -> psycopg.AsyncConnection[Any] | None:
        if self._conn is None or self._conn.closed:
            self._forget()
            try:
                conn = await psycopg.AsyncConnection.connect(
                    self.conninfo, **{**self._kwargs, "autocommit": True}
                )
                await conn.execute(_LISTEN)
            except psycopg.Error:
                return None
            self._conn = conn
            self._reader = conn.fileno()
            asyncio.get_running_loop().add_reader(self._reader, self._readable.set)
        return self._conn

    def _forget(self) -> None:
        if self._reader is not None:
            with contextlib.suppress(Exception):
                asyncio.get_running_loop().remove_reader(self._reader)
            self._reader = None
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.pgconn.finish()

    async def listen(self) -> None:
        """Start listening now (``wait`` does it otherwise)."""
        if await self._connection() is None:
            await (await psycopg.AsyncConnection.connect(self.conninfo, **self._kwargs)).close()

    async def _either(self, timeout: float) -> None:
        waits = [asyncio.ensure_future(e.wait()) for e in (self._event, self._readable)]
        try:
            await asyncio.wait(waits, timeout=max(0.0, timeout), return_when="FIRST_COMPLETED")
        finally:
            for w in waits:
                w.cancel()

    async def wait(self, timeout: float) -> bool:
        conn = await self._connection()
        if conn is None:
            if not self._lost:
                self._lost = True
                return True
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._event.wait(), max(0.0, timeout))
            woken = self._event.is_set()
            self._event.clear()
            return woken
        self._lost = False
        try:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + max(0.0, timeout)
            while True:
                self._readable.clear()
                if _drain(conn, self._prefix, self.kind) or self._event.is_set():
                    self._event.clear()
                    return True
                left = deadline - loop.time()
                if left <= 0:
                    return False
                await self._either(left)  # the socket had something, or wake(), or time
        except (psycopg.Error, OSError, ValueError):
            self._forget()
            return True

    def wake(self) -> None:
        self._event.set()

    async def close(self) -> None:
        self._forget()
