"""MySQL / MariaDB: fencing beside hand-written PyMySQL transactions with the same guarantee.

The main baseline is the plain transaction a careful engineer writes with PyMySQL:
``UPDATE ... WHERE key AND version``, check the matched row count, ``INSERT`` the applied
intent id, ``COMMIT`` (three round trips). For readers comparing approaches, a
``SELECT ... FOR UPDATE`` transaction (lock and read, check, UPDATE, INSERT, COMMIT)
does the same job too. Both sessions run at READ COMMITTED with ``CLIENT.FOUND_ROWS``,
as fencing's do.

Both sides live in a scratch database ``fencing_bench_<id>``, dropped afterwards
(the bench needs the CREATE DATABASE privilege).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Sequence
from typing import Any, Final
from urllib.parse import unquote, urlsplit, urlunsplit

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
from ._mysql_answer import MySQLAnswers

__all__ = ["MySQLBench"]

_OPTIONS: Final = "ENGINE=InnoDB ROW_FORMAT=DYNAMIC DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin"
_ASCII: Final = "CHARACTER SET ascii COLLATE ascii_bin"

# The baseline's tables: fencing's MySQL schema under other names, and a user table.
SCHEMA: Final = (
    f"CREATE TABLE fencing_bench_records (collection VARCHAR(128) {_ASCII} NOT NULL,"
    " `key` VARBINARY(2048) NOT NULL, version BIGINT NOT NULL,"
    " fence BIGINT NOT NULL DEFAULT 0, state LONGTEXT NOT NULL,"
    f" updated_at DECIMAL(20,6) NOT NULL, PRIMARY KEY (collection, `key`)) {_OPTIONS}",
    f"CREATE TABLE fencing_bench_applied (scope VARCHAR(130) {_ASCII} NOT NULL,"
    f" intent_id VARCHAR(128) {_ASCII} NOT NULL, key_text VARBINARY(2050) NOT NULL,"
    " applied_at DECIMAL(20,6) NOT NULL, PRIMARY KEY (scope, intent_id),"
    f" KEY fencing_bench_applied_at (applied_at)) {_OPTIONS}",
    f"CREATE TABLE fencing_bench_leases (name VARCHAR(128) {_ASCII} NOT NULL PRIMARY KEY,"
    " owner VARCHAR(200) NULL, token BIGINT NOT NULL, expires_at DECIMAL(20,6) NOT NULL)"
    f" {_OPTIONS}",
)
ORDERS_DDL: Final = (
    "CREATE TABLE {name} (id INT PRIMARY KEY, version INT NOT NULL DEFAULT 1,"
    " status VARCHAR(40), total INT, note VARCHAR(200)) ENGINE=InnoDB"
)
ORDERS_ROWS: Final = "INSERT INTO {name} (id, status, total) VALUES (%s, 'new', 0)"
NOW: Final = "UNIX_TIMESTAMP(NOW(6))"

INSERT_RECORD: Final = (
    "INSERT INTO fencing_bench_records (collection, `key`, version, state, updated_at)"
    f" VALUES (%s, %s, 1, %s, {NOW})"
)
UPDATE_RECORD: Final = (
    f"UPDATE fencing_bench_records SET state = %s, version = version + 1, updated_at = {NOW}"
    " WHERE collection = %s AND `key` = %s AND version = %s"
)
UPDATE_RECORD_FENCED: Final = (
    "UPDATE fencing_bench_records SET state = %s, version = version + 1,"
    f" fence = GREATEST(fence, %s), updated_at = {NOW}"
    " WHERE collection = %s AND `key` = %s AND version = %s AND fence <= %s"
)
UPDATE_ORDER: Final = (
    "UPDATE fencing_bench_orders SET status = %s, total = %s, version = version + 1"
    " WHERE id = %s AND version = %s"
)
INSERT_APPLIED: Final = (
    "INSERT INTO fencing_bench_applied (scope, intent_id, key_text, applied_at)"
    f" VALUES (%s, %s, %s, {NOW})"
)
READ: Final = (
    "SELECT version, state FROM fencing_bench_records WHERE collection = %s AND `key` = %s"
)
LOCK_RECORD: Final = (
    "SELECT version FROM fencing_bench_records WHERE collection = %s AND `key` = %s FOR UPDATE"
)
WRITE_RECORD: Final = (
    f"UPDATE fencing_bench_records SET state = %s, version = version + 1, updated_at = {NOW}"
    " WHERE collection = %s AND `key` = %s"
)
LOCK_ORDER: Final = "SELECT version FROM fencing_bench_orders WHERE id = %s FOR UPDATE"
WRITE_ORDER: Final = (
    "UPDATE fencing_bench_orders SET status = %s, total = %s, version = version + 1 WHERE id = %s"
)
# The lease row, locked: no takeover can commit until this transaction ends.
LEASE_LIVE: Final = (
    "SELECT token FROM fencing_bench_leases WHERE name = %s AND token = %s"
    f" AND owner IS NOT NULL AND expires_at > {NOW} LOCK IN SHARE MODE"
)
LEASE_LOCK: Final = (
    f"SELECT owner, token, expires_at > {NOW} FROM fencing_bench_leases WHERE name = %s FOR UPDATE"
)
LEASE_NEW: Final = (
    "INSERT INTO fencing_bench_leases (name, owner, token, expires_at)"
    f" VALUES (%s, %s, 1, {NOW} + %s)"
)
LEASE_TAKE: Final = (
    f"UPDATE fencing_bench_leases SET owner = %s, token = token + 1, expires_at = {NOW} + %s"
    " WHERE name = %s"
)
RENEW: Final = (
    f"UPDATE fencing_bench_leases SET expires_at = {NOW} + %s"
    f" WHERE name = %s AND token = %s AND owner IS NOT NULL AND expires_at > {NOW}"
)
RELEASE: Final = (
    "UPDATE fencing_bench_leases SET owner = NULL, expires_at = 0"
    f" WHERE name = %s AND token = %s AND owner IS NOT NULL AND expires_at > {NOW}"
)

TXN: Final = "plain txn"
FOR_UPDATE: Final = "FOR UPDATE txn"


def _pymysql() -> Any:
    try:
        import pymysql
    except ModuleNotFoundError as exc:
        raise MissingDependency(
            "the mysql bench needs PyMySQL: pip install 'fencing[mysql]'"
        ) from exc
    return pymysql


def connect(url: StoreURL, database: str | None) -> Any:
    """A PyMySQL connection like fencing's: READ COMMITTED, FOUND_ROWS, UTC, no autocommit."""
    pymysql = _pymysql()
    from pymysql.constants import CLIENT

    kwargs: dict[str, Any] = {
        "host": url.host or "localhost",
        "port": url.port or 3306,
        "user": unquote(url.username) if url.username else "root",
        "password": unquote(url.password) if url.password else "",
        "charset": "utf8mb4",
        "autocommit": False,
        "client_flag": CLIENT.FOUND_ROWS,
        "connect_timeout": 10,
    }
    if database:
        kwargs["database"] = database
    if url.options.get("unix_socket"):
        kwargs["unix_socket"] = url.options["unix_socket"]
    try:
        conn = pymysql.connect(**kwargs)
    except pymysql.err.OperationalError as exc:
        raise TransientStoreError(f"mysql: cannot connect: {exc}") from exc
    with conn.cursor() as cur:
        cur.execute("SET time_zone = '+00:00'")
        cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
    conn.commit()
    return conn


