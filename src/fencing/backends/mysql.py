"""The MySQL / MariaDB backend: ``mysql://user:password@host:3306/db`` (also ``mariadb://``).

Drivers
    PyMySQL for the sync store, aiomysql for the async one (``pip install 'fencing[mysql]'``).
    Both are pure Python, so installing them needs no compiler and no client library;
    aiomysql is built on PyMySQL's protocol code, so the two speak the same protocol,
    raise the same ``pymysql.err`` exceptions and convert types the same way: one set of
    SQL texts, parameters and row readers serves both. Connections are pooled: a small
    thread-safe pool of PyMySQL connections (sync), ``aiomysql.create_pool`` (async).

How a commit works
    One commit, or a whole ``commit_many`` batch, is *one* round trip: the statements of
    one transaction are sent together as a multi-statement query (``CLIENT.MULTI_STATEMENTS``;
    every statement is reviewed text below, values are escaped by the driver, identifiers
    were validated by the front and are quoted with backticks)::

        START TRANSACTION
        SET @f_claimed = 1, @f_done = 0
        INSERT INTO fencing_applied ... ON DUPLICATE KEY UPDATE ... (@f_claimed := 0)
                                                    claim the intent's root id for its key
        (fenced) SELECT ... fencing_leases LOCK IN SHARE MODE    no takeover until we end
        (fenced) SELECT ... FOR UPDATE              lock the record / the user's row
        SET @f_now = UNIX_TIMESTAMP(NOW(6))         the server's clock, after any lock wait
        UPDATE ... SET ..., version = version + (@f_done := 1)
                   WHERE key AND version [AND guard] [AND fence and live lease] AND @f_claimed
        DELETE the claim IF @f_claimed AND NOT @f_done
        (tables, fenced) raise fencing_fences IF @f_done
        SELECT @f_claimed, @f_done, @f_now, the record ... FOR UPDATE
        (fenced) SELECT the lease row
        COMMIT

    The success path is decided by the conditional UPDATE (its WHERE is re-read under
    the row lock it waits for). On the refused path the current record (``FOR UPDATE``),
    whether the intent was applied (the claim found a row, whose lock the claim holds)
    and the lease row (share-locked before the UPDATE) come from the same transaction,
    and ``fencing._rules.judge`` says why. Should the rules find nothing wrong with the
    row read then (a record deleted and created again in between, or a user-table value
    the server compared differently from Python), the answer is ``Stale``: nothing was
    written. MySQL has no ``UPDATE ... RETURNING`` (MariaDB has it only for INSERT and
    DELETE), which is why the record is read back by the final SELECT of the batch.

    A collection intent with a guard is judged in Python on the record read ``FOR
    UPDATE``: that costs a second round trip (its write follows under the lock held).

    Connections use ``CLIENT.FOUND_ROWS``: MySQL reports *changed* rows by default, so an
    UPDATE writing an identical state would count 0; with FOUND_ROWS it counts matched
    rows (the version is bumped too, so the row always changes anyway).

    A batch of a collection's commits first locks its keys' tombstone rows (in key
    order), as ``create`` and ``delete`` do for their one key before anything else: no
    record of a batch is created or deleted before it commits, and a create that
    overlaps a delete of its key continues after the deleted version (versions of a key
    never repeat). An intent id names work on one key: the claim is
    ``(scope, intent_id, key_text)``.

    A duplicate intent committed concurrently cannot apply twice: the second claim of
    the same ``(scope, intent_id)`` (the intent's root id, which its ``Recompute``
    derivations share) waits on the first one's row lock and, once the first
    transaction commits, finds the row and reports ``Duplicate``.

Effects
    ``fencing_effects`` holds one row per idempotency key (``EFFECT_COLUMNS``; times are
    the server's clock as ``DOUBLE`` epoch seconds). Each operation is one round trip::

        record   INSERT ... ON DUPLICATE KEY UPDATE (a no-op that only locks); SELECT the row
        mark     START TRANSACTION; lock the row; SET @f_now; UPDATE; SELECT the row; COMMIT
        settle   START TRANSACTION; lock the intent's unsettled rows; SET @f_now;
                 UPDATE ... WHERE outcome IS NULL; SELECT the intent's settled rows; COMMIT
        list     one SELECT ... ORDER BY recorded_at, idempotency_key LIMIT n

    Concurrent recordings of one key queue on the first one's row lock and get its row
    back: the first recording wins. After the settling UPDATE every effect of the intent
    it saw has an outcome; an effect recorded after it (READ COMMITTED takes no gap
    locks) still has none and is left out of the answer, as if recorded after the settle.
    Neither server has partial indexes: the effects to reconcile are indexed by the
    generated column ``open_since`` (``recorded_at`` while settled and not reconciled,
    else NULL), read in order from that index.

Isolation
    InnoDB, ``READ COMMITTED`` for every session, deliberately: every statement reads the
    latest committed rows (a ``REPEATABLE READ`` snapshot taken early in a transaction
    could make the refused path judge against an old version), and READ COMMITTED takes
    no gap locks, so concurrent claims, fence and lease inserts do not deadlock on gaps.
    Decisions never rely on a plain read: they use the UPDATE's own current read and
    locking reads (``FOR UPDATE`` / ``LOCK IN SHARE MODE``). With binary logging, READ
    COMMITTED needs ``binlog_format`` ROW or MIXED (the defaults of MySQL 8 and MariaDB).
    A deadlock (InnoDB rolls the whole transaction back) is retried a few times before it
    surfaces as ``TransientStoreError``.

Clock
    Lease expiry is measured by the server: ``UNIX_TIMESTAMP(NOW(6))`` in a session whose
    ``time_zone`` is ``+00:00`` (so no DST hour is ever ambiguous), taken after the
    transaction holds its locks.

Keys
    Collection keys are stored as ``VARBINARY(2048)`` (their UTF-8 bytes), not as a
    ``VARCHAR`` with a binary collation: ``utf8mb4_bin`` is a PAD SPACE collation on both
    servers, under which ``"a"`` and ``"a "`` would be one key. Bytes compare exactly,
    case-sensitively, on MySQL and MariaDB alike. Table keys are recorded in
    ``fencing_applied`` / ``fencing_fences`` as ``i:<int>`` or ``s:<text>``, which
    cannot collide.

MySQL 8 vs MariaDB 10.11
    The SQL is the common subset (``LOCK IN SHARE MODE`` rather than ``FOR SHARE``; no
    ``VALUES()`` in ``ON DUPLICATE KEY UPDATE``; ``SET SESSION TRANSACTION ISOLATION``
    rather than the ``tx_isolation`` / ``transaction_isolation`` variable). Tested here on
    MariaDB 10.11. Guard values of user tables are compared with the null-safe ``<=>``;
    text guards compare under ``utf8mb4_bin`` plus the exact length, so neither case nor
    trailing spaces match loosely.

Options (URL query or keyword)
    ``pool_size`` (5), ``pool_timeout`` seconds to wait for a free connection (30),
    ``connect_timeout`` (10), ``lock_wait_timeout`` seconds a statement waits for a row
    lock, ``innodb_lock_wait_timeout`` of the session (10), ``pool_recycle`` seconds an
    idle connection is kept (3600), ``unix_socket``; keyword only: ``ssl`` (a dict or
    ``ssl.SSLContext`` handed to the driver).

Errors (translated where the driver is called, ``raise ... from exc``)::

    pymysql.err.*
    ├── 1062 on create                         -> AlreadyExists
    ├── 2002/2003/2006/2013/2055, 1040, 1053,   -> TransientStoreError (outcome unknown:
    │   1205 lock wait, 1213 deadlock, 1317,       retry with the same intent)
    │   1927, 4031, socket errors
    ├── 1146 unknown table, 1054 unknown column -> SchemaError
    ├── 1048/1264/1265/1292/1366/1406: a value  -> InvalidState (rolled back: nothing
    │   a user table's column cannot hold          was written)
    ├── UnicodeEncodeError (a lone surrogate)   -> InvalidInput (before sending)
    └── anything else                          -> StoreError
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import json
import os
import random
import select
import time
import weakref
from collections.abc import Callable, Generator, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, TypeVar
from urllib.parse import unquote

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
    InvalidInput,
    InvalidState,
    MissingDependency,
    SchemaError,
    StoreClosed,
    StoreError,
    TransientStoreError,
)
from .._request import CommitRequest, CommitResult, LeaseAnswer, Target, table_version
from .._rules import LeaseRow, Status, judge
from .._values import Record
from ._contract import AsyncBackend, Backend
from ._pool import Pool

__all__ = [
    "SCHEMA_VERSION",
    "AsyncMySQLBackend",
    "MySQLBackend",
    "open_async_backend",
    "open_backend",
]

T = TypeVar("T")

# 2: fencing_effects (1 -> 2 only added a table);
# 3: an applied intent is keyed by (scope, intent_id, key_text): an id names work on one key
SCHEMA_VERSION: Final = 3

# -- the library's own tables, as reviewed text ---------------------------------------
_TABLE_OPTIONS: Final = (
    "ENGINE=InnoDB ROW_FORMAT=DYNAMIC DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin"
)
_ASCII: Final = "CHARACTER SET ascii COLLATE ascii_bin"  # names and ids: ASCII by validation
SCHEMA: Final = (
    f"CREATE TABLE IF NOT EXISTS fencing_schema ("
    f" component VARCHAR(64) {_ASCII} NOT NULL PRIMARY KEY,"
    f" version INT NOT NULL) {_TABLE_OPTIONS}",
    f"CREATE TABLE IF NOT EXISTS fencing_records ("
    f" collection VARCHAR(128) {_ASCII} NOT NULL,"
    f" `key` VARBINARY(2048) NOT NULL,"
    f" version BIGINT NOT NULL,"
    f" fence BIGINT NOT NULL DEFAULT 0,"
    f" state LONGTEXT NOT NULL,"
    f" updated_at DECIMAL(20,6) NOT NULL,"
    f" PRIMARY KEY (collection, `key`)) {_TABLE_OPTIONS}",
    f"CREATE TABLE IF NOT EXISTS fencing_applied ("
    f" scope VARCHAR(130) {_ASCII} NOT NULL,"
    f" intent_id VARCHAR(128) {_ASCII} NOT NULL,"
    f" key_text VARBINARY(2050) NOT NULL,"
    f" applied_at DECIMAL(20,6) NOT NULL,"
    f" PRIMARY KEY (scope, intent_id, key_text),"
    f" KEY fencing_applied_at (applied_at)) {_TABLE_OPTIONS}",
    f"CREATE TABLE IF NOT EXISTS fencing_fences ("
    f" scope VARCHAR(130) {_ASCII} NOT NULL,"
    f" key_text VARBINARY(2050) NOT NULL,"
    f" fence BIGINT NOT NULL,"
    f" PRIMARY KEY (scope, key_text)) {_TABLE_OPTIONS}",
    f"CREATE TABLE IF NOT EXISTS fencing_leases ("
    f" name VARCHAR(128) {_ASCII} NOT NULL PRIMARY KEY,"
    f" owner VARCHAR(200) NULL,"
    f" token BIGINT NOT NULL,"
    f" expires_at DECIMAL(20,6) NOT NULL) {_TABLE_OPTIONS}",
    # the last version of a deleted record: a re-created record continues after it
    f"CREATE TABLE IF NOT EXISTS fencing_tombstones ("
    f" collection VARCHAR(128) {_ASCII} NOT NULL,"
    f" `key` VARBINARY(2048) NOT NULL,"
    f" version BIGINT NOT NULL,"
    f" PRIMARY KEY (collection, `key`)) {_TABLE_OPTIONS}",
    # recorded effects (``fencing._effects``): the columns of EFFECT_COLUMNS, then
    # ``open_since``, ``recorded_at`` of an effect that needs reconciling (else NULL): its
    # index stands in for a partial index (neither server has one), so the effects to
    # reconcile are read in order from the index, never by scanning the settled ones
    f"CREATE TABLE IF NOT EXISTS fencing_effects ("
    f" idempotency_key CHAR(43) {_ASCII} NOT NULL PRIMARY KEY,"
    f" scope VARCHAR(130) {_ASCII} NOT NULL,"
    f" record_key TEXT NOT NULL,"
    f" intent_id VARCHAR(128) {_ASCII} NOT NULL,"
    f" transition VARCHAR(128) {_ASCII} NOT NULL,"
    f" name VARCHAR(128) {_ASCII} NOT NULL,"
    f" status VARCHAR(16) {_ASCII} NOT NULL,"
    f" detail LONGTEXT NULL,"
    f" outcome VARCHAR(16) {_ASCII} NULL,"
    f" reconciled_at DOUBLE NULL,"
    f" recorded_at DOUBLE NOT NULL,"
    f" updated_at DOUBLE NOT NULL,"
    f" open_since DOUBLE GENERATED ALWAYS AS"
    f" (IF(outcome IS NOT NULL AND reconciled_at IS NULL, recorded_at, NULL)) STORED,"
    f" KEY fencing_effects_intent (scope, intent_id, recorded_at),"
    f" KEY fencing_effects_open (open_since)) {_TABLE_OPTIONS}",
)
_SCHEMA_ROW: Final = "INSERT IGNORE INTO fencing_schema (component, version) VALUES ('core', %s)"
# 1 -> 2 only added a table (made above, IF NOT EXISTS); a newer version is left alone
_SCHEMA_BUMP: Final = (
    "UPDATE fencing_schema SET version = %s WHERE component = 'core' AND version < %s"
)
# 2 -> 3 (a second run only rebuilds the same key)
_APPLIED_BY_KEY: Final = (
    "ALTER TABLE fencing_applied DROP PRIMARY KEY, ADD PRIMARY KEY (scope, intent_id, key_text)"
)
_SCHEMA_READ: Final = "SELECT version FROM fencing_schema WHERE component = 'core'"

# -- statements -----------------------------------------------------------------------
_NOW: Final = "UNIX_TIMESTAMP(NOW(6))"
_SET_NOW: Final = f"SET @f_now = {_NOW}"
# Whether the claim was new and whether the UPDATE applied are set by the statements
# themselves (an assignment in ON DUPLICATE KEY UPDATE, and in the UPDATE's SET, which
# runs only for the row it writes), never read from ROW_COUNT(): when the client is gone
# (a worker killed or interrupted mid-call), the server still runs the whole script, but
# ROW_COUNT() answers -1 once a statement's reply could not be sent; a claim kept by
# mistake would then answer Duplicate for work that was never applied.
_INIT_FLAGS: Final = "SET @f_claimed = 1, @f_done = 0"
_CLAIM: Final = (
    "INSERT INTO fencing_applied (scope, intent_id, key_text, applied_at)"
    f" VALUES (%s, %s, %s, {_NOW})"
    " ON DUPLICATE KEY UPDATE applied_at = IF(@f_claimed := 0, applied_at, applied_at)"
)
_DONE: Final = "(@f_done := 1)"
_UNCLAIM: Final = (
    "DELETE FROM fencing_applied WHERE scope = %s AND intent_id = %s AND key_text = %s"
    " AND @f_claimed = 1 AND @f_done = 0"
)
_LOCK_LEASE: Final = "SELECT 1 FROM fencing_leases WHERE name = %s LOCK IN SHARE MODE"
_LOCK_RECORD: Final = (
    "SELECT 1 FROM fencing_records WHERE collection = %s AND `key` = %s FOR UPDATE"
)
_LEASE_LIVE: Final = (
    " AND EXISTS (SELECT 1 FROM fencing_leases WHERE name = %s AND token = %s"
    " AND owner IS NOT NULL AND expires_at > @f_now)"
)
_COLLECTION_UPDATE: Final = (
    "UPDATE fencing_records SET state = %s, version = version + " + _DONE + ","
    " updated_at = @f_now{fence_set}"
    " WHERE collection = %s AND `key` = %s AND version = %s AND @f_claimed = 1{fence_where}"
)
# One JSON column rather than six: each column costs the driver a descriptor to parse,
# and this SELECT is on every commit's success path.
_COLLECTION_RESULT: Final = (
    "SELECT JSON_ARRAY(@f_claimed, @f_done, @f_now, version, fence, IF(@f_done = 1, NULL, state))"
    " FROM fencing_records WHERE collection = %s AND `key` = %s FOR UPDATE"
)
_LEASE_AFTER_REFUSAL: Final = (
    "SELECT owner, token, expires_at FROM fencing_leases WHERE name = %s AND @f_done = 0"
)
_RAISE_FENCE: Final = (
    "INSERT INTO fencing_fences (scope, key_text, fence) SELECT %s, %s, %s FROM DUAL"
    " WHERE @f_done = 1 ON DUPLICATE KEY UPDATE fence = GREATEST(fence, %s)"
)
_FENCE_OF: Final = "(SELECT fence FROM fencing_fences WHERE scope = %s AND key_text = %s)"
_READ_RECORD: Final = (
    "SELECT version, fence, state FROM fencing_records WHERE collection = %s AND `key` = %s"
)
# the server's now, and whether the intent was applied
_JUDGE_META: Final = (
    f"SELECT {_NOW}, EXISTS (SELECT 1 FROM fencing_applied WHERE scope = %s AND intent_id = %s"
    " AND key_text = %s)"
)
_READ_LEASE: Final = "SELECT owner, token, expires_at FROM fencing_leases WHERE name = %s"
# A record created again after a delete continues the deleted one's versions, so an
# intent decided against the deleted record can never match the new one. The key's
# tombstone row is its lock: create and delete both take it first (an upsert takes an
# exclusive lock whether it inserts the row or finds it), so a create that overlaps a
# delete waits for it, and reads the tombstone the delete left.
_KEY_LOCK: Final = (
    "INSERT INTO fencing_tombstones (collection, `key`, version) VALUES (%s, %s, 0)"
    " ON DUPLICATE KEY UPDATE version = version"
)
# Under the key's lock no other create or delete of it runs: the plain reads are current.
_CREATE: Final = (
    "INSERT INTO fencing_records (collection, `key`, version, fence, state, updated_at)"
    " SELECT t.collection, t.`key`, t.version + 1, 0, %s, " + _NOW + " FROM fencing_tombstones t"
    " WHERE t.collection = %s AND t.`key` = %s AND NOT EXISTS (SELECT 1 FROM fencing_records r"
    " WHERE r.collection = t.collection AND r.`key` = t.`key`)"
)
_CREATED: Final = (
    "SELECT ROW_COUNT(), (SELECT version FROM fencing_records WHERE collection = %s AND `key` = %s)"
)
_DELETE_LOCK: Final = (
    "SELECT version INTO @f_gone FROM fencing_records"
    " WHERE collection = %s AND `key` = %s FOR UPDATE"
)
_DELETE: Final = "DELETE FROM fencing_records WHERE collection = %s AND `key` = %s"
_TOMBSTONE: Final = (
    "UPDATE fencing_tombstones SET version = GREATEST(version, @f_gone)"
    " WHERE collection = %s AND `key` = %s AND @f_gone IS NOT NULL"
)
_COLUMNS: Final = (
    "SELECT TABLE_NAME, COLUMN_NAME FROM information_schema.COLUMNS"
    " WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = %s"
)
_ENGINE: Final = (
    "SELECT TABLE_NAME, ENGINE, @@lower_case_table_names FROM information_schema.TABLES"
    " WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = %s"
)
_PRUNE: Final = f"DELETE FROM fencing_applied WHERE applied_at < {_NOW} - %s"

# Leases: the row is locked first (an upsert of a placeholder row takes an exclusive
# lock whether it inserts or finds the row, so two first-ever acquisitions of a name
# serialise); the clock is read after the lock; one conditional UPDATE decides.
_LEASE_LOCK_NEW: Final = (
    "INSERT INTO fencing_leases (name, owner, token, expires_at) VALUES (%s, NULL, 0, 0)"
    " ON DUPLICATE KEY UPDATE token = token"
)
_LEASE_LOCK: Final = "SELECT 1 FROM fencing_leases WHERE name = %s FOR UPDATE"
_LEASE_HELD: Final = "owner IS NOT NULL AND expires_at > @f_now"
_LEASE_GRANT: Final = (
    "UPDATE fencing_leases SET owner = %s, token = token + 1, expires_at = @f_now + %s"
    f" WHERE name = %s AND NOT ({_LEASE_HELD})"
)
_LEASE_RENEW: Final = (
    "UPDATE fencing_leases SET expires_at = @f_now + %s"
    f" WHERE name = %s AND token = %s AND {_LEASE_HELD}"
)
_LEASE_RELEASE: Final = (
    "UPDATE fencing_leases SET owner = NULL, expires_at = 0"
    f" WHERE name = %s AND token = %s AND {_LEASE_HELD}"
)
_LEASE_READ: Final = (
    "SELECT {now}, l.owner, l.token, l.expires_at FROM (SELECT 1 AS one) AS d"
    " LEFT JOIN fencing_leases AS l ON l.name = %s"
)

# Effects: rows keyed by their idempotency key (see "Effects" in the module docstring).
_EFFECT_ROW: Final = ", ".join(EFFECT_COLUMNS)
_EFFECT_SELECT: Final = f"SELECT {_EFFECT_ROW} FROM fencing_effects WHERE "
_EFFECT_ORDER: Final = " ORDER BY recorded_at, idempotency_key"
_EFFECT_BY_KEY: Final = "idempotency_key = %s"
_EFFECT_BY_INTENT: Final = "scope = %s AND intent_id = %s"
_EFFECT_OPEN: Final = "open_since IS NOT NULL"  # outcome set, reconciled_at NULL
_EFFECT_PENDING: Final = PENDING.format(cutoff=f"({_NOW} - %s)")
# The first recording wins: a duplicate key only takes the row's lock (no change), so
# concurrent recordings of one key wait for the first to commit and then find its row.
# (Not INSERT IGNORE: that would also turn a value the column cannot hold into a warning.)
_EFFECT_RECORD: Final = (
    f"INSERT INTO fencing_effects ({_EFFECT_ROW})"
    f" VALUES (%s, %s, %s, %s, %s, %s, %s, %s, NULL, NULL, {_NOW}, {_NOW})"
    " ON DUPLICATE KEY UPDATE idempotency_key = idempotency_key"
)
_EFFECT_LOCK: Final = "SELECT 1 FROM fencing_effects WHERE idempotency_key = %s FOR UPDATE"
_EFFECT_MARK: Final = (
    "UPDATE fencing_effects SET status = COALESCE(%s, status), detail = COALESCE(%s, detail),"
    " reconciled_at = IF(%s, COALESCE(reconciled_at, @f_now), reconciled_at),"
    " updated_at = @f_now WHERE idempotency_key = %s"
)
_EFFECT_LOCK_OPEN: Final = (
    "SELECT 1 FROM fencing_effects WHERE scope = %s AND intent_id = %s AND outcome IS NULL"
    " FOR UPDATE"
)
_EFFECT_SETTLE: Final = (
    "UPDATE fencing_effects SET outcome = %s, updated_at = @f_now"
    " WHERE scope = %s AND intent_id = %s AND outcome IS NULL"
)
# Every effect of the intent the UPDATE saw now has an outcome; one recorded since it
# (READ COMMITTED takes no gap locks) is left out, as if recorded after the settle.
_EFFECT_SETTLED: Final = (
    _EFFECT_SELECT + _EFFECT_BY_INTENT + " AND outcome IS NOT NULL" + _EFFECT_ORDER
)

# Errors: the driver's error numbers (server and client) fencing treats as transient.
# The server refused what the URL says: retrying cannot fix it.
_CONFIGURATION: Final = frozenset(
    {
        1044,  # access denied for user to database
        1045,  # access denied (user or password)
        1049,  # unknown database
        1698,  # access denied (auth plugin, e.g. unix_socket)
    }
)
_TRANSIENT: Final = frozenset(
    {
        1040,  # too many connections
        1053,  # server shutdown in progress
        1158,  # network read error
        1159,  # network read timeout
        1160,  # network write error
        1161,  # network write timeout
        1205,  # lock wait timeout exceeded
        1213,  # deadlock; the transaction was rolled back
        1317,  # query execution was interrupted
        1927,  # MariaDB: connection was killed
        2002,  # can't connect (socket)
        2003,  # can't connect (TCP)
        2006,  # server has gone away
        2013,  # lost connection during query
        2055,  # lost connection (system error)
        4031,  # MySQL 8: disconnected by the server for inactivity
    }
)
_SCHEMA_ERRORS: Final = frozenset({1146, 1054})
# A value a user table's column cannot hold (too long, out of range, NULL in NOT NULL,
# not a number, not in the column's character set): the statement failed and the
# transaction is rolled back, so nothing was written.
_DATA_ERRORS: Final = frozenset({1048, 1264, 1265, 1292, 1366, 1406})
_DEADLOCK: Final = 1213
_DEADLOCK_ATTEMPTS: Final = 4
_BATCH_BYTES: Final = 1 << 20  # flush a commit_many batch (same transaction) past this


# -- batches and their results ----------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Batch:
    """Statements sent in one round trip; ``params`` fill their ``%s`` in order."""

    sql: str
    params: tuple[Any, ...] | None
    duplicate: str | None = None  # a duplicate key here means AlreadyExists(duplicate)


@dataclass(frozen=True, slots=True)
class Result:
    """One statement's result: column names and rows (empty for non-SELECT), row count."""

    names: tuple[str, ...]
    rows: tuple[tuple[Any, ...], ...]
    affected: int


