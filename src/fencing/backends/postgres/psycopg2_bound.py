"""PostgreSQL on the caller's psycopg2 connection (``store.using(conn)``): the same flows,
checks and steps as on a psycopg 3 connection (``bound``), only the statements are sent
another way. psycopg2 has no pipeline, so:

* The caller is in a transaction, or its connection is not in autocommit mode (psycopg2
  begins one at the first statement): ``SAVEPOINT fencing_step`` goes with the step's
  first statement (one ``execute``, one round trip), each further statement on its own,
  then ``RELEASE SAVEPOINT``. A statement the server refuses is undone with ``ROLLBACK
  TO SAVEPOINT`` and the caller's transaction is as it was.
* Autocommit and no transaction: a step of one statement runs alone; a step of several
  (a psycopg 3 pipeline's implicit transaction) in ``BEGIN`` ... ``COMMIT`` of its own.
* Rows as psycopg 3 gives them, whatever the caller registered on its connection
  (Django's psycopg2 backend reads ``jsonb`` as text): a plain tuple cursor of fencing's
  own, on which ``json``/``jsonb`` are parsed, ``uuid`` read as ``UUID`` and ``bytea``
  as ``bytes`` (typecasters registered on that cursor only). A ``UUID`` parameter is
  sent as its text.
* Errors: the server's SQLSTATE (``pgcode``) translated as psycopg 3's (``errors``). An
  exception that is not the server's (a signal handler's, ``KeyboardInterrupt``) lands
  between statements (psycopg2 runs one to its end): the savepoint is rolled back to and
  the exception propagates. A statement still running then (a wait callback, as
  gevent's) is cancelled and the connection closed; the exception says so.
"""

from __future__ import annotations

import functools
import json
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, Final, NoReturn

from ..._errors import StoreError
from .bound import (
    _ABORTED,
    _BACK,
    _GONE,
    _LOST,
    _RELEASE,
    _SAVEPOINT,
    PostgresBoundBackend,
    _failed,
    _noted,
    _plan,
    _result,
)
from .steps import Answer, Pipeline, Query, Step
from .watch import hold

__all__ = ["Psycopg2BoundBackend"]

# libpq's transaction status (psycopg2.extensions.TRANSACTION_STATUS_*)
_IDLE, _ACTIVE, _INTRANS, _INERROR = 0, 1, 2, 3
_OWN: Final = ("BEGIN", "COMMIT", "ROLLBACK")


@functools.cache
def _driver() -> Any:
    import psycopg2
    import psycopg2.extensions
    import psycopg2.extras

    return psycopg2


@functools.cache
def _casters() -> tuple[Any, ...]:
    """``uuid`` and ``bytea`` read as psycopg 3 reads them (``json``/``jsonb``: below)."""
    ext = _driver().extensions
    binary = _driver().BINARY

    def as_uuid(value: str | None, cur: Any) -> uuid.UUID | None:
        return None if value is None else uuid.UUID(value)

    def as_bytes(value: str | None, cur: Any) -> bytes | None:
        return None if value is None else bytes(binary(value, cur))

    uuid_type = ext.new_type((2950,), "FENCING_UUID", as_uuid)
    bytes_type = ext.new_type(binary.values, "FENCING_BYTEA", as_bytes)
    return (
        uuid_type,
        ext.new_array_type((2951,), "FENCING_UUID[]", uuid_type),
        bytes_type,
        ext.new_array_type((1001,), "FENCING_BYTEA[]", bytes_type),
    )


def _cursor(conn: Any) -> Any:
    """A tuple cursor of fencing's own, reading values as psycopg 3 does."""
    psycopg2 = _driver()
    cur = conn.cursor(cursor_factory=psycopg2.extensions.cursor)
    for caster in _casters():
        psycopg2.extensions.register_type(caster, cur)
    psycopg2.extras.register_default_json(cur, loads=json.loads)
    psycopg2.extras.register_default_jsonb(cur, loads=json.loads)
    return cur


def _params(params: Mapping[str, Any]) -> Mapping[str, Any]:
    """psycopg2 adapts everything fencing binds but a ``UUID``: its text."""
    for value in params.values():
        if type(value) is uuid.UUID:
            return {k: str(v) if type(v) is uuid.UUID else v for k, v in params.items()}
    return params


