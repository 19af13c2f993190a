"""SQLite's statements: fencing's own tables' (fixed text) and a guarded table's (built
per shape of request from checked identifiers, and cached)."""

from __future__ import annotations

from typing import Any, Final

from ..._effects import EFFECT_COLUMNS, PRUNABLE
from ..._request import CommitRequest, Target
from .values import bound

__all__ = ["Statements", "quote"]

EFFECT_ROW: Final = ", ".join(EFFECT_COLUMNS)
EFFECT_ORDER: Final = " ORDER BY recorded_at, idempotency_key LIMIT ?"
EFFECT_WHERE: Final = {
    "key": "idempotency_key = ?",
    "intent": "scope = ? AND intent_id = ?",
    "open": "outcome IS NOT NULL AND reconciled_at IS NULL",
}
RECORD_EFFECT: Final = (
    f"INSERT INTO fencing_effects ({EFFECT_ROW}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, NULL, NULL, ?, ?)"
    " ON CONFLICT (idempotency_key) DO NOTHING"
)
MARK_EFFECT: Final = (
    "UPDATE fencing_effects SET status = coalesce(?, status), detail = coalesce(?, detail),"
    " updated_at = ?, reconciled_at = CASE WHEN ? THEN coalesce(reconciled_at, ?)"
    " ELSE reconciled_at END WHERE idempotency_key = ?"
)
SETTLE_EFFECTS: Final = (
    "UPDATE fencing_effects SET outcome = ?, updated_at = ?"
    " WHERE scope = ? AND intent_id = ? AND outcome IS NULL"
)

