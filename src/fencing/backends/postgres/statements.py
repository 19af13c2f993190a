"""PostgreSQL's statements: fencing's own tables' (fixed text) and those built per shape
of request (a guarded table's from its checked identifiers, and cached), each ONE
statement; ``qualified`` puts fencing's tables in the store's schema. Why each stays
atomic under READ COMMITTED: ``docs/backends/postgres.md``."""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Final

from psycopg import sql

from ..._effects import EFFECT_COLUMNS, PENDING, PRUNABLE
from ..._request import Target

# The server's clock, as epoch seconds. ``now()`` is the start of the statement's
# transaction: one instant for every check of a statement (and of a batch).
NOW: Final = "extract(epoch FROM now())::float8"


# -- fencing's tables in the store's schema; a guarded table's columns -----------------
# Each of the store's own connections, once: its lock timeout (a statement that waits
# longer for a lock is cancelled whole: ``LockTimeout``), and its schema first on its
# search path.
SESSION: Final = "SELECT set_config('lock_timeout', %(lock_timeout)s, false)"
SESSION_IN_SCHEMA: Final = (
    f"{SESSION}, set_config('search_path',"
    " quote_ident(%(schema)s) || ', ' || current_setting('search_path'), false)"
)
COLUMNS: Final = (
    "SELECT a.attname, EXISTS (SELECT 1 FROM pg_catalog.pg_index i"
    " WHERE i.indrelid = a.attrelid AND i.indisunique AND i.indnkeyatts = 1"
    " AND i.indkey[0] = a.attnum AND i.indpred IS NULL)"
    " FROM pg_catalog.pg_attribute a"
    " WHERE a.attrelid = to_regclass(%(name)s)"
    " AND a.attnum > 0 AND NOT a.attisdropped"
)


def quoted(name: str) -> str:
    """An identifier, quoted (``"name"``); a ``schema.table`` name part by part."""
    return sql.Identifier(*name.split(".")).as_string(None)


_OWN_TABLE: Final = re.compile(
    r"(?<![\w'\".])"
    r"(fencing_(?:schema|records|applied|fences|leases|tombstones|effects|outbox_claim|outbox))\b"
)


@lru_cache(maxsize=2048)
def qualified(text: str, schema: str | None) -> str:
    """``text`` with fencing's own tables in ``schema``: never resolved through the
    search path to another schema's (say, ``public``'s) when ``schema``'s are missing."""
    if schema is None:
        return text
    return _OWN_TABLE.sub(quoted(schema) + r".\1", text)


# -- records --------------------------------------------------------------------------
# Every probe and commit answers one row: seven fixed columns, then the record's.
#   0 applied  1 intent already applied  2 fence  3-5 lease owner, token, expires_at
#   6 now      7.. collection: version, state | table: the table's columns
FIXED: Final = 7
LEASE_LIVE: Final = (
    "EXISTS (SELECT 1 FROM fencing_leases l WHERE l.name = %(lease)s"
    f" AND l.token = %(token)s::bigint AND l.owner IS NOT NULL AND l.expires_at > {NOW})"
)
# A fenced commit key-share-locks the live lease row it writes under (the newest version
# of the row, re-checked after any wait), and a takeover locks the row FOR UPDATE first
# (``ACQUIRE``), which conflicts with it: no takeover can be granted until the commit's
# transaction ends, so a write under token t is never visible after token t + 1 was
# granted. Renew and release update only non-key columns (FOR NO KEY UPDATE), which does
# not conflict with FOR KEY SHARE: the holder can renew and release while a transaction
# that committed under its token is still open (on the caller's connection, say).
LEASE_LOCK_CTE: Final = (
    "fencing_lease AS (SELECT 1 FROM fencing_leases l WHERE l.name = %(lease)s"
    f" AND l.token = %(token)s::bigint AND l.owner IS NOT NULL AND l.expires_at > {NOW}"
    " FOR KEY SHARE)"
)
LEASE_LOCKED: Final = "EXISTS (SELECT 1 FROM fencing_lease)"
IS_APPLIED: Final = (
    "EXISTS (SELECT 1 FROM fencing_applied a WHERE a.scope = %(scope)s AND a.intent_id = %(id)s"
    " AND a.key = %(key_json)s)"
)
# The first column of a refused commit's row: NULL when the intent has no effect left
# to settle, else false (``CommitResult.unsettled``); a probe's row, and a batch's
# refused rows, do not look: false. (A commit that applied says true.)
REFUSED: Final = (
    "SELECT CASE WHEN EXISTS (SELECT 1 FROM fencing_effects e WHERE e.scope = %(scope)s"
    " AND e.intent_id = %(id)s AND e.outcome IS NULL) THEN false END,"
)