class MySQLHand(MySQLAnswers):
    """Hand-written PyMySQL transactions on one connection."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.cur = conn.cursor()

    def close(self) -> None:
        self.conn.close()

    def txn(self, body: Callable[[Any], bool], what: str) -> None:
        """Run ``body(cursor)`` (it must say it applied), then COMMIT; roll back on error."""
        conn = self.conn
        try:
            one_check(body(self.cur), what)
        except BaseException:
            conn.rollback()
            raise
        conn.commit()

    def create_records(self, collection: str, keys: Sequence[str]) -> None:
        text = json.dumps(START)
        self.cur.executemany(INSERT_RECORD, [(collection, k, text) for k in keys])
        self.conn.commit()

    def _plain(self, update: str) -> Callable[[str, str, Any, tuple[Any, ...]], None]:
        """UPDATE ... AND version = %s; check the row count; INSERT applied; COMMIT."""
        conn, cur = self.conn, self.cur

        def run(scope: str, intent_id: str, key: Any, args: tuple[Any, ...]) -> None:
            try:
                one_check(cur.execute(update, args) == 1, f"commit of {key}")
                cur.execute(INSERT_APPLIED, (scope, intent_id, str(key)))
            except BaseException:
                conn.rollback()
                raise
            conn.commit()

        return run

    def _locked(self, lock: str, write: str) -> Callable[..., None]:
        """SELECT version ... FOR UPDATE; check; UPDATE; INSERT applied; COMMIT.

        ``values`` are the UPDATE's parameters, whose last ones are the lock's (the key).
        """
        conn, cur, size = self.conn, self.cur, lock.count("%s")

        def run(
            scope: str, intent_id: str, key: Any, version: int, values: tuple[Any, ...]
        ) -> None:
            try:
                cur.execute(lock, values[-size:])
                row = cur.fetchone()
                one_check(row is not None and row[0] == version, f"locked read of {key}")
                cur.execute(write, values)
                cur.execute(INSERT_APPLIED, (scope, intent_id, str(key)))
            except BaseException:
                conn.rollback()
                raise
            conn.commit()

        return run

    def commit(self, collection: str, keys: Sequence[str]) -> list[Side]:
        plain, locked = Cursor(keys), Cursor(keys)
        run_plain, run_locked = self._plain(UPDATE_RECORD), self._locked(LOCK_RECORD, WRITE_RECORD)
        other = f"{collection}/locked"  # the second baseline's own records
        self.create_records(other, keys)

        def txn(n: int) -> Block:
            items = [
                (new_id(), k, (json.dumps(collection_state(i)), collection, k, v))
                for i, (k, v) in enumerate(plain.take(n))
            ]

            def op(i: int) -> None:
                intent_id, key, args = items[i]
                run_plain(f"c:{collection}", intent_id, key, args)

            return Block([op])

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
            Side(TXN, "UPDATE ... WHERE key AND version=%s; INSERT applied; COMMIT", txn),
            Side(
                FOR_UPDATE,
                "SELECT version ... FOR UPDATE; check; UPDATE; INSERT applied; COMMIT",
                for_update,
            ),
        ]

    def table_commit(self, keys: Sequence[int]) -> list[Side]:
        plain, locked = Cursor(keys), Cursor([k + KEYS for k in keys])
        run_plain, run_locked = self._plain(UPDATE_ORDER), self._locked(LOCK_ORDER, WRITE_ORDER)
        scope = "t:fencing_bench_orders"

        def txn(n: int) -> Block:
            items = [(new_id(), k, ("shipped", i, k, v)) for i, (k, v) in enumerate(plain.take(n))]

            def op(i: int) -> None:
                intent_id, key, args = items[i]
                run_plain(scope, intent_id, key, args)

            return Block([op])

        def for_update(n: int) -> Block:
            items = [(new_id(), k, v, ("shipped", i, k)) for i, (k, v) in enumerate(locked.take(n))]

            def op(i: int) -> None:
                intent_id, key, version, values = items[i]
                run_locked(scope, intent_id, key, version, values)

            return Block([op])

        return [
            Side(
                TXN,
                "UPDATE orders SET status, total, version+1 WHERE id AND version=%s;"
                " INSERT applied; COMMIT",
                txn,
            ),
            Side(
                FOR_UPDATE,
                "SELECT version ... FOR UPDATE; check; UPDATE; INSERT applied; COMMIT",
                for_update,
            ),
        ]

    def apply(self, collection: str, keys: Sequence[str]) -> list[Side]:
        cursor, run_plain, cur, conn = Cursor(keys), self._plain(UPDATE_RECORD), self.cur, self.conn

        def prepare(n: int) -> Block:
            items = [(new_id(), k, v) for k, v in cursor.take(n)]

            def op(i: int) -> None:
                intent_id, key, version = items[i]
                cur.execute(READ, (collection, key))
                row = cur.fetchone()
                conn.commit()  # end the read's transaction: decide runs outside any
                one_check(row is not None and row[0] == version, f"read of {key}")
                state = json.dumps(decide_state(json.loads(row[1])))
                run_plain(f"c:{collection}", intent_id, key, (state, collection, key, version))

            return Block([op])

        return [Side(TXN, "SELECT version, state; COMMIT; decide; the transaction above", prepare)]

    def commit_many(self, collection: str, keys: Sequence[str]) -> list[Side]:
        cursor, conn, cur, batch = Cursor(keys), self.conn, self.cur, len(keys)
        scope = f"c:{collection}"

        def prepare(n: int) -> Block:
            calls = [
                [
                    (new_id(), k, v, json.dumps(collection_state(j)))
                    for j, (k, v) in enumerate(cursor.take(batch))
                ]
                for _ in range(n)
            ]

            def op(i: int) -> None:
                items = calls[i]
                try:
                    for _, key, version, state in items:
                        args = (state, collection, key, version)
                        one_check(cur.execute(UPDATE_RECORD, args) == 1, f"commit of {key}")
                    cur.executemany(INSERT_APPLIED, [(scope, iid, k) for iid, k, _, _ in items])
                except BaseException:
                    conn.rollback()
                    raise
                conn.commit()

            return Block([op])

        method = f"{batch} x UPDATE ... AND version=%s; one multi-row INSERT applied; COMMIT"
        return [Side(TXN, method, prepare)]

    def acquire(self, name: str, ttl: float) -> int:
        tokens: list[int] = []

        def body(cur: Any) -> bool:
            cur.execute(LEASE_LOCK, (name,))
            row = cur.fetchone()
            if row is None:
                cur.execute(LEASE_NEW, (name, "bench", ttl))
                tokens.append(1)
            elif row[0] is None or not row[2]:
                cur.execute(LEASE_TAKE, ("bench", ttl, name))
                tokens.append(int(row[1]) + 1)
            return bool(tokens)

        self.txn(body, f"acquire of {name}")
        return tokens[0]

    def renew(self, name: str, token: int, ttl: float) -> None:
        self.txn(lambda cur: cur.execute(RENEW, (ttl, name, token)) == 1, f"renew of {name}")

    def release(self, name: str, token: int) -> None:
        self.txn(lambda cur: cur.execute(RELEASE, (name, token)) == 1, f"release of {name}")

    def fenced(self, collection: str, keys: Sequence[str], lease_name: str) -> list[Side]:
        cursor, scope = Cursor(keys), f"c:{collection}"

        def prepare(n: int) -> Block:
            token = self.acquire(lease_name, 3600.0)
            items = [
                (new_id(), k, (json.dumps(collection_state(i)), token, collection, k, v, token))
                for i, (k, v) in enumerate(cursor.take(n))
            ]

            def op(i: int) -> None:
                intent_id, key, args = items[i]

                def body(cur: Any) -> bool:
                    if cur.execute(LEASE_LIVE, (lease_name, token)) != 1:
                        return False
                    if cur.execute(UPDATE_RECORD_FENCED, args) != 1:
                        return False
                    cur.execute(INSERT_APPLIED, (scope, intent_id, key))
                    return True

                self.txn(body, f"fenced commit of {key}")

            return Block([op], close=lambda: self.release(lease_name, token))

        method = (
            "SELECT the live lease row LOCK IN SHARE MODE; UPDATE ... fence=GREATEST(fence,t)"
            " WHERE version AND fence<=t; INSERT applied; COMMIT"
        )
        return [Side(TXN, method, prepare)]

    def lease_cycle(self, lease_name: str) -> list[Side]:
        method = (
            "acquire: SELECT ... FOR UPDATE; INSERT or UPDATE token = token + 1; COMMIT;"
            " renew/release: UPDATE ... WHERE token AND live; COMMIT"
        )
        return hand_lease_cycle(self, lease_name, TXN, method)


class MySQLBench(Bench):
    """A MySQL or MariaDB server: fencing via ``fencing.open(url)`` beside PyMySQL."""

    store_name = "mysql"
    guard_trigger = True

    def __init__(self, url: str) -> None:
        parsed = StoreURL.parse(url)
        suffix = uuid.uuid4().hex[:8]
        self.scratch = f"fencing_bench_{suffix}"
        self.setting = f"server {parsed.host or 'localhost'}:{parsed.port or 3306}"
        self.table_name = f"bench_orders_{suffix}"
        pymysql = _pymysql()
        admin = connect(parsed, None)
        try:
            with admin.cursor() as cur:
                cur.execute(f"CREATE DATABASE `{self.scratch}`")
        except pymysql.err.MySQLError as exc:
            raise StoreError(f"mysql: cannot create a scratch database: {exc}") from exc
        finally:
            admin.close()
        try:
            conn = connect(parsed, self.scratch)
            hand = MySQLHand(conn)
            with conn.cursor() as cur:
                for statement in (*SCHEMA, ORDERS_DDL.format(name="fencing_bench_orders")):
                    cur.execute(statement)
                rows = ORDERS_ROWS.format(name="fencing_bench_orders")
                cur.executemany(rows, [(k,) for k in range(1, ANSWER_ROWS + 1)])
            conn.commit()
            parts = urlsplit(url)
            store = fencing.open(urlunsplit(parts._replace(path="/" + self.scratch)))
        except BaseException as exc:
            self._drop_scratch(parsed)
            if isinstance(exc, pymysql.err.MySQLError):
                raise StoreError(f"mysql: cannot set up the bench: {exc}") from exc
            raise
        self._parsed = parsed
        self._borrowed: list[Any] = []
        self.cleanup_records = False  # the scratch database is dropped whole
        super().__init__(store, hand, suffix)
        self._hand = hand

    def _drop_scratch(self, parsed: StoreURL) -> None:
        admin = connect(parsed, None)
        try:
            with admin.cursor() as cur:
                cur.execute(f"DROP DATABASE IF EXISTS `{self.scratch}`")
        finally:
            admin.close()

    def fencing_table(self) -> fencing.Table | Skip:
        return self.user_table(self.table_name)

    def borrowed(self) -> Any:
        conn = connect(self._parsed, self.scratch)  # autocommit off, as an app's
        self._borrowed.append(conn)
        return conn

    def user_table(self, name: str) -> fencing.Table:
        with self._hand.conn.cursor() as cur:
            cur.execute(ORDERS_DDL.format(name=name))
            cur.executemany(ORDERS_ROWS.format(name=name), [(k,) for k in range(1, KEYS + 1)])
        self._hand.conn.commit()
        return self.store.table(name)

    def drop(self) -> None:
        for borrowed in self._borrowed:
            borrowed.close()
        self._hand.conn.rollback()
        self._drop_scratch(self._parsed)
