"""MySQL connections: a batch carried out on a PyMySQL or an aiomysql connection (the
two speak the same protocol and give the same rows; a mysqlclient one given to
``store.using`` too), the rollback after an error, the
sync pool's connections, and ``Hold``: where one flow's use of its connection stands,
and the rules both drivers follow after an exception."""

from __future__ import annotations

import functools
import select
from contextlib import suppress
from typing import Any

from ..._errors import FencingError
from .._pool import Pool
from .errors import driver_module, in_step, is_driver_error, translated
from .settings import Settings
from .steps import Batch, Result

__all__ = [
    "Hold",
    "aexecute",
    "arollback",
    "close_quietly",
    "execute",
    "idle_ok",
    "new_pool",
    "rollback",
]

_ROLLBACK = Batch("ROLLBACK", None)


class Hold:
    """Where one flow's use of its connection stands, and the rules after an exception.

    ``io`` is True while a batch is on the wire or its results are being read: an
    exception landing then (a signal handler's, a cancellation, a lost reply) may leave
    results unread, so the connection is dropped, never reused. An error the server sent
    leaves the connection in step: the transaction is rolled back at once (``clean``:
    nothing sent since) and the connection kept, so that the flow may go on (start its
    transaction again after a deadlock). Any other exception out of a flow is followed by
    a rollback, unless the connection was dropped or is ``clean``.
    """

    __slots__ = ("clean", "io")

    def __init__(self) -> None:
        self.io = False
        self.clean = False

    def sending(self) -> None:
        self.io = True
        self.clean = False

    def may_keep(self, exc: Exception) -> bool:
        """Whether a batch's ``exc`` left the connection in step (roll back and keep it)."""
        return is_driver_error(exc) and in_step(exc)

    def failed(self, exc: Exception, rolled_back: bool) -> FencingError:
        """What a batch's ``exc`` becomes, once rolled back if ``may_keep``; an exception
        not the driver's is raised again as it is (the connection is then dropped)."""
        error = translated(exc)
        self.io = False
        self.clean = rolled_back
        if not rolled_back:
            self.lose()
        return error

    def lose(self) -> None:
        """Drop the connection (the driver's own)."""
        raise NotImplementedError

    def needs_rollback(self, connected: bool) -> bool:
        """After an exception out of the flow: whether the connection (``connected``: still
        held) may be kept once rolled back; ``clean`` keeps it as it is."""
        return connected and not self.io and not self.clean


def _result(description: Any, rows: Any, affected: Any) -> Result:
    if not description:
        return Result((), (), int(affected or 0))
    return Result(tuple(d[0] for d in description), tuple(rows), int(affected or 0))


# -- sync: PyMySQL (and mysqlclient's MySQLdb, for a connection given to store.using) -----
@functools.cache
def _plain_cursor(package: str) -> type[Any]:
    """The driver's tuple cursor (a caller's connection may default to another class):
    PyMySQL's, or mysqlclient's (``MySQLdb``: the same DB-API, rows and results)."""
    cursor: type[Any] = driver_module(f"{package}.cursors").Cursor
    return cursor


def execute(conn: Any, batch: Batch) -> list[Result]:
    package = type(conn).__module__.split(".", 1)[0]
    with conn.cursor(_plain_cursor("MySQLdb" if package == "MySQLdb" else "pymysql")) as cur:
        cur.execute(batch.sql, batch.params)
        results = [_result(cur.description, cur.fetchall(), cur.rowcount)]
        while cur.nextset():
            results.append(_result(cur.description, cur.fetchall(), cur.rowcount))
    return results


def rollback(conn: Any) -> bool:
    """Roll back after an error; whether the connection can be used again."""
    try:
        if conn.open:
            execute(conn, _ROLLBACK)
            return True
    except Exception:  # the connection is dropped instead
        pass
    return False


def close_quietly(conn: Any) -> None:
    with suppress(Exception):  # a broken connection is being dropped anyway
        conn.close()


def idle_ok(conn: Any) -> bool:
    """Whether an idle connection is still usable: nothing may be waiting to be read on
    it (a server that restarted, or closed it for idleness, has sent EOF or an error)."""
    sock = getattr(conn, "_sock", None)
    if sock is None:
        return False
    try:
        if hasattr(select, "poll"):
            poller = select.poll()
            poller.register(sock, select.POLLIN)
            return not poller.poll(0)
        return not select.select([sock], [], [], 0)[0]
    except (OSError, ValueError):
        return False


def _connect(settings: Settings) -> Any:
    pymysql = driver_module("pymysql")
    conn = pymysql.connect(**settings.driver_kwargs())
    try:
        execute(conn, settings.session_setup())
    except BaseException:
        close_quietly(conn)
        raise
    return conn


def new_pool(settings: Settings) -> Pool[Any]:
    """A small thread-safe pool of PyMySQL connections (``backends._pool``)."""
    return Pool(
        "mysql",
        lambda: _connect(settings),
        size=settings.pool_size,
        timeout=settings.pool_timeout,
        close=close_quietly,
        usable=idle_ok,
        recycle=settings.pool_recycle,
    )


# -- async: aiomysql --------------------------------------------------------------------
@functools.cache
def _quiet_cursor() -> type[Any]:
    aiomysql = driver_module("aiomysql")

    base: Any = aiomysql.Cursor

    class QuietCursor(base):  # type: ignore[misc]
        """aiomysql turns server warnings into Python warnings (``SHOW WARNINGS``, one more
        round trip); the notes of ``INSERT IGNORE`` / ``IF NOT EXISTS`` are expected."""

        async def _show_warnings(self, conn: Any) -> None:
            return None

        def _escape_args(self, args: Any, conn: Any) -> Any:
            # aiomysql 0.3 escapes bytes with a helper PyMySQL 1.1 removed (TypeError):
            # bytes are given as a hex literal, X'...', the rest as aiomysql does
            if isinstance(args, tuple | list):
                return tuple(
                    f"X'{a.hex()}'" if isinstance(a, bytes | bytearray) else conn.escape(a)
                    for a in args
                )
            return super()._escape_args(args, conn)

    return QuietCursor


async def aexecute(conn: Any, batch: Batch) -> list[Result]:
    async with conn.cursor(_quiet_cursor()) as cur:
        await cur.execute(batch.sql, batch.params)
        results = [_result(cur.description, await cur.fetchall(), cur.rowcount)]
        while await cur.nextset():
            results.append(_result(cur.description, await cur.fetchall(), cur.rowcount))
    return results


async def arollback(conn: Any) -> bool:
    try:
        if not conn.closed:
            await aexecute(conn, _ROLLBACK)
            return True
    except Exception:  # the connection is dropped instead
        pass
    return False
