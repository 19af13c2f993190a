"""MySQL's statements: reviewed text, the same for every request (values are escaped by
the driver; a user table's statements, built per shape of request, are in ``templates``).
See ``docs/backends/mysql.md`` for how a commit, a lease and an effect use them."""

from __future__ import annotations

from typing import Final

from ..._effects import EFFECT_COLUMNS, PENDING, PRUNABLE

NOW: Final = "UNIX_TIMESTAMP(NOW(6))"
SET_NOW: Final = f"SET @f_now = {NOW}"
# Whether the claim was new and whether the UPDATE applied are set by the statements
# themselves (an assignment in ON DUPLICATE KEY UPDATE, and in the UPDATE's SET, which
# runs only for the row it writes), never read from ROW_COUNT(): when the client is gone
# (a worker killed or interrupted mid-call), the server still runs the whole script, but
# ROW_COUNT() answers -1 once a statement's reply could not be sent; a claim kept by
# mistake would then answer Duplicate for work that was never applied.
INIT_FLAGS: Final = "SET @f_claimed = 1, @f_done = 0"
CLAIM: Final = (
    "INSERT INTO fencing_applied (scope, intent_id, key_text, applied_at)"
    f" VALUES (%s, %s, %s, {NOW})"
    " ON DUPLICATE KEY UPDATE applied_at = IF(@f_claimed := 0, applied_at, applied_at)"
)
DONE: Final = "(@f_done := 1)"
UNCLAIM: Final = (
    "DELETE FROM fencing_applied WHERE scope = %s AND intent_id = %s AND key_text = %s"
    " AND @f_claimed = 1 AND @f_done = 0"
)
# An unfenced collection commit locks its record first and claims the intent only if
# the record is at the intent's version (``@f_fresh``): a stale intent, the common
# refusal, then writes nothing, and its COMMIT has no log to flush. Under the record's
# lock the version cannot move, so a fresh intent's UPDATE applies unless its claim
# finds it applied; whether a stale one is applied is read with a shared lock
# (``APPLIED``: the latest committed claim, whatever the transaction's snapshot).
INIT_FRESH: Final = "SET @f_claimed = 1, @f_done = 0, @f_fresh = 0"
FRESH: Final = (
    "SELECT version = %s INTO @f_fresh FROM fencing_records"
    " WHERE collection = %s AND `key` = %s FOR UPDATE"
)
CLAIM_FRESH: Final = (
    "INSERT INTO fencing_applied (scope, intent_id, key_text, applied_at)"
    f" SELECT %s, %s, %s, {NOW} FROM DUAL WHERE @f_fresh = 1"
    " ON DUPLICATE KEY UPDATE applied_at = IF(@f_claimed := 0, applied_at, applied_at)"
)
APPLIED: Final = (
    "SELECT IF(@f_fresh = 1, @f_claimed, COUNT(*) = 0) INTO @f_claimed FROM fencing_applied"
    " WHERE scope = %s AND intent_id = %s AND key_text = %s LOCK IN SHARE MODE"
)
LOCK_LEASE: Final = "SELECT 1 FROM fencing_leases WHERE name = %s LOCK IN SHARE MODE"
LOCK_RECORD: Final = "SELECT 1 FROM fencing_records WHERE collection = %s AND `key` = %s FOR UPDATE"
LEASE_LIVE: Final = (
    " AND EXISTS (SELECT 1 FROM fencing_leases WHERE name = %s AND token = %s"
    " AND owner IS NOT NULL AND expires_at > @f_now)"
)
COLLECTION_UPDATE: Final = (
    "UPDATE fencing_records SET state = %s, version = version + " + DONE + ","
    " updated_at = @f_now{fence_set}"
    " WHERE collection = %s AND `key` = %s AND version = %s AND @f_claimed = 1{fence_where}"
)
# Whether a refused intent has an effect to settle (``CommitResult.unsettled``): a
# SELECT of its own, so a consistent read that takes no lock (a subquery of a SET, or
# of a SELECT ... FOR UPDATE, would lock the effects it reads: a caller's transaction
# would then hold them against the settling of its own refusal).
UNSETTLED: Final = (
    "SELECT @f_done = 0 AND EXISTS (SELECT 1 FROM fencing_effects"
    " WHERE scope = %s AND intent_id = %s AND outcome IS NULL)"
)
# One JSON column rather than six: each column costs the driver a descriptor to parse,
# and this SELECT is on every commit's success path.
COLLECTION_RESULT: Final = (
    "SELECT JSON_ARRAY(@f_claimed, @f_done, @f_now, version, fence, IF(@f_done = 1, NULL, state))"
    " FROM fencing_records WHERE collection = %s AND `key` = %s FOR UPDATE"
)
LEASE_AFTER_REFUSAL: Final = (
    "SELECT owner, token, expires_at FROM fencing_leases WHERE name = %s AND @f_done = 0"
)
RAISE_FENCE: Final = (
    "INSERT INTO fencing_fences (scope, key_text, fence) SELECT %s, %s, %s FROM DUAL"
    " WHERE @f_done = 1 ON DUPLICATE KEY UPDATE fence = GREATEST(fence, %s)"
)
FENCE_OF: Final = "(SELECT fence FROM fencing_fences WHERE scope = %s AND key_text = %s)"
READ_RECORD: Final = (
    "SELECT version, fence, state FROM fencing_records WHERE collection = %s AND `key` = %s"
)
# the server's now, and whether the intent was applied
JUDGE_META: Final = (
    f"SELECT {NOW}, EXISTS (SELECT 1 FROM fencing_applied WHERE scope = %s AND intent_id = %s"
    " AND key_text = %s)"
)
READ_LEASE: Final = "SELECT owner, token, expires_at FROM fencing_leases WHERE name = %s"
# A record created again after a delete continues the deleted one's versions, so an
# intent decided against the deleted record can never match the new one. The key's
# tombstone row is its lock: create and delete both take it first (an upsert takes an
# exclusive lock whether it inserts the row or finds it), so a create that overlaps a
# delete waits for it, and reads the tombstone the delete left.
KEY_LOCK: Final = (
    "INSERT INTO fencing_tombstones (collection, `key`, version) VALUES (%s, %s, 0)"
    " ON DUPLICATE KEY UPDATE version = version"
)
# Under the key's lock no other create or delete of it runs: the plain reads are current.
CREATE: Final = (
    "INSERT INTO fencing_records (collection, `key`, version, fence, state, updated_at)"
    " SELECT t.collection, t.`key`, t.version + 1, 0, %s, " + NOW + " FROM fencing_tombstones t"
    " WHERE t.collection = %s AND t.`key` = %s AND NOT EXISTS (SELECT 1 FROM fencing_records r"
    " WHERE r.collection = t.collection AND r.`key` = t.`key`)"
)
CREATED: Final = (
    "SELECT ROW_COUNT(), (SELECT version FROM fencing_records WHERE collection = %s AND `key` = %s)"
)
DELETE_LOCK: Final = (
    "SELECT version INTO @f_gone FROM fencing_records"
    " WHERE collection = %s AND `key` = %s FOR UPDATE"
)
DELETE: Final = "DELETE FROM fencing_records WHERE collection = %s AND `key` = %s"
TOMBSTONE: Final = (
    "UPDATE fencing_tombstones SET version = GREATEST(version, @f_gone)"
    " WHERE collection = %s AND `key` = %s AND @f_gone IS NOT NULL"
)
COLUMNS: Final = (
    "SELECT TABLE_NAME, COLUMN_NAME FROM information_schema.COLUMNS"
    " WHERE TABLE_SCHEMA = COALESCE(%s, DATABASE()) AND TABLE_NAME = %s"
)
# Each unique index's columns (a one-column one: that column is unique on its own).
UNIQUE_INDEXES: Final = (
    "SELECT TABLE_NAME, INDEX_NAME, COLUMN_NAME FROM information_schema.STATISTICS"
    " WHERE TABLE_SCHEMA = COALESCE(%s, DATABASE()) AND TABLE_NAME = %s AND NON_UNIQUE = 0"
)
ENGINE: Final = (
    "SELECT TABLE_NAME, ENGINE, @@lower_case_table_names FROM information_schema.TABLES"
    " WHERE TABLE_SCHEMA = COALESCE(%s, DATABASE()) AND TABLE_NAME = %s"
)


