"""MySQL's effects flows: rows of ``fencing_effects`` keyed by their idempotency key,
each operation one round trip (see "Effects" in ``docs/backends/mysql.md``)."""

from __future__ import annotations

from typing import Any

from ..._effects import Effect, EffectQuery, NewEffect, effect_from_row
from ..._flow import Flow
from .._contract import prune_batches
from . import statements as sql
from .restart import restarts_on_deadlock
from .steps import Result, Script, one, pruning

__all__ = ["EffectFlows"]


def _effects_of(result: Result) -> list[Effect]:
    return [effect_from_row(row) for row in result.rows]


class EffectFlows:
    """The effects part of ``_contract.Flows``."""

    __slots__ = ()

    @restarts_on_deadlock
    def record_effect(self, row: NewEffect) -> Flow[Effect]:
        """Insert unless the key exists, then read the stored row: one round trip."""
        script = Script()
        script.add(sql.EFFECT_RECORD, *row)
        read = script.add(sql.EFFECT_SELECT + sql.EFFECT_BY_KEY, row[0])
        results: list[Result] = yield script.batch()
        return _effects_of(results[read])[0]

    @restarts_on_deadlock
    def mark_effect(
        self, idempotency_key: str, status: str | None, detail_json: str | None, reconcile: bool
    ) -> Flow[Effect | None]:
        """Lock the row, read the clock, change it, read it back: one transaction."""
        script = Script(begin=True)
        script.add(sql.EFFECT_LOCK, idempotency_key)
        script.add(sql.SET_NOW)
        script.add(sql.EFFECT_MARK, status, detail_json, bool(reconcile), idempotency_key)
        read = script.add(sql.EFFECT_SELECT + sql.EFFECT_BY_KEY, idempotency_key)
        results: list[Result] = yield script.batch(end=True)
        found = _effects_of(results[read])
        return found[0] if found else None

    @restarts_on_deadlock
    def settle_effects(self, scope: str, intent_id: str, outcome: str) -> Flow[list[Effect]]:
        """Lock the intent's unsettled effects, read the clock, settle them and read all of
        the intent's effects back, in one transaction (one round trip)."""
        script = Script(begin=True)
        script.add(sql.EFFECT_LOCK_OPEN, scope, intent_id)
        script.add(sql.SET_NOW)
        script.add(sql.EFFECT_SETTLE, outcome, scope, intent_id)
        read = script.add(sql.EFFECT_SETTLED, scope, intent_id)
        results: list[Result] = yield script.batch(end=True)
        return _effects_of(results[read])

    @restarts_on_deadlock
    def list_effects(self, query: EffectQuery) -> Flow[list[Effect]]:
        params: tuple[Any, ...]
        if query.idempotency_key is not None:
            where, params = sql.EFFECT_BY_KEY, (query.idempotency_key,)
        elif query.intent_id is not None:
            where, params = sql.EFFECT_BY_INTENT, (query.scope, query.intent_id)
        elif query.pending_for is not None:
            where, params = sql.EFFECT_PENDING, (float(query.pending_for),)
        else:
            where, params = sql.EFFECT_OPEN, ()
        order = " ORDER BY open_since, idempotency_key" if not params else sql.EFFECT_ORDER
        text = sql.EFFECT_SELECT + where + order + " LIMIT %s"
        results: list[Result] = yield one(text, *params, int(query.limit))
        return _effects_of(results[0])

    def prune_effects(self, older_than: float) -> Flow[int]:
        """In batches, like ``prune`` (``_contract.prune_batches``), in key order."""
        return prune_batches(pruning(sql.PRUNE_EFFECTS, older_than, "", 2))
