"""The SQLite backend: the embedded default (``sqlite:///path.db``, ``sqlite://:memory:``).

One connection per store, serialised by a lock (threads of one process hand over
without SQLite's sleeping busy handler); other processes on the same file wait
on ``busy_timeout``. Every write runs in ``BEGIN IMMEDIATE``, so a commit's check
and write happen under SQLite's write lock: atomic across threads and processes.

The store's clock is the host's wall clock, read by the backend inside the write
transaction; every process sharing the file shares that clock.
"""

from __future__ import annotations

import json
import math
import os
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from types import MappingProxyType
from typing import Any, Final, TypeVar

from .._effects import (
    EFFECT_COLUMNS,
    PENDING,
    PRUNABLE,
    Effect,
    EffectQuery,
    NewEffect,
    effect_from_row,
)
from .._errors import (
    AlreadyExists,
    ConfigurationError,
    FencingError,
    SchemaError,
    StoreError,
    TransientStoreError,
)
from .._request import CommitRequest, CommitResult, LeaseAnswer, Target, table_version
from .._rules import LeaseRow, Status, judge, lease_grant, lease_renewal
from .._values import Record

__all__ = ["SCHEMA_VERSION", "SQLiteBackend"]

T = TypeVar("T")

SCHEMA_VERSION: Final = 3  # 2: fencing_effects; 3: applied intents by (scope, id, key)

