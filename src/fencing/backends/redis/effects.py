"""Redis's effects flows (``fencing._effects``): each effect operation is one script, so
one atomic step and one round trip.

``record_effect`` writes the row only if its key is absent and returns the stored row
either way (the first recording wins, however many processes race); ``mark_effect`` and
``settle_effects`` rewrite rows and keep the open index in step with them (settling adds
an effect that is not reconciled, reconciling removes it); ``list_effects`` reads an
index and its rows in one step, oldest first. Every effects key carries one hash tag,
so every script touches one slot (see ``docs/backends/redis.md``).
"""

from __future__ import annotations

from ..._effects import Effect, EffectQuery, NewEffect, pending, prunable
from ..._flow import Flow
from ..._request import Target
from .replies import as_int, as_list, as_text, effect_reply
from .scripts import run_call, run_calls, script_call
from .settings import Settings

__all__ = ["EffectFlows"]

#: One page of effects: ``(effects, the keys of those old and unsettled whose work
#: committed, the cutoff in seconds)``.
Page = tuple[list[Effect], set[str], float]


def _optional(text: str | None) -> str:
    """A value the scripts may leave alone: ``'='`` and the text, or ``'-'`` for None."""
    return "-" if text is None else "=" + text


class EffectFlows:
    """The effects flows of ``_contract.Flows`` for Redis."""

    __slots__ = ("settings",)

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def record_effect(self, row: NewEffect) -> Flow[Effect]:
        settings = self.settings
        layout = settings.layout
        keys = [layout.effect_rows, layout.effect_intent(row[1], row[3])]
        call = script_call(layout, "record_effect", keys, [*row[:7], _optional(row[7])])
        return effect_reply((yield from run_call(settings, call, write=True)))

    def mark_effect(
        self, idempotency_key: str, status: str | None, detail_json: str | None, reconcile: bool
    ) -> Flow[Effect | None]:
        settings = self.settings
        layout = settings.layout
        args = [idempotency_key, status or "", _optional(detail_json), "1" if reconcile else "0"]
        call = script_call(layout, "mark_effect", [layout.effect_rows, layout.effects_open], args)
        reply = yield from run_call(settings, call, write=True)
        return None if reply is None else effect_reply(reply)

    def settle_effects(self, scope: str, intent_id: str, outcome: str) -> Flow[list[Effect]]:
        settings = self.settings
        layout = settings.layout
        keys = [layout.effect_rows, layout.effect_intent(scope, intent_id), layout.effects_open]
        call = script_call(layout, "settle_effects", keys, [scope, intent_id, outcome])
        return [effect_reply(r) for r in as_list((yield from run_call(settings, call, write=True)))]

    def list_effects(self, query: EffectQuery) -> Flow[list[Effect]]:
        if query.pending_for is not None:
            return (yield from self._pending_effects(query))
        settings = self.settings
        layout = settings.layout
        keys = [layout.effect_rows]
        if query.idempotency_key is None:
            if query.intent_id is not None:
                keys.append(layout.effect_intent(query.scope or "", query.intent_id))
            else:
                keys.append(layout.effects_open)
        args = [query.idempotency_key or "", str(query.limit)]
        call = script_call(layout, "list_effects", keys, args)
        reply = yield from run_call(settings, call, write=False)
        # the index keys are digests: the rows themselves say whether they match
        return [e for e in map(effect_reply, as_list(reply)) if query.matches(e)]

    def prune_effects(self, older_than: float) -> Flow[int]:
        """Remove the prunable effects of each page in one script that judges each again
        on its row as it is then."""
        settings = self.settings
        layout = settings.layout
        removed = 0
        for effects, committed, cutoff in (yield from self._effect_pages(older_than)):
            old = [e for e in effects if prunable(e, cutoff, e.idempotency_key in committed)]
            if old:
                intents = (layout.effect_intent(e.scope, e.intent_id) for e in old)
                keys = [layout.effect_rows, *intents]
                args = [str(round(cutoff * 1e6)), *(e.idempotency_key for e in old)]
                call = script_call(layout, "prune_effects", keys, args)
                removed += as_int((yield from run_call(settings, call, write=True)))
        return removed

    def _effect_pages(self, older_than: float) -> Flow[list[Page]]:
        """Every effect, a page at a time (read-only steps): ``(effects, the keys of those
        old and unsettled whose work committed, the cutoff in seconds)``.

        Whether an unsettled effect's work committed is read from its record's applied
        ids, in their own slots (one pipelined round trip a page). Not atomic with what
        the caller does next, and it need not be: an applied id stays until ``prune``
        forgets applied ids, which ``Store.prune`` does after the effects.
        """
        settings = self.settings
        layout = settings.layout
        age = max(0, round(older_than * 1_000_000))
        pages: list[Page] = []
        cursor = "0"
        while True:
            call = script_call(layout, "scan_effects", [layout.effect_rows], [cursor, "200"])
            page = as_list((yield from run_call(settings, call, write=False)))
            cursor, cutoff = as_text(page[0]), (as_int(page[1]) - age) / 1e6
            effects = [effect_reply(row) for row in page[2:]]
            unsettled = [e for e in effects if e.outcome is None and e.updated_at < cutoff]
            committed: set[str] = set()
            if unsettled:
                checks = [
                    script_call(
                        layout,
                        "is_applied",
                        [layout.applied(Target(e.kind, e.collection), e.key)],
                        [e.intent_id],
                    )
                    for e in unsettled
                ]
                answers = yield from run_calls(settings, checks, write=False)
                pairs = zip(unsettled, answers, strict=True)
                committed = {e.idempotency_key for e, a in pairs if as_int(a)}
            pages.append((effects, committed, cutoff))
            if cursor == "0":
                return pages

    def _pending_effects(self, query: EffectQuery) -> Flow[list[Effect]]:
        """The effects still pending ``query.pending_for`` seconds or more, work not
        committed."""
        assert query.pending_for is not None
        found = [
            e
            for effects, committed, cutoff in (yield from self._effect_pages(query.pending_for))
            for e in effects
            if pending(e, cutoff, e.idempotency_key in committed)
        ]
        found.sort(key=lambda e: (e.recorded_at, e.idempotency_key))
        return found[: query.limit]
