"""PostgreSQL on the caller's psycopg connection (``store.using(conn)``): the store's
flows, their steps run inside the caller's transaction (``docs/transactions.md``).

* The caller is in a transaction, or its connection is not in autocommit mode (psycopg
  begins one implicitly: the step's statements join it, and it is left open for the
  caller): ``SAVEPOINT fencing_step``, the step's statements, ``RELEASE SAVEPOINT`` go in
  ONE pipeline (one Sync: one round trip). A statement the server refuses (a claim
  race's unique violation, a serialization failure) is undone with ``ROLLBACK TO
  SAVEPOINT`` and the caller's transaction is as it was.
* Autocommit and no transaction: the caller has none to join; the step runs as on the
  store's own connections (a statement, or a pipeline: its own implicit transaction).
* Anything else that interrupts a step (a signal handler's exception, ``KeyboardInterrupt``,
  asyncio cancellation) may land mid-protocol: the running statement is cancelled, its
  results drained, and the savepoint rolled back to; the interruption then propagates.
  If that cannot be done, the connection is closed (never silently: the exception says
  so) or, its transaction aborted, left for the caller to roll back (the exception says so).
* Fencing's tables are schema-qualified as on the store; ``now()`` (a transaction's
  start) is ``statement_timestamp()`` here, so a lease's expiry is judged at the
  statement, not at the start of a caller's long transaction.
* The connection must reach the store's database, fencing's tables there, and resolve
  a table name as the store's own connections do (the same ``current_schemas``): else
  ``ConfigurationError`` (``identity_flow``).

``PostgresBoundBackend`` and ``AsyncPostgresBoundBackend`` differ only at the awaits.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Final, NoReturn

import psycopg
from psycopg import generators
from psycopg.pq import ConnStatus, PipelineStatus, TransactionStatus
from psycopg.rows import tuple_row

from ..._borrow import Borrowed
from ..._errors import FencingError, InvalidInput, StoreError, TransientStoreError
from ..._flow import Flow
from .._abound import AsyncBoundBackend
from .._bound import BoundBackend
from .errors import translate
from .statements import NOW, quoted
from .statements import qualified as _qualified
from .steps import Answer, Pipeline, Query, Step, answer, has_rows

__all__ = ["AsyncPostgresBoundBackend", "PostgresBoundBackend", "bind"]

#: ``now()`` is the start of the transaction: a caller's may be long open.
_NOW_HERE: Final = "extract(epoch FROM statement_timestamp())::float8"
_TABLES: Final = ("records", "applied", "fences", "leases", "tombstones", "effects")
_SETTLE_TIMEOUT: Final = 5.0  # seconds to cancel and drain an interrupted statement
#: The step's savepoint: a name no caller's savepoint has (``_undo`` relies on it), and
#: one text (psycopg counts texts to prepare; a new name each time would crowd the caller's).
_SAVEPOINT: Final = "fencing_step"
_UNDO: Final = "fencing_undo"
_BEGIN, _RELEASE, _BACK = "SAVEPOINT {}", "RELEASE SAVEPOINT {}", "ROLLBACK TO SAVEPOINT {}"
#: Savepoint statements are never prepared: psycopg forgets every prepared statement
#: of the connection when it sees a ROLLBACK (TO SAVEPOINT) go by, and in a pipeline
#: the statements queued with it can then name one it dropped.
_UTILITY: Final = frozenset(
    form.format(name) for form in (_BEGIN, _RELEASE, _BACK) for name in (_SAVEPOINT, _UNDO)
)
_LOST: Final = "the connection could not be brought back to rest, and was closed"
_GONE: Final = "the connection is lost, and your transaction with it"
_ABORTED: Final = "your transaction could not be restored: roll it back"


def bind(parent: Any, borrowed: Borrowed) -> Any:
    """The store's flows on a psycopg 3 connection the caller gives."""
    if borrowed.kind != "psycopg":
        raise InvalidInput(
            f"a postgresql store joins psycopg (3) connections, or SQLAlchemy sessions and"
            f" connections on postgresql+psycopg, not {borrowed.kind}"
        )
    if borrowed.asynchronous:
        return AsyncPostgresBoundBackend(parent, borrowed)
    return PostgresBoundBackend(parent, borrowed)