# The library's own tables, as reviewed text. Keys have no declared type, so a
# string key and an integer key are stored as what they are.
SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS fencing_schema (
    component TEXT PRIMARY KEY,
    version INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS fencing_records (
    collection TEXT NOT NULL,
    key NOT NULL,
    version INTEGER NOT NULL,
    fence INTEGER NOT NULL DEFAULT 0,
    state TEXT NOT NULL,
    updated_at REAL NOT NULL,
    PRIMARY KEY (collection, key)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS fencing_applied (
    scope TEXT NOT NULL,
    intent_id TEXT NOT NULL,
    key NOT NULL,
    applied_at REAL NOT NULL,
    PRIMARY KEY (scope, intent_id, key)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS fencing_applied_at ON fencing_applied (applied_at);
CREATE TABLE IF NOT EXISTS fencing_fences (
    scope TEXT NOT NULL,
    key NOT NULL,
    fence INTEGER NOT NULL,
    PRIMARY KEY (scope, key)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS fencing_leases (
    name TEXT PRIMARY KEY,
    owner TEXT,
    token INTEGER NOT NULL,
    expires_at REAL NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS fencing_tombstones (
    collection TEXT NOT NULL,
    key NOT NULL,
    version INTEGER NOT NULL,
    PRIMARY KEY (collection, key)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS fencing_effects (
    idempotency_key TEXT PRIMARY KEY,
    scope TEXT NOT NULL,
    record_key TEXT NOT NULL,
    intent_id TEXT NOT NULL,
    transition TEXT NOT NULL,
    name TEXT NOT NULL,
    status TEXT NOT NULL,
    detail TEXT,
    outcome TEXT,
    reconciled_at REAL,
    recorded_at REAL NOT NULL,
    updated_at REAL NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS fencing_effects_intent ON fencing_effects (scope, intent_id);
CREATE INDEX IF NOT EXISTS fencing_effects_open ON fencing_effects (recorded_at)
    WHERE outcome IS NOT NULL AND reconciled_at IS NULL;
"""

# 2 -> 3: rebuild fencing_applied with (scope, intent_id, key) as its primary key
_APPLIED_BY_KEY: Final = (
    "CREATE TABLE fencing_applied_v3 (scope TEXT NOT NULL, intent_id TEXT NOT NULL,"
    " key NOT NULL, applied_at REAL NOT NULL, PRIMARY KEY (scope, intent_id, key))"
    " WITHOUT ROWID",
    "INSERT INTO fencing_applied_v3 SELECT scope, intent_id, key, applied_at FROM fencing_applied",
    "DROP TABLE fencing_applied",
    "ALTER TABLE fencing_applied_v3 RENAME TO fencing_applied",
    "CREATE INDEX IF NOT EXISTS fencing_applied_at ON fencing_applied (applied_at)",
)

_EFFECT_ROW: Final = ", ".join(EFFECT_COLUMNS)
_EFFECT_ORDER: Final = " ORDER BY recorded_at, idempotency_key LIMIT ?"
_EFFECT_WHERE: Final = {
    "key": "idempotency_key = ?",
    "intent": "scope = ? AND intent_id = ?",
    "open": "outcome IS NOT NULL AND reconciled_at IS NULL",
}

_CLAIM: Final = (
    "INSERT INTO fencing_applied (scope, intent_id, key, applied_at) VALUES (?, ?, ?, ?)"
    " ON CONFLICT DO NOTHING"
)
_UNCLAIM: Final = "DELETE FROM fencing_applied WHERE scope = ? AND intent_id = ? AND key = ?"
# An intent id names work on one key: the same id applied to another key is not a duplicate.
_IS_APPLIED: Final = "SELECT 1 FROM fencing_applied WHERE scope = ? AND intent_id = ? AND key = ?"
_LEASE_LIVE: Final = (
    " AND EXISTS (SELECT 1 FROM fencing_leases WHERE name = ? AND token = ?"
    " AND owner IS NOT NULL AND expires_at > ?)"
)
_COLLECTION_UPDATE: Final = (
    "UPDATE fencing_records SET state = ?, version = version + 1, updated_at = ?{fence_set}"
    " WHERE collection = ? AND key = ? AND version = ?{fence_where} RETURNING version, fence"
)
_COLLECTION_UPDATE_PLAIN: Final = _COLLECTION_UPDATE.format(fence_set="", fence_where="")
_COLLECTION_UPDATE_FENCED: Final = _COLLECTION_UPDATE.format(
    fence_set=", fence = max(fence, ?)", fence_where=" AND fence <= ?" + _LEASE_LIVE
)
_READ_RECORD: Final = (
    "SELECT version, fence, state FROM fencing_records WHERE collection = ? AND key = ?"
)
_PROBE_RECORD: Final = (
    "SELECT r.version, r.fence, r.state, EXISTS (" + _IS_APPLIED + ")"
    " FROM fencing_records AS r WHERE r.collection = ? AND r.key = ?"
)
_READ_FENCE: Final = "SELECT fence FROM fencing_fences WHERE scope = ? AND key = ?"
_FENCE_OF_ROW: Final = "(SELECT f.fence FROM fencing_fences AS f WHERE f.scope = ? AND f.key = ?)"
_RAISE_FENCE: Final = (
    "INSERT INTO fencing_fences (scope, key, fence) VALUES (?, ?, ?)"
    " ON CONFLICT (scope, key) DO UPDATE SET fence = max(fence, excluded.fence)"
)
_READ_LEASE: Final = "SELECT owner, token, expires_at FROM fencing_leases WHERE name = ?"
_WRITE_LEASE: Final = (
    "INSERT INTO fencing_leases (name, owner, token, expires_at) VALUES (?, ?, ?, ?)"
    " ON CONFLICT (name) DO UPDATE SET owner = excluded.owner, token = excluded.token,"
    " expires_at = excluded.expires_at"
)

_SYNC_MODES: Final = {"full": "FULL", "normal": "NORMAL", "extra": "EXTRA"}


def quote(identifier: str) -> str:
    """Quote an identifier already checked by ``check_column``."""
    return '"' + identifier.replace('"', '""') + '"'


def _translate(exc: sqlite3.Error) -> FencingError:
    text = str(exc)
    if isinstance(exc, sqlite3.OperationalError) and (
        "locked" in text or "busy" in text or "disk I/O" in text
    ):
        return TransientStoreError(f"sqlite: {text}")
    if "no such table" in text or "no such column" in text:
        return SchemaError(f"sqlite: {text} (run store.migrate() / fencing migrate URL?)")
    return StoreError(f"sqlite: {text}")


class SQLiteBackend:
    scheme = "sqlite"

    def __init__(self, path: str, *, synchronous: str = "full", busy_timeout: float = 30.0) -> None:
        mode = _SYNC_MODES.get(synchronous.lower())
        if mode is None:
            raise ConfigurationError(
                f"sqlite synchronous={synchronous!r}: use full (default), normal or extra"
            )
        self.path = path
        self.synchronous = mode
        self.busy_timeout = busy_timeout
        self._lock = threading.RLock()
        self._conn: sqlite3.Connection | None = self._connect()
        self._pid = os.getpid()
        self._sql_cache: dict[tuple[Any, ...], str] = {}
        ref = weakref.ref(self)
        os.register_at_fork(after_in_child=lambda: _forget_after_fork(ref))

    @property
    def memory(self) -> bool:
        return self.path == ":memory:"

    def _connect(self) -> sqlite3.Connection:
        try:
            conn = sqlite3.connect(
                self.path,
                timeout=self.busy_timeout,
                isolation_level=None,
                check_same_thread=False,
                cached_statements=256,
            )
            if not self.memory:
                mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
                if str(mode).lower() != "wal":
                    raise ConfigurationError(f"sqlite: could not enable WAL (got {mode})")
            conn.execute(f"PRAGMA synchronous={self.synchronous}")
            # RETURNING builds its rows in an ephemeral table: in memory, not in a temp
            # file (`fencing bench`: a temp file cost ~15 us of a ~60 us commit).
            conn.execute("PRAGMA temp_store=MEMORY")
        except sqlite3.Error as exc:
            raise _translate(exc) from exc
        return conn

    @property
    def conn(self) -> sqlite3.Connection:
        conn = self._conn
        if conn is None:
            conn = self._conn = self._connect()
        return conn

    @contextmanager
    def _txn(self, write: bool = True) -> Iterator[sqlite3.Connection]:
        with self._lock:
            conn = self._begin(write)
            try:
                yield conn
            except BaseException as exc:
                self._abort(conn, exc)
                raise
            self._end(conn)

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
            self._abort(conn, exc)
            raise
        return conn

    @staticmethod
    def _abort(conn: sqlite3.Connection, exc: BaseException) -> None:
        """Roll back after ``exc`` (whatever it is and wherever it landed), then let the
        caller re-raise it, translated if it is SQLite's."""
        try:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
        except sqlite3.Error:
            pass  # the next call's _begin() rolls back again
        if isinstance(exc, sqlite3.Error):
            raise _translate(exc) from exc

    def _end(self, conn: sqlite3.Connection) -> None:
        try:
            conn.execute("COMMIT")
        except BaseException as exc:
            self._abort(conn, exc)
            raise

    def _run(self, body: Callable[[sqlite3.Connection, float], T], write: bool = True) -> T:
        """``body(conn, now)`` in a transaction: ``_txn`` for the hot paths.

        The same steps and error handling as ``_txn()``, without a generator-based
        context manager around every call; ``now`` is read once the transaction began.
        Whatever interrupts it, and wherever, the transaction is rolled back before the
        lock is released, or at the latest by the next call (``_begin``).
        """
        with self._lock:
            conn = self._begin(write)
            try:
                result = body(conn, time.time())
            except BaseException as exc:
                self._abort(conn, exc)
                raise
            self._end(conn)
            return result

    # -- schema -------------------------------------------------------------------
    def migrate(self) -> None:
        with self._txn() as conn:
            for statement in SCHEMA.split(";"):
                if statement.strip():
                    conn.execute(statement)
            row = conn.execute(
                "SELECT version FROM fencing_schema WHERE component = 'core'"
            ).fetchone()
            if row is None:
                conn.execute("INSERT INTO fencing_schema VALUES ('core', ?)", (SCHEMA_VERSION,))
            elif row[0] > SCHEMA_VERSION:
                raise SchemaError(
                    f"this store's schema is version {row[0]}, newer than this fencing"
                    f" ({SCHEMA_VERSION}); upgrade fencing"
                )
            elif row[0] < SCHEMA_VERSION:  # 1 -> 2 only added tables, made above
                if row[0] < 3:  # 2 -> 3: the applied intents' key joins their primary key
                    for statement in _APPLIED_BY_KEY:
                        conn.execute(statement)
                conn.execute(
                    "UPDATE fencing_schema SET version = ? WHERE component = 'core'",
                    (SCHEMA_VERSION,),
                )

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def columns(self, target: Target, declare: frozenset[str] | None = None) -> frozenset[str]:
        with self._lock:
            try:
                rows = self.conn.execute(f"PRAGMA table_info({quote(target.name)})").fetchall()
            except sqlite3.Error as exc:
                raise _translate(exc) from exc
        if not rows:
            raise SchemaError(f"table {target.name!r} does not exist")
        return frozenset(r[1] for r in rows)

    # -- records ------------------------------------------------------------------
    def _read(self, conn: sqlite3.Connection, target: Target, key: str | int) -> Record | None:
        if target.kind == "collection":
            row = conn.execute(_READ_RECORD, (target.name, key)).fetchone()
            if row is None:
                return None
            return Record(target.name, key, row[0], row[1], json.loads(row[2]))
        cur = conn.execute(
            f"SELECT * FROM {quote(target.name)} WHERE {quote(target.key_column)} = ?", (key,)
        )
        found = cur.fetchone()
        if found is None:
            return None
        fence = conn.execute(_READ_FENCE, (target.scope, key)).fetchone()
        return self._table_record(target, key, cur.description, found, fence[0] if fence else 0)

    @staticmethod
    def _table_record(
        target: Target, key: str | int, description: Any, row: Sequence[Any], fence: int
    ) -> Record:
        values = dict(zip([d[0] for d in description], row, strict=True))
        vcol = target.version_column
        version = table_version(values.pop(vcol), target, key) if vcol else 0
        values.pop(target.key_column, None)
        # ``values`` is ours alone: hand it over read-only, without Record copying it.
        return Record(target.name, key, version, fence, MappingProxyType(values), "table")

    def read(self, target: Target, key: str | int) -> Record | None:
        return self._run(lambda conn, now: self._read(conn, target, key), write=False)

    def _judge(self, conn: sqlite3.Connection, request: CommitRequest, now: float) -> CommitResult:
        target, intent, lease = request.target, request.intent, request.lease
        record = self._read(conn, target, intent.key)
        args = (target.scope, request.claim_id, intent.key)
        applied = conn.execute(_IS_APPLIED, args).fetchone() is not None
        row = self._lease_row(conn, lease.name) if lease is not None else None
        return CommitResult(judge(record, applied, intent, lease, row, now), record)

    def probe(self, request: CommitRequest) -> CommitResult:
        if request.lease is not None:
            return self._run(lambda conn, now: self._judge(conn, request, now), write=False)
        # Unfenced: one statement reads the record and whether the intent is applied,
        # in one snapshot, so no explicit transaction is needed around it.
        target, intent = request.target, request.intent
        with self._lock:
            try:
                if target.kind == "collection":
                    args = (target.scope, request.claim_id, intent.key, target.name, intent.key)
                    found = self.conn.execute(_PROBE_RECORD, args).fetchone()
                    record = None
                    if found is not None:
                        state = json.loads(found[2])
                        record = Record(target.name, intent.key, found[0], found[1], state)
                else:
                    row_args = (
                        target.scope,
                        intent.key,
                        target.scope,
                        request.claim_id,
                        intent.key,
                        intent.key,
                    )
                    cur = self.conn.execute(self._row_sql(target, probe=True), row_args)
                    found = cur.fetchone()
                    record = None
                    if found is not None:
                        fence, names, values = found[-2] or 0, cur.description[:-2], found[:-2]
                        record = self._table_record(target, intent.key, names, values, fence)
            except sqlite3.Error as exc:
                raise _translate(exc) from exc
        applied = found is not None and bool(found[-1])
        return CommitResult(judge(record, applied, intent, None, None, time.time()), record)

    def _row_sql(self, target: Target, probe: bool) -> str:
        """A user row and its fence (and, to probe, whether an intent is applied)."""
        shape = ("probe" if probe else "row", target.name, target.key_column)
        sql = self._sql_cache.get(shape)
        if sql is None:
            applied = f", EXISTS ({_IS_APPLIED})" if probe else ""
            sql = (
                f"SELECT t.*, {_FENCE_OF_ROW}{applied} FROM {quote(target.name)}"
                f" AS t WHERE t.{quote(target.key_column)} = ?"
            )
            if len(self._sql_cache) < 1024:
                self._sql_cache[shape] = sql
        return sql

    def create(self, target: Target, key: str | int, state_json: str) -> Record:
        with self._txn() as conn:
            # A record created again after a delete continues the deleted one's
            # versions, so an intent decided against the deleted record never matches.
            gone = conn.execute(
                "SELECT version FROM fencing_tombstones WHERE collection = ? AND key = ?",
                (target.name, key),
            ).fetchone()
            version = (gone[0] if gone else 0) + 1
            try:
                conn.execute(
                    "INSERT INTO fencing_records (collection, key, version, fence, state,"
                    " updated_at) VALUES (?, ?, ?, 0, ?, ?)",
                    (target.name, key, version, state_json, time.time()),
                )
            except sqlite3.IntegrityError:
                raise AlreadyExists(f"{target.name}/{key} already exists") from None
        return Record(target.name, key, version, 0, json.loads(state_json))

    def delete(self, target: Target, key: str | int) -> bool:
        with self._txn() as conn:
            gone = conn.execute(
                "DELETE FROM fencing_records WHERE collection = ? AND key = ? RETURNING version",
                (target.name, key),
            ).fetchone()
            if gone is None:
                return False
            conn.execute(
                "INSERT INTO fencing_tombstones (collection, key, version) VALUES (?, ?, ?)"
                " ON CONFLICT (collection, key) DO UPDATE"
                " SET version = max(version, excluded.version)",
                (target.name, key, gone[0]),
            )
            return True

    def _update_sql(self, request: CommitRequest) -> str:
        """The conditional UPDATE for this shape of request (cached per shape)."""
        target, intent = request.target, request.intent
        fenced = request.lease is not None
        if target.kind == "collection":
            return _COLLECTION_UPDATE_FENCED if fenced else _COLLECTION_UPDATE_PLAIN
        guard = intent.guard
        # Plain tuples of strings: they hash and compare in C (a dataclass would not).
        shape = (
            target.name,
            target.key_column,
            target.version_column,
            fenced,
            intent.expected_version is None,
            tuple(request.state),
            tuple(guard) if guard else (),
        )
        sql = self._sql_cache.get(shape)
        if sql is not None:
            return sql
        sets = [f"{quote(c)} = ?" for c in request.state]
        where = [f"{quote(target.key_column)} = ?"]
        if target.version_column:
            v = quote(target.version_column)
            sets.append(f"{v} = {v} + 1")
            if intent.expected_version is not None:
                where.append(f"{v} = ?")
        where += [f"{quote(c)} IS ?" for c in guard or ()]
        if fenced:
            where.append(
                "NOT EXISTS (SELECT 1 FROM fencing_fences WHERE scope = ? AND key = ?"
                " AND fence > ?)" + _LEASE_LIVE
            )
        # No RETURNING: the row is read back by ``_row_sql`` in the same transaction,
        # which SQLite does faster than it builds RETURNING's ephemeral table.
        sql = f"UPDATE {quote(target.name)} SET {', '.join(sets)} WHERE {' AND '.join(where)}"
        if len(self._sql_cache) < 1024:
            self._sql_cache[shape] = sql
        return sql

    def _params(self, request: CommitRequest, now: float) -> list[Any]:
        target, intent, lease = request.target, request.intent, request.lease
        if target.kind == "collection":
            params: list[Any] = [request.state_json, now]
            if lease is not None:
                params.append(lease.token)
            params += [target.name, intent.key, intent.expected_version]
            if lease is not None:
                params += [lease.token, lease.name, lease.token, now]
            return params
        params = list(request.state.values())
        params.append(intent.key)
        if target.version_column and intent.expected_version is not None:
            params.append(intent.expected_version)
        if intent.guard:
            params += intent.guard.values()
        if lease is not None:
            params += [target.scope, intent.key, lease.token, lease.name, lease.token, now]
        return params

    def _commit(self, conn: sqlite3.Connection, request: CommitRequest, now: float) -> CommitResult:
        target, intent, lease = request.target, request.intent, request.lease
        collection = target.kind == "collection"
        if collection and intent.guard is not None:
            # A JSON guard is judged in Python, under the write lock this transaction holds.
            judged = self._judge(conn, request, now)
            if judged.status is not Status.OK:
                return judged
        scope, key = target.scope, intent.key
        if conn.execute(_CLAIM, (scope, request.claim_id, key, now)).rowcount == 0:
            return self._judge(conn, request, now)  # already applied: Duplicate
        cur = conn.execute(self._update_sql(request), self._params(request, now))
        if collection:
            row = cur.fetchone()  # RETURNING version, fence
            if row is not None:
                record = Record(target.name, key, row[0], row[1], request.state)
                return CommitResult(Status.APPLIED, record)
        elif cur.rowcount > 0:
            if lease is not None:
                conn.execute(_RAISE_FENCE, (scope, key, lease.token))
            cur = conn.execute(self._row_sql(target, probe=False), (scope, key, key))
            row = cur.fetchone()
            # every column of the row but the last, which is its fence
            values = dict(zip([d[0] for d in cur.description[:-1]], row))  # noqa: B905
            fence = row[-1] or 0
            vcol = target.version_column
            version = table_version(values.pop(vcol), target, key) if vcol else 0
            values.pop(target.key_column, None)
            record = Record(target.name, key, version, fence, MappingProxyType(values), "table")
            return CommitResult(Status.APPLIED, record)
        conn.execute(_UNCLAIM, (scope, request.claim_id, key))
        return self._judge(conn, request, now)

    def commit(self, request: CommitRequest) -> CommitResult:
        return self._run(lambda conn, now: self._commit(conn, request, now))

    def commit_many(self, requests: Sequence[CommitRequest]) -> list[CommitResult]:
        def body(conn: sqlite3.Connection, now: float) -> list[CommitResult]:
            return [self._commit(conn, r, now) for r in requests]

        return self._run(body)

    # -- leases -------------------------------------------------------------------
    @staticmethod
    def _lease_row(conn: sqlite3.Connection, name: str) -> LeaseRow | None:
        row = conn.execute(_READ_LEASE, (name,)).fetchone()
        return None if row is None else LeaseRow(name, row[0], row[1], row[2])

    def _write_lease(self, conn: sqlite3.Connection, row: LeaseRow) -> None:
        conn.execute(_WRITE_LEASE, (row.name, row.owner, row.token, row.expires_at))

    def acquire(self, name: str, owner: str, ttl: float) -> LeaseAnswer:
        def body(conn: sqlite3.Connection, now: float) -> LeaseAnswer:
            old = self._lease_row(conn, name)
            new = lease_grant(name, old, owner, ttl, now)
            if new is not None:
                self._write_lease(conn, new)
            return LeaseAnswer(new is not None, new or old, now)

        return self._run(body)

    def renew(self, name: str, token: int, ttl: float) -> LeaseAnswer:
        def body(conn: sqlite3.Connection, now: float) -> LeaseAnswer:
            old = self._lease_row(conn, name)
            new = lease_renewal(old, token, ttl, now)
            if new is not None:
                self._write_lease(conn, new)
            return LeaseAnswer(new is not None, new or old, now)

        return self._run(body)

    def release(self, name: str, token: int) -> LeaseAnswer:
        def body(conn: sqlite3.Connection, now: float) -> LeaseAnswer:
            old = self._lease_row(conn, name)
            if old is None or old.token != token or not old.held_at(now):
                return LeaseAnswer(False, old, now)
            new = LeaseRow(name, None, token, 0.0)
            self._write_lease(conn, new)
            return LeaseAnswer(True, new, now)

        return self._run(body)

    def lease_state(self, name: str) -> LeaseAnswer:
        with self._txn(write=False) as conn:
            return LeaseAnswer(False, self._lease_row(conn, name), time.time())

    def prune(self, older_than: float) -> int:
        with self._txn() as conn:
            cur = conn.execute(
                "DELETE FROM fencing_applied WHERE applied_at < ?", (time.time() - older_than,)
            )
            return cur.rowcount

    # -- effects ------------------------------------------------------------------
    @staticmethod
    def _effects(conn: sqlite3.Connection, where: str, args: Sequence[Any]) -> list[Effect]:
        sql = f"SELECT {_EFFECT_ROW} FROM fencing_effects WHERE {where}{_EFFECT_ORDER}"
        return [effect_from_row(r) for r in conn.execute(sql, args).fetchall()]

    def record_effect(self, row: NewEffect) -> Effect:
        def body(conn: sqlite3.Connection, now: float) -> Effect:
            conn.execute(
                f"INSERT INTO fencing_effects ({_EFFECT_ROW})"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, NULL, NULL, ?, ?)"
                " ON CONFLICT (idempotency_key) DO NOTHING",
                (*row, now, now),
            )
            return self._effects(conn, _EFFECT_WHERE["key"], (row[0], 1))[0]

        return self._run(body)

    def mark_effect(
        self, idempotency_key: str, status: str | None, detail_json: str | None, reconcile: bool
    ) -> Effect | None:
        def body(conn: sqlite3.Connection, now: float) -> Effect | None:
            conn.execute(
                "UPDATE fencing_effects SET status = coalesce(?, status),"
                " detail = coalesce(?, detail), updated_at = ?,"
                " reconciled_at = CASE WHEN ? THEN coalesce(reconciled_at, ?)"
                " ELSE reconciled_at END WHERE idempotency_key = ?",
                (status, detail_json, now, reconcile, now, idempotency_key),
            )
            found = self._effects(conn, _EFFECT_WHERE["key"], (idempotency_key, 1))
            return found[0] if found else None

        return self._run(body)

    def settle_effects(self, scope: str, intent_id: str, outcome: str) -> list[Effect]:
        def body(conn: sqlite3.Connection, now: float) -> list[Effect]:
            conn.execute(
                "UPDATE fencing_effects SET outcome = ?, updated_at = ?"
                " WHERE scope = ? AND intent_id = ? AND outcome IS NULL",
                (outcome, now, scope, intent_id),
            )
            return self._effects(conn, _EFFECT_WHERE["intent"], (scope, intent_id, -1))

        return self._run(body)

    def list_effects(self, query: EffectQuery) -> list[Effect]:
        args: list[Any]
        if query.idempotency_key is not None:
            where, args = _EFFECT_WHERE["key"], [query.idempotency_key]
        elif query.intent_id is not None:
            where, args = _EFFECT_WHERE["intent"], [query.scope, query.intent_id]
        elif query.pending_for is not None:
            where, args = PENDING.format(cutoff="?"), [time.time() - query.pending_for]
        else:
            where, args = _EFFECT_WHERE["open"], []
        args.append(query.limit)
        return self._run(lambda conn, now: self._effects(conn, where, args), write=False)

    def prune_effects(self, older_than: float) -> int:
        sql = "DELETE FROM fencing_effects WHERE " + PRUNABLE.format(cutoff=":cutoff")
        return self._run(lambda conn, now: conn.execute(sql, {"cutoff": now - older_than}).rowcount)


def _forget_after_fork(ref: weakref.ReferenceType[SQLiteBackend]) -> None:
    # A connection must not cross fork(); the child opens its own on first use.
    backend = ref()
    if backend is not None and backend._pid != os.getpid():
        backend._conn = None
        backend._lock = threading.RLock()
        backend._pid = os.getpid()


def _sqlite_from_url(url: Any, options: dict[str, Any]) -> SQLiteBackend:
    sync = options.pop("synchronous", url.option("synchronous", "full"))
    try:
        busy = float(options.pop("busy_timeout", url.option("busy_timeout", "30")))
    except ValueError:
        busy = math.nan
    if not 0 <= busy <= 3600:  # also refuses nan and inf
        raise ConfigurationError("sqlite busy_timeout must be 0 to 3600 seconds")
    unknown = (set(url.options) - {"synchronous", "busy_timeout"}) | set(options)
    if unknown:
        raise ConfigurationError(f"unknown sqlite option(s) {sorted(unknown)}")
    return SQLiteBackend(url.path, synchronous=sync, busy_timeout=busy)


def open_backend(url: Any, **options: Any) -> SQLiteBackend:
    """``sqlite:///path.db`` (WAL, synchronous=FULL), ``sqlite://:memory:``."""
    return _sqlite_from_url(url, options)


async def open_async_backend(url: Any, **options: Any) -> Any:
    from ._contract import ThreadedAsyncBackend

    return ThreadedAsyncBackend(_sqlite_from_url(url, options))
