"""SQLite: fencing beside the raw ``sqlite3`` code that gives the same guarantee.

fencing runs on its store's file; the hand-written baseline runs on a second file in
the same directory, with the same schema (fencing's tables renamed ``fencing_bench_*``,
the applied table's ``applied_at`` index included: retention needs it either way), the
same journal mode and the same ``synchronous`` setting. Two files, so that each side
pays for its own WAL growth and checkpoints.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sqlite3
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any, Final

import fencing

from .._url import StoreURL
from ..backends.sqlite import SQLiteBackend
from ._answer import Answer
from ._common import (
    ANSWER_ROWS,
    KEYS,
    START,
    USING_OPERATION,
    Bench,
    Cursor,
    collection_state,
    decide_state,
    hand_lease_cycle,
    new_id,
    one_check,
)
from ._harness import NORMAL_TARGET, SINGLE_TARGET, Block, Side, Skip

__all__ = ["SQLiteBench"]


# The hand-written side's schema: fencing's own DDL under other names.
BASELINE_SCHEMA: Final = """
CREATE TABLE fencing_bench_records (
    collection TEXT NOT NULL,
    key NOT NULL,
    version INTEGER NOT NULL,
    fence INTEGER NOT NULL DEFAULT 0,
    state TEXT NOT NULL,
    updated_at REAL NOT NULL,
    PRIMARY KEY (collection, key)
) WITHOUT ROWID;
CREATE TABLE fencing_bench_applied (
    scope TEXT NOT NULL,
    intent_id TEXT NOT NULL,
    key NOT NULL,
    applied_at REAL NOT NULL,
    PRIMARY KEY (scope, intent_id)
) WITHOUT ROWID;
CREATE INDEX fencing_bench_applied_at ON fencing_bench_applied (applied_at);
CREATE TABLE fencing_bench_leases (
    name TEXT PRIMARY KEY,
    owner TEXT,
    token INTEGER NOT NULL,
    expires_at REAL NOT NULL
) WITHOUT ROWID;
"""

# The user-owned table both sides guard (fencing's copy is named ``bench_orders_<id>``).
ORDERS_DDL: Final = (
    "CREATE TABLE {name} (id INTEGER PRIMARY KEY, version INTEGER NOT NULL DEFAULT 1,"
    " status VARCHAR(40), total INTEGER, note VARCHAR(200))"
)
ORDERS_ROWS: Final = "INSERT INTO {name} (id, status, total) VALUES (?, 'new', 0)"

INSERT_RECORD: Final = (
    "INSERT INTO fencing_bench_records (collection, key, version, fence, state, updated_at)"
    " VALUES (?, ?, 1, 0, ?, ?)"
)
UPDATE_RECORD: Final = (
    "UPDATE fencing_bench_records SET state = ?, version = version + 1, updated_at = ?"
    " WHERE collection = ? AND key = ? AND version = ?"
)
UPDATE_RECORD_FENCED: Final = (
    "UPDATE fencing_bench_records SET state = ?, version = version + 1,"
    " fence = max(fence, ?), updated_at = ?"
    " WHERE collection = ? AND key = ? AND version = ? AND fence <= ?"
    " AND EXISTS (SELECT 1 FROM fencing_bench_leases WHERE name = ? AND token = ?"
    " AND owner IS NOT NULL AND expires_at > ?)"
)
UPDATE_ORDER: Final = (
    "UPDATE fencing_bench_orders SET status = ?, total = ?, version = version + 1"
    " WHERE id = ? AND version = ?"
)
READ_RECORD: Final = (
    "SELECT version, state FROM fencing_bench_records WHERE collection = ? AND key = ?"
)
INSERT_APPLIED: Final = (
    "INSERT INTO fencing_bench_applied (scope, intent_id, key, applied_at) VALUES (?, ?, ?, ?)"
)
ACQUIRE: Final = (
    "INSERT INTO fencing_bench_leases (name, owner, token, expires_at) VALUES (?, ?, 1, ?)"
    " ON CONFLICT (name) DO UPDATE SET owner = excluded.owner, token = token + 1,"
    " expires_at = excluded.expires_at WHERE owner IS NULL OR expires_at <= ?"
    " RETURNING token"
)
RENEW: Final = (
    "UPDATE fencing_bench_leases SET expires_at = ?"
    " WHERE name = ? AND token = ? AND owner IS NOT NULL AND expires_at > ?"
)
RELEASE: Final = (
    "UPDATE fencing_bench_leases SET owner = NULL, expires_at = 0"
    " WHERE name = ? AND token = ? AND owner IS NOT NULL AND expires_at > ?"
)

# The same-answer baseline: the row at its new version from RETURNING; on refusal the
# current row and whether the intent id was applied (duplicate) or not (stale).
UPDATE_RECORD_RETURNING: Final = UPDATE_RECORD + " RETURNING version"
UPDATE_FENCED_RETURNING: Final = UPDATE_RECORD_FENCED + " RETURNING version"
UPDATE_ORDER_RETURNING: Final = UPDATE_ORDER + " RETURNING version, status, total, note"
REFUSED_RECORD: Final = (
    "SELECT version, state, EXISTS (SELECT 1 FROM fencing_bench_applied"
    " WHERE scope = ? AND intent_id = ?) FROM fencing_bench_records"
    " WHERE collection = ? AND key = ?"
)
REFUSED_ORDER: Final = (
    "SELECT version, status, total, note, EXISTS (SELECT 1 FROM fencing_bench_applied"
    " WHERE scope = ? AND intent_id = ?) FROM fencing_bench_orders WHERE id = ?"
)

COMMIT_METHOD: Final = (
    "BEGIN IMMEDIATE; UPDATE records SET state=json.dumps(state), version=version+1"
    " WHERE key=? AND version=?; INSERT applied (primary key); COMMIT"
)

SQLITE_ANSWERS: Final = {
    "commit": "BEGIN IMMEDIATE; UPDATE ... AND version=? RETURNING version; INSERT applied;"
    " COMMIT (refused: SELECT version, state, EXISTS applied id)",
    "table": "BEGIN IMMEDIATE; UPDATE orders ... RETURNING version, status, total, note;"
    " INSERT applied; COMMIT",
    "apply": "SELECT version, state; decide; the same-answer commit",
    "many": "BEGIN IMMEDIATE; per item UPDATE ... RETURNING version; INSERT applied"
    " (refused: SELECT the row, EXISTS applied); COMMIT",
    "fenced": "BEGIN IMMEDIATE; UPDATE ... fence, lease EXISTS ... RETURNING version;"
    " INSERT applied; COMMIT",
}


class SQLiteHand:
    """The raw sqlite3 code a careful engineer would write for each operation.

    Every write is ``BEGIN IMMEDIATE ... COMMIT`` (take the write lock first, as
    fencing does, so that no other process can slip in between check and write) and
    rolls back on any error.
    """

    def __init__(self, path: str, synchronous: str) -> None:
        self.path = path
        self.conn = sqlite3.connect(
            path, timeout=30.0, isolation_level=None, check_same_thread=False, cached_statements=256
        )
        if path != ":memory:":
            self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute(f"PRAGMA synchronous={synchronous}")
        self.conn.executescript(BASELINE_SCHEMA)
        self.conn.execute(ORDERS_DDL.format(name="fencing_bench_orders"))
        self.conn.executemany(
            ORDERS_ROWS.format(name="fencing_bench_orders"),
            [(k,) for k in range(1, ANSWER_ROWS + 1)],
        )

    def close(self) -> None:
        self.conn.close()
        if self.path != ":memory:":
            for tail in ("", "-wal", "-shm"):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.path + tail)

    def create_records(self, collection: str, keys: Sequence[str]) -> None:
        now, text = time.time(), json.dumps(START)
        self.conn.execute("BEGIN IMMEDIATE")
        self.conn.executemany(INSERT_RECORD, [(collection, k, text, now) for k in keys])
        self.conn.execute("COMMIT")

    def _write(self, key: str | int, body: Callable[[float], bool]) -> None:
        """``BEGIN IMMEDIATE``; ``body(now)`` must say it applied; ``COMMIT``."""
        execute = self.conn.execute
        execute("BEGIN IMMEDIATE")
        try:
            one_check(body(time.time()), f"write of {key}")
        except BaseException:
            execute("ROLLBACK")
            raise
        execute("COMMIT")

    def _commit_fn(self, collection: str) -> Callable[[str, str, int, Any], None]:
        execute, scope = self.conn.execute, f"c:{collection}"

        def commit(intent_id: str, key: str, version: int, state: Any) -> None:
            execute("BEGIN IMMEDIATE")
            try:
                now = time.time()
                cur = execute(UPDATE_RECORD, (json.dumps(state), now, collection, key, version))
                one_check(cur.rowcount == 1, f"commit of {key} at {version}")
                execute(INSERT_APPLIED, (scope, intent_id, key, now))
            except BaseException:
                execute("ROLLBACK")
                raise
            execute("COMMIT")

        return commit

    def commit(self, collection: str, keys: Sequence[str]) -> list[Side]:
        cursor, commit = Cursor(keys), self._commit_fn(collection)

        def prepare(n: int) -> Block:
            items = [
                (new_id(), k, v, collection_state(i)) for i, (k, v) in enumerate(cursor.take(n))
            ]

            def op(i: int) -> None:
                commit(*items[i])

            return Block([op])

        return [Side("hand-written", COMMIT_METHOD, prepare)]

    def table_commit(self, keys: Sequence[int]) -> list[Side]:
        cursor, execute = Cursor(keys), self.conn.execute
        scope = "t:fencing_bench_orders"

        def prepare(n: int) -> Block:
            items = [(new_id(), k, v, i) for i, (k, v) in enumerate(cursor.take(n))]

            def op(i: int) -> None:
                intent_id, key, version, total = items[i]
                execute("BEGIN IMMEDIATE")
                try:
                    now = time.time()
                    cur = execute(UPDATE_ORDER, ("shipped", total, key, version))
                    one_check(cur.rowcount == 1, f"table commit of {key}")
                    execute(INSERT_APPLIED, (scope, intent_id, key, now))
                except BaseException:
                    execute("ROLLBACK")
                    raise
                execute("COMMIT")

            return Block([op])

        method = (
            "BEGIN IMMEDIATE; UPDATE orders SET status=?, total=?, version=version+1"
            " WHERE id=? AND version=?; INSERT applied; COMMIT"
        )
        return [Side("hand-written", method, prepare)]

    def apply(self, collection: str, keys: Sequence[str]) -> list[Side]:
        cursor, commit, execute = Cursor(keys), self._commit_fn(collection), self.conn.execute

        def prepare(n: int) -> Block:
            items = [(new_id(), k, v) for k, v in cursor.take(n)]

            def op(i: int) -> None:
                intent_id, key, version = items[i]
                row = execute(READ_RECORD, (collection, key)).fetchone()
                one_check(row is not None and row[0] == version, f"read of {key}")
                commit(intent_id, key, version, decide_state(json.loads(row[1])))

            return Block([op])

        method = "SELECT version, state; decide(json.loads(state)); the commit above"
        return [Side("hand-written", method, prepare)]

    def commit_many(self, collection: str, keys: Sequence[str]) -> list[Side]:
        cursor, execute, batch = Cursor(keys), self.conn.execute, len(keys)
        scope = f"c:{collection}"

        def prepare(n: int) -> Block:
            batches = [
                [
                    (new_id(), k, v, collection_state(j))
                    for j, (k, v) in enumerate(cursor.take(batch))
                ]
                for _ in range(n)
            ]

            def op(i: int) -> None:
                execute("BEGIN IMMEDIATE")
                try:
                    now = time.time()
                    for intent_id, key, version, state in batches[i]:
                        args = (json.dumps(state), now, collection, key, version)
                        one_check(execute(UPDATE_RECORD, args).rowcount == 1, f"commit of {key}")
                        execute(INSERT_APPLIED, (scope, intent_id, key, now))
                except BaseException:
                    execute("ROLLBACK")
                    raise
                execute("COMMIT")

            return Block([op])

        method = f"BEGIN IMMEDIATE; {batch} x (UPDATE ... AND version=?; INSERT applied); COMMIT"
        return [Side("hand-written", method, prepare)]

    def acquire(self, name: str, ttl: float) -> int:
        tokens: list[int] = []

        def body(now: float) -> bool:
            row = self.conn.execute(ACQUIRE, (name, "bench", now + ttl, now)).fetchone()
            if row is not None:
                tokens.append(row[0])
            return row is not None

        self._write(name, body)
        return tokens[0]

    def renew(self, name: str, token: int, ttl: float) -> None:
        self._write(
            name, lambda now: self.conn.execute(RENEW, (now + ttl, name, token, now)).rowcount == 1
        )

    def release(self, name: str, token: int) -> None:
        self._write(name, lambda now: self.conn.execute(RELEASE, (name, token, now)).rowcount == 1)

    def fenced(self, collection: str, keys: Sequence[str], lease_name: str) -> list[Side]:
        cursor, execute, scope = Cursor(keys), self.conn.execute, f"c:{collection}"

        def prepare(n: int) -> Block:
            items = [
                (new_id(), k, v, collection_state(i)) for i, (k, v) in enumerate(cursor.take(n))
            ]
            token = self.acquire(lease_name, 3600.0)

            def op(i: int) -> None:
                intent_id, key, version, state = items[i]
                execute("BEGIN IMMEDIATE")
                try:
                    now = time.time()
                    args = (json.dumps(state), token, now, collection, key, version, token)
                    cur = execute(UPDATE_RECORD_FENCED, (*args, lease_name, token, now))
                    one_check(cur.rowcount == 1, f"fenced commit of {key}")
                    execute(INSERT_APPLIED, (scope, intent_id, key, now))
                except BaseException:
                    execute("ROLLBACK")
                    raise
                execute("COMMIT")

            return Block([op], close=lambda: self.release(lease_name, token))

        method = (
            "BEGIN IMMEDIATE; UPDATE ... fence=max(fence,?) WHERE version=? AND fence<=?"
            " AND EXISTS (the lease row: this token, an owner, not expired); INSERT applied;"
            " COMMIT"
        )
        return [Side("hand-written", method, prepare)]

    # -- the same answer as fencing's (see _answer) ----------------------------------------
    answer_methods = SQLITE_ANSWERS

    def answer_records(self, collection: str, keys: Sequence[str]) -> None:
        self.create_records(collection, keys)

    def _refused(self, scope: str, intent_id: str, collection: str, key: str) -> Answer:
        row = self.conn.execute(REFUSED_RECORD, (scope, intent_id, collection, key)).fetchone()
        if row is None:
            return ("missing", 0, {})
        return ("duplicate" if row[2] else "stale", row[0], json.loads(row[1]))

    def _answer_write(self, body: Callable[[Any, float], Answer]) -> Answer:
        execute = self.conn.execute
        execute("BEGIN IMMEDIATE")
        try:
            answer = body(execute, time.time())
        except BaseException:
            execute("ROLLBACK")
            raise
        execute("COMMIT")
        return answer

    def answer_commit(
        self, collection: str, key: str, version: int, state: dict[str, Any], intent_id: str
    ) -> Answer:
        scope = f"c:{collection}"

        def body(execute: Any, now: float) -> Answer:
            args = (json.dumps(state), now, collection, key, version)
            row = execute(UPDATE_RECORD_RETURNING, args).fetchone()
            if row is None:
                return self._refused(scope, intent_id, collection, key)
            execute(INSERT_APPLIED, (scope, intent_id, key, now))
            return ("committed", row[0], state)

        return self._answer_write(body)

    def answer_read(self, collection: str, key: str) -> tuple[int, dict[str, Any]]:
        row = self.conn.execute(READ_RECORD, (collection, key)).fetchone()
        one_check(row is not None, f"read of {key}")
        return row[0], json.loads(row[1])

    def answer_table(
        self, key: int, version: int, status: str, total: int, intent_id: str
    ) -> Answer:
        scope = "t:fencing_bench_orders"

        def body(execute: Any, now: float) -> Answer:
            row = execute(UPDATE_ORDER_RETURNING, (status, total, key, version)).fetchone()
            if row is None:
                got = execute(REFUSED_ORDER, (scope, intent_id, key)).fetchone()
                if got is None:
                    return ("missing", 0, {})
                kind = "duplicate" if got[4] else "stale"
                return (kind, got[0], {"status": got[1], "total": got[2], "note": got[3]})
            execute(INSERT_APPLIED, (scope, intent_id, key, now))
            return ("committed", row[0], {"status": row[1], "total": row[2], "note": row[3]})

        return self._answer_write(body)

    def answer_fenced(
        self,
        collection: str,
        key: str,
        version: int,
        state: dict[str, Any],
        intent_id: str,
        lease_name: str,
        token: int,
    ) -> Answer:
        scope = f"c:{collection}"

        def body(execute: Any, now: float) -> Answer:
            args = (json.dumps(state), token, now, collection, key, version, token)
            row = execute(UPDATE_FENCED_RETURNING, (*args, lease_name, token, now)).fetchone()
            if row is None:  # fenced or stale: the bench measures the success path only
                return self._refused(scope, intent_id, collection, key)
            execute(INSERT_APPLIED, (scope, intent_id, key, now))
            return ("committed", row[0], state)

        return self._answer_write(body)

    def answer_many(
        self, collection: str, items: Sequence[tuple[str, str, int, dict[str, Any]]]
    ) -> list[Answer]:
        scope = f"c:{collection}"

        def body(execute: Any, now: float) -> Answer:
            for intent_id, key, version, state in items:
                args = (json.dumps(state), now, collection, key, version)
                row = execute(UPDATE_RECORD_RETURNING, args).fetchone()
                if row is None:
                    out.append(self._refused(scope, intent_id, collection, key))
                else:
                    execute(INSERT_APPLIED, (scope, intent_id, key, now))
                    out.append(("committed", row[0], state))
            return ("committed", 0, {})

        out: list[Answer] = []
        self._answer_write(body)
        return out

    def lease_cycle(self, lease_name: str) -> list[Side]:
        method = (
            "each in BEGIN IMMEDIATE ... COMMIT: INSERT ... ON CONFLICT DO UPDATE SET"
            " token=token+1 WHERE free RETURNING token; UPDATE ... WHERE token=? AND live"
        )
        return hand_lease_cycle(self, lease_name, "hand-written", method)


class SQLiteBench(Bench):
    """One SQLite file (or ``:memory:``) at one ``synchronous`` setting."""

    store_name = "sqlite"
    guard_trigger = True

    def __init__(self, url: str | None, synchronous: str = "full") -> None:
        self._tmpdir: str | None = None
        suffix = uuid.uuid4().hex[:8]
        if url is None:
            self._tmpdir = tempfile.mkdtemp(prefix="fencing-bench-")
            path = os.path.join(self._tmpdir, f"fencing-{synchronous}.db")
            url = f"sqlite:///{path}?synchronous={synchronous}"
        parsed = StoreURL.parse(url)
        self.path = parsed.path
        self.memory = parsed.path == ":memory:"
        sync = self._synchronous = parsed.option("synchronous", "full").upper()
        self.setting = ":memory:" if self.memory else f"WAL file, synchronous={sync}"
        self.single_target = (
            None if self.memory else NORMAL_TARGET if sync == "NORMAL" else SINGLE_TARGET
        )
        self.table_name = f"bench_orders_{suffix}"
        store = fencing.open(url)
        try:
            baseline = ":memory:" if self.memory else f"{parsed.path}.fencing-bench-{suffix}.db"
            hand = SQLiteHand(baseline, sync)
        except BaseException:
            store.close()
            raise
        super().__init__(store, hand, suffix)
        self._tables_made: list[str] = []
        self._borrowed: list[sqlite3.Connection] = []
        # A temp directory is removed whole; a user's file gets its records deleted.
        self.cleanup_records = self._tmpdir is None

    def _raw(self) -> sqlite3.Connection:
        """A plain connection to fencing's database (the backend's own for ``:memory:``)."""
        backend = self.store.backend
        if self.memory and isinstance(backend, SQLiteBackend):
            return backend.conn
        return sqlite3.connect(self.path, timeout=30.0, isolation_level=None)

    def fencing_table(self) -> fencing.Table | Skip:
        return self.user_table(self.table_name)

    def borrowed(self) -> sqlite3.Connection | Skip:
        if self.memory:
            return Skip(USING_OPERATION, "a :memory: store has no other connection")
        conn = sqlite3.connect(self.path, timeout=30.0)  # implicit transactions
        conn.execute(f"PRAGMA synchronous={self._synchronous}")  # the store's, to compare
        self._borrowed.append(conn)
        return conn

    def user_table(self, name: str) -> fencing.Table:
        conn = self._raw()
        try:
            conn.execute(ORDERS_DDL.format(name=name))
            self._tables_made.append(name)
            conn.executemany(ORDERS_ROWS.format(name=name), [(k,) for k in range(1, KEYS + 1)])
        finally:
            if not self.memory:
                conn.close()
        return self.store.table(name)

    def drop(self) -> None:
        for conn in self._borrowed:
            conn.close()
        if self._tmpdir is not None:
            return  # the whole directory goes
        if self._tables_made and not self.memory:
            conn = self._raw()
            try:
                for name in self._tables_made:
                    conn.execute(f"DROP TABLE IF EXISTS {name}")
            finally:
                conn.close()

    def close(self) -> None:
        try:
            super().close()
        finally:
            if self._tmpdir is not None:
                shutil.rmtree(self._tmpdir, ignore_errors=True)
