"""Recorded effects on PostgreSQL (``fencing._effects``): their flows, part of the store's
``PostgresFlows``. Each operation is ONE statement (autocommit: its own transaction, one
round trip), idempotent, so each is run once more on a fresh connection when the
connection was lost under it. Why each stays right under concurrent callers:
``docs/backends/postgres.md``."""

from __future__ import annotations

from typing import Any, Final

from ..._effects import Effect, EffectQuery, NewEffect, effect_from_row
from ..._errors import TransientStoreError
from ..._flow import Flow
from .._contract import prune_batches
from . import statements as sql
from .steps import Query, pruning, read_only

__all__ = ["EffectFlows"]

# How often a statement whose answer a concurrent writer made unclear runs again.
_ATTEMPTS: Final = 5


class EffectFlows:
    """The effects' flows of ``_contract.Flows``."""

    __slots__ = ()

    def record_effect(self, row: NewEffect) -> Flow[Effect]:
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
        query = Query(sql.RECORD_EFFECT, params)
        for _ in range(_ATTEMPTS):
            found = yield from read_only(query)
            if found.rows:
                return effect_from_row(found.rows[0])
        # Each time a concurrent recording was in flight, yet no row is there after it.
        raise TransientStoreError(f"postgresql: effect {key} could not be recorded; try again")

    def mark_effect(
        self, idempotency_key: str, status: str | None, detail_json: str | None, reconcile: bool
    ) -> Flow[Effect | None]:
        params = {
            "key": idempotency_key,
            "status": status,
            "detail": detail_json,
            "reconcile": reconcile,
        }
        found = yield from read_only(Query(sql.MARK_EFFECT, params))
        return effect_from_row(found.rows[0]) if found.rows else None

    def settle_effects(self, scope: str, intent_id: str, outcome: str) -> Flow[list[Effect]]:
        query = Query(sql.SETTLE_EFFECTS, {"scope": scope, "id": intent_id, "outcome": outcome})
        for _ in range(_ATTEMPTS):
            found = yield from read_only(query)
            effects = [effect_from_row(row) for row in found.rows]
            # unsettled in the snapshot, skipped by the UPDATE: settled concurrently
            if all(e.outcome is not None for e in effects):
                return effects
        raise TransientStoreError(
            f"postgresql: the effects of {scope}/{intent_id} kept being settled concurrently;"
            " try again"
        )

    def list_effects(self, query: EffectQuery) -> Flow[list[Effect]]:
        params: dict[str, Any] = {"limit": query.limit}
        if query.idempotency_key is not None:
            text, params["key"] = sql.EFFECTS_BY_KEY, query.idempotency_key
        elif query.intent_id is not None:
            text, params["scope"], params["id"] = (
                sql.EFFECTS_BY_INTENT,
                query.scope,
                query.intent_id,
            )
        elif query.pending_for is not None:
            text, params["age"] = sql.EFFECTS_PENDING, float(query.pending_for)
        else:
            text = sql.EFFECTS_OPEN
        found = yield from read_only(Query(text, params))
        return [effect_from_row(row) for row in found.rows]

    def prune_effects(self, older_than: float) -> Flow[int]:
        """In batches, like ``prune`` (``_contract.prune_batches``), in key order."""
        return prune_batches(pruning(sql.PRUNE_EFFECTS, older_than, ""))
