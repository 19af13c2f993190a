"""The PostgreSQL backend (``postgresql://`` and ``postgres://``): psycopg 3 and psycopg_pool.

``postgresql://user:password@host:5432/db?schema=fencing&min_size=1&max_size=10``

Options of the URL (or keyword arguments of ``fencing.open``):

* ``schema``: where fencing's own tables live (created by ``migrate``; every
  statement names them in it, so a missing table is an error, never another
  schema's table). It is also put first on each pooled connection's ``search_path``,
  where guarded tables (``store.table(name)``) are looked up. Default: none, the
  connection's own ``search_path`` (normally ``public``).
* ``min_size`` / ``max_size``: the connection pool's size (default 1 / 10; the synchronous
  store opens connections on demand, the asyncio one keeps ``min_size`` open);
  ``pool_timeout``: seconds to wait for a free connection (default 30).
* ``prepare_threshold``: psycopg's (default 5); ``none`` disables server-side
  prepared statements (PgBouncer in transaction mode).
* anything else is a libpq connection parameter (``sslmode``, ``connect_timeout``
  (default 10), ``application_name`` (default ``fencing``), ...).

States are JSONB: key order is not kept, and numbers are decimals: a float that
JSON writes in exponent form (``1e16`` and up) reads back as an integer (``1.5e300``
as ``15`` and 299 zeros; ``float()`` of it gives the float back). A forked child
(RQ, Celery prefork) never touches its parent's connections: it opens its own pool.
Recorded effects (``fencing._effects``) are in ``_postgres_effects``: one statement each.

How one statement stays atomic under READ COMMITTED
---------------------------------------------------
A commit is ONE statement, one round trip: a data-modifying CTE whose ``UPDATE``
carries every condition (key, version, guard, applied intent, fence, live lease
by the server's clock ``now()``); the applied-intent row is inserted *from the
UPDATE's output*, so a claim exists only if the write does. The same statement
returns, when nothing was updated, the current record, whether the intent is
applied, the lease row and the server's ``now``; :func:`fencing._rules.judge`
then says why, with no second read.

* The ``UPDATE`` re-checks its ``WHERE`` on the newest row version when it waits
  for a concurrent writer (EvalPlanQual), so a write never applies over a version
  it did not expect. Its sibling ``SELECT`` sees the statement's snapshot, which
  may be older: if ``judge`` finds that snapshot *would* have applied, the
  refusal came from a concurrent writer and the statement is simply run again
  (a fresh snapshot; bounded; a batch re-reads instead, see ``commit_many``).
* The same intent committed twice at once: the second insert of
  ``(scope, intent_id)`` hits the primary key, the whole statement rolls back
  (nothing written), and it runs again to report ``Duplicate``.
* A guarded table's fence lives in ``fencing_fences``, not in the user's row, so
  a fenced table commit raises it with ``ON CONFLICT DO UPDATE ... WHERE fence <=
  token``, which sees the newest fence; if a newer token got there first the
  claim's ``applied_at`` is NULL, its ``NOT NULL`` constraint rolls the statement
  back, and the re-run reports ``Fenced``.

A batch (``commit_many``) is one pipeline: one round trip, one transaction. It first
locks what its answer depends on, in key order: the keys' tombstone rows (made if
missing, then shared: no create or delete of those keys), the records (exclusive: no
other commit) and the lease it writes under (shared: no takeover). The batch then runs
on a snapshot taken after those locks, so every item's outcome, and the record a refused
item reports, holds at the batch's commit point. A collection's batch of distinct keys
is then ONE statement: the items travel as one JSON document (``json_to_recordset ...
WITH ORDINALITY``), each item's claim is looked up once by primary key, one ``UPDATE ...
FROM`` applies each item whose own conditions hold (version, guard, not yet applied,
fence and live lease), the claims are inserted from its output, and the answer is one
row per item, in order, laid out like a single commit's. A batch that repeats a key (a
later item must see the earlier one's write) and a guarded table's batch (its items may
write different columns; its user rows are locked, those inserted meanwhile are not) run
one commit statement per item after the locks instead. A batch that is a deadlock's
victim anyway was rolled back whole and runs again. Lease acquire, renew and release are
each one statement; tokens only ever grow (``token + 1`` on the row that is never
deleted). A fenced single commit share-locks the live lease row in its own statement
(``FOR SHARE`` re-checks the newest row after any wait), so no takeover is granted while
a write under the old token is still on its way.

A key's tombstone row (the last version of its deleted record) is also the key's lock:
``create`` and ``delete`` take it first (an upsert locks the row whether it inserts or
finds it, and answers with its newest version), so a create that overlaps a delete of
the same key waits for it and continues after the deleted version: versions of a key
never repeat, whatever overlaps.

Errors are translated at the boundary::

    psycopg.Error
    ├── connection lost, admin shutdown, pool timeout,
    │   serialization failure, deadlock, lock or statement timeout  -> TransientStoreError
    ├── undefined table / column / schema                          -> SchemaError
    ├── a value the column or jsonb cannot hold                    -> InvalidInput / InvalidState
    └── anything else                                              -> StoreError
"""

from __future__ import annotations

import asyncio
import json
import json.encoder
import os
import re
import threading
import weakref
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Final, TypeAlias, TypeVar
from urllib.parse import unquote

from .._errors import (
    AlreadyExists,
    ConfigurationError,
    FencingError,
    InvalidIdentifier,
    InvalidInput,
    InvalidState,
    MissingDependency,
    SchemaError,
    StoreClosed,
    StoreError,
    TransientStoreError,
)
from .._flow import adrive, drive
from .._request import CommitRequest, CommitResult, LeaseAnswer, Target, table_version
from .._rules import LeaseRow, Status, judge, lease_grant, lease_renewal
from .._validate import check_column
from .._values import Record
from ._pool import Pool
from ._postgres_effects import AsyncPostgresEffects, PostgresEffects, effects_ddl

try:
    import psycopg
    from psycopg import sql
    from psycopg.conninfo import make_conninfo
    from psycopg.pq import TransactionStatus
    from psycopg_pool import AsyncConnectionPool, PoolClosed, PoolTimeout
except ModuleNotFoundError as exc:  # pragma: no cover - exercised with the driver hidden
    raise MissingDependency(
        f"the postgres backend needs {exc.name}: pip install 'fencing[postgres]'"
    ) from exc

if TYPE_CHECKING:
    from .._url import StoreURL
    from ._contract import AsyncBackend, Backend

__all__ = [
    "SCHEMA_VERSION",
    "AsyncPostgresBackend",
    "PostgresBackend",
    "open_async_backend",
    "open_backend",
]

T = TypeVar("T")

# ``json.dumps`` of a str with the default options, in C
_json_str: Callable[[str], str] = json.encoder.encode_basestring_ascii

# 2: fencing_effects (1 -> 2 only added a table and its indexes);
# 3: an applied intent is keyed by (scope, intent_id, key): an id names work on one key
SCHEMA_VERSION: Final = 3

# How often a statement refused by a concurrent writer (or rolled back by a
# concurrent claim of the same intent) is run again before giving up.
_ATTEMPTS: Final = 5

# The server's clock, as epoch seconds. ``now()`` is the start of the statement's
# transaction: one instant for every check of a statement (and of a batch).
_NOW: Final = "extract(epoch FROM now())::float8"

