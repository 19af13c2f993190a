"""SQLite on the caller's ``sqlite3`` connection (``store.using(conn)``).

A ``Txn`` step's body runs inside the caller's transaction:

* the connection is in a transaction: the body runs in a savepoint (``SAVEPOINT
  fencing``), released when it succeeds and rolled back to when it fails, so a failed
  step leaves the caller's own work as it was;
* no transaction, and the connection opens them implicitly (``isolation_level`` not
  None, the ``sqlite3`` default): a step that writes begins one (``BEGIN IMMEDIATE``,
  so the write lock is taken before the check) and leaves it open; the caller
  commits it. A failed first step rolls it back: nothing of the caller's was in it. A
  step that only reads ends the transaction it began, as ``sqlite3`` opens none for
  the caller's own SELECT (left open, its snapshot would make the caller's next write
  fail as soon as anyone else commits);
* no transaction, autocommit (``isolation_level=None``): the caller has no transaction
  to join, and the step runs in one of its own, as on the store's connection.

The connection must reach the store's database file (``PRAGMA database_list``): a
store on ``:memory:`` has no other connection, so it is never one.

A read transaction of the caller's (a ``BEGIN`` of its own, then a read) keeps the
snapshot of its first read until it writes. A write in it then fails at once if another
connection committed since (``SQLITE_BUSY_SNAPSHOT``: ``SerializationFailure``), but a
refusal judged on a read alone (a probe, a collection's guard) would show the
snapshot's row: such a refusal (``latest``) is compared with the store's own reading of
the latest committed rows; if they differ and the caller's transaction holds no write
lock (so none of its own writes explains the difference), ``SerializationFailure``.

A refused commit's effects are settled on the store's own connection; when the caller's
transaction holds the write lock (it wrote, or the refused commit's claim did), that
would wait for the caller's commit on the caller's own thread: they are settled as soon
as the lock is free (``later``), and the view answers with them as they will be.
"""

from __future__ import annotations

import dataclasses
import os
import sqlite3
import threading
import time
from dataclasses import dataclass
from typing import Any, Final

from ..._borrow import Borrowed
from ..._effects import Effect, EffectQuery, NewEffect
from ..._errors import ConfigurationError, InvalidInput, SerializationFailure
from ..._flow import Flow
from ..._request import CommitRequest, CommitResult, LeaseAnswer
from ..._rules import Status
from ..._values import Record
from .._abound import snapshot_too_old
from .._bound import BoundBackend
from . import operations as op
from . import statements as sql
from .errors import translate
from .flows import Txn
from .steps import txn

__all__ = [
    "Latest",
    "SQLiteBoundBackend",
    "behind_your_lock",
    "bind",
    "holds_write_lock",
    "identity",
    "latest_flow",
    "memory_refused",
    "might_write",
    "reads_a_snapshot",
    "run_step",
    "same_answer",
    "upcoming",
    "write_lock_free",
]


#: A read transaction that tries to write after another connection committed (WAL).
_BUSY_SNAPSHOT: Final = 517


def bind(parent: Any, borrowed: Borrowed) -> SQLiteBoundBackend:
    """The store's flows on a ``sqlite3`` connection the caller gives."""
    if borrowed.kind != "sqlite3":
        raise InvalidInput(f"a sqlite store joins sqlite3 connections, not {borrowed.kind}")
    return SQLiteBoundBackend(parent, borrowed)


def _where(conn: sqlite3.Connection, now: float) -> str:
    """The file of the connection's main database ('' for a memory or temporary one)."""
    for _, name, path in conn.execute("PRAGMA database_list"):
        if name == "main":
            return os.path.realpath(path) if path else ""
    return ""  # pragma: no cover - every connection has a main database


def identity() -> Flow[object]:
    """Which database file a connection reaches."""
    path: str = yield Txn(_where, begin=False)
    return f"the database file {path!r}" if path else "a private in-memory database"


@dataclass(frozen=True, slots=True)
class Latest:
    """A step: ``result``, a refusal the caller's connection answered for ``request``
    that a snapshot could explain, checked against the store's own reading of the latest
    committed rows (``_abound``'s ``latest``)."""

    request: CommitRequest
    result: CommitResult


def latest_flow(request: CommitRequest, result: CommitResult) -> Flow[CommitResult]:
    checked: CommitResult = yield Latest(request, result)
    return checked


def _row(record: Record | None) -> tuple[Any, ...] | None:
    if record is None:
        return None
    state = dict(record.state) if record.kind == "table" and not record.version else None
    return record.version, record.fence, state