def prune_batch(table: str, column: str, order: str, where: str = "") -> str:
    """One batch of a prune (``_contract.prune_batches``, ``steps.pruning``) of ``table``'s
    rows whose time ``column`` is past the cutoff: the oldest, at most the limit, by the
    index on ``column`` (``order``: then the primary key, so the same rows on a replica).
    Three statements: the time of the last row the batch deletes (``@f_last``), the
    DELETE, and ``@f_last``; parameters ``(after, age, limit)`` twice. A batch starts at
    the time the one before it ended (``after``): InnoDB keeps deleted index entries until
    its purge gets to them, and every batch scanning from the oldest would step over all
    the earlier batches' again (10^5 rows: 7x slower than one DELETE)."""
    rows = f"FROM {table} WHERE {column} >= %s AND {column} < {NOW} - %s{where}"
    return _batch(rows, column, order)


def _batch(rows: str, position: str, order: str) -> str:
    """A prune batch's three statements over ``rows`` (``FROM ... WHERE ...``): the last
    ``position`` of the batch's rows (``@f_last``), the DELETE in ``order``, ``@f_last``."""
    return (
        f"SET @f_last = (SELECT MAX({position}) FROM (SELECT {position} {rows}"
        f" ORDER BY {position} LIMIT %s) AS b);\n"
        f"DELETE {rows} ORDER BY {order} LIMIT %s;\n"
        "SELECT @f_last"
    )