# -- schema ---------------------------------------------------------------------------
# Collection keys are TEXT; keys in fencing_applied / fencing_fences are the JSON text
# of the key ('"7"' and '7' differ), so a table's int and str keys cannot collide.
_DDL: Final = (
    "CREATE TABLE IF NOT EXISTS fencing_schema ("
    " component TEXT PRIMARY KEY, version INTEGER NOT NULL)",
    "CREATE TABLE IF NOT EXISTS fencing_records ("
    " collection TEXT NOT NULL, key TEXT NOT NULL, version BIGINT NOT NULL,"
    " fence BIGINT NOT NULL DEFAULT 0, state JSONB NOT NULL,"
    " updated_at DOUBLE PRECISION NOT NULL, PRIMARY KEY (collection, key))",
    "CREATE TABLE IF NOT EXISTS fencing_applied ("
    " scope TEXT NOT NULL, intent_id TEXT NOT NULL, key TEXT NOT NULL,"
    " applied_at DOUBLE PRECISION NOT NULL, PRIMARY KEY (scope, intent_id, key))",
    "CREATE INDEX IF NOT EXISTS fencing_applied_at ON fencing_applied (applied_at)",
    "CREATE TABLE IF NOT EXISTS fencing_fences ("
    " scope TEXT NOT NULL, key TEXT NOT NULL, fence BIGINT NOT NULL,"
    " PRIMARY KEY (scope, key))",
    "CREATE TABLE IF NOT EXISTS fencing_leases ("
    " name TEXT PRIMARY KEY, owner TEXT, token BIGINT NOT NULL,"
    " expires_at DOUBLE PRECISION NOT NULL)",
    # the last version of a deleted record: a re-created record continues after it
    "CREATE TABLE IF NOT EXISTS fencing_tombstones ("
    " collection TEXT NOT NULL, key TEXT NOT NULL, version BIGINT NOT NULL,"
    " PRIMARY KEY (collection, key))",
    f"INSERT INTO fencing_schema AS v (component, version) VALUES ('core', {SCHEMA_VERSION})"
    " ON CONFLICT (component) DO UPDATE SET version = excluded.version"
    " WHERE v.version < excluded.version",
)
# 2 -> 3 (run under the migration lock; a second run only rebuilds the same key)
_APPLIED_BY_KEY: Final = (
    "ALTER TABLE fencing_applied DROP CONSTRAINT fencing_applied_pkey,"
    " ADD CONSTRAINT fencing_applied_pkey PRIMARY KEY (scope, intent_id, key)"
)
_MIGRATE_LOCK: Final = "SELECT pg_advisory_xact_lock(hashtext('fencing.migrate'))"
_HAS_SCHEMA_TABLE: Final = (
    "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_tables"
    " WHERE schemaname = coalesce(%(schema)s, current_schema())"
    " AND tablename = 'fencing_schema')"
)
_SCHEMA_VERSION: Final = "SELECT version FROM fencing_schema WHERE component = 'core'"
_SEARCH_PATH: Final = (
    "SELECT set_config('search_path',"
    " quote_ident(%(schema)s) || ', ' || current_setting('search_path'), false)"
)
_COLUMNS: Final = (
    "SELECT a.attname, EXISTS (SELECT 1 FROM pg_catalog.pg_index i"
    " WHERE i.indrelid = a.attrelid AND i.indisunique AND i.indnkeyatts = 1"
    " AND i.indkey[0] = a.attnum AND i.indpred IS NULL)"
    " FROM pg_catalog.pg_attribute a"
    " WHERE a.attrelid = to_regclass(quote_ident(%(name)s))"
    " AND a.attnum > 0 AND NOT a.attisdropped"
)

# -- records --------------------------------------------------------------------------
# Every probe and commit answers one row: seven fixed columns, then the record's.
#   0 applied  1 intent already applied  2 fence  3-5 lease owner, token, expires_at
#   6 now      7.. collection: version, state | table: the table's columns
_FIXED: Final = 7
_LEASE_LIVE: Final = (
    "EXISTS (SELECT 1 FROM fencing_leases l WHERE l.name = %(lease)s"
    f" AND l.token = %(token)s::bigint AND l.owner IS NOT NULL AND l.expires_at > {_NOW})"
)
# A fenced commit share-locks the live lease row it writes under (the newest version of
# the row, re-checked after any wait), so no takeover can be granted until it ends: a
# write under token t is never visible after token t + 1 was granted.
_LEASE_LOCK_CTE: Final = (
    "fencing_lease AS (SELECT 1 FROM fencing_leases l WHERE l.name = %(lease)s"
    f" AND l.token = %(token)s::bigint AND l.owner IS NOT NULL AND l.expires_at > {_NOW}"
    " FOR SHARE)"
)
_LEASE_LOCKED: Final = "EXISTS (SELECT 1 FROM fencing_lease)"
_IS_APPLIED: Final = (
    "EXISTS (SELECT 1 FROM fencing_applied a WHERE a.scope = %(scope)s AND a.intent_id = %(id)s"
    " AND a.key = %(key_json)s)"
)
_COLLECTION_PROBE: Final = (
    f"SELECT false, {_IS_APPLIED}, r.fence, l.owner, l.token, l.expires_at, {_NOW},"
    " r.version, r.state"
    " FROM (SELECT 1) AS fencing_one"
    " LEFT JOIN fencing_records r ON r.collection = %(name)s AND r.key = %(key)s"
    " LEFT JOIN fencing_leases l ON l.name = %(lease)s"
)
# Without a lease there is no lease row to report: one relation less to open on
# every statement (a commit's probe half is planned and initialised even when the
# UPDATE applies).
_COLLECTION_READ: Final = (
    f"SELECT false, {_IS_APPLIED}, r.fence, NULL::text, NULL::bigint, NULL::float8, {_NOW},"
    " r.version, r.state"
    " FROM (SELECT 1) AS fencing_one"
    " LEFT JOIN fencing_records r ON r.collection = %(name)s AND r.key = %(key)s"
)
# A record created again after a delete continues the deleted one's versions, so an
# intent decided against the deleted record can never match the new one. The key's
# tombstone row is its lock: create and delete both take it first (an upsert locks the
# row whether it inserts it or finds it, and answers with its newest version), so a
# create that overlaps a delete waits for it and continues after its last version.
_KEY_LOCK: Final = (
    "INSERT INTO fencing_tombstones AS t (collection, key, version)"
    " VALUES (%(name)s, %(key)s, 0) ON CONFLICT (collection, key)"
    " DO UPDATE SET version = t.version RETURNING t.version"
)
_CREATE: Final = (
    f"WITH fencing_key AS ({_KEY_LOCK})"
    " INSERT INTO fencing_records (collection, key, version, fence, state, updated_at)"
    " SELECT %(name)s, %(key)s, k.version + 1, 0, %(state)s::jsonb,"
    f" {_NOW} FROM fencing_key k ON CONFLICT DO NOTHING RETURNING version"
)
_DELETE: Final = (
    "WITH gone AS (DELETE FROM fencing_records WHERE collection = %(name)s AND key = %(key)s"
    " RETURNING version)"
    " UPDATE fencing_tombstones AS t SET version = greatest(t.version, gone.version)"
    " FROM gone WHERE t.collection = %(name)s AND t.key = %(key)s"
)
_PRUNE: Final = f"DELETE FROM fencing_applied WHERE applied_at < {_NOW} - %(age)s::float8"

