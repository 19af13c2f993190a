"""MySQL / MariaDB on the caller's connection (``store.using(conn)``): PyMySQL or
mysqlclient (``MySQLdb``, Django's default) for a sync store, aiomysql for an async one
(a SQLAlchemy session or connection hands out one). mysqlclient keeps no record of the
server's status: with autocommit on, whether the caller began a transaction is asked of
the server first (``@@in_transaction`` on MariaDB; on MySQL, InnoDB's list of open
transactions, which knows of one once it read or wrote a table), one round trip more.

The same flows as on the store's pool (``flows``), framed for the caller's connection
(``steps.framed``):

* the caller is in a transaction (one begun, or autocommit off: every statement is in
  one): a flow's transaction is a savepoint in it, ``SAVEPOINT fencing`` before the
  batch that begins it and ``RELEASE SAVEPOINT fencing`` after the batch that ends it,
  in the same round trips; what it wrote is the caller's to commit or roll back;
* autocommit on and no transaction: the caller has none to join, and the flow runs in a
  transaction of its own, ``START TRANSACTION`` ... ``COMMIT``, as on the pool.

After an error the server sent, the flow's savepoint is rolled back to and released (one
round trip), so the caller's transaction is as it was before the call, usable. A
deadlock (1213) is different: InnoDB rolled the caller's whole transaction back, so it
is not retried inside (``restart`` would run it in a transaction the caller does not
know of): ``TransactionRolledBack`` tells the caller to run its transaction again. So
does any error after which the savepoint is gone (``innodb_rollback_on_timeout``).

An interrupt landing while a batch is on the wire (a signal handler's exception, an
asyncio cancellation, a lost connection) may leave results unread: the next statement
on the connection would read them as its own. The connection is then closed (the
server rolls its transaction back) and the exception goes on with a note saying so; the
caller's next use of it raises the driver's "not connected" error. An exception out of
the flow between batches rolls back to the savepoint.

A flow's transaction runs with the session's ``time_zone`` at UTC, as on fencing's own
sessions (the server's clock, ``UNIX_TIMESTAMP(NOW(6))``, is ambiguous in a DST zone's
repeated hour), set back to the caller's at its end, in the same round trips.

Multi-statement batches need the connection's multi-statement option: turned on once per
connection (``COM_SET_OPTION``) when its client flags do not have it.

The connection must reach the store's server and database (``DATABASE()``: fencing's
statements name their tables unqualified).

A commit's checks are locking reads: they judge the latest committed rows (and the
caller's own writes), whatever the caller's snapshot. A probe (``apply``'s first read)
is a plain read, of the caller's snapshot under ``REPEATABLE READ``: a refusal that
snapshot could explain is read again with the commit's locking reads (``latest``), so
``apply`` decides on the row its commit will judge.
"""

from __future__ import annotations

import asyncio
import struct
import time
import weakref
from contextlib import suppress
from typing import Any, Final

from ..._borrow import Borrowed
from ..._errors import FencingError, InvalidInput
from ..._flow import Flow, Sleep, adrive, drive
from ..._request import CommitRequest, CommitResult
from ..._rules import Status
from .._abound import AsyncBoundBackend
from .._bound import BoundBackend
from .answers import judged
from .connection import aexecute, execute
from .errors import (
    DEADLOCK,
    NO_SAVEPOINT,
    TransactionRolledBack,
    errno,
    in_step,
    is_driver_error,
    translate,
    translated,
)
from .steps import Batch, Result, Script, framed, one, unframed
from .templates import add_judge_reads
from .watch import hold

__all__ = ["AsyncMySQLBoundBackend", "MySQLBoundBackend", "bind", "bind_async"]

# The flow's transaction in the session's time zone set to UTC, as fencing's own
# sessions have it (``UNIX_TIMESTAMP(NOW(6))`` is ambiguous in a DST zone's repeated
# hour), the caller's own time zone set back after it.
_UTC: Final = "SET @f_tz = @@session.time_zone, time_zone = '+00:00'"
_TZ_BACK: Final = "SET time_zone = IFNULL(@f_tz, @@session.time_zone), @f_tz = NULL"
_SAVEPOINT: Final = (f"SAVEPOINT fencing;\n{_UTC}", f"{_TZ_BACK};\nRELEASE SAVEPOINT fencing")
_OWN: Final = (f"START TRANSACTION;\n{_UTC}", f"{_TZ_BACK};\nCOMMIT")
_UNDO: Final = {
    _SAVEPOINT: Batch(
        f"{_TZ_BACK};\nROLLBACK TO SAVEPOINT fencing;\nRELEASE SAVEPOINT fencing", None
    ),
    _OWN: Batch(f"{_TZ_BACK};\nROLLBACK", None),
}
_TZ_RESTORE: Final = Batch(_TZ_BACK, None)
_IN_TRANS: Final = 1  # SERVER_STATUS_IN_TRANS
_COM_SET_OPTION: Final = 27
_MULTI_STATEMENTS_ON: Final = struct.pack("<H", 0)
_MULTI_STATEMENTS: Final = 1 << 16  # CLIENT.MULTI_STATEMENTS
_MYSQL_OPTION_MULTI_STATEMENTS_ON: Final = 0  # mysqlclient's set_server_option
_CLOSED_NOTE: Final = (
    "fencing: this interrupted a batch on the connection given to store.using() (its"
    " results unread): the connection was closed, and the server rolls its transaction"
    " back; roll back and run the transaction again on another connection"
)