def upcoming(scope: str, intent_id: str, outcome: str) -> Flow[list[Effect]]:
    """A flow reading the intent's effects as a settlement will leave them (``later``)."""
    found: list[Effect] = yield from txn(
        lambda conn, now: op.effects(conn, sql.EFFECT_WHERE["intent"], (scope, intent_id, -1)),
        write=False,
    )
    return [e if e.outcome is not None else dataclasses.replace(e, outcome=outcome) for e in found]


def reads_a_snapshot(conn: sqlite3.Connection, path: str) -> bool:
    """Whether the caller's connection is in a transaction that reads a snapshot (of its
    first read), which may be older than the latest commit: one that holds no write lock
    (one that holds it reads the latest rows, its own writes on top)."""
    return conn.in_transaction and (write_lock_free(path) or not holds_write_lock(conn))


def same_answer(theirs: CommitResult, ours: CommitResult) -> bool:
    """Whether the caller's answer and the store's own agree: the same status on the
    same row (present or not, its version and fence; a table's state when it has no
    version column)."""
    return theirs.status is ours.status and _row(theirs.record) == _row(ours.record)


class SQLiteBoundBackend(BoundBackend):
    """The SQLite flows on the caller's ``sqlite3`` connection, inside its transaction."""

    def __init__(self, parent: Any, borrowed: Borrowed) -> None:
        super().__init__(parent, borrowed)
        self._thread = threading.get_ident()  # the caller's, whose connection it is

    def identity_flow(self) -> Flow[object]:
        return identity()

    def _check(self, conn: Any) -> None:
        if self.parent.memory:
            raise memory_refused()
        super()._check(conn)

    def latest(
        self, request: CommitRequest, result: CommitResult, probing: bool
    ) -> Flow[CommitResult]:
        return latest_flow(request, result)

    def _step(self, conn: sqlite3.Connection, step: Txn | Latest) -> Any:
        if isinstance(step, Latest):
            return self._judge_latest(conn, step)
        return run_step(conn, step)

    def _judge_latest(self, conn: sqlite3.Connection, step: Latest) -> CommitResult:
        """The refusal, if the caller's transaction reads the latest rows (none of its own,
        or it holds the write lock) or the store's own reading agrees; else
        ``SerializationFailure``. (The store's connection is asked only by a transaction
        that holds no write lock: the store's may be waiting for one.)"""
        if not reads_a_snapshot(conn, self.parent.path):
            return step.result
        if same_answer(step.result, self.parent.probe(step.request)):
            return step.result
        raise snapshot_too_old("sqlite", step.request)

    # -- leases and recorded effects: on the store's own connection ---------------------
    def acquire(self, name: str, owner: str, ttl: float) -> LeaseAnswer:
        self._not_behind_your_lock()
        return super().acquire(name, owner, ttl)

    def renew(self, name: str, token: int, ttl: float) -> LeaseAnswer:
        self._not_behind_your_lock()
        return super().renew(name, token, ttl)

    def release(self, name: str, token: int) -> LeaseAnswer:
        self._not_behind_your_lock()
        return super().release(name, token)

    def record_effect(self, row: NewEffect) -> Effect:
        self._not_behind_your_lock()
        return super().record_effect(row)

    def mark_effect(
        self, idempotency_key: str, status: str | None, detail_json: str | None, reconcile: bool
    ) -> Effect | None:
        self._not_behind_your_lock()
        return super().mark_effect(idempotency_key, status, detail_json, reconcile)

    def settle_effects(self, scope: str, intent_id: str, outcome: str) -> list[Effect]:
        if not self._behind_your_lock():
            return super().settle_effects(scope, intent_id, outcome)
        # read where the latest rows are (a write transaction's); written later
        found = self._drive(upcoming(scope, intent_id, outcome))
        self.parent.settle_later(scope, intent_id, outcome)
        return found

    def list_effects(self, query: EffectQuery) -> list[Effect]:
        if self._behind_your_lock():  # (the store's connection may be waiting for it)
            found: list[Effect] = self._drive(self.flows.list_effects(query))
            return found
        return super().list_effects(query)

    def _not_behind_your_lock(self) -> None:
        """Refuse, at once, a write on the store's own connection that would wait for
        SQLite's write lock held by the caller's transaction on this very thread (it
        would wait ``busy_timeout``, then fail: the caller cannot commit meanwhile).
        From another thread (a lease's heartbeat) the wait is an ordinary one."""
        if self._behind_your_lock():
            raise behind_your_lock()

    def _behind_your_lock(self) -> bool:
        if threading.get_ident() != self._thread or not might_write(self.borrowed.source):
            return False
        if self.parent.memory or write_lock_free(self.parent.path):
            return False
        return holds_write_lock(self.borrowed.connection())