def refused(probe: str) -> str:
    """A probe as the refusal half of a commit statement: it tells ``REFUSED`` too."""
    assert probe.startswith("SELECT false,")
    return REFUSED + probe[len("SELECT false,") :]


COLLECTION_PROBE: Final = (
    f"SELECT false, {IS_APPLIED}, r.fence, l.owner, l.token, l.expires_at, {NOW},"
    " r.version, r.state"
    " FROM (SELECT 1) AS fencing_one"
    " LEFT JOIN fencing_records r ON r.collection = %(name)s AND r.key = %(key)s"
    " LEFT JOIN fencing_leases l ON l.name = %(lease)s"
)
# Without a lease there is no lease row to report: one relation less to open on
# every statement (a commit's probe half is planned and initialised even when the
# UPDATE applies).
COLLECTION_READ: Final = (
    f"SELECT false, {IS_APPLIED}, r.fence, NULL::text, NULL::bigint, NULL::float8, {NOW},"
    " r.version, r.state"
    " FROM (SELECT 1) AS fencing_one"
    " LEFT JOIN fencing_records r ON r.collection = %(name)s AND r.key = %(key)s"
)
# A record created again after a delete continues the deleted one's versions, so an
# intent decided against the deleted record can never match the new one. The key's
# tombstone row is its lock: create and delete both take it first (an upsert locks the
# row whether it inserts it or finds it, and answers with its newest version), so a
# create that overlaps a delete waits for it and continues after its last version.
KEY_LOCK: Final = (
    "INSERT INTO fencing_tombstones AS t (collection, key, version)"
    " VALUES (%(name)s, %(key)s, 0) ON CONFLICT (collection, key)"
    " DO UPDATE SET version = t.version RETURNING t.version"
)
CREATE: Final = (
    f"WITH fencing_key AS ({KEY_LOCK})"
    " INSERT INTO fencing_records (collection, key, version, fence, state, updated_at)"
    " SELECT %(name)s, %(key)s, k.version + 1, 0, %(state)s::jsonb,"
    f" {NOW} FROM fencing_key k ON CONFLICT DO NOTHING RETURNING version"
)
DELETE: Final = (
    "WITH gone AS (DELETE FROM fencing_records WHERE collection = %(name)s AND key = %(key)s"
    " RETURNING version)"
    " UPDATE fencing_tombstones AS t SET version = greatest(t.version, gone.version)"
    " FROM gone WHERE t.collection = %(name)s AND t.key = %(key)s"
)


def prune_batch(table: str, column: str, row: str, where: str = "") -> str:
    """One batch of a prune (``_contract.prune_batches``, ``steps.pruning``) of ``table``'s
    rows whose time ``column`` is past the cutoff: the oldest, at most ``%(limit)s``, by
    the index on ``column``, deleted by ``row`` (their primary key, or their ctid); it
    answers how many and the last one's time. A batch starts at the time the one before
    it ended (``%(after)s``): dead index entries a snapshot still holds (a long
    transaction anywhere on the server) would otherwise be stepped over again by every
    batch."""
    chosen = f"{where} {column} >= %(after)s::float8 AND {column} < {NOW} - %(age)s::float8"
    return _batch(table, row, chosen, column)