def bind(parent: Any, borrowed: Borrowed) -> MySQLBoundBackend:
    """The store's flows on the caller's PyMySQL or mysqlclient (``MySQLdb``) connection."""
    if borrowed.kind not in ("pymysql", "mysqldb"):
        raise InvalidInput(
            f"a mysql store joins PyMySQL and mysqlclient (MySQLdb) connections, not"
            f" {borrowed.kind}"
        )
    return MySQLBoundBackend(parent, borrowed)


def bind_async(parent: Any, borrowed: Borrowed) -> AsyncMySQLBoundBackend:
    """The async store's flows on the caller's aiomysql connection."""
    if borrowed.kind != "aiomysql":
        raise InvalidInput(f"an async mysql store joins aiomysql connections, not {borrowed.kind}")
    return AsyncMySQLBoundBackend(parent, borrowed)


def _identity() -> Flow[object]:
    results: list[Result] = yield one("SELECT DATABASE(), @@hostname, @@port")
    database, host, port = results[0].rows[0]
    return f"the database {database!r} on the server {host}:{port}"


def _latest(request: CommitRequest, result: CommitResult, probing: bool) -> Flow[CommitResult]:
    """MySQL's ``latest``: a commit's refusal stands (its checks were locking reads); a
    probe's is judged again on the commit's locking reads, in the caller's transaction
    (the locks are held until it ends, as a commit's would be)."""
    if not probing:
        return result
    script = Script()
    at = add_judge_reads(script, request, lock=True)
    results: list[Result] = yield script.batch()
    return judged(results, at, request)


class _On:
    """One flow on the caller's connection: how its transaction is framed, and where
    it stands (``open``: begun and not ended; ``io``: a batch on the wire)."""

    __slots__ = ("conn", "frame", "io", "joined", "open", "tz_back")

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.frame: tuple[str, str] = _SAVEPOINT
        self.joined = False  # the caller was in a transaction at the last batch
        self.open = False
        self.io = False
        self.tz_back = False

    def batch(self, step: Batch, in_transaction: bool) -> Batch:
        """The step as sent, framed as the connection is now (``in_transaction``: the
        caller's, autocommit on, is in one: ``_in_transaction``)."""
        if step.begin or not self.open:  # (in a frame: as when it began)
            self.joined = not self.conn.get_autocommit() or in_transaction
        if step.begin:
            self.frame = _SAVEPOINT if self.joined else _OWN
            self.open = True  # from now on, until ended: the savepoint may exist
        return framed(step, *self.frame)

    def done(self, step: Batch) -> None:
        self.io = False
        if step.end:
            self.open = False

    def server_error(self, exc: Exception) -> FencingError | None:
        """What a server error becomes with nothing to undo; None: undo the frame first.
        (After a deadlock in a begun frame, the caller's time zone is to be set back:
        ``tz_back``.)"""
        self.io = False
        if errno(exc) == DEADLOCK:
            self.tz_back = self.open
            self.open = False  # the server rolled back the whole transaction
            if self.joined and self.frame is _SAVEPOINT:
                return _rolled_back(exc)
            return translate(exc)  # a transaction of fencing's own: the flow may restart
        if not self.open:
            return translate(exc)  # the failed statement alone was undone
        return None

    def undone(self, exc: Exception, undo_exc: Exception | None) -> FencingError:
        """``exc`` once the frame was undone (``undo_exc``: how undoing it failed)."""
        self.open = False
        if undo_exc is None:
            return translate(exc)
        if errno(undo_exc) == NO_SAVEPOINT:
            return _rolled_back(exc)
        raise undo_exc

    def interrupted(self, exc: BaseException, close: Any) -> None:
        """An exception mid-batch that is not an error the server sent: close."""
        self.io = True  # never to be undone: the connection is being closed
        self.open = False
        with suppress(Exception):  # closing a connection in an unknown state
            close(self.conn)
        exc.add_note(_CLOSED_NOTE)