#: A backend operation: yields the batches it needs, receives one Result per statement.
Flow = Generator[Batch, list[Result], T]


class _Script:
    """Statements being gathered into one batch; ``add`` returns a statement's index."""

    __slots__ = ("count", "params", "parts", "size")

    def __init__(self, *statements: str) -> None:
        self.parts: list[str] = list(statements)
        self.params: list[Any] = []
        self.count = len(statements)
        self.size = 0

    def add(self, sql: str, *params: Any, statements: int = 1) -> int:
        """Append ``statements`` statements (joined in ``sql``); the index of the first."""
        self.parts.append(sql)
        self.params.extend(params)
        self.size += len(sql) + sum(len(p) for p in params if isinstance(p, str))
        self.count += statements
        return self.count - statements

    def batch(self, duplicate: str | None = None) -> Batch:
        return Batch(";\n".join(self.parts), tuple(self.params) or None, duplicate)


def _one(sql: str, *params: Any, duplicate: str | None = None) -> Batch:
    return Batch(sql, params or None, duplicate)


def quote(identifier: str) -> str:
    """Quote an identifier already checked by ``check_column``."""
    return "`" + identifier.replace("`", "``") + "`"


def _key_text(key: str | int) -> str:
    """A table key as text that cannot collide: ``i:42`` is never ``s:42``."""
    return f"i:{key}" if isinstance(key, int) else f"s:{key}"