# -- leases ---------------------------------------------------------------------------
# Each is one statement answering (granted, owner, token, expires_at, now) with the row
# after it; refused, the sibling SELECT shows the row as the statement's snapshot saw it.
_LEASE_ANSWER: Final = (
    f" SELECT true, u.owner, u.token, u.expires_at, {_NOW} FROM fencing_up u UNION ALL"
    f" (SELECT false, l.owner, l.token, l.expires_at, {_NOW} FROM (SELECT 1) AS fencing_one"
    " LEFT JOIN fencing_leases l ON l.name = %(name)s"
    " WHERE NOT EXISTS (SELECT 1 FROM fencing_up))"
)
_LEASE_HELD: Final = f"l.owner IS NOT NULL AND l.expires_at > {_NOW}"
_ACQUIRE: Final = (
    "WITH fencing_up AS ("
    " INSERT INTO fencing_leases AS l (name, owner, token, expires_at)"
    f" VALUES (%(name)s, %(owner)s, 1, {_NOW} + %(ttl)s::float8)"
    " ON CONFLICT (name) DO UPDATE SET owner = excluded.owner, token = l.token + 1,"
    f" expires_at = excluded.expires_at WHERE NOT ({_LEASE_HELD})"
    " RETURNING l.owner, l.token, l.expires_at)" + _LEASE_ANSWER
)
_RENEW: Final = (
    "WITH fencing_up AS ("
    f" UPDATE fencing_leases AS l SET expires_at = {_NOW} + %(ttl)s::float8"
    f" WHERE l.name = %(name)s AND l.token = %(token)s::bigint AND {_LEASE_HELD}"
    " RETURNING l.owner, l.token, l.expires_at)" + _LEASE_ANSWER
)
_RELEASE: Final = (
    "WITH fencing_up AS ("
    " UPDATE fencing_leases AS l SET owner = NULL, expires_at = 0"
    f" WHERE l.name = %(name)s AND l.token = %(token)s::bigint AND {_LEASE_HELD}"
    " RETURNING l.owner, l.token, l.expires_at)" + _LEASE_ANSWER
)
_LEASE_STATE: Final = (
    f"SELECT false, l.owner, l.token, l.expires_at, {_NOW} FROM (SELECT 1) AS fencing_one"
    " LEFT JOIN fencing_leases l ON l.name = %(name)s"
)


def _quoted(name: str) -> str:
    return sql.Identifier(name).as_string(None)


@lru_cache(maxsize=4)
def _collection_commit(guarded: bool, fenced: bool) -> str:
    """The one-statement commit to a collection, with or without a guard and a lease."""
    sets = ["state = %(state)s::jsonb", "version = r.version + 1", f"updated_at = {_NOW}"]
    where = ["r.collection = %(name)s", "r.key = %(key)s", "r.version = %(version)s::bigint"]
    if guarded:  # jsonb containment of scalars is JSON equality: true is not 1, 1 is 1.0
        where.append("r.state @> %(guard)s::jsonb")
    if fenced:
        sets.append("fence = greatest(r.fence, %(token)s::bigint)")
        where += ["r.fence <= %(token)s::bigint", _LEASE_LOCKED]
    where.append(f"NOT {_IS_APPLIED}")
    return (
        f"WITH {_LEASE_LOCK_CTE + ', ' if fenced else ''}"
        f"fencing_upd AS (UPDATE fencing_records AS r SET {', '.join(sets)}"
        f" WHERE {' AND '.join(where)} RETURNING r.version, r.fence),"
        " fencing_claim AS (INSERT INTO fencing_applied (scope, intent_id, key, applied_at)"
        f" SELECT %(scope)s, %(id)s, %(key_json)s, {_NOW} FROM fencing_upd)"
        " SELECT true, false, u.fence, NULL::text, NULL::bigint, NULL::float8,"
        f" {_NOW}, u.version, NULL::jsonb FROM fencing_upd u"
        f" UNION ALL ({_COLLECTION_PROBE if fenced else _COLLECTION_READ}"
        " WHERE NOT EXISTS (SELECT 1 FROM fencing_upd))"
    )


@lru_cache(maxsize=2)
def _collection_batch(fenced: bool) -> str:
    """A whole batch of commits to one collection in ONE statement (distinct keys).

    The items come as one JSON array of objects (``json_to_recordset ... WITH
    ORDINALITY``: ``n`` is the item's place; ``k`` key, ``j`` its JSON text, ``i``
    claim id, ``v`` expected version, ``s`` state, ``g`` guard or null). Each
    item's claim is looked up once (``seen``, a ``LIMIT 1`` lateral
    lookup: always the primary key, never a scan of the scope); the ``UPDATE ...
    FROM`` applies every item whose conditions hold, each on its own; the claims
    are inserted from its output; the answer has one row per item, in order, in
    the layout of a single commit's: the new version and fence when applied, else
    the record as the statement's snapshot saw it (a lateral primary-key lookup,
    only for the items not applied) and the lease row.
    """
    sets = ["state = i.s", "version = r.version + 1", f"updated_at = {_NOW}"]
    where = [
        "r.collection = %(name)s",
        "r.key = i.k",
        "r.version = i.v",
        # jsonb containment of scalars is JSON equality: true is not 1, 1 is 1.0
        "(i.g IS NULL OR r.state @> i.g)",
        "NOT i.seen",
    ]
    lease_cols, lease_join = "NULL::text, NULL::bigint, NULL::float8", ""
    if fenced:
        sets.append("fence = greatest(r.fence, %(token)s::bigint)")
        where += ["r.fence <= %(token)s::bigint", _LEASE_LIVE]
        lease_cols = "l.owner, l.token, l.expires_at"
        lease_join = " LEFT JOIN fencing_leases l ON l.name = %(lease)s"
    return (
        "WITH fencing_item AS MATERIALIZED (SELECT i.*, s.seen IS NOT NULL AS seen"
        " FROM ROWS FROM (json_to_recordset(%(items)s::json)"
        " AS (k text, j text, i text, v bigint, s jsonb, g jsonb))"
        " WITH ORDINALITY AS i(k, j, i, v, s, g, n)"
        " LEFT JOIN LATERAL (SELECT true AS seen FROM fencing_applied a"
        " WHERE a.scope = %(scope)s AND a.intent_id = i.i AND a.key = i.j LIMIT 1) AS s ON true),"
        f" fencing_upd AS (UPDATE fencing_records AS r SET {', '.join(sets)}"
        f" FROM fencing_item i WHERE {' AND '.join(where)}"
        " RETURNING i.n, i.i, i.j, r.version, r.fence),"
        " fencing_claim AS (INSERT INTO fencing_applied (scope, intent_id, key, applied_at)"
        f" SELECT %(scope)s, u.i, u.j, {_NOW} FROM fencing_upd u)"
        f" SELECT u.n IS NOT NULL, i.seen, coalesce(u.fence, r.fence), {lease_cols}, {_NOW},"
        " coalesce(u.version, r.version), r.state"
        " FROM fencing_item i LEFT JOIN fencing_upd u ON u.n = i.n"
        " LEFT JOIN LATERAL (SELECT r.fence, r.version, r.state FROM fencing_records r"
        " WHERE u.n IS NULL AND r.collection = %(name)s AND r.key = i.k LIMIT 1) AS r ON true"
        f"{lease_join} ORDER BY i.n"
    )


