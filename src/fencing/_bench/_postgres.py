"""PostgreSQL: fencing beside hand-written psycopg statements with the same guarantee.

The main baseline is what a careful engineer writes for one round trip: a
data-modifying CTE whose conditional ``UPDATE`` feeds the insert of the applied
intent id, so the id is recorded exactly when the write applies. For readers
comparing approaches, a ``SELECT ... FOR UPDATE`` transaction (BEGIN, lock and read,
check, UPDATE, INSERT, COMMIT: five round trips) does the same job too.

Both sides live in a scratch schema ``fencing_bench_<id>`` (fencing's via its
``schema`` option, unless the URL names one), dropped afterwards.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Callable, Sequence
from typing import Any, Final

import fencing

from .._errors import MissingDependency, StoreError, TransientStoreError
from .._url import StoreURL
from ._common import (
    ANSWER_ROWS,
    KEYS,
    START,
    Bench,
    Cursor,
    collection_state,
    decide_state,
    hand_lease_cycle,
    new_id,
    one_check,
)
from ._harness import Block, Side, Skip
from ._postgres_answer import PostgresAnswers

__all__ = ["PostgresBench"]

# fencing's own URL options: everything else is a libpq connection parameter.
_FENCING_OPTIONS: Final = frozenset(
    {"schema", "min_size", "max_size", "pool_timeout", "prepare_threshold"}
)

# The baseline's tables: fencing's PostgreSQL schema under other names, and a user table.
SCHEMA: Final = (
    "CREATE TABLE {s}.fencing_bench_records (collection TEXT NOT NULL, key TEXT NOT NULL,"
    " version BIGINT NOT NULL, fence BIGINT NOT NULL DEFAULT 0, state JSONB NOT NULL,"
    " updated_at DOUBLE PRECISION NOT NULL, PRIMARY KEY (collection, key))",
    "CREATE TABLE {s}.fencing_bench_applied (scope TEXT NOT NULL, intent_id TEXT NOT NULL,"
    " key TEXT NOT NULL, applied_at DOUBLE PRECISION NOT NULL, PRIMARY KEY (scope, intent_id))",
    "CREATE INDEX ON {s}.fencing_bench_applied (applied_at)",
    "CREATE TABLE {s}.fencing_bench_leases (name TEXT PRIMARY KEY, owner TEXT,"
    " token BIGINT NOT NULL, expires_at DOUBLE PRECISION NOT NULL)",
)
ORDERS_DDL: Final = (
    "CREATE TABLE {s}.{name} (id INTEGER PRIMARY KEY, version INTEGER NOT NULL DEFAULT 1,"
    " status VARCHAR(40), total INTEGER, note VARCHAR(200))"
)
ORDERS_ROWS: Final = (
    "INSERT INTO {s}.{name} (id, status, total) SELECT g, 'new', 0 FROM generate_series(1, %s) g"
)
NOW: Final = "extract(epoch from now())"

INSERT_RECORDS: Final = (
    "INSERT INTO {s}.fencing_bench_records (collection, key, version, state, updated_at)"
    f" SELECT %s, k, 1, %s::jsonb, {NOW} FROM unnest(%s::text[]) k"
)
# One round trip: the applied id is inserted from the UPDATE's output.
COMMIT_CTE: Final = (
    "WITH upd AS (UPDATE {s}.fencing_bench_records"
    f" SET state = %(state)s::jsonb, version = version + 1, updated_at = {NOW}"
    " WHERE collection = %(c)s AND key = %(k)s AND version = %(v)s RETURNING key)"
    " INSERT INTO {s}.fencing_bench_applied (scope, intent_id, key, applied_at)"
    f" SELECT %(scope)s, %(id)s, key, {NOW} FROM upd"
)
FENCED_CTE: Final = (
    "WITH upd AS (UPDATE {s}.fencing_bench_records"
    " SET state = %(state)s::jsonb, version = version + 1, fence = GREATEST(fence, %(t)s),"
    f" updated_at = {NOW}"
    " WHERE collection = %(c)s AND key = %(k)s AND version = %(v)s AND fence <= %(t)s"
    " AND EXISTS (SELECT 1 FROM {s}.fencing_bench_leases WHERE name = %(lease)s"
    f" AND token = %(t)s AND owner IS NOT NULL AND expires_at > {NOW}) RETURNING key)"
    " INSERT INTO {s}.fencing_bench_applied (scope, intent_id, key, applied_at)"
    f" SELECT %(scope)s, %(id)s, key, {NOW} FROM upd"
)
TABLE_CTE: Final = (
    "WITH upd AS (UPDATE {s}.fencing_bench_orders"
    " SET status = %(status)s, total = %(total)s, version = version + 1"
    " WHERE id = %(k)s AND version = %(v)s RETURNING id)"
    " INSERT INTO {s}.fencing_bench_applied (scope, intent_id, key, applied_at)"
    f" SELECT %(scope)s, %(id)s, id::text, {NOW} FROM upd"
)
# A batch in one statement: the items as arrays, one conditional UPDATE ... FROM.
BATCH_CTE: Final = (
    "WITH item AS (SELECT * FROM unnest(%(ids)s::text[], %(keys)s::text[],"
    " %(versions)s::bigint[], %(states)s::jsonb[]) AS i(intent_id, key, version, state)),"
    " upd AS (UPDATE {s}.fencing_bench_records r SET state = item.state,"
    f" version = r.version + 1, updated_at = {NOW} FROM item"
    " WHERE r.collection = %(c)s AND r.key = item.key AND r.version = item.version"
    " RETURNING r.key, item.intent_id)"
    " INSERT INTO {s}.fencing_bench_applied (scope, intent_id, key, applied_at)"
    f" SELECT %(scope)s, intent_id, key, {NOW} FROM upd"
)
READ: Final = (
    "SELECT version, state FROM {s}.fencing_bench_records WHERE collection = %s AND key = %s"
)
LOCK_RECORD: Final = (
    "SELECT version FROM {s}.fencing_bench_records WHERE collection = %s AND key = %s FOR UPDATE"
)
WRITE_RECORD: Final = (
    f"UPDATE {{s}}.fencing_bench_records SET state = %s::jsonb, version = version + 1,"
    f" updated_at = {NOW} WHERE collection = %s AND key = %s"
)
LOCK_ORDER: Final = "SELECT version FROM {s}.fencing_bench_orders WHERE id = %s FOR UPDATE"
WRITE_ORDER: Final = (
    "UPDATE {s}.fencing_bench_orders SET status = %s, total = %s, version = version + 1"
    " WHERE id = %s"
)
INSERT_APPLIED: Final = (
    "INSERT INTO {s}.fencing_bench_applied (scope, intent_id, key, applied_at)"
    f" VALUES (%s, %s, %s, {NOW})"
)
ACQUIRE: Final = (
    "INSERT INTO {s}.fencing_bench_leases AS l (name, owner, token, expires_at)"
    f" VALUES (%(n)s, %(o)s, 1, {NOW} + %(ttl)s)"
    " ON CONFLICT (name) DO UPDATE SET owner = excluded.owner, token = l.token + 1,"
    f" expires_at = excluded.expires_at WHERE l.owner IS NULL OR l.expires_at <= {NOW}"
    " RETURNING token"
)
RENEW: Final = (
    f"UPDATE {{s}}.fencing_bench_leases SET expires_at = {NOW} + %s"
    f" WHERE name = %s AND token = %s AND owner IS NOT NULL AND expires_at > {NOW}"
)
RELEASE: Final = (
    "UPDATE {s}.fencing_bench_leases SET owner = NULL, expires_at = 0"
    f" WHERE name = %s AND token = %s AND owner IS NOT NULL AND expires_at > {NOW}"
)

ONE_TRIP: Final = "1-trip CTE"
SECOND_SELECT: Final = "same answer, 2nd SELECT"
FOR_UPDATE: Final = "FOR UPDATE txn"


def _psycopg() -> Any:
    try:
        import psycopg
    except ModuleNotFoundError as exc:
        raise MissingDependency(
            "the postgres bench needs psycopg: pip install 'fencing[postgres]'"
        ) from exc
    return psycopg


#: Fencing's schema first on a borrowed connection's search path, as on the store's own.
SEARCH_PATH: Final = "SELECT set_config('search_path', %(schema)s, false)"


def conninfo(url: StoreURL) -> str:
    """libpq connection parameters of a store URL (fencing's own options left out)."""
    from urllib.parse import unquote

    psycopg = _psycopg()
    params: dict[str, Any] = {k: v for k, v in url.options.items() if k not in _FENCING_OPTIONS}
    params.update(
        host=url.host,
        port=url.port,
        user=unquote(url.username) if url.username else None,
        password=unquote(url.password) if url.password else None,
        dbname=url.path or None,
    )
    text: str = psycopg.conninfo.make_conninfo(
        "", **{k: v for k, v in params.items() if v is not None}
    )
    return text


class PostgresHand(PostgresAnswers):
    """Hand-written psycopg baselines on one autocommit connection."""

    def __init__(self, conn: Any, schema: str) -> None:
        self.conn = conn
        self.schema = schema

    def sql(self, text: str) -> str:
        return text.replace("{s}", f'"{self.schema}"')

    def close(self) -> None:
        self.conn.close()

    def create_records(self, collection: str, keys: Sequence[str]) -> None:
        self.conn.execute(self.sql(INSERT_RECORDS), (collection, json.dumps(START), list(keys)))

    def _one(self, sql: str, what: str) -> Callable[[dict[str, Any]], None]:
        """Run one statement; it must have inserted exactly one applied id."""
        execute, text = self.conn.execute, self.sql(sql)

        def run(params: dict[str, Any]) -> None:
            one_check(execute(text, params).rowcount == 1, what)

        return run

    def _locked(self, lock: str, write: str) -> Callable[..., None]:
        """BEGIN; SELECT version ... FOR UPDATE; check; UPDATE; INSERT applied; COMMIT.

        ``run(scope, intent_id, key, version, values)``: ``values`` are the UPDATE's
        parameters, whose last ones (the key: collection and key, or id) are the lock's.
        """
        conn = self.conn
        lock, write, insert = self.sql(lock), self.sql(write), self.sql(INSERT_APPLIED)
        where_size = lock.count("%s")

        def run(
            scope: str, intent_id: str, key: Any, version: int, values: tuple[Any, ...]
        ) -> None:
            with conn.transaction():
                row = conn.execute(lock, values[-where_size:]).fetchone()
                one_check(row is not None and row[0] == version, f"locked read of {key}")
                conn.execute(write, values)
                conn.execute(insert, (scope, intent_id, str(key)))

        return run

    def commit(self, collection: str, keys: Sequence[str]) -> list[Side]:
        one, locked = Cursor(keys), Cursor(keys)
        scope, cte = f"c:{collection}", self._one(COMMIT_CTE, "commit")
        run_locked = self._locked(LOCK_RECORD, WRITE_RECORD)
        other = f"{collection}/locked"  # the second baseline's own records
        self.create_records(other, keys)

        def one_trip(n: int) -> Block:
            items = [
                {
                    "state": json.dumps(collection_state(i)),
                    "c": collection,
                    "k": k,
                    "v": v,
                    "scope": scope,
                    "id": new_id(),
                }
                for i, (k, v) in enumerate(one.take(n))
            ]
            return Block([lambda i: cte(items[i])])

        def for_update(n: int) -> Block:
            items = [
                (new_id(), k, v, (json.dumps(collection_state(i)), other, k))
                for i, (k, v) in enumerate(locked.take(n))
            ]

            def op(i: int) -> None:
                intent_id, key, version, values = items[i]
                run_locked(f"c:{other}", intent_id, key, version, values)

            return Block([op])

        return [
            Side(
                ONE_TRIP,
                "WITH upd AS (UPDATE records ... WHERE key AND version RETURNING key)"
                " INSERT INTO applied SELECT ... FROM upd",
                one_trip,
            ),
            Side(
                FOR_UPDATE,
                "BEGIN; SELECT version ... FOR UPDATE; check; UPDATE; INSERT applied; COMMIT",
                for_update,
            ),
        ]

    def table_commit(self, keys: Sequence[int]) -> list[Side]:
        # The second baseline has rows of its own: KEYS + 1 to 2 * KEYS.
        one, locked = Cursor(keys), Cursor([k + KEYS for k in keys])
        scope, cte = "t:fencing_bench_orders", self._one(TABLE_CTE, "table commit")
        run_locked = self._locked(LOCK_ORDER, WRITE_ORDER)

        def one_trip(n: int) -> Block:
            items = [
                {"status": "shipped", "total": i, "k": k, "v": v, "scope": scope, "id": new_id()}
                for i, (k, v) in enumerate(one.take(n))
            ]
            return Block([lambda i: cte(items[i])])

        def for_update(n: int) -> Block:
            items = [(new_id(), k, v, ("shipped", i, k)) for i, (k, v) in enumerate(locked.take(n))]

            def op(i: int) -> None:
                intent_id, key, version, values = items[i]
                run_locked(scope, intent_id, key, version, values)

            return Block([op])

        return [
            Side(
                ONE_TRIP,
                "WITH upd AS (UPDATE orders SET status, total, version+1 WHERE id AND version"
                " RETURNING id) INSERT INTO applied SELECT ... FROM upd",
                one_trip,
            ),
            Side(
                FOR_UPDATE,
                "BEGIN; SELECT version ... FOR UPDATE; check; UPDATE; INSERT applied; COMMIT",
                for_update,
            ),
        ]

    def apply(self, collection: str, keys: Sequence[str]) -> list[Side]:
        cursor, scope = Cursor(keys), f"c:{collection}"
        cte, read, execute = self._one(COMMIT_CTE, "apply"), self.sql(READ), self.conn.execute

        def prepare(n: int) -> Block:
            items = [(new_id(), k, v) for k, v in cursor.take(n)]

            def op(i: int) -> None:
                intent_id, key, version = items[i]
                row = execute(read, (collection, key)).fetchone()
                one_check(row is not None and row[0] == version, f"read of {key}")
                state = decide_state(row[1])  # jsonb arrives as a dict
                params = {"state": json.dumps(state), "c": collection, "k": key, "v": version}
                cte({**params, "scope": scope, "id": intent_id})

            return Block([op])

        method = "SELECT version, state; decide(state); the one-round-trip commit"
        return [Side(ONE_TRIP, method, prepare)]

    def commit_many(self, collection: str, keys: Sequence[str]) -> list[Side]:
        cursor, scope, batch = Cursor(keys), f"c:{collection}", len(keys)
        text, execute = self.sql(BATCH_CTE), self.conn.execute

        def prepare(n: int) -> Block:
            calls = []
            for _ in range(n):
                taken = cursor.take(batch)
                calls.append(
                    {
                        "ids": [new_id() for _ in taken],
                        "keys": [k for k, _ in taken],
                        "versions": [v for _, v in taken],
                        "states": [json.dumps(collection_state(j)) for j in range(batch)],
                        "c": collection,
                        "scope": scope,
                    }
                )

            def op(i: int) -> None:
                one_check(execute(text, calls[i]).rowcount == batch, "batch commit")

            return Block([op])

        method = (
            f"one statement for {batch}: unnest(ids, keys, versions, states) ->"
            " UPDATE ... FROM item WHERE key AND version -> INSERT applied"
        )
        return [Side(ONE_TRIP, method, prepare)]

    def acquire(self, name: str, ttl: float) -> int:
        row = self.conn.execute(self.sql(ACQUIRE), {"n": name, "o": "bench", "ttl": ttl}).fetchone()
        one_check(row is not None, f"acquire of {name}")
        return int(row[0])

    def renew(self, name: str, token: int, ttl: float) -> None:
        cur = self.conn.execute(self.sql(RENEW), (ttl, name, token))
        one_check(cur.rowcount == 1, f"renew of {name}")

    def release(self, name: str, token: int) -> None:
        cur = self.conn.execute(self.sql(RELEASE), (name, token))
        one_check(cur.rowcount == 1, f"release of {name}")

    def fenced(self, collection: str, keys: Sequence[str], lease_name: str) -> list[Side]:
        cursor, scope, cte = Cursor(keys), f"c:{collection}", self._one(FENCED_CTE, "fenced")

        def prepare(n: int) -> Block:
            token = self.acquire(lease_name, 3600.0)
            items = [
                {
                    "state": json.dumps(collection_state(i)),
                    "c": collection,
                    "k": k,
                    "v": v,
                    "t": token,
                    "lease": lease_name,
                    "scope": scope,
                    "id": new_id(),
                }
                for i, (k, v) in enumerate(cursor.take(n))
            ]
            return Block([lambda i: cte(items[i])], close=lambda: self.release(lease_name, token))

        method = (
            "the one-round-trip CTE with fence = GREATEST(fence, token), AND fence <= token"
            " AND EXISTS (the lease row: this token, an owner, expires_at > now())"
        )
        return [Side(ONE_TRIP, method, prepare)]

    def lease_cycle(self, lease_name: str) -> list[Side]:
        method = (
            "one statement each: INSERT ... ON CONFLICT DO UPDATE SET token = token + 1"
            " WHERE free RETURNING token; UPDATE ... WHERE token AND live"
        )
        return hand_lease_cycle(self, lease_name, ONE_TRIP, method)


class PostgresBench(Bench):
    """A PostgreSQL server: fencing via ``fencing.open(url)`` beside psycopg."""

    store_name = "postgresql"
    guard_trigger = True

    def __init__(self, url: str) -> None:
        parsed = StoreURL.parse(url)
        psycopg = _psycopg()
        suffix = uuid.uuid4().hex[:8]
        scratch = f"fencing_bench_{suffix}"
        self.setting = f"server {parsed.host or 'localhost'}:{parsed.port or 5432}/{parsed.path}"
        self.table_name = f"bench_orders_{suffix}"
        try:
            conn = psycopg.connect(conninfo(parsed), autocommit=True)
        except psycopg.Error as exc:
            raise TransientStoreError(f"postgresql: cannot connect: {exc}") from exc
        hand = PostgresHand(conn, scratch)
        try:
            conn.execute(f'CREATE SCHEMA "{scratch}"')
            for statement in SCHEMA:
                conn.execute(hand.sql(statement))
            conn.execute(hand.sql(ORDERS_DDL.format(s="{s}", name="fencing_bench_orders")))
            orders_rows = hand.sql(ORDERS_ROWS.format(s="{s}", name="fencing_bench_orders"))
            conn.execute(orders_rows, (ANSWER_ROWS,))
            own = parsed.options.get("schema")
            store = fencing.open(url) if own else fencing.open(url, schema=scratch)
        except BaseException as exc:
            with contextlib.suppress(psycopg.Error):
                conn.execute(f'DROP SCHEMA IF EXISTS "{scratch}" CASCADE')
            conn.close()
            if isinstance(exc, psycopg.Error):
                raise StoreError(f"postgresql: cannot set up the bench: {exc}") from exc
            raise
        self.fencing_schema = own or scratch
        self.cleanup_records = own is not None  # a scratch schema is dropped whole
        self._tables_made: list[str] = []
        self._borrowed: list[Any] = []
        self._conninfo = conninfo(parsed)
        super().__init__(store, hand, suffix)
        self._hand = hand

    def fencing_table(self) -> fencing.Table | Skip:
        return self.user_table(self.table_name)

    def extra_answers(self, collection: str, keys: Sequence[str]) -> list[Side]:
        """The same answer from a second SELECT (in one pipelined transaction), beside the
        one statement with RETURNING: whichever is faster is the one to beat."""
        cursor, commit = Cursor(keys), self._hand.answer_commit_select

        def prepare(n: int) -> Block:
            items = [
                (k, v, collection_state(i), new_id()) for i, (k, v) in enumerate(cursor.take(n))
            ]

            def op(i: int) -> None:
                key, version, state, intent_id = items[i]
                answer = commit(collection, key, version, state, intent_id)
                one_check(answer[0] == "committed", f"commit of {key}")

            return Block([op])

        method = (
            "one pipeline: BEGIN; the commit CTE; SELECT version, state, EXISTS applied id; COMMIT"
        )
        return [Side(SECOND_SELECT, method, prepare)]

    def borrowed(self) -> Any:
        psycopg = _psycopg()
        conn = psycopg.connect(self._conninfo)  # a transaction per block, as an app's
        conn.execute(SEARCH_PATH, {"schema": self.fencing_schema})
        conn.commit()
        self._borrowed.append(conn)
        return conn

    def user_table(self, name: str) -> fencing.Table:
        conn, s = self._hand.conn, f'"{self.fencing_schema}"'
        conn.execute(ORDERS_DDL.format(s=s, name=name))
        self._tables_made.append(name)
        conn.execute(ORDERS_ROWS.format(s=s, name=name), (KEYS,))
        return self.store.table(name)

    def drop(self) -> None:
        for borrowed in self._borrowed:
            borrowed.close()
        conn = self._hand.conn
        if self.fencing_schema != self._hand.schema:
            for name in self._tables_made:
                conn.execute(f'DROP TABLE IF EXISTS "{self.fencing_schema}".{name}')
                conn.execute(
                    f'DROP FUNCTION IF EXISTS "{self.fencing_schema}".fencing_guard_{name}()'
                )
        conn.execute(f'DROP SCHEMA IF EXISTS "{self._hand.schema}" CASCADE')