@lru_cache(maxsize=2048)
def _text(text: str, schema: str | None) -> str:
    return _qualified(text, schema).replace(NOW, _NOW_HERE)


def _plan(step: Step, schema: str | None) -> tuple[Query, ...]:
    queries = (step,) if isinstance(step, Query) else step.queries
    return tuple(Query(_text(q.text, schema), q.params, q.names) for q in queries)


def _wrapped(queries: tuple[Query, ...], name: str) -> tuple[Query, ...]:
    return (Query(_BEGIN.format(name)), *queries, Query(_RELEASE.format(name)))


def _prepare(q: Query) -> bool | None:
    """psycopg's ``prepare=``: never for a savepoint statement, else its own choice."""
    return False if q.text in _UTILITY else None


def _joins(conn: Any) -> bool:
    """Whether a step joins the caller's transaction (else it runs in one of its own)."""
    status = conn.info.transaction_status
    if status == TransactionStatus.INTRANS:
        return True
    if status == TransactionStatus.IDLE:
        return not conn.autocommit
    if status == TransactionStatus.INERROR:
        raise StoreError(
            "postgresql: your transaction is aborted (a statement in it failed): roll it"
            " back (or back to a savepoint) before fencing can join it; nothing was run"
        )
    state = "busy with a command in progress" if status == TransactionStatus.ACTIVE else "closed"
    raise StoreError(f"postgresql: your connection is {state}; nothing was run")


def _result(step: Step, answers: list[Answer]) -> Answer | list[Answer]:
    return answers[0] if isinstance(step, Query) else answers


def _failed(exc: Exception, why: str | None) -> FencingError:
    """The fencing error for a step the server refused (or the driver could not send);
    ``why``: what became of the caller's transaction, if it is not as it was."""
    error = translate(exc)
    if getattr(exc, "sqlstate", None) == "40001":
        error = TransientStoreError(
            f"{error}: your transaction's snapshot cannot see the row's newest version;"
            " roll your transaction back and run it again"
        )
    if why == _ABORTED:
        return StoreError(f"{error}; and {why}")
    if why is not None:
        _noted(error, why)
    return error


def _busy(conn: Any) -> bool:
    """Whether an exception left the connection mid-protocol (a statement running, or
    a pipeline's results uncollected)."""
    pgconn = conn.pgconn
    return bool(
        pgconn.status != ConnStatus.BAD
        and (
            pgconn.transaction_status == TransactionStatus.ACTIVE
            or pgconn.pipeline_status != PipelineStatus.OFF
        )
    )


def _interruption(exc: BaseException, busy: bool) -> BaseException | None:
    """The exception that interrupted a step, when psycopg's cleanup of an unfinished
    pipeline replaced it with its own error (its context)."""
    context = exc.__context__
    if not busy or not isinstance(exc, psycopg.Error) or context is None:
        return None
    return None if isinstance(context, (psycopg.Error, UnicodeError)) else context


def _reraise(exc: BaseException, why: str | None, busy: bool) -> NoReturn:
    """Raise what a step raises after ``exc``, once the caller's transaction was seen to
    (``why``: what became of it, if it is not as it was): a statement the server refused
    as fencing's error; an interruption (a signal handler's exception, Ctrl-C, a
    cancellation) as itself, never swallowed."""
    interrupted = _interruption(exc, busy)
    if interrupted is None and isinstance(exc, (psycopg.Error, UnicodeError)):
        raise _failed(exc, why) from exc
    raised = exc if interrupted is None else interrupted
    if why is not None:
        _noted(raised, why)
    if raised is exc:
        raise exc
    raise raised from None  # the interruption psycopg's cleanup error replaced


def _noted(exc: BaseException, why: str) -> None:
    exc.add_note(f"fencing (store.using, postgresql): {why}")