# A batch first locks what its answer depends on, in key order, so that every item's
# outcome (applied or refused, and the record it reports) holds at the batch's commit:
# the keys' tombstones (made if missing; shared: no create or delete of them), the
# records (exclusive: no other commit), and the lease it writes under (shared: no
# takeover). The batch itself then runs on a snapshot taken after those locks.
_BATCH_KEYS_NEW: Final = (
    "INSERT INTO fencing_tombstones (collection, key, version)"
    " SELECT %(name)s, k, 0 FROM unnest(%(keys)s::text[]) AS k ORDER BY k"
    " ON CONFLICT (collection, key) DO NOTHING"
)
_BATCH_KEYS_LOCK: Final = (
    "SELECT 1 FROM fencing_tombstones WHERE collection = %(name)s"
    " AND key = ANY(%(keys)s::text[]) ORDER BY key FOR SHARE"
)
_BATCH_RECORDS_LOCK: Final = (
    "SELECT 1 FROM fencing_records WHERE collection = %(name)s"
    " AND key = ANY(%(keys)s::text[]) ORDER BY key FOR UPDATE"
)
_BATCH_LEASE_LOCK: Final = "SELECT 1 FROM fencing_leases WHERE name = %(lease)s FOR SHARE"


@lru_cache(maxsize=256)
def _table_rows_lock(target: Target) -> str:
    k = _quoted(target.key_column)
    return f"SELECT 1 FROM {_quoted(target.name)} WHERE {k} = ANY(%(keys)s) ORDER BY {k} FOR UPDATE"


@lru_cache(maxsize=256)
def _table_probe(target: Target) -> str:
    """The probe of a guarded table: same fixed columns, then the row's own."""
    t = _quoted(target.name)
    return (
        f"SELECT false, {_IS_APPLIED}, (SELECT f.fence FROM fencing_fences f"
        " WHERE f.scope = %(scope)s AND f.key = %(key_json)s),"
        f" l.owner, l.token, l.expires_at, {_NOW}, {t}.*"
        f" FROM (SELECT 1) AS fencing_one LEFT JOIN {t} ON {t}.{_quoted(target.key_column)}"
        " = %(key)s LEFT JOIN fencing_leases l ON l.name = %(lease)s"
    )


@lru_cache(maxsize=1024)
def _table_commit(
    target: Target, columns: tuple[str, ...], guards: tuple[str, ...], check: bool, fenced: bool
) -> str:
    """The one-statement commit for this shape of request to a guarded table.

    Only ``columns`` are written (``%(s0)s``...); ``guards`` compare with ``IS NOT
    DISTINCT FROM`` (``%(g0)s``...); ``check`` adds the version condition.
    """
    t, k = _quoted(target.name), _quoted(target.key_column)
    sets = [f"{_quoted(c)} = %(s{i})s" for i, c in enumerate(columns)]
    where = [f"{k} = %(key)s"]
    if target.version_column is not None:
        v = _quoted(target.version_column)
        sets.append(f"{v} = {v} + 1")
        if check:
            where.append(f"{v} = %(version)s")
    where += [f"{_quoted(c)} IS NOT DISTINCT FROM %(g{i})s" for i, c in enumerate(guards)]
    where.append(f"NOT {_IS_APPLIED}")
    ctes = [f"fencing_upd AS (UPDATE {t} SET {', '.join(sets)}"]
    if fenced:
        where.append(
            "NOT EXISTS (SELECT 1 FROM fencing_fences f WHERE f.scope = %(scope)s"
            " AND f.key = %(key_json)s AND f.fence > %(token)s::bigint)"
        )
        where.append(_LEASE_LOCKED)
    ctes[0] += f" WHERE {' AND '.join(where)} RETURNING *)"
    if fenced:
        ctes.insert(0, _LEASE_LOCK_CTE)
    if fenced:
        # Sees the newest fence (ON CONFLICT locks it); a newer one leaves it empty,
        # and then the claim below violates NOT NULL: the statement rolls back.
        ctes.append(
            "fencing_fence AS (INSERT INTO fencing_fences AS f (scope, key, fence)"
            " SELECT %(scope)s, %(key_json)s, %(token)s::bigint FROM fencing_upd"
            " ON CONFLICT (scope, key) DO UPDATE SET fence = excluded.fence"
            " WHERE f.fence <= excluded.fence RETURNING f.fence)"
        )
        applied_at = f"CASE WHEN EXISTS (SELECT 1 FROM fencing_fence) THEN {_NOW} END"
        fence = "(SELECT fence FROM fencing_fence)"
    else:
        applied_at = _NOW
        fence = (
            "(SELECT f.fence FROM fencing_fences f WHERE f.scope = %(scope)s"
            " AND f.key = %(key_json)s)"
        )
    ctes.append(
        "fencing_claim AS (INSERT INTO fencing_applied (scope, intent_id, key, applied_at)"
        f" SELECT %(scope)s, %(id)s, %(key_json)s, {applied_at} FROM fencing_upd)"
    )
    return (
        f"WITH {', '.join(ctes)}"
        f" SELECT true, false, {fence}, NULL::text, NULL::bigint, NULL::float8, {_NOW}, u.*"
        f" FROM fencing_upd u UNION ALL ({_table_probe(target)}"
        " WHERE NOT EXISTS (SELECT 1 FROM fencing_upd))"
    )


# -- steps: what a flow asks its driver to run ------------------------------------------
@dataclass(frozen=True, slots=True)
class Query:
    """One statement on its own (autocommit): its own transaction, one round trip."""

    text: str
    params: Mapping[str, Any] = field(default_factory=dict)
    names: bool = False  # the flow reads the answer's column names


@dataclass(frozen=True, slots=True)
class Pipeline:
    """Statements sent at once with one Sync: one round trip, one implicit transaction."""

    queries: tuple[Query, ...]


@dataclass(frozen=True, slots=True)
class Answer:
    """A statement's result: column names, rows and row count."""

    names: tuple[str, ...]
    rows: list[tuple[Any, ...]]
    rowcount: int


Step: TypeAlias = Query | Pipeline
#: A backend operation: yields steps, receives an ``Answer`` (``list[Answer]`` for a
#: ``Pipeline``), may receive a translated error thrown back in, returns the result.
Flow: TypeAlias = Generator[Step, Any, T]


class _Retry(TransientStoreError):
    """The statement rolled back because a concurrent commit claimed the same intent,
    or a newer fence got there first; nothing was written, run it again."""


class _Disconnected(TransientStoreError):
    """The connection was lost; the outcome of a write is unknown."""


class _Deadlock(TransientStoreError):
    """The server chose this statement as a deadlock's victim and rolled it back
    whole: nothing was written, so a batch may simply run again."""


_TRANSIENT: Final = frozenset({"40001", "40P01", "55P03", "57014", "53300", "53400"})
_DISCONNECTED: Final = frozenset({"57P01", "57P02", "57P03"})
_UNDEFINED: Final = frozenset({"42P01", "42703", "3F000"})
_UNSTORABLE: Final = frozenset({"22P05", "22021"})  # jsonb: \u0000, bad encoding

# A connection refused by the server for what the URL says (no such database, role or
# password; no pg_hba.conf entry) is a configuration error: retrying cannot fix it.
# libpq reports these on connect without a SQLSTATE, so its FATAL text is matched too.
_CONFIG_STATES: Final = frozenset({"3D000", "28P01", "28000"})
_CONFIG_TEXT: Final = re.compile(
    r"FATAL:\s+(database \S.* does not exist|role \S.* does not exist"
    r"|password authentication failed|no pg_hba\.conf entry|.*authentication failed)"
)


