"""SQLite on the caller's ``sqlite3`` connection (``store.using(conn)``).

A ``Txn`` step's body runs inside the caller's transaction:

* the connection is in a transaction: the body runs in a savepoint (``SAVEPOINT
  fencing``), released when it succeeds and rolled back to when it fails, so a failed
  step leaves the caller's own work as it was;
* no transaction, and the connection opens them implicitly (``isolation_level`` not
  None, the ``sqlite3`` default): the step begins one (``BEGIN IMMEDIATE`` when it
  writes, so the write lock is taken before the check) and leaves it open; the caller
  commits it. A failed first step rolls it back: nothing of the caller's was in it;
* no transaction, autocommit (``isolation_level=None``): the caller has no transaction
  to join, and the step runs in one of its own, as on the store's connection.

The connection must reach the store's database file (``PRAGMA database_list``): a
store on ``:memory:`` has no other connection, so it is never one.
"""

from __future__ import annotations

import os
import sqlite3
import time
from typing import Any

from ..._borrow import Borrowed
from ..._errors import ConfigurationError, InvalidInput
from ..._flow import Flow
from .._bound import BoundBackend
from .errors import translate
from .flows import Txn

__all__ = ["SQLiteBoundBackend", "bind"]


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


def _identity() -> Flow[object]:
    path: str = yield Txn(_where, begin=False)
    return f"the database file {path!r}" if path else "a private in-memory database"


class SQLiteBoundBackend(BoundBackend):
    """The SQLite flows on the caller's ``sqlite3`` connection, inside its transaction."""

    def identity_flow(self) -> Flow[object]:
        return _identity()

    def _check(self, conn: Any) -> None:
        if self.parent.memory:
            raise self._memory()
        super()._check(conn)

    def _memory(self) -> Exception:
        return ConfigurationError(
            "sqlite: a store on :memory: has a private database no other connection"
            " reaches; store.using() needs a store on a database file"
        )

    def _step(self, conn: sqlite3.Connection, step: Txn) -> Any:
        try:
            if not step.begin:
                return step.body(conn, time.time())
            if conn.in_transaction:
                return _in_savepoint(conn, step)
            return _in_new_transaction(conn, step, commit=conn.isolation_level is None)
        except sqlite3.Error as exc:
            raise translate(exc) from exc


def _in_savepoint(conn: sqlite3.Connection, step: Txn) -> Any:
    conn.execute("SAVEPOINT fencing")
    try:
        result = step.body(conn, time.time())
    except BaseException:
        _undo(conn, "ROLLBACK TO fencing", "RELEASE fencing")
        raise
    conn.execute("RELEASE fencing")
    return result


def _in_new_transaction(conn: sqlite3.Connection, step: Txn, *, commit: bool) -> Any:
    conn.execute("BEGIN IMMEDIATE" if step.write else "BEGIN")
    try:
        result = step.body(conn, time.time())
        if commit:
            conn.execute("COMMIT")
    except BaseException:
        _undo(conn, "ROLLBACK")
        raise
    return result


def _undo(conn: sqlite3.Connection, *statements: str) -> None:
    """Undo a failed step (whatever interrupted it); a failure here leaves the caller's
    transaction to the caller, who sees the step's own error."""
    try:
        for text in statements:
            if conn.in_transaction:
                conn.execute(text)
    except sqlite3.Error:
        pass