def _run(conn: Any, q: Query, prefix: str = "") -> Answer:
    """One ``execute``: ``prefix`` (statements without results) then ``q``."""
    with _cursor(conn) as cur:
        cur.execute(prefix + q.text, _params(q.params))
        rows = cur.fetchall() if cur.description is not None else []
        names = tuple(d[0] for d in cur.description) if q.names and cur.description else ()
        return Answer(names, rows, cur.rowcount)


def _send(conn: Any, queries: Sequence[Query], frame: tuple[str, str] | None) -> list[Answer]:
    """The statements, ``frame``'s first statement sent with the first of them and its
    last after them."""
    if frame is None:
        return [_run(conn, q) for q in queries]
    begin, end = frame
    first, *rest = queries
    answers = [_run(conn, first, f"{begin};\n"), *(_run(conn, q) for q in rest)]
    _run(conn, Query(end))
    return answers


def _joins(conn: Any) -> bool:
    """Whether a step joins the caller's transaction (else it runs in one of its own)."""
    if conn.closed:
        raise StoreError("postgresql: your connection is closed; nothing was run")
    status = conn.info.transaction_status
    if status == _INTRANS:
        return True
    if status == _IDLE:
        return not conn.autocommit
    if status == _INERROR:
        raise StoreError(
            "postgresql: your transaction is aborted (a statement in it failed): roll it"
            " back (or back to a savepoint) before fencing can join it; nothing was run"
        )
    raise StoreError("postgresql: your connection is busy with a command; nothing was run")


def _undo(conn: Any, frame: tuple[str, str] | None) -> str | None:
    """Undo a step's statements: back to its savepoint (or its own transaction rolled
    back); None when the caller's transaction is as before the step, else what the
    caller must know."""
    if conn.closed:
        return _GONE
    status = conn.info.transaction_status
    if status == _ACTIVE:  # a statement still running (a wait callback was interrupted)
        try:
            conn.cancel()
        finally:
            conn.close()
        return _LOST
    if frame is None or status == _IDLE:
        return None
    try:
        if frame[0] == "BEGIN":
            _run(conn, Query("ROLLBACK"))
            return None
        back = f"{_BACK.format(_SAVEPOINT)};\n{_RELEASE.format(_SAVEPOINT)}"
        if status == _INERROR:
            _run(conn, Query(back))
            return None
        # Not aborted: the savepoint may be gone already (the step ran whole): its
        # statements in one savepoint of their own, so "no such savepoint" aborts nothing.
        _run(conn, Query(f"SAVEPOINT fencing_undo;\n{back};\nRELEASE SAVEPOINT fencing_undo"))
        return None
    except _driver().Error:
        if conn.closed:
            return _GONE
        try:
            if frame[0] != "BEGIN":
                _run(conn, Query("ROLLBACK TO SAVEPOINT fencing_undo"))
                _run(conn, Query("RELEASE SAVEPOINT fencing_undo"))
                return None
        except _driver().Error:
            pass
        return _ABORTED


def _reraise(exc: BaseException, why: str | None) -> NoReturn:
    """A statement the server refused as fencing's error; anything else as itself, with a
    note if the caller's transaction is not as it was."""
    if isinstance(exc, _driver().Error | UnicodeError):
        if why is None and isinstance(exc, _driver().InterfaceError):
            why = _GONE  # psycopg2's "connection already closed"
        raise _failed(exc, why) from exc
    if why is not None:
        _noted(exc, why)
    raise exc


class Psycopg2BoundBackend(PostgresBoundBackend):
    """The PostgreSQL flows on the caller's psycopg2 connection, inside its transaction."""

    def _statements(self, conn: Any, step: Step) -> Any:
        queries = _plan(step, self.parent.schema)
        frame: tuple[str, str] | None = None
        if _joins(conn):
            hold(conn)
            frame = (f"SAVEPOINT {_SAVEPOINT}", _RELEASE.format(_SAVEPOINT))
        elif isinstance(step, Pipeline) and len(queries) > 1:
            frame = ("BEGIN", "COMMIT")  # one transaction, as a pipeline's
        try:
            return _result(step, _send(conn, queries, frame))
        except BaseException as exc:
            _reraise(exc, _undo(conn, frame))