def translate(exc: Exception) -> FencingError:
    """The fencing error for a driver error (``raise translate(exc) from exc``)."""
    state = getattr(exc, "sqlstate", None) or ""
    diag = getattr(exc, "diag", None)
    text = f"postgresql: {str(exc).strip() or type(exc).__name__}"
    if state == "23505" and getattr(diag, "constraint_name", None) == "fencing_applied_pkey":
        return _Retry(text)
    if state == "23502" and getattr(diag, "table_name", None) == "fencing_applied":
        return _Retry(text)
    if isinstance(exc, UnicodeError):
        return InvalidInput(f"postgresql: text that cannot be encoded ({exc})")
    if isinstance(exc, PoolClosed):
        return StoreClosed("postgresql: the store is closed")
    if state == "40P01":
        return _Deadlock(text)
    if state in _CONFIG_STATES:
        return ConfigurationError(f"{text} (the URL's database or credentials)")
    if isinstance(exc, PoolTimeout) or state in _TRANSIENT:
        return TransientStoreError(text)
    if isinstance(exc, psycopg.OperationalError):
        if not state or state.startswith("08") or state in _DISCONNECTED:
            return _Disconnected(text)
        return TransientStoreError(text)
    if state in _UNDEFINED:
        return SchemaError(f"{text} (run store.migrate() / fencing migrate URL?)")
    if state in _UNSTORABLE:
        return InvalidState(f"{text} (PostgreSQL cannot store this text)")
    if isinstance(exc, psycopg.DataError) or state in ("42804", "42883"):
        return InvalidInput(f"{text} (a value the column cannot hold or compare)")
    return StoreError(text)


def has_rows(cursor: Any) -> bool:
    """Whether the cursor's statement returned a result set (``SELECT``, ``RETURNING``)."""
    result = cursor.pgresult
    return result is not None and bool(result.nfields)


def answer(query: Query, cursor: Any, rows: list[tuple[Any, ...]]) -> Answer:
    """The step's answer; column names only when the flow needs them (building
    ``cursor.description`` costs more than the rest of the answer)."""
    names: tuple[str, ...] = ()
    if query.names:
        result = cursor.pgresult
        names = tuple(bytes(result.fname(i)).decode() for i in range(result.nfields))
    return Answer(names, rows, cursor.rowcount)


# -- the operations, once for sync and async --------------------------------------------
def _read_only(query: Query) -> Flow[Answer]:
    """A read: safe to run again once on a fresh connection if the first was lost."""
    try:
        result: Answer = yield query
    except _Disconnected:
        result = yield query
    return result


_OWN_TABLE: Final = re.compile(
    r"(?<![\w'\".])"
    r"(fencing_(?:schema|records|applied|fences|leases|tombstones|effects))\b"
)


@lru_cache(maxsize=2048)
def qualified(text: str, schema: str | None) -> str:
    """``text`` with fencing's own tables in ``schema``: never resolved through the
    search path to another schema's (say, ``public``'s) when ``schema``'s are missing."""
    if schema is None:
        return text
    return _OWN_TABLE.sub(_quoted(schema) + r".\1", text)


def _not_newer(stored: int | None) -> None:
    if stored is not None and stored > SCHEMA_VERSION:
        raise SchemaError(
            f"this store's schema is version {stored}, newer than this fencing"
            f" ({SCHEMA_VERSION}); upgrade fencing"
        )


def migrate_flow(schema: str | None) -> Flow[None]:
    """Create fencing's tables (in ``schema``) unless they are there at this version."""
    found: Answer = yield from _read_only(Query(_HAS_SCHEMA_TABLE, {"schema": schema}))
    stored = None
    if found.rows[0][0]:
        have: Answer = yield from _read_only(Query(_SCHEMA_VERSION))
        stored = have.rows[0][0] if have.rows else None
        _not_newer(stored)
        if stored == SCHEMA_VERSION:
            return
    queries = [Query(_MIGRATE_LOCK)]
    if schema is not None:
        queries.append(Query(f"CREATE SCHEMA IF NOT EXISTS {_quoted(schema)}"))
    queries += [Query(ddl) for ddl in _DDL]
    queries += [Query(ddl) for ddl in effects_ddl(schema)]  # new in version 2
    if stored is not None and stored < 3:
        queries.append(Query(_APPLIED_BY_KEY))
    queries.append(Query(_SCHEMA_VERSION))
    answers: list[Answer] = yield Pipeline(tuple(queries))
    _not_newer(answers[-1].rows[0][0])


def columns_flow(target: Target) -> Flow[frozenset[str]]:
    found: Answer = yield from _read_only(Query(_COLUMNS, {"name": target.name}))
    if not found.rows:
        raise SchemaError(f"table {target.name!r} does not exist")
    unique = {name for name, is_unique in found.rows if is_unique}
    names = frozenset(name for name, _ in found.rows)
    if target.key_column in names and target.key_column not in unique:
        raise SchemaError(
            f"key column {target.key_column!r} of table {target.name!r} must be unique"
            " (a primary key or a unique index on that column alone)"
        )
    return names


def _key_json(key: str | int) -> str:
    """The JSON text of a key (``json.dumps``'s, without its per-call setup)."""
    return _json_str(key) if isinstance(key, str) else json.dumps(key)


def _probe_query(target: Target, key: str | int, claim_id: str | None, lease: str | None) -> Query:
    params = {
        "name": target.name,
        "key": key,
        "key_json": _key_json(key),
        "scope": target.scope,
        "id": claim_id,
        "lease": lease,
    }
    if target.kind == "collection":
        return Query(_COLLECTION_READ if lease is None else _COLLECTION_PROBE, params)
    return Query(_table_probe(target), params, names=True)


def _request_probe(request: CommitRequest) -> Query:
    lease = request.lease.name if request.lease is not None else None
    return _probe_query(request.target, request.intent.key, request.claim_id, lease)


def _commit_query(request: CommitRequest) -> Query:
    target, intent, lease = request.target, request.intent, request.lease
    params: dict[str, Any] = {
        "name": target.name,
        "key": intent.key,
        "key_json": _key_json(intent.key),
        "scope": target.scope,
        "id": request.claim_id,  # every derivation of one intent shares its claim
        "version": intent.expected_version,
        "lease": None,
    }
    if lease is not None:
        params["lease"], params["token"] = lease.name, lease.token
    if target.kind == "collection":
        params["state"] = request.state_json
        if intent.guard is not None:
            params["guard"] = json.dumps(dict(intent.guard))
        return Query(_collection_commit(intent.guard is not None, lease is not None), params)
    guard = intent.guard or {}
    params.update({f"s{i}": v for i, v in enumerate(request.state.values())})
    params.update({f"g{i}": v for i, v in enumerate(guard.values())})
    check = intent.expected_version is not None
    text = _table_commit(target, tuple(request.state), tuple(guard), check, lease is not None)
    return Query(text, params, names=True)


def _record(target: Target, key: str | int, found: Answer, row: Sequence[Any]) -> Record | None:
    """The record in the columns after the fixed ones, or None when missing."""
    fence = row[2] or 0
    if target.kind == "collection":
        version, state = row[_FIXED], row[_FIXED + 1]
        return None if version is None else Record(target.name, key, version, fence, state)
    values = dict(zip(found.names[_FIXED:], row[_FIXED:], strict=True))
    if values.pop(target.key_column, None) is None:
        return None
    vcol = target.version_column
    version = table_version(values.pop(vcol), target, key) if vcol is not None else 0
    return Record(target.name, key, version, fence, values, "table")


def _judged(request: CommitRequest, found: Answer) -> CommitResult:
    """What ``judge`` says of an answer's probe columns (``Status.OK``: it would apply)."""
    row, lease = found.rows[0], request.lease
    record = _record(request.target, request.intent.key, found, row)
    lease_row = None
    if lease is not None and row[4] is not None:
        lease_row = LeaseRow(lease.name, row[3], row[4], row[5])
    status = judge(record, bool(row[1]), request.intent, lease, lease_row, row[6])
    return CommitResult(status, record)