def _float(value: Any) -> float:
    return 0.0 if value is None else float(value)


def _lease_row(name: str, owner: Any, token: Any, expires_at: Any) -> LeaseRow | None:
    if token is None:
        return None
    return LeaseRow(name, owner, int(token), _float(expires_at))


def _table_record(
    target: Target, key: str | int, names: Sequence[str], row: Sequence[Any], fence: Any
) -> Record:
    values = dict(zip(names, row, strict=True))
    vcol = target.version_column
    version = table_version(values.pop(vcol), target, key) if vcol else 0
    values.pop(target.key_column, None)
    return Record(target.name, key, version, int(fence or 0), values, "table")


# -- reading records ------------------------------------------------------------------
def _key_sql(target: Target, text: bool) -> str:
    """A user table's row by key, matched exactly: an integer key matches only a numeric
    (or binary) key column, a text key only a text column, character for character.
    MySQL alone would find row 0 of an INTEGER column for ``'abc'``, row ``'05'`` of a
    text column for ``5``, and ``'K'`` or ``'k '`` for ``'k'`` under a case-insensitive
    PAD SPACE collation; and one row under two keys would split its fence."""
    k = quote(target.key_column)
    if not text:
        return f"({k} = %s AND CHARSET({k}) = 'binary')"
    return (
        f"({k} = %s AND CHARSET({k}) <> 'binary'"
        f" AND CAST({k} AS CHAR) COLLATE utf8mb4_bin = %s AND CHAR_LENGTH({k}) = %s)"
    )


