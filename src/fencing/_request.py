"""The values a store and its backend exchange: where records live, one commit's
request, and the backends' answers (with the public outcome each answer means).

Below the policy and the backends, which both import it; it does no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ._errors import SchemaError
from ._rules import LeaseRef, LeaseRow, Status
from ._validate import compact_json
from ._values import (
    Committed,
    Duplicate,
    Fenced,
    FenceReason,
    Intent,
    Kind,
    Missing,
    Outcome,
    Record,
    Stale,
    slot_setters,
)

__all__ = [
    "EFFECT_COUNTS",
    "AppliedIntent",
    "CommitRequest",
    "CommitResult",
    "LeaseAnswer",
    "ScopeStats",
    "StoreStats",
    "Target",
    "effect_counts",
    "outcome_for",
    "scope_stats",
    "snapshot_may_explain",
    "stats_scopes",
    "table_version",
]


def table_version(value: Any, target: Target, key: object) -> int:
    """A guarded table row's version as read: ``SchemaError`` if it is NULL (or not an
    integer), which a guarded table's version column must never hold."""
    if value is None or isinstance(value, bool):
        raise SchemaError(
            f"table {target.name!r} row {key!r} has NULL in its version column"
            f" {target.version_column!r}: a guarded table's version column must be an"
            " integer, NOT NULL (fencing migrate URL --guard-table adds the guard)"
        )
    try:
        return int(value)
    except (TypeError, ValueError):
        raise SchemaError(
            f"table {target.name!r} row {key!r} has a non-integer version in column"
            f" {target.version_column!r}"
        ) from None


@dataclass(frozen=True, slots=True)
class Target:
    """Where records live: a library-managed collection, or a table the user owns."""

    kind: Kind
    name: str
    key_column: str = "key"
    version_column: str | None = "version"
    #: ``guard_table`` only: what the guard trigger does with an UPDATE that leaves the
    #: version unchanged, ``"bump"`` it or refuse it (``"strict"``; docs/guard.md).
    guard_mode: str = "bump"
    #: The namespace of applied intents and fences: ``c:name`` or ``t:name`` (made once:
    #: every commit names it).
    scope: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        scope = ("c:" if self.kind == "collection" else "t:") + self.name
        object.__setattr__(self, "scope", scope)


@dataclass(frozen=True, slots=True, init=False)
class CommitRequest:
    """One conditional write: apply ``state`` if ``intent`` still holds (and ``lease``).

    ``state`` was validated before any I/O. ``json_text`` is its canonical JSON when
    the front made it (a collection's state); a table's state is flat column values
    that most backends bind one by one, so its JSON is made only if a backend asks
    for ``state_json``.

    ``sql_values`` are a table's columns the database computes in the commit's own
    UPDATE, as ``(column, sql)``: a mapped column's SQL ``onupdate`` (``func.now()``),
    rendered in the store's dialect by ``_onupdate`` (application code, never input).
    A SQL backend writes ``column = sql`` after the state's columns; no other store
    gets one.
    """

    target: Target
    intent: Intent
    state: Mapping[str, Any]
    json_text: str | None
    lease: LeaseRef | None = None
    sql_values: tuple[tuple[str, str], ...] = ()

    def __init__(
        self,
        target: Target,
        intent: Intent,
        state: Mapping[str, Any],
        json_text: str | None,
        lease: LeaseRef | None = None,
        sql_values: tuple[tuple[str, str], ...] = (),
    ) -> None:
        # the dataclass's own, without its per-field lookups: one is made per commit
        _request_target(self, target)
        _request_intent(self, intent)
        _request_state(self, state)
        _request_json_text(self, json_text)
        _request_lease(self, lease)
        _request_sql_values(self, sql_values)

    @property
    def state_json(self) -> str:
        """The canonical JSON of ``state`` (made once, on first use, for a table)."""
        text = self.json_text
        if text is None:
            text = compact_json(dict(self.state))
            _request_json_text(self, text)
        return text

    @property
    def claim_id(self) -> str:
        """The id under which the store records the intent as applied: its root id.

        A ``Recompute`` commits a derived intent (``<root>~<n>``) in place of the
        original; every derivation of one root shares one claim, so the work of one
        intent is applied at most once, however it is redelivered or recomputed.
        """
        return self.intent.root_id


(
    _request_target,
    _request_intent,
    _request_state,
    _request_json_text,
    _request_lease,
    _request_sql_values,
) = slot_setters(CommitRequest)


class CommitResult(NamedTuple):
    """What the store did: the status and the record (new if applied, else current).

    A named tuple rather than a frozen dataclass: one is made per commit, and a tuple
    is made five times faster.
    """

    status: Status
    record: Record | None
    #: On a refusal: whether the intent may have effects still to settle. A backend that
    #: looks in the same statement answers False when it has none, and the refusal then
    #: costs no settling call; True (the default) when it may, or did not look.
    unsettled: bool = True


