"""Recorded effects on PostgreSQL: the SQL, the flows, and the drivers' methods.

The four operations are kept here once, as generator flows in the style of
``postgres.py`` (they yield its ``Query`` steps; ``PostgresBackend._drive`` and
``AsyncPostgresBackend._drive`` run them), and the two mixins give both drivers
the contract's methods. This module imports ``postgres`` only inside functions,
so ``postgres`` may import it at the top without a cycle.

Each operation is ONE statement (autocommit: its own transaction, one round trip):

* ``record_effect``: ``INSERT ... ON CONFLICT DO NOTHING RETURNING`` the new row,
  ``UNION ALL`` the stored row when nothing was inserted. Under READ COMMITTED a
  concurrent first recording of the same key makes the insert wait and do nothing,
  while the sibling ``SELECT`` (the statement's older snapshot) cannot see that
  row yet: the answer is empty, and the statement runs again (a fresh snapshot
  sees the winner's row). The first recording wins; every caller gets its row.
* ``mark_effect``: one ``UPDATE ... RETURNING`` (no row: no such effect).
* ``settle_effects``: the ``UPDATE`` of the intent's unsettled effects
  ``RETURNING`` them (their newest versions), ``UNION ALL`` the intent's other
  effects. An effect the snapshot shows unsettled that the ``UPDATE`` skipped was
  settled by a concurrent statement (the ``UPDATE`` waited for it, then re-checked
  ``outcome IS NULL``): the answer would show it unsettled, so the statement runs
  again, and then shows it as the other settled it.
* ``list_effects``: one ``SELECT`` (the open ones through a partial index).

All four are idempotent, so each is run once more on a fresh connection when the
connection was lost under it (a lost reply leaves nothing for the retry to double).
Times are the server's clock, epoch seconds (``now()``: the statement's transaction).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Final, TypeVar

from .._effects import (
    EFFECT_COLUMNS,
    PENDING,
    PRUNABLE,
    Effect,
    EffectQuery,
    NewEffect,
    effect_from_row,
)
from .._errors import TransientStoreError

if TYPE_CHECKING:
    from .postgres import Answer, Config, Flow, Query

__all__ = ["AsyncPostgresEffects", "PostgresEffects", "effects_ddl"]

T = TypeVar("T")

# How often a statement whose answer a concurrent writer made unclear runs again.
_ATTEMPTS: Final = 5

# The server's clock as epoch seconds (the same expression as postgres.py's).
_NOW: Final = "extract(epoch FROM now())::float8"

# -- schema -------------------------------------------------------------------------------
# ``record_key`` is the JSON text of the key and ``detail`` JSON text (or NULL), both kept
# exactly as given; ``outcome`` is NULL until settled, ``reconciled_at`` until reconciled.
_EFFECTS_DDL: Final = (
    "CREATE TABLE IF NOT EXISTS fencing_effects ("
    " idempotency_key TEXT PRIMARY KEY, scope TEXT NOT NULL, record_key TEXT NOT NULL,"
    " intent_id TEXT NOT NULL, transition TEXT NOT NULL, name TEXT NOT NULL,"
    " status TEXT NOT NULL, detail TEXT, outcome TEXT, reconciled_at DOUBLE PRECISION,"
    " recorded_at DOUBLE PRECISION NOT NULL, updated_at DOUBLE PRECISION NOT NULL)",
    "CREATE INDEX IF NOT EXISTS fencing_effects_intent ON fencing_effects (scope, intent_id)",
    # the effects that need reconciling, in listing order
    "CREATE INDEX IF NOT EXISTS fencing_effects_open ON fencing_effects"
    " (recorded_at, idempotency_key) WHERE outcome IS NOT NULL AND reconciled_at IS NULL",
)

# -- statements ---------------------------------------------------------------------------
_ROW: Final = ", ".join(EFFECT_COLUMNS)
_ORDER: Final = " ORDER BY recorded_at, idempotency_key"
_RECORD: Final = (
    f"WITH fencing_new AS (INSERT INTO fencing_effects ({_ROW})"
    " VALUES (%(key)s, %(scope)s, %(record_key)s, %(id)s, %(transition)s, %(name)s,"
    f" %(status)s, %(detail)s::text, NULL, NULL, {_NOW}, {_NOW})"
    f" ON CONFLICT (idempotency_key) DO NOTHING RETURNING {_ROW})"
    f" SELECT {_ROW} FROM fencing_new UNION ALL"
    f" (SELECT {_ROW} FROM fencing_effects WHERE idempotency_key = %(key)s"
    " AND NOT EXISTS (SELECT 1 FROM fencing_new))"
)
_MARK: Final = (
    "UPDATE fencing_effects SET status = coalesce(%(status)s::text, status),"
    f" detail = coalesce(%(detail)s::text, detail), updated_at = {_NOW},"
    f" reconciled_at = CASE WHEN %(reconcile)s::boolean THEN coalesce(reconciled_at, {_NOW})"
    f" ELSE reconciled_at END WHERE idempotency_key = %(key)s RETURNING {_ROW}"
)
_SETTLE: Final = (
    f"WITH fencing_settled AS (UPDATE fencing_effects SET outcome = %(outcome)s,"
    f" updated_at = {_NOW} WHERE scope = %(scope)s AND intent_id = %(id)s"
    f" AND outcome IS NULL RETURNING {_ROW})"
    f" SELECT {_ROW} FROM fencing_settled UNION ALL"
    f" SELECT {_ROW} FROM fencing_effects e WHERE e.scope = %(scope)s AND e.intent_id = %(id)s"
    " AND NOT EXISTS (SELECT 1 FROM fencing_settled s"
    f" WHERE s.idempotency_key = e.idempotency_key){_ORDER}"
)
_LIST: Final = f"SELECT {_ROW} FROM fencing_effects WHERE {{}}{_ORDER} LIMIT %(limit)s"
_LIST_BY_KEY: Final = _LIST.format("idempotency_key = %(key)s")
_LIST_BY_INTENT: Final = _LIST.format("scope = %(scope)s AND intent_id = %(id)s")
_LIST_OPEN: Final = _LIST.format("outcome IS NOT NULL AND reconciled_at IS NULL")
_LIST_PENDING: Final = _LIST.format(PENDING.format(cutoff=f"({_NOW} - %(age)s::float8)"))

_TABLE: Final = re.compile(r"(?<![\w'\".])fencing_effects\b")


@lru_cache(maxsize=64)
def _in_schema(text: str, schema: str | None) -> str:
    """``text`` with the effects table in ``schema`` (never another schema's table
    found through the search path when ``schema``'s is missing)."""
    if schema is None:
        return text
    from .postgres import _quoted

    return _TABLE.sub(_quoted(schema) + r".fencing_effects", text)


def effects_ddl(schema: str | None) -> tuple[str, ...]:
    """The statements that create the effects table and its indexes (idempotent), in
    ``schema``: ``postgres.migrate_flow`` runs them in its migration transaction."""
    return tuple(_in_schema(ddl, schema) for ddl in _EFFECTS_DDL)


def _query(text: str, params: Mapping[str, Any], schema: str | None) -> Query:
    from .postgres import Query

    return Query(_in_schema(text, schema), params)


def _idempotent(query: Query) -> Flow[Answer]:
    """Run ``query``; once more on a fresh connection if the first was lost."""
    from .postgres import _read_only

    found: Answer = yield from _read_only(query)
    return found


# -- the operations, once for sync and async ----------------------------------------------
def record_effect_flow(row: NewEffect, schema: str | None) -> Flow[Effect]:
    key, scope, record_key, intent_id, transition, name, status, detail = row
    params = {
        "key": key,
        "scope": scope,
        "record_key": record_key,
        "id": intent_id,
        "transition": transition,
        "name": name,
        "status": status,
        "detail": detail,
    }
    query = _query(_RECORD, params, schema)
    for _ in range(_ATTEMPTS):
        found = yield from _idempotent(query)
        if found.rows:
            return effect_from_row(found.rows[0])
    # Each time a concurrent recording was in flight, yet no row is there after it.
    raise TransientStoreError(f"postgresql: effect {key} could not be recorded; try again")


def mark_effect_flow(
    key: str, status: str | None, detail_json: str | None, reconcile: bool, schema: str | None
) -> Flow[Effect | None]:
    params = {"key": key, "status": status, "detail": detail_json, "reconcile": reconcile}
    found = yield from _idempotent(_query(_MARK, params, schema))
    return effect_from_row(found.rows[0]) if found.rows else None


def settle_effects_flow(
    scope: str, intent_id: str, outcome: str, schema: str | None
) -> Flow[list[Effect]]:
    query = _query(_SETTLE, {"scope": scope, "id": intent_id, "outcome": outcome}, schema)
    for _ in range(_ATTEMPTS):
        found = yield from _idempotent(query)
        effects = [effect_from_row(row) for row in found.rows]
        # unsettled in the snapshot, skipped by the UPDATE: settled concurrently
        if all(e.outcome is not None for e in effects):
            return effects
    raise TransientStoreError(
        f"postgresql: the effects of {scope}/{intent_id} kept being settled concurrently; try again"
    )


def list_effects_flow(query: EffectQuery, schema: str | None) -> Flow[list[Effect]]:
    params: dict[str, Any] = {"limit": query.limit}
    if query.idempotency_key is not None:
        text, params["key"] = _LIST_BY_KEY, query.idempotency_key
    elif query.intent_id is not None:
        text, params["scope"], params["id"] = _LIST_BY_INTENT, query.scope, query.intent_id
    elif query.pending_for is not None:
        from .postgres import Query, qualified  # its applied table too, in the schema

        params["age"] = float(query.pending_for)
        found = yield from _idempotent(Query(qualified(_LIST_PENDING, schema), params))
        return [effect_from_row(row) for row in found.rows]
    else:
        text = _LIST_OPEN
    found = yield from _idempotent(_query(text, params, schema))
    return [effect_from_row(row) for row in found.rows]


_PRUNE: Final = "DELETE FROM fencing_effects WHERE " + PRUNABLE.format(
    cutoff=f"({_NOW} - %(age)s::float8)"
)


def prune_effects_flow(older_than: float, schema: str | None) -> Flow[int]:
    from .postgres import Query, qualified  # its applied table too, in the schema

    query = Query(qualified(_PRUNE, schema), {"age": float(older_than)})
    found = yield from _idempotent(query)
    return int(found.rowcount)


# -- the drivers' methods -----------------------------------------------------------------
class PostgresEffects:
    """The effects methods of ``PostgresBackend`` (which provides ``config`` and ``_drive``)."""

    if TYPE_CHECKING:
        config: Config

        def _drive(self, flow: Flow[T]) -> T: ...

    def record_effect(self, row: NewEffect) -> Effect:
        return self._drive(record_effect_flow(row, self.config.schema))

    def mark_effect(
        self, idempotency_key: str, status: str | None, detail_json: str | None, reconcile: bool
    ) -> Effect | None:
        flow = mark_effect_flow(idempotency_key, status, detail_json, reconcile, self.config.schema)
        return self._drive(flow)

    def settle_effects(self, scope: str, intent_id: str, outcome: str) -> list[Effect]:
        return self._drive(settle_effects_flow(scope, intent_id, outcome, self.config.schema))

    def list_effects(self, query: EffectQuery) -> list[Effect]:
        return self._drive(list_effects_flow(query, self.config.schema))

    def prune_effects(self, older_than: float) -> int:
        return self._drive(prune_effects_flow(older_than, self.config.schema))


class AsyncPostgresEffects:
    """The effects methods of ``AsyncPostgresBackend`` (which provides ``config`` and
    ``_drive``)."""

    if TYPE_CHECKING:
        config: Config

        async def _drive(self, flow: Flow[T]) -> T: ...

    async def record_effect(self, row: NewEffect) -> Effect:
        return await self._drive(record_effect_flow(row, self.config.schema))

    async def mark_effect(
        self, idempotency_key: str, status: str | None, detail_json: str | None, reconcile: bool
    ) -> Effect | None:
        flow = mark_effect_flow(idempotency_key, status, detail_json, reconcile, self.config.schema)
        return await self._drive(flow)

    async def settle_effects(self, scope: str, intent_id: str, outcome: str) -> list[Effect]:
        return await self._drive(settle_effects_flow(scope, intent_id, outcome, self.config.schema))

    async def list_effects(self, query: EffectQuery) -> list[Effect]:
        return await self._drive(list_effects_flow(query, self.config.schema))

    async def prune_effects(self, older_than: float) -> int:
        return await self._drive(prune_effects_flow(older_than, self.config.schema))