def _batch(table: str, row: str, chosen: str, position: str, again: str = "") -> str:
    """A prune batch's statement: at most ``%(limit)s`` of ``table``'s rows that
    ``chosen`` selects, in ``position`` order, deleted by ``row`` (and only if ``again``
    still holds for the row as locked); it answers how many and the last ``position``."""
    return (
        f"WITH gone AS (DELETE FROM {table} WHERE {row} = ANY(ARRAY(SELECT {row} FROM {table}"
        f" WHERE{chosen} ORDER BY {position} LIMIT %(limit)s)){again} RETURNING {position})"
        f" SELECT count(*), max({position}) FROM gone"
    )


# By their tuple ids (a TID scan): an applied id's row is only ever inserted and deleted,
# never updated, so its ctid stays its own.
PRUNE_APPLIED: Final = prune_batch("fencing_applied", "applied_at", "ctid")

# -- reads for looking (``fencing inspect``, ``fencing stats``) ------------------------
APPLIED_TO_KEY: Final = (
    "SELECT intent_id, applied_at FROM fencing_applied"
    " WHERE scope = %(scope)s AND key = %(key_json)s"
    " ORDER BY applied_at DESC, intent_id DESC LIMIT %(limit)s"
)
STATS_RECORDS: Final = "SELECT collection, COUNT(*) FROM fencing_records GROUP BY collection"
STATS_APPLIED: Final = "SELECT scope, COUNT(*) FROM fencing_applied GROUP BY scope"
STATS_EFFECTS: Final = (
    "SELECT scope, status, COUNT(*),"
    " COUNT(*) FILTER (WHERE outcome IS NOT NULL AND reconciled_at IS NULL)"
    " FROM fencing_effects GROUP BY scope, status"
)
# the tables with a guard trigger (``guard``) in the store's schema (without one: those
# its search path finds), by the name this store's statements find them by
GUARDED_TABLES: Final = (
    "SELECT DISTINCT CASE WHEN pg_catalog.pg_table_is_visible(c.oid) THEN c.relname"
    " ELSE n.nspname || '.' || c.relname END"
    " FROM pg_catalog.pg_trigger t JOIN pg_catalog.pg_class c ON c.oid = t.tgrelid"
    " JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace"
    " WHERE starts_with(t.tgname, 'fencing_guard_') AND CASE WHEN %(schema)s::text IS NULL"
    " THEN pg_catalog.pg_table_is_visible(c.oid) ELSE n.nspname = %(schema)s END"
)
# each table's row count (NULL: no such table), in one statement: the count of a table
# named by a parameter runs through query_to_xml
ROW_COUNTS: Final = (
    "SELECT t.name, CASE WHEN to_regclass(t.quoted) IS NULL THEN NULL ELSE"
    " (xpath('/row/c/text()', query_to_xml(format('SELECT count(*) AS c FROM %%s',"
    " to_regclass(t.quoted)), false, true, '')))[1]::text::bigint END"
    " FROM unnest(%(names)s::text[], %(quoted)s::text[]) AS t (name, quoted)"
)
_HELD: Final = f"l.owner IS NOT NULL AND l.expires_at > {NOW}"
LEASES_HELD: Final = f"SELECT COUNT(*), {NOW} FROM fencing_leases l WHERE {_HELD}"
# per name: the held leases named ``<name>/...``
LEASES_HELD_UNDER: Final = (
    "SELECT n.name, COUNT(l.name) FROM unnest(%(names)s::text[]) AS n (name)"
    f" LEFT JOIN fencing_leases l ON starts_with(l.name, n.name || '/') AND {_HELD}"
    " GROUP BY n.name"
)