# Whether a refused intent has an effect to settle (``CommitResult.unsettled``).
UNSETTLED: Final = (
    "SELECT 1 FROM fencing_effects WHERE scope = ? AND intent_id = ? AND outcome IS NULL LIMIT 1"
)
CLAIM: Final = (
    "INSERT INTO fencing_applied (scope, intent_id, key, applied_at) VALUES (?, ?, ?, ?)"
    " ON CONFLICT DO NOTHING"
)
# An intent id names work on one key: the same id applied to another key is not a duplicate.
IS_APPLIED: Final = "SELECT 1 FROM fencing_applied WHERE scope = ? AND intent_id = ? AND key = ?"
# The last condition of every conditional UPDATE: the intent is not applied yet. A refused
# commit writes nothing at all (its transaction ends with nothing to sync); the claim is
# written only once the UPDATE has changed its row.
UNAPPLIED: Final = " AND NOT EXISTS (" + IS_APPLIED + ")"
# One batch of a prune (``_contract.prune_batches``): the oldest ids, by the applied_at index,
# at most the limit (fencing_applied has no rowid: by its primary key).
PRUNE_APPLIED: Final = (
    "DELETE FROM fencing_applied WHERE (scope, intent_id, key) IN (SELECT scope, intent_id, key"
    " FROM fencing_applied WHERE applied_at < ? ORDER BY applied_at LIMIT ?)"
)
# One batch of an effects prune (``steps.keyed_pruning``): at most ``:limit`` prunable
# effects in key order after ``:after``, and their keys.
PRUNE_EFFECTS: Final = (
    "DELETE FROM fencing_effects WHERE idempotency_key IN (SELECT idempotency_key"
    " FROM fencing_effects WHERE idempotency_key > :after AND ("
    + PRUNABLE.format(cutoff=":cutoff")
    + ") ORDER BY idempotency_key LIMIT :limit) RETURNING idempotency_key"
)
LEASE_LIVE: Final = (
    " AND EXISTS (SELECT 1 FROM fencing_leases WHERE name = ? AND token = ?"
    " AND owner IS NOT NULL AND expires_at > ?)"
)
_COLLECTION_UPDATE: Final = (
    "UPDATE fencing_records SET state = ?, version = version + 1, updated_at = ?{fence_set}"
    " WHERE collection = ? AND key = ? AND version = ?{fence_where}"
    + UNAPPLIED
    + " RETURNING version, fence"
)
COLLECTION_UPDATE_PLAIN: Final = _COLLECTION_UPDATE.format(fence_set="", fence_where="")
COLLECTION_UPDATE_FENCED: Final = _COLLECTION_UPDATE.format(
    fence_set=", fence = max(fence, ?)", fence_where=" AND fence <= ?" + LEASE_LIVE
)
READ_RECORD: Final = (
    "SELECT version, fence, state FROM fencing_records WHERE collection = ? AND key = ?"
)
PROBE_RECORD: Final = (
    "SELECT r.version, r.fence, r.state, EXISTS (" + IS_APPLIED + ")"
    " FROM fencing_records AS r WHERE r.collection = ? AND r.key = ?"
)
# A refused commit's probe: whether the intent has an effect to settle, too.
REFUSAL_PROBE: Final = PROBE_RECORD.replace(
    " FROM fencing_records", ", EXISTS (" + UNSETTLED + ") FROM fencing_records"
)
READ_FENCE: Final = "SELECT fence FROM fencing_fences WHERE scope = ? AND key = ?"
FENCE_OF_ROW: Final = "(SELECT f.fence FROM fencing_fences AS f WHERE f.scope = ? AND f.key = ?)"
RAISE_FENCE: Final = (
    "INSERT INTO fencing_fences (scope, key, fence) VALUES (?, ?, ?)"
    " ON CONFLICT (scope, key) DO UPDATE SET fence = max(fence, excluded.fence)"
)
READ_LEASE: Final = "SELECT owner, token, expires_at FROM fencing_leases WHERE name = ?"
WRITE_LEASE: Final = (
    "INSERT INTO fencing_leases (name, owner, token, expires_at) VALUES (?, ?, ?, ?)"
    " ON CONFLICT (name) DO UPDATE SET owner = excluded.owner, token = excluded.token,"
    " expires_at = excluded.expires_at"
)
TOMBSTONE_VERSION: Final = "SELECT version FROM fencing_tombstones WHERE collection = ? AND key = ?"
CREATE: Final = (
    "INSERT INTO fencing_records (collection, key, version, fence, state, updated_at)"
    " VALUES (?, ?, ?, 0, ?, ?)"
)
DELETE: Final = "DELETE FROM fencing_records WHERE collection = ? AND key = ? RETURNING version"
TOMBSTONE: Final = (
    "INSERT INTO fencing_tombstones (collection, key, version) VALUES (?, ?, ?)"
    " ON CONFLICT (collection, key) DO UPDATE SET version = max(version, excluded.version)"
)

# reads for looking (``fencing inspect``, ``fencing stats``)
APPLIED_TO_KEY: Final = (
    "SELECT intent_id, applied_at FROM fencing_applied WHERE scope = ? AND key = ?"
    " ORDER BY applied_at DESC, intent_id DESC LIMIT ?"
)
STATS_RECORDS: Final = "SELECT collection, COUNT(*) FROM fencing_records GROUP BY collection"
STATS_APPLIED: Final = "SELECT scope, COUNT(*) FROM fencing_applied GROUP BY scope"
# the tables of this database with a guard trigger (``guard``)
GUARDED_TABLES: Final = (
    "SELECT DISTINCT tbl_name FROM sqlite_master"
    " WHERE type = 'trigger' AND name GLOB 'fencing_guard_*'"
)
STATS_EFFECTS: Final = (
    "SELECT scope, status, COUNT(*),"
    " SUM(CASE WHEN outcome IS NOT NULL AND reconciled_at IS NULL THEN 1 ELSE 0 END)"
    " FROM fencing_effects GROUP BY scope, status"
)
LEASES_HELD: Final = (
    "SELECT COUNT(*) FROM fencing_leases WHERE owner IS NOT NULL AND expires_at > ?"
)
LEASES_HELD_UNDER: Final = LEASES_HELD + " AND substr(name, 1, ?) = ?"

_CACHED: Final = 1024  # statements of guarded tables' shapes kept per store