def _commit_result(request: CommitRequest, found: Answer) -> CommitResult:
    """A commit statement's answer. ``Status.OK`` means it was refused although its
    snapshot says it would apply: a concurrent writer got there first."""
    row, target, key = found.rows[0], request.target, request.intent.key
    if not row[0]:
        return _judged(request, found)
    if target.kind == "collection":
        return CommitResult(
            Status.APPLIED, Record(target.name, key, row[_FIXED], row[2], request.state)
        )
    return CommitResult(Status.APPLIED, _record(target, key, found, row))


def read_flow(target: Target, key: str | int) -> Flow[Record | None]:
    found: Answer = yield from _read_only(_probe_query(target, key, None, None))
    return _record(target, key, found, found.rows[0])


def probe_flow(request: CommitRequest) -> Flow[CommitResult]:
    found: Answer = yield from _read_only(_request_probe(request))
    return _judged(request, found)


def create_flow(target: Target, key: str | int, state_json: str) -> Flow[Record]:
    done: Answer = yield Query(_CREATE, {"name": target.name, "key": key, "state": state_json})
    if not done.rows:
        raise AlreadyExists(f"{target.name}/{key} already exists")
    return Record(target.name, key, int(done.rows[0][0]), 0, json.loads(state_json))


def delete_flow(target: Target, key: str | int) -> Flow[bool]:
    """Lock the key's tombstone, then delete and raise the tombstone to the deleted
    version: two statements, one transaction, one round trip."""
    params = {"name": target.name, "key": key}
    done: list[Answer] = yield Pipeline((Query(_KEY_LOCK, params), Query(_DELETE, params)))
    return done[1].rowcount > 0


def commit_flow(request: CommitRequest) -> Flow[CommitResult]:
    """One statement; run again only when a concurrent writer made its answer unclear."""
    query = _commit_query(request)
    for attempt in range(1, _ATTEMPTS + 1):
        try:
            found: Answer = yield query
        except _Retry:
            if attempt == _ATTEMPTS:
                raise
            continue
        result = _commit_result(request, found)
        if result.status is not Status.OK:
            return result
    # Refused each time by a writer that got there first: the intent is stale.
    return CommitResult(Status.STALE, result.record)


def _batch_query(requests: Sequence[CommitRequest]) -> tuple[Query, list[int]] | None:
    """The one-statement batch and the items' order in it; None for the shapes it
    does not take: a guarded table's, or a key twice (a later item must see the one
    before it: only one statement per item, in order, gives that)."""
    first = requests[0]
    if first.target.kind != "collection":
        return None
    keys = [r.intent.key for r in requests]
    if len(set(keys)) != len(keys):
        return None
    # The items go in key order, so batches over the same keys take their row locks
    # in the same order and seldom wait for each other in a circle; a deadlock that
    # happens anyway rolls the batch back whole, and it runs again (``_run_batch``).
    order = sorted(range(len(requests)), key=keys.__getitem__)
    lease = first.lease  # one lease (or none) for the whole batch
    # The items as one JSON document (json_to_recordset): the states go in as the
    # canonical JSON they already are, and the server parses the lot at C speed.
    dumps = json.dumps
    rows = []
    for i in order:
        r = requests[i]
        key_json = _key_json(keys[i])
        guard = "null" if r.intent.guard is None else dumps(dict(r.intent.guard))
        rows.append(
            f'{{"k":{key_json},"j":{dumps(key_json)},"i":{dumps(r.claim_id)},'
            f'"v":{r.intent.expected_version},"s":{r.state_json},"g":{guard}}}'
        )
    params: dict[str, Any] = {
        "name": first.target.name,
        "scope": first.target.scope,
        "items": f"[{','.join(rows)}]",
    }
    if lease is not None:
        params["lease"], params["token"] = lease.name, lease.token
    return Query(_collection_batch(lease is not None), params), order


def _batch_locks(requests: Sequence[CommitRequest]) -> tuple[Query, ...]:
    """The statements that lock what a batch's answer depends on (see ``_BATCH_KEYS_NEW``)."""
    first = requests[0]
    target = first.target
    params = {"name": target.name, "keys": list(dict.fromkeys(r.intent.key for r in requests))}
    if target.kind == "collection":
        locks = [
            Query(_BATCH_KEYS_NEW, params),
            Query(_BATCH_KEYS_LOCK, params),
            Query(_BATCH_RECORDS_LOCK, params),
        ]
    else:  # a user's rows: those that exist (a row inserted meanwhile is not locked)
        locks = [Query(_table_rows_lock(target), params)]
    if first.lease is not None:
        locks.append(Query(_BATCH_LEASE_LOCK, {"lease": first.lease.name}))
    return tuple(locks)


def _run_batch(step: Pipeline) -> Flow[list[Answer]]:
    """Run a batch (one pipeline: one transaction) again when it rolled back whole: a
    concurrent claim of one of its intents, or chosen as a deadlock's victim. Nothing
    was written; bounded."""
    for attempt in range(1, _ATTEMPTS + 1):
        try:
            answers: list[Answer] = yield step
            return answers
        except (_Retry, _Deadlock):
            if attempt == _ATTEMPTS:
                raise
    raise AssertionError("unreachable")  # pragma: no cover


def commit_many_flow(requests: Sequence[CommitRequest]) -> Flow[list[CommitResult]]:
    """One transaction, one round trip: lock what the answer depends on, then one
    statement for a collection's batch of distinct keys, else one commit statement per
    item. Every outcome describes the store at the batch's commit."""
    locks = _batch_locks(requests)
    batch = _batch_query(requests)
    if batch is not None:
        query, order = batch
        answers = yield from _run_batch(Pipeline((*locks, query)))
        # one row per item, in the statement's (key) order: back to the caller's
        by_item = {
            i: _commit_result(requests[i], Answer((), [row], 1))
            for i, row in zip(order, answers[-1].rows, strict=True)
        }
        results = [by_item[i] for i in range(len(requests))]
    else:
        answers = yield from _run_batch(Pipeline((*locks, *(_commit_query(r) for r in requests))))
        results = [
            _commit_result(r, a) for r, a in zip(requests, answers[len(locks) :], strict=True)
        ]
    # Refused although the rules find nothing wrong with the row as read: with the rows
    # locked, only a value the server compared differently from Python (a user table's
    # column type) or a user row inserted meanwhile; nothing was written: stale.
    return [
        CommitResult(Status.STALE, res.record) if res.status is Status.OK else res
        for res in results
    ]


def _lease_flow(
    text: str,
    params: Mapping[str, Any],
    name: str,
    consistent: Callable[[LeaseRow | None, float], bool],
) -> Flow[LeaseAnswer]:
    """A lease statement; a refusal its snapshot cannot explain (``consistent`` says
    whether the snapshot row agrees) came from a concurrent change: run it again."""
    for attempt in range(1, _ATTEMPTS + 1):
        found: Answer = yield Query(text, params)
        granted, owner, token, expires_at, now = found.rows[0]
        row = None if token is None else LeaseRow(name, owner, token, expires_at)
        if granted or consistent(row, now) or attempt == _ATTEMPTS:
            return LeaseAnswer(bool(granted), row, now)
    raise AssertionError("unreachable")  # pragma: no cover


def acquire_flow(name: str, owner: str, ttl: float) -> Flow[LeaseAnswer]:
    return _lease_flow(
        _ACQUIRE,
        {"name": name, "owner": owner, "ttl": ttl},
        name,
        lambda row, now: lease_grant(name, row, owner, ttl, now) is None,
    )