@dataclass(frozen=True)
class _Identity:
    """Where a connection's statements land: its database, fencing's tables, and the
    schemas a table name is looked up in."""

    database: str
    oid: int
    tables: tuple[int | None, ...]
    search: tuple[str, ...]

    def __str__(self) -> str:
        return (
            f"database {self.database!r} (oid {self.oid}) with fencing's records table"
            f" {self.tables[0]} and search path {list(self.search)}"
        )


def _identity(schema: str | None) -> Flow[object]:
    where = [f"{quoted(schema)}.fencing_{t}" if schema else f"fencing_{t}" for t in _TABLES]
    oids = ", ".join(f"to_regclass(%(t{i})s)::oid" for i in range(len(where)))
    found: Answer = yield Query(
        "SELECT current_database(), (SELECT oid FROM pg_catalog.pg_database"
        f" WHERE datname = current_database()), current_schemas(false)::text[], {oids}",
        {f"t{i}": name for i, name in enumerate(where)},
    )
    database, oid, search, *tables = found.rows[0]
    return _Identity(database, oid, tuple(search), tuple(tables))


# -- sync --------------------------------------------------------------------------------
def _send(conn: Any, queries: Sequence[Query], pipeline: bool) -> list[Answer]:
    """The statements on ``conn``, rows as tuples whatever the caller's row factory."""
    if not pipeline:
        (q,) = queries
        cur = conn.cursor(row_factory=tuple_row)
        cur.execute(q.text, q.params, prepare=_prepare(q))
        return [answer(q, cur, cur.fetchall() if has_rows(cur) else [])]
    with conn.pipeline():
        curs = []
        for q in queries:
            cur = conn.cursor(row_factory=tuple_row)
            cur.execute(q.text, q.params, prepare=_prepare(q))
            curs.append(cur)
    return [
        answer(q, c, c.fetchall() if has_rows(c) else [])
        for q, c in zip(queries, curs, strict=True)
    ]


def _settle(conn: Any) -> bool:
    """Bring an interrupted connection's protocol to rest: cancel a running statement and
    drain its results. False if it cannot be (then it is closed)."""
    pgconn = conn.pgconn
    try:
        if conn.closed or pgconn.status == ConnStatus.BAD:
            return False
        if pgconn.transaction_status == TransactionStatus.ACTIVE:
            conn.cancel_safe(timeout=_SETTLE_TIMEOUT)
        if pgconn.pipeline_status != PipelineStatus.OFF:
            pgconn.pipeline_sync()  # one more Sync is harmless; none would leave it hanging
            conn.wait(generators.send(pgconn), timeout=_SETTLE_TIMEOUT)
            while True:
                try:
                    pgconn.exit_pipeline_mode()
                    break
                except psycopg.OperationalError:  # results still to collect
                    conn.wait(generators.fetch(pgconn), timeout=_SETTLE_TIMEOUT)
        while pgconn.transaction_status == TransactionStatus.ACTIVE:
            conn.wait(generators.fetch(pgconn), timeout=_SETTLE_TIMEOUT)
        return True
    except BaseException:
        conn.close()
        return False


def _undo(conn: Any, name: str | None) -> str | None:
    """Roll the caller's transaction back to the step's savepoint (if it was made); None
    when its transaction is as before the step, else what the caller must know."""
    if conn.closed or conn.pgconn.status == ConnStatus.BAD:
        return _GONE
    status = conn.info.transaction_status
    if name is None or status == TransactionStatus.IDLE:
        return None
    back = (Query(_BACK.format(name)), Query(_RELEASE.format(name)))
    try:
        if status == TransactionStatus.INERROR:
            _send(conn, back, True)
            return None
        # Not aborted: the savepoint may be gone already (the step ran whole). Try it
        # under a savepoint of our own, so that "no such savepoint" aborts nothing.
        try:
            _send(conn, (Query(_BEGIN.format(_UNDO)), *back), True)
        except psycopg.Error:
            _send(conn, (Query(_BACK.format(_UNDO)), Query(_RELEASE.format(_UNDO))), True)
        return None
    except psycopg.Error:
        return _ABORTED