def _rolled_back(exc: Exception) -> TransactionRolledBack:
    return TransactionRolledBack(
        f"mysql: {exc}; the server rolled back your whole transaction (nothing of it"
        " remains, fencing's writes nor yours): roll it back and run it again"
    )


def _lost(on: _On, exc: Exception) -> Exception:
    """What ``exc`` (not an error the server sent, or one after which the frame could
    not be undone) becomes, the connection closed; the note is on what is raised."""
    error = translate(exc) if is_driver_error(exc) and not isinstance(exc, FencingError) else exc
    on.interrupted(error, _close)
    return error


def _ends_idle(conn: Any, result: object) -> bool:
    """Whether to end the transaction a refused commit began: the caller had none active
    (nothing of its own is in it), and the commit wrote nothing. Its locks, kept until
    the caller ends it, would make a lease taken again on the store's own connection (a
    lease that ran out while nobody took over) wait for them."""
    return (
        isinstance(result, CommitResult)
        and result.status not in (Status.APPLIED, Status.OK)
        and _status_in_transaction(conn)
    )


def _multi_statements(conn: Any) -> bool:
    """Whether the connection runs multi-statement batches already (else turned on)."""
    return bool(conn.client_flag & _MULTI_STATEMENTS) or conn in _MULTI_ON


#: mysqlclient connections whose multi-statement option fencing turned on (their
#: ``client_flag`` is read-only)
_MULTI_ON: weakref.WeakSet[Any] = weakref.WeakSet()
#: Whether a session is in a transaction, when autocommit is on: MariaDB says so; on
#: MySQL, InnoDB knows of a transaction once it read or wrote a table.
_IN_TRANSACTION: Final = {
    True: one("SELECT @@in_transaction"),
    False: one(
        "SELECT COUNT(*) FROM information_schema.innodb_trx"
        " WHERE trx_mysql_thread_id = CONNECTION_ID()"
    ),
}


def _asks_server(conn: Any) -> bool:
    """Whether the driver keeps no server status (mysqlclient: the server is asked)."""
    return getattr(conn, "server_status", None) is None


def _in_transaction_sql(conn: Any) -> Batch | None:
    """The statement asking whether an autocommit session is in a transaction (``START
    TRANSACTION`` or ``BEGIN`` through the connection), when the driver does not keep the
    server's status (mysqlclient; PyMySQL and aiomysql do: None)."""
    if not _asks_server(conn) or not conn.get_autocommit():
        return None
    return _IN_TRANSACTION["MariaDB" in conn.get_server_info()]


def _status_in_transaction(conn: Any) -> bool:
    """PyMySQL's and aiomysql's record of the server's status: in a transaction."""
    return not _asks_server(conn) and bool(conn.server_status & _IN_TRANS)


def _close(conn: Any) -> None:
    conn.close()


class MySQLBoundBackend(BoundBackend):
    """The MySQL flows on the caller's PyMySQL or mysqlclient connection, inside its
    transaction."""

    def identity_flow(self) -> Flow[object]:
        return _identity()

    def latest(
        self, request: CommitRequest, result: CommitResult, probing: bool
    ) -> Flow[CommitResult]:
        return _latest(request, result, probing)

    def _drive(self, flow: Flow[Any]) -> Any:
        conn = self.borrowed.connection()
        if not self._seen(conn):
            self._check(conn)
        hold(conn, self.parent.settings.server)  # this thread's (watch.py)
        on = _On(conn)
        # (mysqlclient keeps no transaction status: its refused commits are left to you)
        idle = not _asks_server(conn) and not conn.server_status & _IN_TRANS
        try:
            result = drive(flow, lambda step: self._on(on, step))
            if idle and _ends_idle(conn, result):
                conn.rollback()
            return result
        except BaseException as exc:
            if on.open and not on.io:  # out of the flow between batches: undo its part
                try:
                    execute(conn, _UNDO[on.frame])
                except BaseException as undo_exc:
                    on.interrupted(exc, _close)
                    if not isinstance(undo_exc, Exception):
                        raise
            raise

    def _step(self, conn: Any, step: Any) -> Any:
        return self._on(_On(conn), step)

    def _on(self, on: _On, step: Batch | Sleep) -> Any:
        if isinstance(step, Sleep):
            time.sleep(step.seconds)
            return None
        conn = on.conn
        if not _multi_statements(conn):
            _turn_on_multi_statements(conn)
        asks = _in_transaction_sql(conn) if step.begin or not on.open else None
        in_transaction = _status_in_transaction(conn)
        if asks is not None:
            in_transaction = bool(_ask(conn, asks, execute)[0].rows[0][0])
        batch = on.batch(step, in_transaction)
        try:
            on.io = True
            results = unframed(step, execute(conn, batch), 2, 2)
        except Exception as exc:
            if not (is_driver_error(exc) and in_step(exc)):
                lost = _lost(on, exc)
                if lost is exc:
                    raise
                raise lost from exc
            error = on.server_error(exc)
            if on.tz_back:
                with suppress(Exception):  # the error says what happened; this is tidying
                    execute(conn, _TZ_RESTORE)
            if error is None:
                undo_exc = None
                try:
                    execute(conn, _UNDO[on.frame])
                except Exception as failed:
                    undo_exc = failed
                try:
                    error = on.undone(exc, undo_exc)
                except Exception:
                    raise _lost(on, exc) from exc
            raise error from exc
        except BaseException as exc:
            on.interrupted(exc, _close)
            raise
        on.done(step)
        return results