def _key_params(key: str | int) -> tuple[Any, ...]:
    return (key, key, len(key)) if isinstance(key, str) else (key,)


def _table_select(target: Target, text_key: bool, head: str = "", lock: str = "") -> str:
    table = quote(target.name)
    where = _key_sql(target, text_key)
    return f"SELECT {head}{_FENCE_OF}, {table}.* FROM {table} WHERE {where}{lock}"


def _add_read(script: _Script, target: Target, key: str | int, lock: str = "") -> int:
    if target.kind == "collection":
        return script.add(_READ_RECORD + lock, target.name, key)
    sql = _table_select(target, isinstance(key, str), lock=lock)
    return script.add(sql, target.scope, _key_text(key), *_key_params(key))


def _record_of(result: Result, target: Target, key: str | int) -> Record | None:
    if not result.rows:
        return None
    row = result.rows[0]
    if target.kind == "collection":
        return Record(target.name, key, int(row[0]), int(row[1]), json.loads(row[2]))
    return _table_record(target, key, result.names[1:], row[1:], row[0])


def read_flow(target: Target, key: str | int) -> Flow[Record | None]:
    script = _Script()
    at = _add_read(script, target, key)
    results = yield script.batch()
    return _record_of(results[at], target, key)


@dataclass(frozen=True, slots=True)
class _Reads:
    """Where the answers of ``_add_judge_reads`` are in its batch's results."""

    meta: int
    record: int
    lease: int | None


def _add_judge_reads(script: _Script, request: CommitRequest, lock: bool) -> _Reads:
    """The lease row, the record, whether the intent is applied and the server's now;
    with ``lock``, in the order of the commit's own locks (lease shared, record exclusive)."""
    target, intent, lease = request.target, request.intent, request.lease
    lease_at = None
    if lease is not None:
        lease_at = script.add(_READ_LEASE + (" LOCK IN SHARE MODE" if lock else ""), lease.name)
    record = _add_read(script, target, intent.key, " FOR UPDATE" if lock else "")
    meta = script.add(_JUDGE_META, target.scope, request.claim_id, _key_text(intent.key))
    return _Reads(meta, record, lease_at)


def _judged(results: list[Result], at: _Reads, request: CommitRequest) -> CommitResult:
    target, intent, lease = request.target, request.intent, request.lease
    now, applied = results[at.meta].rows[0]
    record = _record_of(results[at.record], target, intent.key)
    row = None
    if lease is not None and at.lease is not None and results[at.lease].rows:
        row = _lease_row(lease.name, *results[at.lease].rows[0])
    return CommitResult(judge(record, bool(applied), intent, lease, row, _float(now)), record)


def probe_flow(request: CommitRequest) -> Flow[CommitResult]:
    script = _Script()
    at = _add_judge_reads(script, request, lock=False)
    return _judged((yield script.batch()), at, request)


# -- commits --------------------------------------------------------------------------
@functools.lru_cache(maxsize=1024)
def _table_update_sql(
    target: Target,
    columns: tuple[str, ...],
    text_key: bool,
    versioned: bool,
    guard: tuple[tuple[str, bool], ...],
    fenced: bool,
) -> str:
    """The conditional UPDATE of a user table for one shape of request."""
    sets = [f"{quote(c)} = %s" for c in columns]
    where = [_key_sql(target, text_key)]
    if target.version_column:
        v = quote(target.version_column)
        sets.append(f"{v} = {v} + {_DONE}")  # (@f_done := 1) is 1: written, and flagged
        if versioned:
            where.append(f"{v} = %s")
    else:  # the first column's value, flagging the write on the way
        sets[0] = f"{quote(columns[0])} = IF({_DONE} = 1, %s, NULL)"
    for column, is_text in guard:
        if is_text:  # exact text: binary collation, and the length (no PAD SPACE)
            col = quote(column)
            where.append(f"({col} = %s COLLATE utf8mb4_bin AND CHAR_LENGTH({col}) = %s)")
        else:
            where.append(f"{quote(column)} <=> %s")
    where.append("@f_claimed = 1")
    if fenced:
        where.append(
            "NOT EXISTS (SELECT 1 FROM fencing_fences WHERE scope = %s AND key_text = %s"
            " AND fence > %s)" + _LEASE_LIVE
        )
    return f"UPDATE {quote(target.name)} SET {', '.join(sets)} WHERE {' AND '.join(where)}"


@dataclass(frozen=True, slots=True)
class _Template:
    """The statements of one shape of commit, joined; where its answers are."""

    sql: str
    statements: int
    result: int  # the SELECT of the record after the commit
    lease: int | None  # the SELECT of the lease row (fenced commits)