def renew_flow(name: str, token: int, ttl: float) -> Flow[LeaseAnswer]:
    return _lease_flow(
        _RENEW,
        {"name": name, "token": token, "ttl": ttl},
        name,
        lambda row, now: lease_renewal(row, token, ttl, now) is None,
    )


def release_flow(name: str, token: int) -> Flow[LeaseAnswer]:
    return _lease_flow(
        _RELEASE,
        {"name": name, "token": token},
        name,
        lambda row, now: row is None or row.token != token or not row.held_at(now),
    )


def lease_state_flow(name: str) -> Flow[LeaseAnswer]:
    found: Answer = yield from _read_only(Query(_LEASE_STATE, {"name": name}))
    _, owner, token, expires_at, now = found.rows[0]
    return LeaseAnswer(
        False, None if token is None else LeaseRow(name, owner, token, expires_at), now
    )


def prune_flow(older_than: float) -> Flow[int]:
    done: Answer = yield Query(_PRUNE, {"age": older_than})
    return done.rowcount


# -- configuration ----------------------------------------------------------------------
@dataclass(frozen=True)
class Config:
    """What ``open_backend`` understood of a URL and its options (its repr hides the
    conninfo, which holds the password)."""

    conninfo: str = field(repr=False)
    where: str
    schema: str | None = None
    min_size: int = 1
    max_size: int = 10
    pool_timeout: float = 30.0
    connect_kwargs: Mapping[str, Any] = field(default_factory=dict)

    def pool_kwargs(self) -> dict[str, Any]:
        return {
            "conninfo": self.conninfo,
            "kwargs": {"autocommit": True, **self.connect_kwargs},
            "min_size": self.min_size,
            "max_size": self.max_size,
            "timeout": self.pool_timeout,
            "name": "fencing",
            "open": False,
        }


def _number(name: str, raw: object, low: float, kind: Callable[[Any], T]) -> T:
    try:
        if isinstance(raw, bool):
            raise ValueError(raw)
        value = kind(raw)
    except (TypeError, ValueError):
        raise ConfigurationError(f"postgresql option {name}={raw!r} must be a number") from None
    if value < low:  # type: ignore[operator]
        raise ConfigurationError(f"postgresql option {name}={raw!r} must be at least {low}")
    return value


def config_from_url(url: StoreURL, options: Mapping[str, Any]) -> Config:
    """Our options out of the URL's query and ``options``; the rest go to libpq."""
    merged: dict[str, Any] = {**url.options, **options}
    schema = merged.pop("schema", None)
    if schema is not None:
        try:
            schema = check_column(schema, "schema")
        except InvalidIdentifier as exc:
            raise ConfigurationError(f"postgresql option schema: {exc}") from exc
    min_size = _number("min_size", merged.pop("min_size", 1), 0, int)
    max_size = _number("max_size", merged.pop("max_size", max(10, min_size)), 1, int)
    if max_size < min_size:
        raise ConfigurationError(f"postgresql max_size={max_size} is below min_size={min_size}")
    pool_timeout = _number("pool_timeout", merged.pop("pool_timeout", 30.0), 0.001, float)
    connect_kwargs: dict[str, Any] = {}
    if "prepare_threshold" in merged:
        raw = merged.pop("prepare_threshold")
        none = raw is None or str(raw).lower() == "none"
        connect_kwargs["prepare_threshold"] = (
            None if none else _number("prepare_threshold", raw, 0, int)
        )
    params: dict[str, Any] = {
        "host": url.host,
        "port": url.port,
        "user": unquote(url.username) if url.username else None,
        "password": unquote(url.password) if url.password else None,
        "dbname": unquote(url.path) or None,
        "application_name": "fencing",
        "connect_timeout": 10,
    }
    params.update(merged)  # everything else is a libpq parameter (sslmode, ...)
    try:
        conninfo = make_conninfo("", **{k: v for k, v in params.items() if v is not None})
    except psycopg.ProgrammingError as exc:
        raise ConfigurationError(f"postgresql URL: {exc}") from exc
    where = f"{params['host'] or 'localhost'}:{params['port'] or 5432}/{params['dbname'] or ''}"
    return Config(conninfo, where, schema, min_size, max_size, pool_timeout, connect_kwargs)


def _unreachable(config: Config, exc: psycopg.Error) -> FencingError:
    """The error for a failed connect: ``ConfigurationError`` if the server refused the
    URL's database or credentials, else ``TransientStoreError`` (a server that is down)."""
    text = str(exc)
    if exc.sqlstate in _CONFIG_STATES or _CONFIG_TEXT.search(text):
        return ConfigurationError(
            f"postgresql: {config.where} refused the URL's database or credentials: {text}"
        )
    return TransientStoreError(f"postgresql: cannot connect to {config.where}: {text}")


# -- the drivers: they only execute ------------------------------------------------------
class _Base:
    scheme = "postgresql"

    def __init__(self, config: Config) -> None:
        self.config = config

    @property
    def conninfo(self) -> str:
        """The libpq connection string (tests use it for setup connections)."""
        return self.config.conninfo

    @property
    def schema(self) -> str | None:
        return self.config.schema

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.config.where} schema={self.config.schema}>"


def _close(conn: psycopg.Connection[Any]) -> None:
    conn.close()


def _idle(conn: psycopg.Connection[Any]) -> bool:
    """Whether a connection is at rest: open, not broken, no transaction, no result due."""
    return not conn.closed and conn.info.transaction_status == TransactionStatus.IDLE


# A forked child must never use (nor close) its parent's sockets: the pools it inherits
# are kept here, untouched, and it opens its own on first use.
_INHERITED: list[object] = []


