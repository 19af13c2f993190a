"""Recorded external effects: values and rules, free of I/O.

An *effect* is a side effect outside the store (a charge, an email, a call to
another service) that a task makes on behalf of an intent. The task records it
*before* making it; the record gives it an idempotency key derived from the
intent's root id and the effect's name, the same on every redelivery, retry and
``Recompute`` of that work, so the provider de-duplicates. When the intent ends
``Stale``, ``Fenced``, ``Contended`` or ``Missing`` the store *settles* its effects
with that outcome: they happened for a decision that never committed, and stay
listed (``store.effects_to_reconcile()``, ``fencing reconcile URL``) until someone
marks them reconciled.

Every backend stores the same row (``EFFECT_COLUMNS``) and answers with
:class:`Effect` values built by :func:`effect_from_row`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

from ._errors import InvalidInput, InvalidState
from ._validate import check_name
from ._values import Contended, Fenced, FenceReason, Intent, Kind, Missing, Outcome, Stale

__all__ = [
    "EFFECT_COLUMNS",
    "PENDING",
    "PRUNABLE",
    "Effect",
    "EffectQuery",
    "EffectStatus",
    "NewEffect",
    "dump_detail",
    "effect_from_row",
    "effect_key",
    "new_effect_row",
    "pending",
    "prunable",
    "settles",
]

EffectStatus = Literal["pending", "done", "failed"]
STATUSES: Final = ("pending", "done", "failed")
#: The outcomes that settle an intent's effects (the decision never committed);
#: ``"abandoned"``: its task failed for good (``collection.abandon(intent)``).
SETTLING: Final = ("stale", "fenced", "contended", "missing", "abandoned")
MAX_DETAIL_BYTES: Final = 16 * 1024
MAX_LIST: Final = 10_000

#: ``(idempotency_key, scope, record_key, intent_id, transition, name, status, detail)``
NewEffect = tuple[str, str, str, str, str, str, str, str | None]

#: The stored row, in this order, on every backend. ``key`` is the record key as
#: JSON (a string key and an integer key stay apart); ``detail`` is JSON or NULL;
#: ``outcome`` is NULL until settled; ``reconciled_at`` is NULL until reconciled.
EFFECT_COLUMNS: Final = (
    "idempotency_key",
    "scope",
    "record_key",
    "intent_id",
    "transition",
    "name",
    "status",
    "detail",
    "outcome",
    "reconciled_at",
    "recorded_at",
    "updated_at",
)


@dataclass(frozen=True, slots=True)
class Effect:
    """An external effect recorded against an intent, as the store holds it.

    ``idempotency_key`` is stable for the intent's work (its root id) and ``name``:
    pass it to the provider. ``status`` is ``"pending"`` until marked ``"done"`` or
    ``"failed"``. ``outcome`` is set once the intent ended without committing
    (``"stale"``, ``"fenced"``, ``"contended"`` or ``"missing"``), or its task was
    given up (``"abandoned"``); such an effect
    ``needs_reconcile`` until it is marked ``reconciled``. Times are the store's clock.
    """

    idempotency_key: str
    kind: Kind
    collection: str
    key: str | int
    intent_id: str
    transition: str
    name: str
    status: EffectStatus
    detail: Any = None
    outcome: str | None = None
    reconciled: bool = False
    recorded_at: float = 0.0
    updated_at: float = 0.0

    @property
    def scope(self) -> str:
        return ("c:" if self.kind == "collection" else "t:") + self.collection

    @property
    def needs_reconcile(self) -> bool:
        """Settled by a stale, fenced, contended or missing outcome, not yet reconciled."""
        return self.outcome is not None and not self.reconciled

    def to_dict(self) -> dict[str, Any]:
        return {
            "idempotency_key": self.idempotency_key,
            "kind": self.kind,
            "collection": self.collection,
            "key": self.key,
            "intent_id": self.intent_id,
            "transition": self.transition,
            "name": self.name,
            "status": self.status,
            "detail": self.detail,
            "outcome": self.outcome,
            "reconciled": self.reconciled,
            "recorded_at": self.recorded_at,
            "updated_at": self.updated_at,
        }


@dataclass(frozen=True, slots=True)
class EffectQuery:
    """Which effects a backend lists, oldest first.

    Exactly one of: the effects of one intent (``scope`` and ``intent_id``), one
    effect (``idempotency_key``), the effects still pending ``pending_for`` seconds
    or more (``PENDING``), or (none of these) the effects that need reconciling.
    """

    scope: str | None = None
    intent_id: str | None = None
    idempotency_key: str | None = None
    limit: int = 100
    pending_for: float | None = None

    def matches(self, effect: Effect) -> bool:
        """The query as a predicate: the reference every backend is held to."""
        if self.idempotency_key is not None:
            return effect.idempotency_key == self.idempotency_key
        if self.intent_id is not None:
            return effect.scope == self.scope and effect.intent_id == self.intent_id
        if self.pending_for is not None:  # and its work not committed: the backend knows
            return effect.outcome is None and not effect.reconciled
        return effect.needs_reconcile


#: The effects ``prune`` forgets, finished with before ``{cutoff}``: those whose work
#: committed (their intent's root id is among the applied ids) and untouched since, and
#: those reconciled since. An effect whose work has not committed, or that needs
#: reconciling, is kept however old: its work may still end stale. ``prune`` forgets
#: effects before applied ids, so the applied id it relies on is still there.
PRUNABLE: Final = (
    "(outcome IS NULL AND updated_at < {cutoff} AND EXISTS (SELECT 1 FROM fencing_applied"
    " WHERE fencing_applied.scope = fencing_effects.scope"
    " AND fencing_applied.intent_id = fencing_effects.intent_id))"
    " OR (reconciled_at IS NOT NULL AND reconciled_at < {cutoff})"
)


#: Effects whose work has neither committed nor ended, untouched since ``{cutoff}``: a
#: task that charged and then vanished (killed for good, never redelivered, or failed
#: while the store was unreachable). Not settled, so not listed by default.
PENDING: Final = (
    "outcome IS NULL AND reconciled_at IS NULL AND updated_at < {cutoff} AND NOT EXISTS"
    " (SELECT 1 FROM fencing_applied WHERE fencing_applied.scope = fencing_effects.scope"
    " AND fencing_applied.intent_id = fencing_effects.intent_id)"
)


def pending(effect: Effect, cutoff: float, committed: bool) -> bool:
    """``PENDING`` as a predicate (``committed``: the intent's root id is applied)."""
    return (
        effect.outcome is None
        and not effect.reconciled
        and effect.updated_at < cutoff
        and not committed
    )


def prunable(effect: Effect, cutoff: float, committed: bool) -> bool:
    """``PRUNABLE`` as a predicate (``committed``: the intent's root id is applied)."""
    if effect.outcome is None:
        return committed and effect.updated_at < cutoff
    return effect.reconciled and effect.updated_at < cutoff


def effect_key(scope: str, root_id: str, name: str) -> str:
    """The idempotency key of effect ``name`` of the work ``root_id`` in ``scope``.

    40 hex digits after ``fx_``: short enough for every provider's idempotency
    header, the same on every retry of the same work.
    """
    digest = hashlib.sha256(f"{scope}\x00{root_id}\x00{name}".encode()).hexdigest()
    return "fx_" + digest[:40]


def check_effect_key(value: object) -> str:
    if (
        not isinstance(value, str)
        or len(value) != 43
        or not value.startswith("fx_")
        or any(c not in "0123456789abcdef" for c in value[3:])
    ):
        raise InvalidInput(f"{value!r} is not an effect's idempotency key (fx_ and 40 hex digits)")
    return value


def check_limit(limit: object) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIST:
        raise InvalidInput(f"limit must be an integer from 1 to {MAX_LIST}, not {limit!r}")
    return limit


def dump_detail(detail: object) -> str | None:
    """A detail as canonical JSON (or None), bounded; ``InvalidState`` if it is not JSON."""
    if detail is None:
        return None
    try:
        text = json.dumps(
            detail, separators=(",", ":"), sort_keys=True, allow_nan=False, ensure_ascii=False
        )
    except (TypeError, ValueError) as exc:
        raise InvalidState(f"effect detail must be JSON-serialisable: {exc}") from None
    except RecursionError:
        raise InvalidState("effect detail is nested too deeply") from None
    try:
        size = len(text.encode())
    except UnicodeEncodeError:
        raise InvalidState("effect detail holds a lone surrogate") from None
    if size > MAX_DETAIL_BYTES:
        raise InvalidState(f"effect detail is larger than {MAX_DETAIL_BYTES} bytes of JSON")
    return text


def new_effect_row(scope: str, intent: Intent, name: str, detail_json: str | None) -> NewEffect:
    """What ``record_effect`` inserts: the first eight of ``EFFECT_COLUMNS``.

    The backend adds ``outcome`` and ``reconciled_at`` (NULL) and its own clock's
    ``recorded_at`` and ``updated_at``.
    """
    check_name(name, "effect")
    return (
        effect_key(scope, intent.root_id, name),
        scope,
        json.dumps(intent.key),
        intent.root_id,
        intent.transition,
        name,
        "pending",
        detail_json,
    )


def effect_from_row(row: Sequence[Any]) -> Effect:
    """An :class:`Effect` from a stored row in ``EFFECT_COLUMNS`` order."""
    scope = str(row[1])
    kind: Kind = "collection" if scope.startswith("c:") else "table"
    detail = row[7]
    status = str(row[6])
    assert status in STATUSES, status
    return Effect(
        idempotency_key=str(row[0]),
        kind=kind,
        collection=scope[2:],
        key=json.loads(row[2]),
        intent_id=str(row[3]),
        transition=str(row[4]),
        name=str(row[5]),
        status=status,  # type: ignore[arg-type]
        detail=None if detail is None else json.loads(detail),
        outcome=None if row[8] is None else str(row[8]),
        reconciled=row[9] is not None,
        recorded_at=float(row[10]),
        updated_at=float(row[11]),
    )


def settles(outcome: Outcome) -> str | None:
    """The settling outcome name if ``outcome`` ends an intent without committing for
    good. ``Fenced(EXPIRED)`` does not: the lease ran out with nobody taking over, so
    the same intent can still commit (a retry, or ``abandon`` when it is given up)."""
    if isinstance(outcome, Fenced) and outcome.reason is FenceReason.EXPIRED:
        return None
    if isinstance(outcome, Stale | Fenced | Contended | Missing):
        return outcome.kind
    return None