def might_write(source: object) -> bool:
    """Whether the caller's connection or session may be in a transaction (so may hold
    SQLite's write lock); False only when it certainly is not."""
    state = getattr(source, "in_transaction", True)
    try:
        return bool(state() if callable(state) else state)
    except Exception:  # (a closed connection, an unusual session: ask the database)
        return True


def write_lock_free(path: str) -> bool:
    """Whether SQLite's write lock on the database file is free now (a connection of
    its own tries it, without waiting)."""
    try:
        probe = sqlite3.connect(path, timeout=0, isolation_level=None)
    except sqlite3.Error:
        return True  # (the store's own call will say what is wrong)
    try:
        probe.execute("BEGIN IMMEDIATE")
        probe.execute("ROLLBACK")
        return True
    except sqlite3.OperationalError:
        return False
    finally:
        probe.close()


def holds_write_lock(conn: sqlite3.Connection) -> bool:
    """Whether the caller's connection holds SQLite's write lock, asked in a savepoint
    that is rolled back: a read first, so that a write lock held by another
    connection fails the write at once (SQLite does not wait for the lock to upgrade a
    read transaction); the write changes nothing. If the lock is free at this moment
    (its holder just committed), the write takes it for the caller's transaction,
    which then does hold it."""
    if not conn.in_transaction:
        return False
    try:
        conn.execute("SAVEPOINT fencing_lock")
        conn.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()
        conn.execute("DELETE FROM fencing_leases WHERE 0")
        return True
    except sqlite3.Error:
        return False
    finally:
        _undo(conn, "ROLLBACK TO fencing_lock", "RELEASE fencing_lock")


def memory_refused() -> ConfigurationError:
    return ConfigurationError(
        "sqlite: a store on :memory: has a private database no other connection"
        " reaches; store.using() needs a store on a database file"
    )


def behind_your_lock() -> ConfigurationError:
    return ConfigurationError(
        "sqlite: your transaction holds SQLite's write lock (it has written), and"
        " leases and recorded effects are written on the store's own connection, which"
        " would wait for your commit: acquire leases and record effects before your"
        " transaction writes, or on the store itself (docs/transactions.md, SQLite)"
    )


def run_step(conn: sqlite3.Connection, step: Txn) -> Any:
    """One step on the caller's connection, inside the caller's transaction (see the
    module docstring); SQLite's errors translated."""
    try:
        if not step.begin:
            return step.body(conn, time.time())
        if conn.in_transaction:
            return _in_savepoint(conn, step)
        # (a read ends its own: a SELECT of the caller's own would leave none open)
        alone = conn.isolation_level is None or not step.write
        return _in_new_transaction(conn, step, commit=alone)
    except sqlite3.Error as exc:
        if getattr(exc, "sqlite_errorcode", None) == _BUSY_SNAPSHOT:
            raise SerializationFailure(
                f"sqlite: {exc}: your transaction's snapshot (of its first read) is older"
                " than the latest commit, so it cannot write: roll it back and run it again"
            ) from exc
        raise translate(exc) from exc


def _in_savepoint(conn: sqlite3.Connection, step: Txn) -> Any:
    try:
        conn.execute("SAVEPOINT fencing")
        result = step.body(conn, time.time())
    except BaseException:
        _undo(conn, "ROLLBACK TO fencing", "RELEASE fencing")
        raise
    try:
        conn.execute("RELEASE fencing")
    except BaseException:
        # (interrupted after the release, the savepoint is gone: the undo finds none)
        _undo(conn, "ROLLBACK TO fencing", "RELEASE fencing")
        raise
    return result


def _in_new_transaction(conn: sqlite3.Connection, step: Txn, *, commit: bool) -> Any:
    try:
        conn.execute("BEGIN IMMEDIATE" if step.write else "BEGIN")
        result = step.body(conn, time.time())
        if commit:
            conn.execute("COMMIT")
        elif _refused(result):
            # A refused commit wrote nothing (its claim undone) in the transaction it
            # began, and nothing of the caller's is in it: ended, its write lock is not
            # kept, which a lease taken again on the store's own connection (a lease
            # that ran out while nobody took over) would otherwise wait on.
            conn.execute("ROLLBACK")
    except BaseException:
        _undo(conn, "ROLLBACK")  # (the caller was in no transaction: all of it is ours)
        raise
    return result


def _refused(result: object) -> bool:
    return isinstance(result, CommitResult) and result.status is not Status.APPLIED


def _undo(conn: sqlite3.Connection, *statements: str) -> None:
    """Undo a failed step (whatever interrupted it); a failure here leaves the caller's
    transaction to the caller, who sees the step's own error."""
    for text in statements:
        try:
            if conn.in_transaction:
                conn.execute(text)
        except sqlite3.Error:
            pass