def snapshot_may_explain(request: CommitRequest, result: CommitResult) -> bool:
    """Whether a refusal could be an artefact of judging ``request`` on a snapshot older
    than the latest commit (a caller's ``REPEATABLE READ`` transaction, say), so that the
    latest committed rows might answer otherwise: a record absent; one older than the
    version the intent was decided against (or any ``Stale`` of a guard-only intent,
    which has no version to compare); a refusal by the lease row (not by a newer fence
    on the record). ``Stale`` at a version above the intent's, ``Duplicate``, and a fence
    above the lease's token hold whatever the snapshot's age: each shows a row that was
    committed (or written by the caller's own transaction), and versions, claims and
    fences never go back."""
    status, record = result.status, result.record
    if record is None:  # Missing
        return status is not Status.APPLIED
    if status is Status.STALE:
        expected = request.intent.expected_version
        return expected is None or record.version < expected
    if status is Status.FENCED_NEWER or status is Status.FENCED_EXPIRED:
        lease = request.lease
        return lease is not None and record.fence <= lease.token
    return False


@dataclass(frozen=True, slots=True)
class LeaseAnswer:
    """A lease operation's answer: the row after it, and whether it was granted.

    ``now`` is the store's clock at that moment, so callers can tell how long is left
    without trusting their own clock.
    """

    granted: bool
    row: LeaseRow | None
    now: float


@dataclass(frozen=True, slots=True)
class AppliedIntent:
    """An intent id the store recorded as applied to a key, and when (the store's clock).

    The store keeps these for ``Duplicate`` detection until pruned; it records the id
    (of the intent's root: every ``Recompute`` derivation shares it), not a version.
    """

    intent_id: str
    applied_at: float


#: The effect counts of ``ScopeStats.effects``: by status, and those needing reconciling.
EFFECT_COUNTS = ("pending", "done", "failed", "reconcile")


@dataclass(frozen=True, slots=True)
class ScopeStats:
    """What a store holds for one collection (``c:name``) or table (``t:name``).

    ``records``: a collection's records, or a table's rows (None if the table is gone);
    a table is listed once fencing has committed to it or guards it (its trigger; on
    Redis, its declaration). ``applied``: intent ids recorded as applied (commits not
    yet pruned); ``effects``: counts by ``EFFECT_COUNTS``; ``leases_held``: unexpired
    leases named ``<name>/<key>`` (the record-lease convention, ``docs/leases.md``).
    """

    scope: str
    records: int | None
    applied: int
    effects: Mapping[str, int]
    leases_held: int

    @property
    def kind(self) -> Kind:
        return "collection" if self.scope.startswith("c:") else "table"

    @property
    def name(self) -> str:
        return self.scope[2:]


@dataclass(frozen=True, slots=True)
class StoreStats:
    """A store's counts (``Backend.stats``): per scope, and all leases held, at ``now``
    (the store's clock)."""

    scopes: tuple[ScopeStats, ...]
    leases_held: int
    now: float


def stats_scopes(
    records: Mapping[str, Any], applied: Mapping[str, Any], effects: Mapping[str, Any]
) -> list[str]:
    """Every scope the counts name (each keyed by scope), sorted: collections first."""
    return sorted({*records, *applied, *effects})


def effect_counts(rows: Iterable[Sequence[Any]]) -> dict[str, dict[str, int]]:
    """Effect counts by scope from rows of (scope, status, count, how many of those need
    reconciling), as every SQL store's ``stats`` reads them."""
    found: dict[str, dict[str, int]] = {}
    for scope, status, count, reconcile in rows:
        counts = found.setdefault(str(scope), dict.fromkeys(EFFECT_COUNTS, 0))
        counts[str(status)] = counts.get(str(status), 0) + int(count)
        counts["reconcile"] += int(reconcile or 0)
    return found


def scope_stats(
    records: Mapping[str, int | None],
    applied: Mapping[str, int],
    effects: Mapping[str, Mapping[str, int]],
    held: Mapping[str, int],
) -> tuple[ScopeStats, ...]:
    """The stats of every scope of ``stats_scopes``. ``records`` counts a collection's
    records and a table's rows (None: the table is gone); ``held`` counts leases by the
    collection or table name they start with (``<name>/``), or by scope where a store
    names a table row's lease otherwise (Redis: ``docs/backends/redis.md``)."""
    zero = dict.fromkeys(EFFECT_COUNTS, 0)
    return tuple(
        ScopeStats(
            scope,
            records.get(scope, 0 if scope.startswith("c:") else None),
            applied.get(scope, 0),
            {**zero, **effects.get(scope, {})},
            held.get(scope, held.get(scope[2:], 0)),
        )
        for scope in stats_scopes(records, applied, effects)
    )


def outcome_for(result: CommitResult, intent: Intent) -> Outcome:
    """The public outcome for a backend's answer."""
    status, record = result.status, result.record
    if status is Status.APPLIED and record is not None:
        return Committed(record, intent)
    if status is Status.MISSING or record is None:
        return Missing(intent)
    if status is Status.STALE:
        return Stale(record, intent)
    if status is Status.DUPLICATE:
        return Duplicate(record, intent)
    if status is Status.FENCED_NEWER:
        return Fenced(record, FenceReason.NEWER_OWNER, intent)
    if status is Status.FENCED_EXPIRED:
        return Fenced(record, FenceReason.EXPIRED, intent)
    raise AssertionError(f"unexpected status {status}")  # pragma: no cover