class PostgresBackend(PostgresEffects, _Base):
    """The synchronous driver over a ``psycopg_pool.ConnectionPool``."""

    def __init__(self, config: Config) -> None:
        super().__init__(config)
        self._lock = threading.Lock()
        self._pool: Pool[psycopg.Connection[Any]] | None = None
        ref = weakref.ref(self)
        os.register_at_fork(after_in_child=lambda: _forget_after_fork(ref))

    def _connect(self) -> psycopg.Connection[Any]:
        config = self.config
        conn = psycopg.connect(config.conninfo, autocommit=True, **config.connect_kwargs)
        try:
            if config.schema is not None:
                conn.execute(_SEARCH_PATH, {"schema": config.schema})
        except BaseException:
            conn.close()
            raise
        return conn

    @property
    def pool(self) -> Pool[psycopg.Connection[Any]]:
        pool = self._pool
        if pool is None:
            with self._lock:
                if self._pool is None:
                    self._pool = Pool(
                        "postgresql",
                        self._connect,
                        size=self.config.max_size,
                        timeout=self.config.pool_timeout,
                        close=_close,
                        usable=_idle,
                    )
                pool = self._pool
        return pool

    def connect(self) -> None:
        """Check that the server answers (with its own error if not), then keep that
        connection in the pool."""
        pool = self.pool
        error: FencingError | None = None
        try:
            slot = pool.get()
        except psycopg.Error as exc:
            error = _unreachable(self.config, exc)
        if error is not None:
            # raised outside the handler, so not chained: the driver's error holds the
            # connection's conninfo, password included
            raise error
        pool.put(slot)

    def _run(self, step: Step) -> Answer | list[Answer]:
        pool = self.pool
        try:
            slot = pool.get()
            conn = slot.conn
            assert conn is not None
            try:
                if isinstance(step, Query):
                    cur = conn.execute(qualified(step.text, self.schema), step.params)
                    found: Answer | list[Answer] = answer(
                        step, cur, cur.fetchall() if has_rows(cur) else []
                    )
                else:
                    with conn.pipeline():
                        curs = [
                            conn.execute(qualified(q.text, self.schema), q.params)
                            for q in step.queries
                        ]
                    found = [
                        answer(q, c, c.fetchall() if has_rows(c) else [])
                        for q, c in zip(step.queries, curs, strict=True)
                    ]
            except (psycopg.Error, UnicodeError):
                # The server refused a statement: the connection is reused only if it is
                # back at rest (a broken one, or one left in a transaction, is closed).
                if _idle(conn):
                    pool.put(slot)
                else:
                    pool.discard(slot)
                raise
            except BaseException:
                # Anything else (a signal handler's exception, a bug) may have landed
                # mid-statement or mid-pipeline: the connection's state is unknown.
                pool.discard(slot)
                raise
            pool.put(slot)
            return found
        except (psycopg.Error, UnicodeError) as exc:
            raise translate(exc) from exc

    def _drive(self, flow: Flow[T]) -> T:
        return drive(flow, self._run)

    def migrate(self) -> None:
        self._drive(migrate_flow(self.config.schema))

    def close(self) -> None:
        with self._lock:
            if self._pool is not None:
                self._pool.close()

    def columns(self, target: Target, declare: frozenset[str] | None = None) -> frozenset[str]:
        return self._drive(columns_flow(target))

    def read(self, target: Target, key: str | int) -> Record | None:
        return self._drive(read_flow(target, key))

    def probe(self, request: CommitRequest) -> CommitResult:
        return self._drive(probe_flow(request))

    def create(self, target: Target, key: str | int, state_json: str) -> Record:
        return self._drive(create_flow(target, key, state_json))

    def delete(self, target: Target, key: str | int) -> bool:
        return self._drive(delete_flow(target, key))

    def commit(self, request: CommitRequest) -> CommitResult:
        return self._drive(commit_flow(request))

    def commit_many(self, requests: Sequence[CommitRequest]) -> list[CommitResult]:
        return self._drive(commit_many_flow(requests))

    def acquire(self, name: str, owner: str, ttl: float) -> LeaseAnswer:
        return self._drive(acquire_flow(name, owner, ttl))

    def renew(self, name: str, token: int, ttl: float) -> LeaseAnswer:
        return self._drive(renew_flow(name, token, ttl))

    def release(self, name: str, token: int) -> LeaseAnswer:
        return self._drive(release_flow(name, token))

    def lease_state(self, name: str) -> LeaseAnswer:
        return self._drive(lease_state_flow(name))

    def prune(self, older_than: float) -> int:
        return self._drive(prune_flow(older_than))


def _forget_after_fork(ref: weakref.ReferenceType[PostgresBackend]) -> None:
    backend = ref()
    if backend is not None and backend._pool is not None:
        _INHERITED.append(backend._pool)
        backend._pool = None
        backend._lock = threading.Lock()


class AsyncPostgresBackend(AsyncPostgresEffects, _Base):
    """The asyncio driver over a ``psycopg_pool.AsyncConnectionPool``."""

    def __init__(self, config: Config) -> None:
        super().__init__(config)
        self.pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
            **config.pool_kwargs(), configure=self._configure
        )

    async def _configure(self, conn: psycopg.AsyncConnection[Any]) -> None:
        if self.config.schema is not None:
            await conn.execute(_SEARCH_PATH, {"schema": self.config.schema})

    async def connect(self) -> None:
        """Check that the server answers (with its own error if not), then open the pool."""
        error: FencingError | None = None
        try:
            conn = await psycopg.AsyncConnection.connect(self.config.conninfo, autocommit=True)
            await conn.close()
        except psycopg.Error as exc:
            error = _unreachable(self.config, exc)
        if error is not None:
            raise error  # not chained: see the sync connect()
        await self.pool.open(wait=False)

    async def _run(self, step: Step) -> Answer | list[Answer]:
        try:
            # psycopg_pool gives a connection it handed to a cancelled waiter back itself.
            conn = await self.pool.getconn()
            try:
                if isinstance(step, Query):
                    cur = await conn.execute(qualified(step.text, self.schema), step.params)
                    return answer(step, cur, await cur.fetchall() if has_rows(cur) else [])
                async with conn.pipeline():
                    curs = [
                        await conn.execute(qualified(q.text, self.schema), q.params)
                        for q in step.queries
                    ]
                return [
                    answer(q, c, await c.fetchall() if has_rows(c) else [])
                    for q, c in zip(step.queries, curs, strict=True)
                ]
            except (psycopg.Error, UnicodeError):
                raise
            except BaseException:
                # Cancelled (or anything else) at an await mid-statement or mid-pipeline:
                # the connection's state is unknown, so it is closed; the pool replaces it.
                await conn.close()  # (no await inside: a pool's connection closes at once)
                raise
            finally:
                # Shielded: a cancellation landing here must not keep the connection from
                # its pool (putconn rolls back a transaction left open, discards a closed one).
                await asyncio.shield(self.pool.putconn(conn))
        except (psycopg.Error, UnicodeError) as exc:
            raise translate(exc) from exc

    async def _drive(self, flow: Flow[T]) -> T:
        return await adrive(flow, self._run)

    async def migrate(self) -> None:
        await self._drive(migrate_flow(self.config.schema))

    async def close(self) -> None:
        await self.pool.close()

    async def columns(
        self, target: Target, declare: frozenset[str] | None = None
    ) -> frozenset[str]:
        return await self._drive(columns_flow(target))

    async def read(self, target: Target, key: str | int) -> Record | None:
        return await self._drive(read_flow(target, key))

    async def probe(self, request: CommitRequest) -> CommitResult:
        return await self._drive(probe_flow(request))

    async def create(self, target: Target, key: str | int, state_json: str) -> Record:
        return await self._drive(create_flow(target, key, state_json))

    async def delete(self, target: Target, key: str | int) -> bool:
        return await self._drive(delete_flow(target, key))

    async def commit(self, request: CommitRequest) -> CommitResult:
        return await self._drive(commit_flow(request))

    async def commit_many(self, requests: Sequence[CommitRequest]) -> list[CommitResult]:
        return await self._drive(commit_many_flow(requests))

    async def acquire(self, name: str, owner: str, ttl: float) -> LeaseAnswer:
        return await self._drive(acquire_flow(name, owner, ttl))

    async def renew(self, name: str, token: int, ttl: float) -> LeaseAnswer:
        return await self._drive(renew_flow(name, token, ttl))

    async def release(self, name: str, token: int) -> LeaseAnswer:
        return await self._drive(release_flow(name, token))

    async def lease_state(self, name: str) -> LeaseAnswer:
        return await self._drive(lease_state_flow(name))

    async def prune(self, older_than: float) -> int:
        return await self._drive(prune_flow(older_than))


if TYPE_CHECKING:  # both drivers keep the contract

    def _conforms(sync: PostgresBackend, aio: AsyncPostgresBackend) -> tuple[Backend, AsyncBackend]:
        return sync, aio


def open_backend(url: StoreURL, **options: Any) -> PostgresBackend:
    """``postgresql://user:password@host:port/db?schema=...`` (see the module docstring)."""
    backend = PostgresBackend(config_from_url(url, options))
    backend.connect()
    return backend


async def open_async_backend(url: StoreURL, **options: Any) -> AsyncPostgresBackend:
    """The asyncio twin of :func:`open_backend`."""
    backend = AsyncPostgresBackend(config_from_url(url, options))
    await backend.connect()
    return backend