def _template(statements: list[str], result: str, lease: str | None) -> _Template:
    statements = [*statements, result] + ([lease] if lease else [])
    at = len(statements) - (2 if lease else 1)
    return _Template(";\n".join(statements), len(statements), at, at + 1 if lease else None)


def _locks(fenced: bool, lock_record: str) -> list[str]:
    """Claim the intent; under a lease, lock the lease row, then the record, then read
    the clock (after any lock wait)."""
    if not fenced:
        return [_INIT_FLAGS, _CLAIM, _SET_NOW]
    return [_INIT_FLAGS, _CLAIM, _LOCK_LEASE, lock_record, _SET_NOW]


@functools.lru_cache(maxsize=2)
def _collection_template(fenced: bool) -> _Template:
    update = _COLLECTION_UPDATE.format(
        fence_set=", fence = GREATEST(fence, %s)" if fenced else "",
        fence_where=" AND fence <= %s" + _LEASE_LIVE if fenced else "",
    )
    statements = [*_locks(fenced, _LOCK_RECORD), update, _UNCLAIM]
    return _template(statements, _COLLECTION_RESULT, _LEASE_AFTER_REFUSAL if fenced else None)


@functools.lru_cache(maxsize=1024)
def _table_template(
    target: Target,
    columns: tuple[str, ...],
    text_key: bool,
    versioned: bool,
    guard: tuple[tuple[str, bool], ...],
    fenced: bool,
) -> _Template:
    table, where = quote(target.name), _key_sql(target, text_key)
    update = _table_update_sql(target, columns, text_key, versioned, guard, fenced)
    lock_row = f"SELECT 1 FROM {table} WHERE {where} FOR UPDATE"
    statements = [*_locks(fenced, lock_row), update, _UNCLAIM]
    if fenced:
        statements.append(_RAISE_FENCE)
    result = _table_select(target, text_key, "@f_claimed, @f_done, @f_now, ", " FOR UPDATE")
    return _template(statements, result, _LEASE_AFTER_REFUSAL if fenced else None)


@dataclass(frozen=True, slots=True)
class _Slots:
    """Where one commit's answers are in its batch's results."""

    result: int
    lease: int | None


def _add_commit(script: _Script, request: CommitRequest) -> _Slots:
    """The statements of one conditional commit (see the module docstring), and their
    parameters in order; the SQL text is built once per shape of request."""
    target, intent, lease = request.target, request.intent, request.lease
    scope, key, key_text = target.scope, intent.key, _key_text(intent.key)
    claim = request.claim_id  # the root id: an intent and its derivations share one claim
    params: list[Any] = [scope, claim, key_text]
    if lease is not None:
        params.append(lease.name)
    if target.kind == "collection":
        template = _collection_template(lease is not None)
        if lease is None:
            params += [request.state_json, target.name, key, intent.expected_version]
        else:
            token = lease.token
            params += [target.name, key]  # the record's lock
            params += [request.state_json, token, target.name, key, intent.expected_version]
            params += [token, lease.name, token]
        params += [scope, claim, key_text, target.name, key]
    else:
        guard = intent.guard or {}
        versioned = bool(target.version_column) and intent.expected_version is not None
        shape = tuple((c, isinstance(v, str)) for c, v in guard.items())
        text_key = isinstance(key, str)
        template = _table_template(
            target, tuple(request.state), text_key, versioned, shape, lease is not None
        )
        if lease is not None:
            params += _key_params(key)  # the row's lock
        params += request.state.values()
        params += _key_params(key)
        if versioned:
            params.append(intent.expected_version)
        for value in guard.values():
            params += [value, len(value)] if isinstance(value, str) else [value]
        if lease is not None:
            params += [scope, key_text, lease.token, lease.name, lease.token]
        params += [scope, claim, key_text]
        if lease is not None:
            params += [scope, key_text, lease.token, lease.token]
        params += [scope, key_text, *_key_params(key)]
    if lease is not None:
        params.append(lease.name)
    at = script.add(template.sql, *params, statements=template.statements)
    return _Slots(at + template.result, None if template.lease is None else at + template.lease)


def _commit_result(results: list[Result], slots: _Slots, request: CommitRequest) -> CommitResult:
    target, intent, lease = request.target, request.intent, request.lease
    found = results[slots.result]
    if not found.rows:
        return CommitResult(Status.MISSING, None)
    if target.kind == "collection":
        claimed, done, now, version, fence, state = json.loads(found.rows[0][0])
        claimed, done = int(claimed), int(done)  # MariaDB renders user variables as text
        if done == 1:
            record = Record(target.name, intent.key, int(version), int(fence), request.state)
            return CommitResult(Status.APPLIED, record)
        record = Record(target.name, intent.key, int(version), int(fence), json.loads(state))
    else:
        claimed, done, now, fence, *rest = found.rows[0]
        claimed, done = int(claimed), int(done)
        record = _table_record(target, intent.key, found.names[4:], rest, fence)
        if done == 1:
            return CommitResult(Status.APPLIED, record)
    row = None
    if lease is not None and slots.lease is not None:
        lease_rows = results[slots.lease].rows
        row = _lease_row(lease.name, *lease_rows[0]) if lease_rows else None
    status = judge(record, claimed == 0, intent, lease, row, _float(now))
    # The UPDATE refused. The rules agreeing now, on the row locked since, can only mean
    # a row created (again) since the UPDATE looked, or a comparison the server made
    # differently from Python (a user table's column type): nothing was written.
    return CommitResult(Status.STALE if status is Status.OK else status, record)


def commit_flow(requests: Sequence[CommitRequest]) -> Flow[list[CommitResult]]:
    """One transaction for all ``requests``, one round trip unless a guard is judged here."""
    out: list[CommitResult | None] = [None] * len(requests)
    script = _Script("START TRANSACTION")
    pending: list[tuple[int, _Slots]] = []
    if len(requests) > 1 and requests[0].target.kind == "collection":
        # A batch first locks its keys (their tombstone rows, in key order), so no record
        # of the batch is created or deleted before it commits: an item answered Missing
        # is still missing then, like every other answer of the batch.
        name = requests[0].target.name
        keys = sorted({str(r.intent.key) for r in requests})
        values = ", ".join(["(%s, %s, 0)"] * len(keys))
        script.add(
            f"INSERT INTO fencing_tombstones (collection, `key`, version) VALUES {values}"
            " ON DUPLICATE KEY UPDATE version = version",
            *(p for k in keys for p in (name, k)),
        )

    def settle(results: list[Result]) -> None:
        for i, slots in pending:
            out[i] = _commit_result(results, slots, requests[i])
        pending.clear()

    for i, request in enumerate(requests):
        if request.target.kind == "collection" and request.intent.guard is not None:
            # A JSON guard is judged in Python on the record read FOR UPDATE.
            at = _add_judge_reads(script, request, lock=True)
            results = yield script.batch()
            settle(results)
            script = _Script()
            judged = _judged(results, at, request)
            if judged.status is not Status.OK:
                out[i] = judged
                continue
        pending.append((i, _add_commit(script, request)))
        if script.size > _BATCH_BYTES and i + 1 < len(requests):
            settle((yield script.batch()))
            script = _Script()
    script.add("COMMIT")
    settle((yield script.batch()))
    done = [r for r in out if r is not None]
    assert len(done) == len(requests)
    return done


# -- leases ---------------------------------------------------------------------------
def _lease_flow(name: str, lock: str, change: str, *params: Any) -> Flow[LeaseAnswer]:
    script = _Script("START TRANSACTION")
    script.add(lock, name)
    script.add(_SET_NOW)
    changed = script.add(change, *params)
    read = script.add(_LEASE_READ.format(now="@f_now"), name)
    script.add("COMMIT")
    results = yield script.batch()
    return _lease_answer(name, results[read], results[changed].affected == 1)


def _lease_answer(name: str, result: Result, granted: bool) -> LeaseAnswer:
    now, owner, token, expires_at = result.rows[0]
    return LeaseAnswer(granted, _lease_row(name, owner, token, expires_at), _float(now))


def acquire_flow(name: str, owner: str, ttl: float) -> Flow[LeaseAnswer]:
    return _lease_flow(name, _LEASE_LOCK_NEW, _LEASE_GRANT, owner, ttl, name)


def renew_flow(name: str, token: int, ttl: float) -> Flow[LeaseAnswer]:
    return _lease_flow(name, _LEASE_LOCK, _LEASE_RENEW, ttl, name, token)