class PostgresBoundBackend(BoundBackend):
    """The PostgreSQL flows on the caller's psycopg ``Connection``, inside its transaction."""

    def identity_flow(self) -> Flow[object]:
        return _identity(self.parent.schema)

    def _step(self, conn: Any, step: Step) -> Answer | list[Answer]:
        queries = _plan(step, self.parent.schema)
        name = _SAVEPOINT if _joins(conn) else None
        try:
            if name is None:
                return _result(step, _send(conn, queries, isinstance(step, Pipeline)))
            return _result(step, _send(conn, _wrapped(queries, name), True)[1:-1])
        except BaseException as exc:
            busy = _busy(conn)
            _reraise(exc, _undo(conn, name) if _settle(conn) else _LOST, busy)


# -- async: the same, awaited ------------------------------------------------------------
async def _asend(conn: Any, queries: Sequence[Query], pipeline: bool) -> list[Answer]:
    if not pipeline:
        (q,) = queries
        cur = conn.cursor(row_factory=tuple_row)
        await cur.execute(q.text, q.params, prepare=_prepare(q))
        return [answer(q, cur, await cur.fetchall() if has_rows(cur) else [])]
    async with conn.pipeline():
        curs = []
        for q in queries:
            cur = conn.cursor(row_factory=tuple_row)
            await cur.execute(q.text, q.params, prepare=_prepare(q))
            curs.append(cur)
    return [
        answer(q, c, await c.fetchall() if has_rows(c) else [])
        for q, c in zip(queries, curs, strict=True)
    ]


async def _asettle(conn: Any) -> bool:
    pgconn = conn.pgconn
    try:
        if conn.closed or pgconn.status == ConnStatus.BAD:
            return False
        if pgconn.transaction_status == TransactionStatus.ACTIVE:
            await conn.cancel_safe(timeout=_SETTLE_TIMEOUT)
        if pgconn.pipeline_status != PipelineStatus.OFF:
            pgconn.pipeline_sync()
            await conn.wait(generators.send(pgconn), timeout=_SETTLE_TIMEOUT)
            while True:
                try:
                    pgconn.exit_pipeline_mode()
                    break
                except psycopg.OperationalError:
                    await conn.wait(generators.fetch(pgconn), timeout=_SETTLE_TIMEOUT)
        while pgconn.transaction_status == TransactionStatus.ACTIVE:
            await conn.wait(generators.fetch(pgconn), timeout=_SETTLE_TIMEOUT)
        return True
    except BaseException:
        await conn.close()
        return False


async def _aundo(conn: Any, name: str | None) -> str | None:
    if conn.closed or conn.pgconn.status == ConnStatus.BAD:
        return _GONE
    status = conn.info.transaction_status
    if name is None or status == TransactionStatus.IDLE:
        return None
    back = (Query(_BACK.format(name)), Query(_RELEASE.format(name)))
    try:
        if status == TransactionStatus.INERROR:
            await _asend(conn, back, True)
            return None
        try:
            await _asend(conn, (Query(_BEGIN.format(_UNDO)), *back), True)
        except psycopg.Error:
            await _asend(conn, (Query(_BACK.format(_UNDO)), Query(_RELEASE.format(_UNDO))), True)
        return None
    except psycopg.Error:
        return _ABORTED


class AsyncPostgresBoundBackend(AsyncBoundBackend):
    """The PostgreSQL flows on the caller's psycopg ``AsyncConnection``, inside its
    transaction."""

    def identity_flow(self) -> Flow[object]:
        return _identity(self.parent.schema)

    async def _step(self, conn: Any, step: Step) -> Answer | list[Answer]:
        queries = _plan(step, self.parent.schema)
        name = _SAVEPOINT if _joins(conn) else None
        try:
            if name is None:
                return _result(step, await _asend(conn, queries, isinstance(step, Pipeline)))
            return _result(step, (await _asend(conn, _wrapped(queries, name), True))[1:-1])
        except BaseException as exc:
            busy = _busy(conn)
            _reraise(exc, await _aundo(conn, name) if await _asettle(conn) else _LOST, busy)