def quote(identifier: str) -> str:
    """Quote an identifier already checked by ``check_column`` (or ``check_table``: a
    ``schema.table`` name is quoted part by part)."""
    return ".".join('"' + part.replace('"', '""') + '"' for part in identifier.split("."))


def table_read(target: Target) -> str:
    return f"SELECT * FROM {quote(target.name)} WHERE {quote(target.key_column)} = ?"


def guard_held(target: Target, fields: tuple[str, ...]) -> str:
    """Whether a table row holds a guard's values, compared by SQLite (``IS ?``, with the
    columns' affinity, as the conditional UPDATE compares them): 1, 0, or no row."""
    held = " AND ".join(f"{quote(c)} IS ?" for c in fields)
    return f"SELECT {held} FROM {quote(target.name)} WHERE {quote(target.key_column)} = ?"


class Statements:
    """A guarded table's statements, built once per shape of request (one per store)."""

    __slots__ = ("_cache",)

    def __init__(self) -> None:
        self._cache: dict[tuple[Any, ...], str] = {}

    def _keep(self, shape: tuple[Any, ...], sql: str) -> str:
        if len(self._cache) < _CACHED:
            self._cache[shape] = sql
        return sql

    def row(self, target: Target, probe: bool, refusal: bool = False) -> str:
        """A user row and its fence (and, to probe, whether an intent is applied; for a
        refusal, also whether it has an effect to settle)."""
        kind = "refusal" if refusal else "probe" if probe else "row"
        shape = (kind, target.name, target.key_column)
        sql = self._cache.get(shape)
        if sql is None:
            applied = f", EXISTS ({IS_APPLIED})" if probe or refusal else ""
            if refusal:
                applied += f", EXISTS ({UNSETTLED})"
            sql = self._keep(
                shape,
                f"SELECT t.*, {FENCE_OF_ROW}{applied} FROM {quote(target.name)}"
                f" AS t WHERE t.{quote(target.key_column)} = ?",
            )
        return sql

    def update(self, request: CommitRequest) -> str:
        """The conditional UPDATE for this shape of request."""
        target, intent = request.target, request.intent
        fenced = request.lease is not None
        if target.kind == "collection":
            return COLLECTION_UPDATE_FENCED if fenced else COLLECTION_UPDATE_PLAIN
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
            request.sql_values,
        )
        sql = self._cache.get(shape)
        if sql is not None:
            return sql
        sets = [f"{quote(c)} = ?" for c in request.state]
        sets += [f"{quote(c)} = {expression}" for c, expression in request.sql_values]
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
                " AND fence > ?)" + LEASE_LIVE
            )
        # No RETURNING: the row is read back by ``row`` in the same transaction, which
        # SQLite does faster than it builds RETURNING's ephemeral table.
        table = quote(target.name)
        return self._keep(
            shape, f"UPDATE {table} SET {', '.join(sets)} WHERE {' AND '.join(where)}{UNAPPLIED}"
        )


def update_params(request: CommitRequest, now: float) -> list[Any]:
    """The parameters of ``Statements.update(request)``, in order."""
    target, intent, lease = request.target, request.intent, request.lease
    if target.kind == "collection":  # (one list each: a commit makes one)
        key = intent.key
        if lease is None:
            return [
                request.state_json,
                now,
                target.name,
                key,
                intent.expected_version,
                target.scope,
                request.claim_id,
                key,
            ]
        token = lease.token
        return [
            request.state_json,
            now,
            token,
            target.name,
            key,
            intent.expected_version,
            token,
            lease.name,
            token,
            now,
            target.scope,
            request.claim_id,
            key,
        ]
    params = bound(request.state.values())
    params.append(intent.key)
    if target.version_column and intent.expected_version is not None:
        params.append(intent.expected_version)
    if intent.guard:
        params += bound(intent.guard.values())
    if lease is not None:
        params += [target.scope, intent.key, lease.token, lease.name, lease.token, now]
    params += [target.scope, request.claim_id, intent.key]
    return params