PRUNE: Final = prune_batch(
    "fencing_applied", "applied_at", "applied_at, scope, intent_id, key_text"
)

# Reads for looking (``fencing inspect``, ``fencing stats``): one batch, then the held
# leases named ``<name>/...`` per name (``LEASES_HELD_UNDER``, one statement per name).
APPLIED_TO_KEY: Final = (
    "SELECT intent_id, applied_at FROM fencing_applied WHERE scope = %s AND key_text = %s"
    " ORDER BY applied_at DESC, intent_id DESC LIMIT %s"
)
STATS_RECORDS: Final = "SELECT collection, COUNT(*) FROM fencing_records GROUP BY collection"
STATS_APPLIED: Final = "SELECT scope, COUNT(*) FROM fencing_applied GROUP BY scope"
STATS_EFFECTS: Final = (
    "SELECT scope, status, COUNT(*), COUNT(open_since) FROM fencing_effects GROUP BY scope, status"
)
# the tables of this database with a guard trigger (``guard``); whether a table exists
GUARDED_TABLES: Final = (
    "SELECT DISTINCT EVENT_OBJECT_TABLE FROM information_schema.TRIGGERS"
    " WHERE TRIGGER_SCHEMA = DATABASE() AND LEFT(TRIGGER_NAME, 14) = 'fencing_guard_'"
)
TABLE_EXISTS: Final = (
    "SELECT COUNT(*) FROM information_schema.TABLES"
    " WHERE TABLE_SCHEMA = COALESCE(NULLIF(%s, ''), DATABASE()) AND TABLE_NAME = %s"
)
LEASES_HELD: Final = (
    f"SELECT COUNT(*), {NOW} FROM fencing_leases WHERE owner IS NOT NULL AND expires_at > {NOW}"
)
LEASES_HELD_UNDER: Final = (
    "SELECT COUNT(*) FROM fencing_leases WHERE owner IS NOT NULL"
    f" AND expires_at > {NOW} AND LEFT(name, %s) = %s"
)