# -- leases ---------------------------------------------------------------------------
# Each is one statement answering (granted, owner, token, expires_at, now) with the row
# after it; refused, the sibling SELECT shows the row as the statement's snapshot saw it.
LEASE_ANSWER: Final = (
    f" SELECT true, u.owner, u.token, u.expires_at, {NOW} FROM fencing_up u UNION ALL"
    f" (SELECT false, l.owner, l.token, l.expires_at, {NOW} FROM (SELECT 1) AS fencing_one"
    " LEFT JOIN fencing_leases l ON l.name = %(name)s"
    " WHERE NOT EXISTS (SELECT 1 FROM fencing_up))"
)
LEASE_HELD: Final = f"l.owner IS NOT NULL AND l.expires_at > {NOW}"
# A takeover first locks a free row FOR UPDATE (``fencing_free``, read whole before the
# upsert's one row is made): it waits for every fenced commit that key-share-locked the
# row under the previous token (``LEASE_LOCK_CTE``), and then re-checks that the row is
# still free. Only a row it locked so is taken over: one its snapshot saw held but a
# release freed since is refused (as held), never taken without the lock. A refused
# acquire (the lease is held) does not wait for those commits.
ACQUIRE: Final = (
    "WITH fencing_free AS MATERIALIZED (SELECT 1 FROM fencing_leases l"
    f" WHERE l.name = %(name)s AND NOT ({LEASE_HELD}) FOR UPDATE),"
    " fencing_up AS ("
    " INSERT INTO fencing_leases AS l (name, owner, token, expires_at)"
    f" SELECT %(name)s, %(owner)s, 1, {NOW} + %(ttl)s::float8"
    " FROM (SELECT count(*) FROM fencing_free) AS fencing_locked"
    " ON CONFLICT (name) DO UPDATE SET owner = excluded.owner, token = l.token + 1,"
    f" expires_at = excluded.expires_at WHERE NOT ({LEASE_HELD})"
    " AND EXISTS (SELECT 1 FROM fencing_free)"
    " RETURNING l.owner, l.token, l.expires_at)" + LEASE_ANSWER
)
RENEW: Final = (
    "WITH fencing_up AS ("
    f" UPDATE fencing_leases AS l SET expires_at = {NOW} + %(ttl)s::float8"
    f" WHERE l.name = %(name)s AND l.token = %(token)s::bigint AND {LEASE_HELD}"
    " RETURNING l.owner, l.token, l.expires_at)" + LEASE_ANSWER
)
RELEASE: Final = (
    "WITH fencing_up AS ("
    " UPDATE fencing_leases AS l SET owner = NULL, expires_at = 0"
    f" WHERE l.name = %(name)s AND l.token = %(token)s::bigint AND {LEASE_HELD}"
    " RETURNING l.owner, l.token, l.expires_at)" + LEASE_ANSWER
)
LEASE_STATE: Final = (
    f"SELECT false, l.owner, l.token, l.expires_at, {NOW} FROM (SELECT 1) AS fencing_one"
    " LEFT JOIN fencing_leases l ON l.name = %(name)s"
)


# -- commits, built per shape of request -----------------------------------------------
@lru_cache(maxsize=4)
def collection_commit(guarded: bool, fenced: bool) -> str:
    """The one-statement commit to a collection, with or without a guard and a lease."""
    sets = ["state = %(state)s::jsonb", "version = r.version + 1", f"updated_at = {NOW}"]
    where = ["r.collection = %(name)s", "r.key = %(key)s", "r.version = %(version)s::bigint"]
    if guarded:  # jsonb containment of scalars is JSON equality: true is not 1, 1 is 1.0
        where.append("r.state @> %(guard)s::jsonb")
    if fenced:
        sets.append("fence = greatest(r.fence, %(token)s::bigint)")
        where += ["r.fence <= %(token)s::bigint", LEASE_LOCKED]
    where.append(f"NOT {IS_APPLIED}")
    return (
        f"WITH {LEASE_LOCK_CTE + ', ' if fenced else ''}"
        f"fencing_upd AS (UPDATE fencing_records AS r SET {', '.join(sets)}"
        f" WHERE {' AND '.join(where)} RETURNING r.version, r.fence),"
        " fencing_claim AS (INSERT INTO fencing_applied (scope, intent_id, key, applied_at)"
        f" SELECT %(scope)s, %(id)s, %(key_json)s, {NOW} FROM fencing_upd)"
        " SELECT true, false, u.fence, NULL::text, NULL::bigint, NULL::float8,"
        f" {NOW}, u.version, NULL::jsonb FROM fencing_upd u"
        f" UNION ALL ({refused(COLLECTION_PROBE if fenced else COLLECTION_READ)}"
        " WHERE NOT EXISTS (SELECT 1 FROM fencing_upd))"
    )


