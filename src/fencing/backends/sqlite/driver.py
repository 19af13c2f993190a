"""SQLite's driver: one connection per store, serialised by a lock (threads of one process
hand over without SQLite's sleeping busy handler); other processes on the same file wait
on ``busy_timeout``. It carries out ``Txn`` steps: begin, run the body, commit; whatever
interrupts a body, and wherever, the transaction is rolled back before the lock is
released, or at the latest by the next call. Effects a view could not settle at once
(the caller's transaction holds the write lock) are settled by ``later.Settler``, on a
connection of its own, as soon as the lock is free."""

from __future__ import annotations

import os
import sqlite3
import threading
import time
import urllib.parse
import weakref
from collections.abc import Sequence
from typing import Any

from ..._borrow import Borrowed
from ..._errors import ConfigurationError, StoreNotMigrated
from ..._request import CommitRequest, CommitResult
from .._base import FlowBackend
from .bound import SQLiteBoundBackend, bind
from .errors import translate
from .flows import SQLiteFlows, Txn
from .later import Settler
from .schema import SCHEMA_VERSION
from .settings import Settings

__all__ = ["SQLiteBackend"]


class SQLiteBackend(FlowBackend):
    """The sync SQLite backend (the async store runs it in a worker thread)."""

    scheme = "sqlite"
    flows: SQLiteFlows

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.flows = SQLiteFlows()
        self._lock = threading.RLock()
        self._conn: sqlite3.Connection | None = self._connect()
        self._settler = Settler(self._connect, self.flows, settings.busy_timeout)
        self._pid = os.getpid()
        ref = weakref.ref(self)
        os.register_at_fork(after_in_child=lambda: _forget_after_fork(ref))

    @property
    def path(self) -> str:
        return self.settings.path

    @property
    def memory(self) -> bool:
        return self.settings.memory

    def _connect(self) -> sqlite3.Connection:
        settings = self.settings
        existing = not settings.create and not settings.memory
        try:
            conn = sqlite3.connect(
                _read_write_uri(settings.path) if existing else settings.path,
                timeout=settings.busy_timeout,
                isolation_level=None,
                check_same_thread=False,
                cached_statements=256,
                uri=existing,
            )
            if not settings.memory and not existing:
                mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
                if str(mode).lower() != "wal":
                    raise ConfigurationError(f"sqlite: could not enable WAL (got {mode})")
            conn.execute(f"PRAGMA synchronous={settings.synchronous}")
            # RETURNING builds its rows in an ephemeral table: in memory, not in a temp
            # file (`fencing bench`: a temp file cost ~15 us of a ~60 us commit).
            conn.execute("PRAGMA temp_store=MEMORY")
        except sqlite3.Error as exc:
            if existing and not os.path.exists(settings.path):
                raise StoreNotMigrated("no such file", None, SCHEMA_VERSION) from None
            raise translate(exc) from exc
        return conn

    @property
    def conn(self) -> sqlite3.Connection:
        conn = self._conn
        if conn is None:
            conn = self._conn = self._connect()
        return conn

    # A commit, a batch and a probe are each one step: run it, without driving its flow
    # (``flows.commit`` is that step, yielded; a store's view drives the flow).
    def commit(self, request: CommitRequest) -> CommitResult:
        result: CommitResult = self._run(self.flows.commit_step(request))
        return result

    def commit_many(self, requests: Sequence[CommitRequest]) -> list[CommitResult]:
        results: list[CommitResult] = self._run(self.flows.commit_many_step(requests))
        return results

    def probe(self, request: CommitRequest) -> CommitResult:
        result: CommitResult = self._run(self.flows.probe_step(request))
        return result

    def _run(self, step: Txn) -> Any:
        """Carry out a step: ``step.body(conn, now)`` in its transaction, then leave the
        lock free for ``step.pause``."""
        result = self._carry(step)
        if step.pause:
            time.sleep(step.pause)
        return result

    def _carry(self, step: Txn) -> Any:
        with self._lock:
            if not step.begin:
                try:
                    return step.body(self.conn, time.time())
                except sqlite3.Error as exc:
                    raise translate(exc) from exc
            conn = self._begin(step.write)
            try:
                result = step.body(conn, time.time())
            except BaseException as exc:
                _abort(conn, exc)
                raise
            try:
                conn.execute("COMMIT")
            except BaseException as exc:
                _abort(conn, exc)
                raise
            return result

    def _begin(self, write: bool) -> sqlite3.Connection:
        """The connection, in a new transaction (the caller holds the lock)."""
        conn = self.conn
        try:
            if conn.in_transaction:
                # A call interrupted (a signal handler's exception) after its BEGIN and
                # before its own cleanup: nothing of it was committed; undo it now.
                conn.execute("ROLLBACK")
            conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
        except BaseException as exc:
            _abort(conn, exc)
            raise
        return conn

    def settle_later(self, scope: str, intent_id: str, outcome: str) -> None:
        """Settle the intent's effects as soon as SQLite's write lock is free (for a view
        whose caller's transaction holds it: ``later``). Never waits for this store's
        lock: the caller may hold the write lock a call holding it waits for."""
        self._settler.put(scope, intent_id, outcome)

    def bind(self, borrowed: Borrowed) -> SQLiteBoundBackend:
        """This store's flows on the caller's ``sqlite3`` connection (``store.using``)."""
        return bind(self, borrowed)

    def close(self) -> None:
        self._settler.close()  # (its own connection: waited for without the lock)
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None


def _read_write_uri(path: str) -> str:
    """``path`` as an SQLite URI that opens it read-write and never creates it."""
    return f"file:{urllib.parse.quote(os.path.abspath(path))}?mode=rw"


def _abort(conn: sqlite3.Connection, exc: BaseException) -> None:
    """Roll back after ``exc`` (whatever it is and wherever it landed), then let the caller
    re-raise it, translated if it is SQLite's."""
    try:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
    except sqlite3.Error:
        pass  # the next call's _begin() rolls back again
    if isinstance(exc, sqlite3.Error):
        raise translate(exc) from exc


def _forget_after_fork(ref: weakref.ReferenceType[SQLiteBackend]) -> None:
    # A connection must not cross fork(); the child opens its own on first use.
    backend = ref()
    if backend is not None and backend._pid != os.getpid():
        backend._conn = None
        # (the parent's queue is the parent's to write)
        backend._settler = Settler(backend._connect, backend.flows, backend.settings.busy_timeout)
        backend._lock = threading.RLock()
        backend._pid = os.getpid()
