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
* The connection must reach the store's database and fencing's tables there
  (``identity_flow``, once per connection), and a user table's name must resolve to the
  same table on it as on the store's own connections, whose search path starts with the
  store's schema (checked once per connection and name): else ``ConfigurationError``.

``PostgresBoundBackend`` and ``AsyncPostgresBoundBackend`` differ only at the awaits.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from contextlib import suppress
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Final, NoReturn, TypeVar

import psycopg
from psycopg import generators
from psycopg.pq import ConnStatus, PipelineStatus, TransactionStatus
from psycopg.rows import tuple_row

from ..._borrow import Borrowed
from ..._errors import (
    ConfigurationError,
    FencingError,
    InvalidInput,
    SerializationFailure,
    StoreError,
)
from ..._flow import Flow
from ..._request import CommitRequest, CommitResult, Target
from .._abound import AsyncBoundBackend
from .._bound import BoundBackend
from .errors import sqlstate, translate
from .snapshot import Ours
from .snapshot import latest as _latest
from .statements import NOW, quoted
from .statements import qualified as _qualified
from .steps import Answer, Pipeline, Query, Step, answer, has_rows
from .watch import hold

__all__ = ["AsyncPostgresBoundBackend", "PostgresBoundBackend", "bind"]

R = TypeVar("R")

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
    """The store's flows on a psycopg 3 connection the caller gives (psycopg2's:
    ``psycopg2_bound.bind``, which the driver asks first)."""
    if borrowed.kind != "psycopg":
        raise InvalidInput(
            f"a postgresql store joins psycopg (3) and psycopg2 connections, or SQLAlchemy"
            f" sessions and connections on postgresql+psycopg or postgresql+psycopg2, not"
            f" {borrowed.kind}"
        )
    if isinstance(borrowed.source, (psycopg.Connection, psycopg.AsyncConnection)):
        hold(borrowed.source)
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
    if sqlstate(exc) == "40001":
        error = SerializationFailure(
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
    """Where a connection's statements land: its database and fencing's tables there."""

    database: str
    oid: int
    tables: tuple[int | None, ...]

    def __str__(self) -> str:
        found = "no fencing tables" if self.tables[0] is None else "fencing's tables"
        return f"database {self.database!r} (oid {self.oid}) with {found} (oids {self.tables})"


def _identity(schema: str | None) -> Flow[object]:
    where = [f"{quoted(schema)}.fencing_{t}" if schema else f"fencing_{t}" for t in _TABLES]
    oids = ", ".join(f"to_regclass(%(t{i})s)::oid" for i in range(len(where)))
    found: Answer = yield Query(
        "SELECT current_database(), (SELECT oid FROM pg_catalog.pg_database"
        f" WHERE datname = current_database()), {oids}",
        {f"t{i}": name for i, name in enumerate(where)},
    )
    database, oid, *tables = found.rows[0]
    return _Identity(database, oid, tuple(tables))


@dataclass(frozen=True, slots=True)
class _Resolve:
    """A step: check that a user table's name resolves on the caller's connection to
    the table it names on the store's own (once per connection and name)."""

    name: str


_WHERE: Final = (
    "SELECT c.oid, n.nspname, current_schemas(false)::text[] FROM (SELECT 1) AS fencing_one"
    " LEFT JOIN pg_catalog.pg_class c ON c.oid = to_regclass(%(name)s)"
    " LEFT JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace"
)


def _where(name: str) -> Flow[tuple[Any, ...]]:
    found: Answer = yield Query(_WHERE, {"name": quoted(name)})
    return tuple(found.rows[0])


def _resolving(target: Target, flow: Flow[R]) -> Flow[R]:
    """``flow``, after the check that ``target``'s name (a user table's, unqualified)
    resolves as on the store's own connections."""
    if target.kind == "table" and "." not in target.name:
        yield _Resolve(target.name)
    return (yield from flow)


def _misresolved(name: str, theirs: tuple[Any, ...], ours: tuple[Any, ...]) -> ConfigurationError:
    def where(found: tuple[Any, ...]) -> str:
        oid, schema, path = found
        at = "no table" if oid is None else f"{schema}.{name}"
        return f"{at} (search path {list(path)})"

    return ConfigurationError(
        f"postgresql: table {name!r} is {where(theirs)} on the connection given to"
        f" store.using(), but {where(ours)} on the store's own: give your connection the"
        " store's search path (its schema first), or name the table with its schema"
    )


class _Tables:
    """What both bound backends share: a user table's operations first check (once per
    connection) that its name resolves as on the store's own connections; a refusal a
    snapshot could explain is checked against the latest committed rows (``snapshot``)."""

    def _scoped(self, target: Target, flow: Flow[R]) -> Flow[R]:
        return _resolving(target, flow)

    def latest(
        self, request: CommitRequest, result: CommitResult, probing: bool
    ) -> Flow[CommitResult]:
        return _latest(request, result)


def _resolved_on(parent: Any, conn: Any) -> set[str]:
    """The table names checked on ``conn`` for the store ``parent`` (held as long as the
    connection; a connection that cannot be weakly referenced is checked every time)."""
    by_conn: weakref.WeakKeyDictionary[Any, set[str]] | None
    by_conn = getattr(parent, "_fencing_resolved", None)
    if by_conn is None:
        by_conn = parent._fencing_resolved = weakref.WeakKeyDictionary()
    try:
        known = by_conn.get(conn)
        if known is None:
            known = by_conn[conn] = set()
        return known
    except TypeError:
        return set()


# -- sync --------------------------------------------------------------------------------
def _send(
    conn: Any, queries: Sequence[Query], pipeline: bool, held: list[Any] | None = None
) -> list[Answer]:
    """The statements on ``conn``, rows as tuples whatever the caller's row factory;
    ``held`` gets psycopg's pipeline context (``_settle`` finishes it if interrupted)."""
    if not pipeline:
        (q,) = queries
        cur = conn.cursor(row_factory=tuple_row)
        cur.execute(q.text, q.params, prepare=_prepare(q))
        return [answer(q, cur, cur.fetchall() if has_rows(cur) else [])]
    context = conn.pipeline()
    if held is not None:
        held.append(context)
    with context:
        curs = []
        for q in queries:
            cur = conn.cursor(row_factory=tuple_row)
            cur.execute(q.text, q.params, prepare=_prepare(q))
            curs.append(cur)
    return [
        answer(q, c, c.fetchall() if has_rows(c) else [])
        for q, c in zip(queries, curs, strict=True)
    ]


def _agrees(conn: Any, theirs: object) -> bool:
    """Whether psycopg's own record of a pipeline (``conn._pipeline``, private) agrees
    with libpq's state, which ``_settle`` brought out of pipeline mode. An interruption
    between two steps of psycopg's bookkeeping (about once in a thousand) leaves one
    behind, its level not counted down, with no pipeline under it: every later command
    then fails ("connection not in pipeline mode", "another command is already in
    progress"). Ours (not the caller's, ``theirs``) is forgotten; anything else is not
    repaired here (the caller closes the connection)."""
    found = getattr(conn, "_pipeline", None)
    off: bool = conn.pgconn.pipeline_status == PipelineStatus.OFF
    if found is None or found is theirs:
        return off == (found is None)
    if theirs is not None or not off:
        return False
    conn._pipeline = None
    return getattr(conn, "_pipeline", None) is None


def _restless(conn: Any, theirs: object) -> bool:
    """Whether the connection is open but not at rest (a command in progress, or a
    pipeline psycopg and libpq disagree about): the caller must not be left with it."""
    pgconn = conn.pgconn
    if conn.closed or pgconn.status == ConnStatus.BAD:
        return False
    return pgconn.transaction_status == TransactionStatus.ACTIVE or not _agrees(conn, theirs)


def _suspended(held: Sequence[Any]) -> list[Any]:
    """The generators of psycopg's pipeline contexts (``conn.pipeline()``) an
    interruption left suspended (it landed in the context manager's own ``__exit__``
    before it resumed them). Left so, the garbage collector would finish one later, at
    any moment: a Sync sent on the caller's connection in the middle of its next
    command."""
    found = (getattr(context, "gen", None) for context in held)
    return [gen for gen in found if gen is not None and _frame(gen) is not None]


def _frame(gen: Any) -> Any:
    return getattr(gen, "gi_frame", None) or getattr(gen, "ag_frame", None)


def _settle(conn: Any, theirs: object = None, held: Sequence[Any] = ()) -> str | None:
    """Bring an interrupted connection's protocol to rest: cancel a running statement and
    drain its results, finish psycopg's pipeline context if it was left suspended (once
    libpq is at rest: its cleanup then finds nothing to wait for), and forget a pipeline
    psycopg still records (``_agrees``). None when it is at rest (or lost already:
    ``_undo`` says so); if it cannot be, it is closed, and the answer says so."""
    pgconn = conn.pgconn
    try:
        if conn.closed or pgconn.status == ConnStatus.BAD:
            return None
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
        for gen in _suspended(held):
            with suppress(Exception):  # (psycopg logs what it ignores)
                gen.close()
        if not _agrees(conn, theirs):
            conn.close()
            return _LOST
        return None
    except BaseException:
        conn.close()
        return _LOST


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


class PostgresBoundBackend(_Tables, BoundBackend):
    """The PostgreSQL flows on the caller's psycopg ``Connection``, inside its transaction."""

    def identity_flow(self) -> Flow[object]:
        return _identity(self.parent.schema)

    def _step(self, conn: Any, step: Step | _Resolve | Ours) -> Any:
        if isinstance(step, Ours):
            return self.parent._drive(step.flow)
        if isinstance(step, _Resolve):
            known = _resolved_on(self.parent, conn)
            if step.name not in known:
                theirs = self._step(conn, Query(_WHERE, {"name": quoted(step.name)}))
                ours = self.parent._drive(_where(step.name))
                if theirs.rows[0][0] != ours[0]:
                    raise _misresolved(step.name, tuple(theirs.rows[0]), ours)
                known.add(step.name)
            return None
        return self._statements(conn, step)

    def _statements(self, conn: Any, step: Step) -> Any:
        """A step's statements on the caller's connection (psycopg 3's; psycopg2's:
        ``psycopg2.Psycopg2BoundBackend``)."""
        queries = _plan(step, self.parent.schema)
        name = _SAVEPOINT if _joins(conn) else None
        if name is not None:
            hold(conn)
        theirs = getattr(conn, "_pipeline", None)  # the caller's own pipeline, if any
        held: list[Any] = []
        try:
            if name is None:
                return _result(step, _send(conn, queries, isinstance(step, Pipeline), held))
            return _result(step, _send(conn, _wrapped(queries, name), True, held)[1:-1])
        except BaseException as exc:
            busy = _busy(conn)
            why = _settle(conn, theirs, held) or _undo(conn, name)
            if _restless(conn, theirs):  # never left so: closed
                conn.close()
                why = _LOST
            _reraise(exc, why, busy)


# -- async: the same, awaited ------------------------------------------------------------
async def _asend(
    conn: Any, queries: Sequence[Query], pipeline: bool, held: list[Any] | None = None
) -> list[Answer]:
    if not pipeline:
        (q,) = queries
        cur = conn.cursor(row_factory=tuple_row)
        await cur.execute(q.text, q.params, prepare=_prepare(q))
        return [answer(q, cur, await cur.fetchall() if has_rows(cur) else [])]
    context = conn.pipeline()
    if held is not None:
        held.append(context)
    async with context:
        curs = []
        for q in queries:
            cur = conn.cursor(row_factory=tuple_row)
            await cur.execute(q.text, q.params, prepare=_prepare(q))
            curs.append(cur)
    return [
        answer(q, c, await c.fetchall() if has_rows(c) else [])
        for q, c in zip(queries, curs, strict=True)
    ]


async def _asettle(conn: Any, theirs: object = None, held: Sequence[Any] = ()) -> str | None:
    pgconn = conn.pgconn
    try:
        if conn.closed or pgconn.status == ConnStatus.BAD:
            return None
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
        for gen in _suspended(held):
            with suppress(Exception):
                await gen.aclose()
        if not _agrees(conn, theirs):
            await conn.close()
            return _LOST
        return None
    except BaseException:
        await conn.close()
        return _LOST


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


class AsyncPostgresBoundBackend(_Tables, AsyncBoundBackend):
    """The PostgreSQL flows on the caller's psycopg ``AsyncConnection``, inside its
    transaction."""

    def identity_flow(self) -> Flow[object]:
        return _identity(self.parent.schema)

    async def _step(self, conn: Any, step: Step | _Resolve | Ours) -> Any:
        if isinstance(step, Ours):
            return await self.parent._drive(step.flow)
        if isinstance(step, _Resolve):
            known = _resolved_on(self.parent, conn)
            if step.name not in known:
                theirs = await self._step(conn, Query(_WHERE, {"name": quoted(step.name)}))
                ours = await self.parent._drive(_where(step.name))
                if theirs.rows[0][0] != ours[0]:
                    raise _misresolved(step.name, tuple(theirs.rows[0]), ours)
                known.add(step.name)
            return None
        queries = _plan(step, self.parent.schema)
        name = _SAVEPOINT if _joins(conn) else None
        if name is not None:
            hold(conn)
        theirs = getattr(conn, "_pipeline", None)  # the caller's own pipeline, if any
        held: list[Any] = []
        try:
            if name is None:
                pipelined = isinstance(step, Pipeline)
                return _result(step, await _asend(conn, queries, pipelined, held))
            return _result(step, (await _asend(conn, _wrapped(queries, name), True, held))[1:-1])
        except BaseException as exc:
            busy = _busy(conn)
            why = await _asettle(conn, theirs, held) or await _aundo(conn, name)
            if _restless(conn, theirs):  # never left so: closed
                await conn.close()
                why = _LOST
            _reraise(exc, why, busy)