@lru_cache(maxsize=2)
def collection_batch(fenced: bool) -> str:
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
    sets = ["state = i.s", "version = r.version + 1", f"updated_at = {NOW}"]
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
        where += ["r.fence <= %(token)s::bigint", LEASE_LIVE]
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
        f" SELECT %(scope)s, u.i, u.j, {NOW} FROM fencing_upd u)"
        f" SELECT u.n IS NOT NULL, i.seen, coalesce(u.fence, r.fence), {lease_cols}, {NOW},"
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
BATCH_KEYS_NEW: Final = (
    "INSERT INTO fencing_tombstones (collection, key, version)"
    " SELECT %(name)s, k, 0 FROM unnest(%(keys)s::text[]) AS k ORDER BY k"
    " ON CONFLICT (collection, key) DO NOTHING"
)
BATCH_KEYS_LOCK: Final = (
    "SELECT 1 FROM fencing_tombstones WHERE collection = %(name)s"
    " AND key = ANY(%(keys)s::text[]) ORDER BY key FOR SHARE"
)
BATCH_RECORDS_LOCK: Final = (
    "SELECT 1 FROM fencing_records WHERE collection = %(name)s"
    " AND key = ANY(%(keys)s::text[]) ORDER BY key FOR UPDATE"
)
BATCH_LEASE_LOCK: Final = "SELECT 1 FROM fencing_leases WHERE name = %(lease)s FOR KEY SHARE"


@lru_cache(maxsize=256)
def table_rows_lock(target: Target) -> str:
    k = quoted(target.key_column)
    return f"SELECT 1 FROM {quoted(target.name)} WHERE {k} = ANY(%(keys)s) ORDER BY {k} FOR UPDATE"


@lru_cache(maxsize=256)
def table_probe(target: Target) -> str:
    """The probe of a guarded table: same fixed columns, then the row's own."""
    t = quoted(target.name)
    return (
        f"SELECT false, {IS_APPLIED}, (SELECT f.fence FROM fencing_fences f"
        " WHERE f.scope = %(scope)s AND f.key = %(key_json)s),"
        f" l.owner, l.token, l.expires_at, {NOW}, {t}.*"
        f" FROM (SELECT 1) AS fencing_one LEFT JOIN {t} ON {t}.{quoted(target.key_column)}"
        " = %(key)s LEFT JOIN fencing_leases l ON l.name = %(lease)s"
    )


@lru_cache(maxsize=1024)
def table_commit(
    target: Target,
    columns: tuple[str, ...],
    guards: tuple[str, ...],
    check: bool,
    fenced: bool,
    sql_values: tuple[tuple[str, str], ...] = (),
) -> str:
    """The one-statement commit for this shape of request to a guarded table.

    Only ``columns`` are written (``%(s0)s``...), and ``sql_values``' columns as the
    database computes them (``CommitRequest.sql_values``); ``guards`` compare with
    ``IS NOT DISTINCT FROM`` (``%(g0)s``...); ``check`` adds the version condition.
    """
    t, k = quoted(target.name), quoted(target.key_column)
    sets = [f"{quoted(c)} = %(s{i})s" for i, c in enumerate(columns)]
    sets += [f"{quoted(c)} = {expression}" for c, expression in sql_values]
    where = [f"{k} = %(key)s"]
    if target.version_column is not None:
        v = quoted(target.version_column)
        sets.append(f"{v} = {v} + 1")
        if check:
            where.append(f"{v} = %(version)s")
    where += [f"{quoted(c)} IS NOT DISTINCT FROM %(g{i})s" for i, c in enumerate(guards)]
    where.append(f"NOT {IS_APPLIED}")
    ctes = [f"fencing_upd AS (UPDATE {t} SET {', '.join(sets)}"]
    if fenced:
        where.append(
            "NOT EXISTS (SELECT 1 FROM fencing_fences f WHERE f.scope = %(scope)s"
            " AND f.key = %(key_json)s AND f.fence > %(token)s::bigint)"
        )
        where.append(LEASE_LOCKED)
    ctes[0] += f" WHERE {' AND '.join(where)} RETURNING *)"
    if fenced:
        ctes.insert(0, LEASE_LOCK_CTE)
    if fenced:
        # Sees the newest fence (ON CONFLICT locks it); a newer one leaves it empty,
        # and then the claim below violates NOT NULL: the statement rolls back.
        ctes.append(
            "fencing_fence AS (INSERT INTO fencing_fences AS f (scope, key, fence)"
            " SELECT %(scope)s, %(key_json)s, %(token)s::bigint FROM fencing_upd"
            " ON CONFLICT (scope, key) DO UPDATE SET fence = excluded.fence"
            " WHERE f.fence <= excluded.fence RETURNING f.fence)"
        )
        applied_at = f"CASE WHEN EXISTS (SELECT 1 FROM fencing_fence) THEN {NOW} END"
        fence = "(SELECT fence FROM fencing_fence)"
    else:
        applied_at = NOW
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
        f" SELECT true, false, {fence}, NULL::text, NULL::bigint, NULL::float8, {NOW}, u.*"
        f" FROM fencing_upd u UNION ALL ({refused(table_probe(target))}"
        " WHERE NOT EXISTS (SELECT 1 FROM fencing_upd))"
    )