def release_flow(name: str, token: int) -> Flow[LeaseAnswer]:
    return _lease_flow(name, _LEASE_LOCK, _LEASE_RELEASE, name, token)


def lease_state_flow(name: str) -> Flow[LeaseAnswer]:
    results = yield _one(_LEASE_READ.format(now=_NOW), name)
    return _lease_answer(name, results[0], False)


# -- effects --------------------------------------------------------------------------
def _effects_of(result: Result) -> list[Effect]:
    return [effect_from_row(row) for row in result.rows]


def record_effect_flow(row: NewEffect) -> Flow[Effect]:
    """Insert unless the key exists, then read the stored row: one round trip."""
    script = _Script()
    script.add(_EFFECT_RECORD, *row)
    read = script.add(_EFFECT_SELECT + _EFFECT_BY_KEY, row[0])
    results = yield script.batch()
    return _effects_of(results[read])[0]


def mark_effect_flow(
    idempotency_key: str, status: str | None, detail_json: str | None, reconcile: bool
) -> Flow[Effect | None]:
    """Lock the row, read the clock, change it, read it back: one transaction."""
    script = _Script("START TRANSACTION")
    script.add(_EFFECT_LOCK, idempotency_key)
    script.add(_SET_NOW)
    script.add(_EFFECT_MARK, status, detail_json, bool(reconcile), idempotency_key)
    read = script.add(_EFFECT_SELECT + _EFFECT_BY_KEY, idempotency_key)
    script.add("COMMIT")
    results = yield script.batch()
    found = _effects_of(results[read])
    return found[0] if found else None


def settle_effects_flow(scope: str, intent_id: str, outcome: str) -> Flow[list[Effect]]:
    """Lock the intent's unsettled effects, read the clock, settle them and read all of
    the intent's effects back, in one transaction (one round trip)."""
    script = _Script("START TRANSACTION")
    script.add(_EFFECT_LOCK_OPEN, scope, intent_id)
    script.add(_SET_NOW)
    script.add(_EFFECT_SETTLE, outcome, scope, intent_id)
    read = script.add(_EFFECT_SETTLED, scope, intent_id)
    script.add("COMMIT")
    results = yield script.batch()
    return _effects_of(results[read])


def list_effects_flow(query: EffectQuery) -> Flow[list[Effect]]:
    params: tuple[Any, ...]
    if query.idempotency_key is not None:
        where, params = _EFFECT_BY_KEY, (query.idempotency_key,)
    elif query.intent_id is not None:
        where, params = _EFFECT_BY_INTENT, (query.scope, query.intent_id)
    elif query.pending_for is not None:
        where, params = _EFFECT_PENDING, (float(query.pending_for),)
    else:
        where, params = _EFFECT_OPEN, ()
    order = " ORDER BY open_since, idempotency_key" if not params else _EFFECT_ORDER
    results = yield _one(_EFFECT_SELECT + where + order + " LIMIT %s", *params, int(query.limit))
    return _effects_of(results[0])


_PRUNE_EFFECTS: Final = "DELETE FROM fencing_effects WHERE " + PRUNABLE.format(
    cutoff=f"({_NOW} - %s)"
)


def prune_effects_flow(older_than: float) -> Flow[int]:
    age = float(older_than)
    results = yield _one(_PRUNE_EFFECTS, age, age)
    return results[0].affected


# -- the rest of the contract ---------------------------------------------------------
def migrate_flow() -> Flow[None]:
    script = _Script(*SCHEMA)
    script.add(_SCHEMA_ROW, SCHEMA_VERSION)
    at = script.add(_SCHEMA_READ)
    results = yield script.batch()
    version = int(results[at].rows[0][0])
    if version > SCHEMA_VERSION:
        raise SchemaError(
            f"this store's schema is version {version}, newer than this fencing"
            f" ({SCHEMA_VERSION}); upgrade fencing"
        )
    if version < SCHEMA_VERSION:
        script = _Script()
        if version < 3:  # the applied intents' key joins their primary key
            script.add(_APPLIED_BY_KEY)
        script.add(_SCHEMA_BUMP, SCHEMA_VERSION, SCHEMA_VERSION)
        yield script.batch()


def columns_flow(target: Target) -> Flow[frozenset[str]]:
    name = target.name
    script = _Script()
    engine_at = script.add(_ENGINE, name)
    columns_at = script.add(_COLUMNS, name)
    results = yield script.batch()
    tables = results[engine_at].rows
    exact = [r for r in tables if r[0] == name]
    if not exact and tables and int(tables[0][2] or 0) > 0:  # lower_case_table_names
        exact = [r for r in tables if str(r[0]).lower() == name.lower()]
    if not exact:
        raise SchemaError(f"table {name!r} does not exist")
    table_name, engine = exact[0][0], exact[0][1]
    if str(engine).lower() != "innodb":
        raise SchemaError(
            f"table {name!r} uses the {engine} engine: fencing guards InnoDB tables only"
            " (its commits must be transactional)"
        )
    return frozenset(str(c) for t, c in results[columns_at].rows if t == table_name)


def create_flow(target: Target, key: str | int, state_json: str) -> Flow[Record]:
    """Lock the key (its tombstone row), insert after the tombstone's version unless the
    record exists, read what happened: one transaction, one round trip."""
    script = _Script("START TRANSACTION")
    script.add(_KEY_LOCK, target.name, key)
    script.add(_CREATE, state_json, target.name, key)
    read = script.add(_CREATED, target.name, key)
    script.add("COMMIT")
    results = yield script.batch(duplicate=f"{target.name}/{key} already exists")
    made, version = results[read].rows[0]
    if not made:
        raise AlreadyExists(f"{target.name}/{key} already exists")
    return Record(target.name, key, int(version), 0, json.loads(state_json))


def delete_flow(target: Target, key: str | int) -> Flow[bool]:
    """Lock the key (its tombstone row), then the record; delete it and raise the
    tombstone to its version: one transaction, one round trip."""
    script = _Script("START TRANSACTION", "SET @f_gone = NULL")
    script.add(_KEY_LOCK, target.name, key)
    script.add(_DELETE_LOCK, target.name, key)
    deleted = script.add(_DELETE, target.name, key)
    script.add(_TOMBSTONE, target.name, key)
    script.add("COMMIT")
    results = yield script.batch()
    return results[deleted].affected > 0


def prune_flow(older_than: float) -> Flow[int]:
    results = yield _one(_PRUNE, float(older_than))
    return results[0].affected


def _first(flow: Flow[list[CommitResult]]) -> Flow[CommitResult]:
    results = yield from flow
    return results[0]


# -- errors ---------------------------------------------------------------------------
def _errno(exc: BaseException) -> int | None:
    args = getattr(exc, "args", ())
    return args[0] if args and isinstance(args[0], int) else None


def _in_step(exc: BaseException) -> bool:
    """Whether a driver error raised mid-batch left the connection in step: only an
    error the server sent (an error packet ends the script's results; the 2000s are the
    client library's own codes), and not one the driver made of another exception
    (a signal handler's, raised while it read)."""
    code = _errno(exc)
    server = code is not None and not 2000 <= code < 3000
    return server and exc.__context__ is None and exc.__cause__ is None


def _is_driver_error(exc: BaseException) -> bool:
    pymysql = _import("pymysql")
    return isinstance(exc, pymysql.err.MySQLError | OSError | UnicodeError)


def _translate(exc: BaseException, batch: Batch | None) -> FencingError:
    code = _errno(exc)
    text = f"mysql: {exc}"
    if isinstance(exc, UnicodeEncodeError):  # raised while escaping: nothing was sent
        return InvalidInput(f"mysql: a value cannot be sent as UTF-8 ({exc})")
    if code == 1062 and batch is not None and batch.duplicate is not None:
        return AlreadyExists(batch.duplicate)
    if code in _CONFIGURATION:
        return ConfigurationError(f"{text} (the URL's database or credentials)")
    pymysql = _import("pymysql")
    if code in _TRANSIENT or isinstance(exc, OSError | pymysql.err.InterfaceError):
        return TransientStoreError(text)
    if code in _SCHEMA_ERRORS:
        return SchemaError(f"{text} (run store.migrate() / fencing migrate URL?)")
    if code in _DATA_ERRORS:
        return InvalidState(f"{text}; nothing was written")
    return StoreError(text)