def _ask(conn: Any, batch: Batch, run: Any) -> Any:
    """``run(conn, batch)``, a statement outside any frame; interrupted (or lost), the
    connection is closed."""
    try:
        return run(conn, batch)
    except BaseException as exc:
        if isinstance(exc, Exception) and is_driver_error(exc) and in_step(exc):
            raise translate(exc) from exc
        _On(conn).interrupted(exc, _close)
        if isinstance(exc, Exception):
            raise translated(exc) from exc
        raise


def _turn_on_multi_statements(conn: Any) -> None:
    """One round trip, once per connection; interrupted, the connection is closed."""
    try:
        if _asks_server(conn):  # mysqlclient: mysql_set_server_option
            conn.set_server_option(_MYSQL_OPTION_MULTI_STATEMENTS_ON)
            _MULTI_ON.add(conn)
            return
        conn._execute_command(_COM_SET_OPTION, _MULTI_STATEMENTS_ON)
        conn._read_packet()
    except BaseException as exc:
        _On(conn).interrupted(exc, _close)
        if isinstance(exc, Exception):
            raise translated(exc) from exc
        raise
    conn.client_flag |= _MULTI_STATEMENTS


async def _aturn_on_multi_statements(conn: Any) -> None:
    """One round trip, once per connection; interrupted, the connection is closed."""
    try:
        await conn._execute_command(_COM_SET_OPTION, _MULTI_STATEMENTS_ON)
        await conn._read_packet()
    except BaseException as exc:
        _On(conn).interrupted(exc, _close)
        if isinstance(exc, Exception):
            raise translated(exc) from exc
        raise
    conn.client_flag |= _MULTI_STATEMENTS


class AsyncMySQLBoundBackend(AsyncBoundBackend):
    """The MySQL flows on the caller's aiomysql connection, inside its transaction."""

    def identity_flow(self) -> Flow[object]:
        return _identity()

    def latest(
        self, request: CommitRequest, result: CommitResult, probing: bool
    ) -> Flow[CommitResult]:
        return _latest(request, result, probing)

    async def _drive(self, flow: Flow[Any]) -> Any:
        conn = await self.borrowed.aconnection()
        if not self._seen(conn):
            await self._check(conn)
        on = _On(conn)

        async def run(step: Any) -> Any:
            return await self._on(on, step)

        idle = not conn.server_status & _IN_TRANS
        try:
            result = await adrive(flow, run)
            if idle and _ends_idle(conn, result):
                await conn.rollback()
            return result
        except BaseException as exc:
            if on.open and not on.io:  # out of the flow between batches: undo its part
                try:
                    await aexecute(conn, _UNDO[on.frame])
                except BaseException as undo_exc:
                    on.interrupted(exc, _close)
                    if not isinstance(undo_exc, Exception):
                        raise
            raise

    async def _step(self, conn: Any, step: Any) -> Any:
        return await self._on(_On(conn), step)

    async def _on(self, on: _On, step: Batch | Sleep) -> Any:
        if isinstance(step, Sleep):
            await asyncio.sleep(step.seconds)
            return None
        conn = on.conn
        if not _multi_statements(conn):
            await _aturn_on_multi_statements(conn)
        batch = on.batch(step, _status_in_transaction(conn))
        try:
            on.io = True
            results = unframed(step, await aexecute(conn, batch), 2, 2)
        except Exception as exc:
            if not (is_driver_error(exc) and in_step(exc)):
                lost = _lost(on, exc)
                if lost is exc:
                    raise
                raise lost from exc
            error = on.server_error(exc)
            if on.tz_back:
                with suppress(Exception):  # the error says what happened; this is tidying
                    await aexecute(conn, _TZ_RESTORE)
            if error is None:
                undo_exc = None
                try:
                    await aexecute(conn, _UNDO[on.frame])
                except Exception as failed:
                    undo_exc = failed
                try:
                    error = on.undone(exc, undo_exc)
                except Exception:
                    raise _lost(on, exc) from exc
            raise error from exc
        except BaseException as exc:
            on.interrupted(exc, _close)
            raise
        on.done(step)
        return results