# -- effects ---------------------------------------------------------------------------
EFFECT_ROW: Final = ", ".join(EFFECT_COLUMNS)
EFFECT_ORDER: Final = " ORDER BY recorded_at, idempotency_key"
RECORD_EFFECT: Final = (
    f"WITH fencing_new AS (INSERT INTO fencing_effects ({EFFECT_ROW})"
    " VALUES (%(key)s, %(scope)s, %(record_key)s, %(id)s, %(transition)s, %(name)s,"
    f" %(status)s, %(detail)s::text, NULL, NULL, {NOW}, {NOW})"
    f" ON CONFLICT (idempotency_key) DO NOTHING RETURNING {EFFECT_ROW})"
    f" SELECT {EFFECT_ROW} FROM fencing_new UNION ALL"
    f" (SELECT {EFFECT_ROW} FROM fencing_effects WHERE idempotency_key = %(key)s"
    " AND NOT EXISTS (SELECT 1 FROM fencing_new))"
)
MARK_EFFECT: Final = (
    "UPDATE fencing_effects SET status = coalesce(%(status)s::text, status),"
    f" detail = coalesce(%(detail)s::text, detail), updated_at = {NOW},"
    f" reconciled_at = CASE WHEN %(reconcile)s::boolean THEN coalesce(reconciled_at, {NOW})"
    f" ELSE reconciled_at END WHERE idempotency_key = %(key)s RETURNING {EFFECT_ROW}"
)
SETTLE_EFFECTS: Final = (
    f"WITH fencing_settled AS (UPDATE fencing_effects SET outcome = %(outcome)s,"
    f" updated_at = {NOW} WHERE scope = %(scope)s AND intent_id = %(id)s"
    f" AND outcome IS NULL RETURNING {EFFECT_ROW})"
    f" SELECT {EFFECT_ROW} FROM fencing_settled UNION ALL"
    f" SELECT {EFFECT_ROW} FROM fencing_effects e"
    " WHERE e.scope = %(scope)s AND e.intent_id = %(id)s"
    " AND NOT EXISTS (SELECT 1 FROM fencing_settled s"
    f" WHERE s.idempotency_key = e.idempotency_key){EFFECT_ORDER}"
)
_LIST_EFFECTS: Final = (
    f"SELECT {EFFECT_ROW} FROM fencing_effects WHERE {{}}{EFFECT_ORDER} LIMIT %(limit)s"
)
EFFECTS_BY_KEY: Final = _LIST_EFFECTS.format("idempotency_key = %(key)s")
EFFECTS_BY_INTENT: Final = _LIST_EFFECTS.format("scope = %(scope)s AND intent_id = %(id)s")
EFFECTS_OPEN: Final = _LIST_EFFECTS.format("outcome IS NOT NULL AND reconciled_at IS NULL")
EFFECTS_PENDING: Final = _LIST_EFFECTS.format(PENDING.format(cutoff=f"({NOW} - %(age)s::float8)"))