def _import(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        raise MissingDependency(
            f"the mysql backend needs {exc.name}: pip install 'fencing[mysql]'"
        ) from exc


# -- settings -------------------------------------------------------------------------
_OPTIONS: Final = {
    "pool_size": int,
    "pool_timeout": float,
    "connect_timeout": float,
    "lock_wait_timeout": int,
    "pool_recycle": float,
    "unix_socket": str,
}


@dataclass(frozen=True)
class Settings:
    host: str
    port: int
    user: str | None
    password: str = field(repr=False)
    database: str
    unix_socket: str | None = None
    pool_size: int = 5
    pool_timeout: float = 30.0
    connect_timeout: float = 10.0
    lock_wait_timeout: int = 10
    pool_recycle: float = 3600.0
    ssl: Any = None

    def driver_kwargs(self, database_arg: str = "database") -> dict[str, Any]:
        """What PyMySQL's ``connect`` takes (aiomysql's: ``database_arg="db"``)."""
        client = _import("pymysql.constants.CLIENT")
        kwargs: dict[str, Any] = {
            "host": self.host,
            "port": self.port,
            "user": self.user,
            "password": self.password,
            database_arg: self.database,
            "charset": "utf8mb4",
            "autocommit": True,
            "client_flag": client.FOUND_ROWS | client.MULTI_STATEMENTS,
            "connect_timeout": self.connect_timeout,
        }
        if self.unix_socket:
            kwargs["unix_socket"] = self.unix_socket
        if self.ssl is not None:
            kwargs["ssl"] = self.ssl
        return kwargs

    def session_setup(self) -> Batch:
        """Run once on every new connection."""
        return Batch(
            f"SET time_zone = '+00:00', innodb_lock_wait_timeout = {int(self.lock_wait_timeout)};\n"
            "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED",
            None,
        )


def settings_from_url(url: Any, options: dict[str, Any]) -> Settings:
    """Settings from a parsed ``StoreURL`` and keyword options (keywords win)."""
    unknown = (set(url.options) - set(_OPTIONS)) | (set(options) - set(_OPTIONS) - {"ssl"})
    if unknown:
        raise ConfigurationError(
            f"unknown mysql option(s) {sorted(unknown)}; known: {sorted([*_OPTIONS, 'ssl'])}"
        )
    values: dict[str, Any] = {}
    for name, kind in _OPTIONS.items():
        raw = options.get(name, url.options.get(name))
        if raw is None:
            continue
        try:
            value = kind(raw)
        except (TypeError, ValueError):
            raise ConfigurationError(
                f"mysql option {name}={raw!r} must be {kind.__name__}"
            ) from None
        if kind is not str and not value > 0:
            raise ConfigurationError(f"mysql option {name}={raw!r} must be positive")
        values[name] = value
    database = unquote(url.path or "")
    if not database or "/" in database:
        raise ConfigurationError(
            "a mysql URL names its database: mysql://user:password@host:3306/dbname"
        )
    return Settings(
        host=url.host or "localhost",
        port=url.port or 3306,
        user=unquote(url.username) if url.username else None,
        password=unquote(url.password) if url.password else "",
        database=database,
        ssl=options.get("ssl"),
        **values,
    )


# -- sync: a small thread-safe pool of PyMySQL connections ------------------------------
def _execute(conn: Any, batch: Batch) -> list[Result]:
    with conn.cursor() as cur:
        cur.execute(batch.sql, batch.params)
        results = [_result(cur.description, cur.fetchall(), cur.rowcount)]
        while cur.nextset():
            results.append(_result(cur.description, cur.fetchall(), cur.rowcount))
    return results


def _result(description: Any, rows: Any, affected: Any) -> Result:
    if not description:
        return Result((), (), int(affected or 0))
    return Result(tuple(d[0] for d in description), tuple(rows), int(affected or 0))


def _close_quietly(conn: Any) -> None:
    with suppress(Exception):  # a broken connection is being dropped anyway
        conn.close()


def _idle_ok(conn: Any) -> bool:
    """Whether an idle connection is still usable: nothing may be waiting to be read on
    it (a server that restarted, or closed it for idleness, has sent EOF or an error)."""
    sock = getattr(conn, "_sock", None)
    if sock is None:
        return False
    try:
        if hasattr(select, "poll"):
            poller = select.poll()
            poller.register(sock, select.POLLIN)
            return not poller.poll(0)
        return not select.select([sock], [], [], 0)[0]
    except (OSError, ValueError):
        return False


def _connect(settings: Settings) -> Any:
    pymysql = _import("pymysql")
    conn = pymysql.connect(**settings.driver_kwargs())
    try:
        _execute(conn, settings.session_setup())
    except BaseException:
        _close_quietly(conn)
        raise
    return conn


def _new_pool(settings: Settings) -> Pool[Any]:
    return Pool(
        "mysql",
        lambda: _connect(settings),
        size=settings.pool_size,
        timeout=settings.pool_timeout,
        close=_close_quietly,
        usable=_idle_ok,
        recycle=settings.pool_recycle,
    )


# A forked child must not use (nor close) its parent's sockets: the pools it inherits
# are kept here, untouched, and it opens its own.
_INHERITED: list[object] = []


def _forget_after_fork(ref: weakref.ReferenceType[MySQLBackend]) -> None:
    backend = ref()
    if backend is not None:
        _INHERITED.append(backend._pool)
        backend._pool = _new_pool(backend.settings)


def _rollback(conn: Any) -> bool:
    """Roll back after an error; whether the connection can be used again."""
    try:
        if conn.open:
            _execute(conn, Batch("ROLLBACK", None))
            return True
    except Exception:  # the connection is dropped instead
        pass
    return False


def _backoff(attempt: int) -> float:
    return random.uniform(0.0, 0.005 * 2**attempt)


class MySQLBackend:
    """The synchronous MySQL / MariaDB backend: it only runs the module's flows."""

    scheme = "mysql"

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._pool = _new_pool(settings)
        ref = weakref.ref(self)
        os.register_at_fork(after_in_child=lambda: _forget_after_fork(ref))

    def _run(self, make: Callable[[], Flow[T]]) -> T:
        attempt = 0
        while True:
            attempt += 1
            pool = self._pool
            try:
                slot = pool.get()
            except FencingError:
                raise
            except Exception as exc:
                if not _is_driver_error(exc):
                    raise
                raise _translate(exc, None) from exc
            conn = slot.conn
            batch: Batch | None = None
            io = False  # True while a batch is on the wire or its results are being read
            try:
                flow = make()
                batch = next(flow)
                while True:
                    io = True
                    results = _execute(conn, batch)
                    io = False
                    batch = flow.send(results)
            except StopIteration as stop:
                pool.put(slot)
                value: T = stop.value
                return value
            except Exception as exc:
                driver = _is_driver_error(exc)
                # Interrupted mid-batch by anything but the server's own error (a signal
                # handler's exception, a lost reply): results may be left unread, the
                # connection is dropped.
                if (io and not (driver and _in_step(exc))) or not _rollback(conn):
                    pool.discard(slot)
                else:
                    pool.put(slot)
                if not driver:
                    raise
                if _errno(exc) == _DEADLOCK and attempt < _DEADLOCK_ATTEMPTS:
                    time.sleep(_backoff(attempt))
                    continue
                raise _translate(exc, batch) from exc
            except BaseException:
                pool.discard(slot)
                raise

    def migrate(self) -> None:
        self._run(migrate_flow)

    def close(self) -> None:
        self._pool.close()

    def columns(self, target: Target, declare: frozenset[str] | None = None) -> frozenset[str]:
        return self._run(lambda: columns_flow(target))

    def read(self, target: Target, key: str | int) -> Record | None:
        return self._run(lambda: read_flow(target, key))

    def probe(self, request: CommitRequest) -> CommitResult:
        return self._run(lambda: probe_flow(request))

    def create(self, target: Target, key: str | int, state_json: str) -> Record:
        return self._run(lambda: create_flow(target, key, state_json))

    def delete(self, target: Target, key: str | int) -> bool:
        return self._run(lambda: delete_flow(target, key))

    def commit(self, request: CommitRequest) -> CommitResult:
        return self._run(lambda: _first(commit_flow([request])))

    def commit_many(self, requests: Sequence[CommitRequest]) -> list[CommitResult]:
        return self._run(lambda: commit_flow(requests))

    def acquire(self, name: str, owner: str, ttl: float) -> LeaseAnswer:
        return self._run(lambda: acquire_flow(name, owner, ttl))

    def renew(self, name: str, token: int, ttl: float) -> LeaseAnswer:
        return self._run(lambda: renew_flow(name, token, ttl))

    def release(self, name: str, token: int) -> LeaseAnswer:
        return self._run(lambda: release_flow(name, token))

    def lease_state(self, name: str) -> LeaseAnswer:
        return self._run(lambda: lease_state_flow(name))

    def prune(self, older_than: float) -> int:
        return self._run(lambda: prune_flow(older_than))

    def record_effect(self, row: NewEffect) -> Effect:
        return self._run(lambda: record_effect_flow(row))

    def mark_effect(
        self, idempotency_key: str, status: str | None, detail_json: str | None, reconcile: bool
    ) -> Effect | None:
        return self._run(lambda: mark_effect_flow(idempotency_key, status, detail_json, reconcile))

    def settle_effects(self, scope: str, intent_id: str, outcome: str) -> list[Effect]:
        return self._run(lambda: settle_effects_flow(scope, intent_id, outcome))

    def list_effects(self, query: EffectQuery) -> list[Effect]:
        return self._run(lambda: list_effects_flow(query))

    def prune_effects(self, older_than: float) -> int:
        return self._run(lambda: prune_effects_flow(older_than))


# -- async: aiomysql's pool --------------------------------------------------------------
@functools.cache
def _quiet_cursor() -> type[Any]:
    aiomysql = _import("aiomysql")

    base: Any = aiomysql.Cursor

    class QuietCursor(base):  # type: ignore[misc]
        """aiomysql turns server warnings into Python warnings (``SHOW WARNINGS``, one more
        round trip); the notes of ``INSERT IGNORE`` / ``IF NOT EXISTS`` are expected."""

        async def _show_warnings(self, conn: Any) -> None:
            return None

    return QuietCursor


async def _aexecute(conn: Any, batch: Batch) -> list[Result]:
    async with conn.cursor(_quiet_cursor()) as cur:
        await cur.execute(batch.sql, batch.params)
        results = [_result(cur.description, await cur.fetchall(), cur.rowcount)]
        while await cur.nextset():
            results.append(_result(cur.description, await cur.fetchall(), cur.rowcount))
    return results


async def _arollback(conn: Any) -> bool:
    try:
        if not conn.closed:
            await _aexecute(conn, Batch("ROLLBACK", None))
            return True
    except Exception:  # the connection is dropped instead
        pass
    return False


class AsyncMySQLBackend:
    """The asynchronous MySQL / MariaDB backend: it only runs the module's flows."""

    scheme = "mysql"

    def __init__(self, settings: Settings, pool: Any) -> None:
        self.settings = settings
        self._pool = pool
        self._ready: weakref.WeakSet[Any] = weakref.WeakSet()
        self._closed = False

    @classmethod
    async def open(cls, settings: Settings) -> AsyncMySQLBackend:
        aiomysql = _import("aiomysql")
        try:
            pool = await aiomysql.create_pool(
                minsize=0,
                maxsize=settings.pool_size,
                pool_recycle=settings.pool_recycle,
                **settings.driver_kwargs("db"),
            )
        except Exception as exc:
            if not _is_driver_error(exc):
                raise
            raise _translate(exc, None) from exc
        return cls(settings, pool)

    async def _acquire(self) -> Any:
        if self._closed:
            raise StoreClosed("mysql: this store is closed")
        try:
            async with asyncio.timeout(self.settings.pool_timeout):
                conn = await self._pool.acquire()
        except TimeoutError:
            raise TransientStoreError(
                f"mysql: no free connection within {self.settings.pool_timeout}s"
                f" (pool_size={self.settings.pool_size})"
            ) from None
        if conn not in self._ready:
            try:
                await _aexecute(conn, self.settings.session_setup())
            except BaseException:
                conn.close()
                self._pool.release(conn)
                raise
            self._ready.add(conn)
        return conn

    async def _run(self, make: Callable[[], Flow[T]]) -> T:
        attempt = 0
        while True:
            attempt += 1
            try:
                conn = await self._acquire()
            except FencingError:
                raise
            except Exception as exc:
                if not _is_driver_error(exc):
                    raise
                raise _translate(exc, None) from exc
            reusable = False
            batch: Batch | None = None
            io = False  # True while a batch is on the wire or its results are being read
            try:
                flow = make()
                batch = next(flow)
                while True:
                    io = True
                    results = await _aexecute(conn, batch)
                    io = False
                    batch = flow.send(results)
            except StopIteration as stop:
                reusable = True
                value: T = stop.value
                return value
            except Exception as exc:
                driver = _is_driver_error(exc)
                in_step = not io or (driver and _in_step(exc))
                reusable = in_step and await _arollback(conn)
                if not driver:
                    raise
                if _errno(exc) == _DEADLOCK and attempt < _DEADLOCK_ATTEMPTS:
                    await asyncio.sleep(_backoff(attempt))
                    continue
                raise _translate(exc, batch) from exc
            finally:
                if not reusable:
                    conn.close()  # cancelled or broken mid-batch: never reuse it
                self._pool.release(conn)

    async def migrate(self) -> None:
        await self._run(migrate_flow)

    async def close(self) -> None:
        self._closed = True
        self._pool.close()
        await self._pool.wait_closed()

    async def columns(
        self, target: Target, declare: frozenset[str] | None = None
    ) -> frozenset[str]:
        return await self._run(lambda: columns_flow(target))

    async def read(self, target: Target, key: str | int) -> Record | None:
        return await self._run(lambda: read_flow(target, key))

    async def probe(self, request: CommitRequest) -> CommitResult:
        return await self._run(lambda: probe_flow(request))

    async def create(self, target: Target, key: str | int, state_json: str) -> Record:
        return await self._run(lambda: create_flow(target, key, state_json))

    async def delete(self, target: Target, key: str | int) -> bool:
        return await self._run(lambda: delete_flow(target, key))

    async def commit(self, request: CommitRequest) -> CommitResult:
        return await self._run(lambda: _first(commit_flow([request])))

    async def commit_many(self, requests: Sequence[CommitRequest]) -> list[CommitResult]:
        return await self._run(lambda: commit_flow(requests))

    async def acquire(self, name: str, owner: str, ttl: float) -> LeaseAnswer:
        return await self._run(lambda: acquire_flow(name, owner, ttl))

    async def renew(self, name: str, token: int, ttl: float) -> LeaseAnswer:
        return await self._run(lambda: renew_flow(name, token, ttl))

    async def release(self, name: str, token: int) -> LeaseAnswer:
        return await self._run(lambda: release_flow(name, token))

    async def lease_state(self, name: str) -> LeaseAnswer:
        return await self._run(lambda: lease_state_flow(name))

    async def prune(self, older_than: float) -> int:
        return await self._run(lambda: prune_flow(older_than))

    async def record_effect(self, row: NewEffect) -> Effect:
        return await self._run(lambda: record_effect_flow(row))

    async def mark_effect(
        self, idempotency_key: str, status: str | None, detail_json: str | None, reconcile: bool
    ) -> Effect | None:
        return await self._run(
            lambda: mark_effect_flow(idempotency_key, status, detail_json, reconcile)
        )

    async def settle_effects(self, scope: str, intent_id: str, outcome: str) -> list[Effect]:
        return await self._run(lambda: settle_effects_flow(scope, intent_id, outcome))

    async def list_effects(self, query: EffectQuery) -> list[Effect]:
        return await self._run(lambda: list_effects_flow(query))

    async def prune_effects(self, older_than: float) -> int:
        return await self._run(lambda: prune_effects_flow(older_than))


if TYPE_CHECKING:  # both drivers keep the contract

    def _conforms(sync: MySQLBackend, aio: AsyncMySQLBackend) -> tuple[Backend, AsyncBackend]:
        return sync, aio


def open_backend(url: Any, **options: Any) -> MySQLBackend:
    """``mysql://user:password@host:3306/db?pool_size=5`` (also ``mariadb://``)."""
    _import("pymysql")
    return MySQLBackend(settings_from_url(url, options))


async def open_async_backend(url: Any, **options: Any) -> AsyncMySQLBackend:
    """The same URL, for asyncio (aiomysql)."""
    return await AsyncMySQLBackend.open(settings_from_url(url, options))