# Leases: the row is locked first (an upsert of a placeholder row takes an exclusive
# lock whether it inserts or finds the row, so two first-ever acquisitions of a name
# serialise); the clock is read after the lock; one conditional UPDATE decides.
LEASE_LOCK_NEW: Final = (
    "INSERT INTO fencing_leases (name, owner, token, expires_at) VALUES (%s, NULL, 0, 0)"
    " ON DUPLICATE KEY UPDATE token = token"
)
LEASE_LOCK: Final = "SELECT 1 FROM fencing_leases WHERE name = %s FOR UPDATE"
LEASE_HELD: Final = "owner IS NOT NULL AND expires_at > @f_now"
LEASE_GRANT: Final = (
    "UPDATE fencing_leases SET owner = %s, token = token + 1, expires_at = @f_now + %s"
    f" WHERE name = %s AND NOT ({LEASE_HELD})"
)
LEASE_RENEW: Final = (
    "UPDATE fencing_leases SET expires_at = @f_now + %s"
    f" WHERE name = %s AND token = %s AND {LEASE_HELD}"
)
LEASE_RELEASE: Final = (
    "UPDATE fencing_leases SET owner = NULL, expires_at = 0"
    f" WHERE name = %s AND token = %s AND {LEASE_HELD}"
)
LEASE_READ: Final = (
    "SELECT {now}, l.owner, l.token, l.expires_at FROM (SELECT 1 AS one) AS d"
    " LEFT JOIN fencing_leases AS l ON l.name = %s"
)

# Effects: rows keyed by their idempotency key (see "Effects" in docs/backends/mysql.md).
EFFECT_ROW: Final = ", ".join(EFFECT_COLUMNS)
EFFECT_SELECT: Final = f"SELECT {EFFECT_ROW} FROM fencing_effects WHERE "
EFFECT_ORDER: Final = " ORDER BY recorded_at, idempotency_key"
EFFECT_BY_KEY: Final = "idempotency_key = %s"
EFFECT_BY_INTENT: Final = "scope = %s AND intent_id = %s"
EFFECT_OPEN: Final = "open_since IS NOT NULL"  # outcome set, reconciled_at NULL
EFFECT_PENDING: Final = PENDING.format(cutoff=f"({NOW} - %s)")
# The first recording wins: a duplicate key only takes the row's lock (no change), so
# concurrent recordings of one key wait for the first to commit and then find its row.
# (Not INSERT IGNORE: that would also turn a value the column cannot hold into a warning.)
EFFECT_RECORD: Final = (
    f"INSERT INTO fencing_effects ({EFFECT_ROW})"
    f" VALUES (%s, %s, %s, %s, %s, %s, %s, %s, NULL, NULL, {NOW}, {NOW})"
    " ON DUPLICATE KEY UPDATE idempotency_key = idempotency_key"
)
EFFECT_LOCK: Final = "SELECT 1 FROM fencing_effects WHERE idempotency_key = %s FOR UPDATE"
EFFECT_MARK: Final = (
    "UPDATE fencing_effects SET status = COALESCE(%s, status), detail = COALESCE(%s, detail),"
    " reconciled_at = IF(%s, COALESCE(reconciled_at, @f_now), reconciled_at),"
    " updated_at = @f_now WHERE idempotency_key = %s"
)
EFFECT_LOCK_OPEN: Final = (
    "SELECT 1 FROM fencing_effects WHERE scope = %s AND intent_id = %s AND outcome IS NULL"
    " FOR UPDATE"
)
EFFECT_SETTLE: Final = (
    "UPDATE fencing_effects SET outcome = %s, updated_at = @f_now"
    " WHERE scope = %s AND intent_id = %s AND outcome IS NULL"
)
# Every effect of the intent the UPDATE saw now has an outcome; one recorded since it
# (READ COMMITTED takes no gap locks) is left out, as if recorded after the settle.
EFFECT_SETTLED: Final = EFFECT_SELECT + EFFECT_BY_INTENT + " AND outcome IS NOT NULL" + EFFECT_ORDER

# One batch of an effects prune (``steps.pruning``): at most the limit of prunable effects
# in key order after the last key of the batch before (``_batch``; parameters
# ``(after, age, age, limit)`` twice: the cutoff is in the predicate twice).
PRUNE_EFFECTS: Final = _batch(
    "FROM fencing_effects WHERE idempotency_key > %s AND ("
    + PRUNABLE.format(cutoff=f"({NOW} - %s)")
    + ")",
    "idempotency_key",
    "idempotency_key",
)