_PRUNABLE_NOW: Final = PRUNABLE.format(cutoff=f"({NOW} - %(age)s::float8)")
# One batch of an effects prune (``steps.pruning``): at most ``%(limit)s`` prunable
# effects in key order after ``%(after)s``, deleted if still prunable as they are when
# locked (a row changed meanwhile is judged again), with how many and the last key.
PRUNE_EFFECTS: Final = _batch(
    "fencing_effects",
    "idempotency_key",
    f" idempotency_key > %(after)s AND ({_PRUNABLE_NOW})",
    "idempotency_key",
    f" AND ({_PRUNABLE_NOW})",
)


# A guarded table's batch: its items' values come as JSON and take the table's column
# types as PostgreSQL's input functions read text (``json_populate_record`` over the
# table's row type), which is how a single commit's string parameters are read; the
# flow sends only values that a single commit's parameters would give the same value
# (strings, integers, booleans, None) and only to a table without json, jsonb or domain
# columns (``fencing_check.unfit``: such a batch writes nothing, and the flow runs it
# as one statement per item instead).
UNFIT: Final = (
    "EXISTS (SELECT 1 FROM pg_catalog.pg_attribute a JOIN pg_catalog.pg_type ty"
    " ON ty.oid = a.atttypid WHERE a.attrelid = to_regclass(%(table)s) AND a.attnum > 0"
    " AND NOT a.attisdropped AND (ty.typtype = 'd'"
    " OR a.atttypid IN ('json'::regtype, 'jsonb'::regtype)))"
)


@lru_cache(maxsize=256)
def table_batch(
    target: Target,
    columns: tuple[str, ...],
    guards: tuple[str, ...],
    check: bool,
    fenced: bool,
    sql_values: tuple[tuple[str, str], ...] = (),
) -> str:
    """A whole batch of commits of one shape to a guarded table (distinct keys) in ONE
    statement: a single commit's (``table_commit``) for every item at once.

    The items come as one JSON array (``%(items)s``: ``n`` place, ``i`` claim id, ``j``
    key's JSON text, ``v`` expected version, ``k``/``s``/``g`` objects of the key, the
    state and the guard by column). The statement first locks the batch's rows that
    exist (``fencing_lock``: in key order, FOR UPDATE, each the newest version after
    any wait) and compares them with its snapshot's (``fencing_check``): the same row
    versions mean no commit changed them after the snapshot was taken, so every UPDATE,
    and every refusal's row as the snapshot shows it, holds until this transaction
    commits (the rows stay locked). A row changed meanwhile (``moved``) makes every
    UPDATE write nothing; the answer says so, and the flow runs the batch again after a
    statement of its own took the locks. Each answer row is ``n, moved, unfit`` and
    then a single commit's answer, in the items' order.
    """
    t, k = quoted(target.name), quoted(target.key_column)
    sets = [f"{quoted(c)} = (i.fencing_s).{quoted(c)}" for c in columns]
    sets += [f"{quoted(c)} = {expression}" for c, expression in sql_values]
    where = [f"r.{k} = (i.fencing_k).{k}", "NOT i.fencing_seen"]
    if target.version_column is not None:
        v = quoted(target.version_column)
        sets.append(f"{v} = r.{v} + 1")
        if check:
            where.append(f"r.{v} = i.fencing_v")
    where += [f"r.{quoted(c)} IS NOT DISTINCT FROM (i.fencing_g).{quoted(c)}" for c in guards]
    if fenced:
        where.append(
            "NOT EXISTS (SELECT 1 FROM fencing_fences f WHERE f.scope = %(scope)s"
            " AND f.key = i.fencing_j AND f.fence > %(token)s::bigint)"
        )
        where.append(LEASE_LOCKED)
    where.append("NOT (SELECT moved OR unfit FROM fencing_check)")
    ctes = [LEASE_LOCK_CTE] if fenced else []
    ctes += [
        f"fencing_lock AS MATERIALIZED (SELECT {k} AS k, ctid AS c FROM {t}"
        f" WHERE {k} = ANY(%(keys)s) ORDER BY {k} FOR UPDATE)",
        "fencing_check AS MATERIALIZED (SELECT EXISTS (SELECT 1 FROM (SELECT"
        f" {k} AS k, ctid AS c FROM {t} WHERE {k} = ANY(%(keys)s)) AS s FULL JOIN"
        f" fencing_lock l ON l.k = s.k WHERE s.c IS DISTINCT FROM l.c) AS moved, {UNFIT} AS unfit)",
        "fencing_item AS MATERIALIZED (SELECT x.n AS fencing_n, x.i AS fencing_i,"
        " x.j AS fencing_j, x.v AS fencing_v, a.seen IS NOT NULL AS fencing_seen,"
        f" json_populate_record(NULL::{t}, x.k) AS fencing_k,"
        f" json_populate_record(NULL::{t}, x.s) AS fencing_s,"
        f" json_populate_record(NULL::{t}, x.g) AS fencing_g"
        " FROM json_to_recordset(%(items)s::json)"
        " AS x(n int, i text, j text, v bigint, k json, s json, g json)"
        " LEFT JOIN LATERAL (SELECT true AS seen FROM fencing_applied a"
        " WHERE a.scope = %(scope)s AND a.intent_id = x.i AND a.key = x.j LIMIT 1)"
        " AS a ON true WHERE NOT (SELECT unfit FROM fencing_check))",
        f"fencing_upd AS (UPDATE {t} AS r SET {', '.join(sets)} FROM fencing_item i"
        f" WHERE {' AND '.join(where)}"
        " RETURNING i.fencing_n, i.fencing_i, i.fencing_j, r AS fencing_row)",
    ]
    if fenced:
        # Each sees the newest fence (ON CONFLICT locks it); a newer one leaves its key
        # out, and then its claim below violates NOT NULL: the statement rolls back.
        ctes.append(
            "fencing_fence AS (INSERT INTO fencing_fences AS f (scope, key, fence)"
            " SELECT %(scope)s, u.fencing_j, %(token)s::bigint FROM fencing_upd u"
            " ON CONFLICT (scope, key) DO UPDATE SET fence = excluded.fence"
            " WHERE f.fence <= excluded.fence RETURNING f.key, f.fence)"
        )
        applied_at = (
            f"CASE WHEN EXISTS (SELECT 1 FROM fencing_fence ff WHERE ff.key = u.fencing_j)"
            f" THEN {NOW} END"
        )
        fence = "(SELECT ff.fence FROM fencing_fence ff WHERE ff.key = u.fencing_j)"
    else:
        applied_at = NOW
        fence = (
            "(SELECT f.fence FROM fencing_fences f WHERE f.scope = %(scope)s"
            " AND f.key = u.fencing_j)"
        )
    ctes.append(
        "fencing_claim AS (INSERT INTO fencing_applied (scope, intent_id, key, applied_at)"
        f" SELECT %(scope)s, u.fencing_i, u.fencing_j, {applied_at} FROM fencing_upd u)"
    )
    flags = "c.moved, c.unfit"
    return (
        f"WITH {', '.join(ctes)}"
        f" SELECT u.fencing_n, {flags}, true, false, {fence}, NULL::text, NULL::bigint,"
        f" NULL::float8, {NOW}, (u.fencing_row).* FROM fencing_upd u, fencing_check c"
        f" UNION ALL SELECT i.fencing_n, {flags}, false, i.fencing_seen,"
        " (SELECT f.fence FROM fencing_fences f WHERE f.scope = %(scope)s"
        f" AND f.key = i.fencing_j), l.owner, l.token, l.expires_at, {NOW}, {t}.*"
        f" FROM fencing_item i CROSS JOIN fencing_check c LEFT JOIN {t}"
        f" ON {t}.{k} = (i.fencing_k).{k} LEFT JOIN fencing_leases l ON l.name = %(lease)s"
        " WHERE NOT EXISTS (SELECT 1 FROM fencing_upd u WHERE u.fencing_n = i.fencing_n)"
        f" UNION ALL SELECT -1, {flags}, false, false, NULL, NULL, NULL, NULL, NULL, {t}.*"
        f" FROM fencing_check c LEFT JOIN {t} ON false WHERE c.unfit"
    )
