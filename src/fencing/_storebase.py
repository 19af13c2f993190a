"""The shared base of the two stores (``_astore.py`` and the generated ``_store.py``):
what ``Collection``/``AsyncCollection``, ``Table``/``AsyncTable`` and ``Lease``/``AsyncLease``
have in common, free of I/O. They only add the calls to their backend on top of these.
The checks of the public calls' arguments are in ``_checks``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from ._checks import Binder, bind_mapped, mapped_binders
from ._effects import (
    Effect,
    EffectQuery,
    NewEffect,
    dump_detail,
    new_effect_row,
)
from ._errors import (
    InvalidIdentifier,
    InvalidInput,
    InvalidIntent,
    InvalidState,
    LeaseLost,
    RecordNotFound,
    SchemaError,
)
from ._observe import HUB, Event, now_ns
from ._onupdate import Updates, mapped_updates
from ._request import CommitRequest, CommitResult, LeaseAnswer, Target, outcome_for
from ._rules import LeaseRef, LeaseRow, check_ttl
from ._types import column_value, decimal_chars, state_size
from ._validate import check_column, check_key, check_name, dump_state, is_unicode
from ._values import Committed, Fenced, Intent, Outcome, Record

if TYPE_CHECKING:
    from ._values import Kind

__all__ = ["CommittedHook", "LeaseBase", "StoreOptions", "TargetBase", "lease_event"]

#: ``hook(outcome, connection)``: called after each ``Committed`` outcome of a collection
#: or table (``on_committed``); ``connection`` is what ``store.using()`` was given, or None
#: on the store's own connections. An async store's hook may be a coroutine function.
CommittedHook = Callable[[Committed, Any], Any]

MAX_BATCH = 10_000
MAX_EFFECTS = 10_000  # listed per intent


@dataclass(frozen=True, slots=True)
class StoreOptions:
    """Settings shared by a store's collections and tables."""

    max_state_bytes: int
    retention: float  # seconds applied intent ids are kept for Duplicate detection


class TargetBase:
    """Pure checks and answers for one collection or table."""

    __slots__ = (
        "_binders",
        "_columns",
        "_declared",
        "_hooks",
        "_mapped",
        "_options",
        "_store",
        "_updates",
        "_writable",
        "name",
        "target",
    )

    def __init__(
        self,
        store: object,
        options: StoreOptions,
        target: Target,
        declared: frozenset[str] | None = None,
        mapped: object = None,
    ) -> None:
        self._store = store
        self._declared = declared  # the columns given to store.table(columns=...)
        self._options = options
        self.target = target
        self.name = target.name
        self._columns: frozenset[str] | None = None
        self._writable: frozenset[str] = frozenset()  # columns a state was allowed to set
        # a mapped class's columns whose type binds a value as another (``mapped_binders``)
        # and its columns' onupdate rules (``_onupdate``), for this store's dialect
        self._mapped = mapped
        self._binders: Mapping[str, Binder] = {}
        self._updates: Updates | None = None
        if mapped is not None:
            self._binders = mapped_binders(mapped)
            managed = (target.key_column, target.version_column)
            self._updates = mapped_updates(mapped, _scheme(store), managed)
        self._hooks: list[CommittedHook] = []  # shared with the fronts of the store's views

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"

    @property
    def kind(self) -> Kind:
        return self.target.kind

    def lease_name(self, key: object) -> str:
        """The name of the lease that fences this record (``store.lease(name, ...)``;
        the task integrations' default): ``<name>/<key>``. On Redis a table row's is
        the row's own key, ``<table_prefix><table>:<key>``, so that on a Cluster the
        lease lives in the row's hash slot and a fenced commit can be atomic."""
        checked = self._key(key)
        backend = getattr(_root(self._store), "backend", None)
        own = getattr(backend, "record_lease_name", None)
        return f"{self.name}/{checked}" if own is None else str(own(self.target, checked))

    def on_committed(self, hook: CommittedHook) -> CommittedHook:
        """Call ``hook(outcome, connection)`` after each commit of this collection or
        table that comes back ``Committed`` (``commit``, ``commit_many``, ``apply``),
        on this store and on its views (``store.using(connection)``), before the call
        returns: what a mapper's ``after_update`` event would have done, since a fenced
        commit does not go through the ORM's unit of work. ``connection`` is the one
        given to ``store.using()`` (your session: what the hook writes there commits
        or rolls back with the fenced commit), or None on the store's own connections,
        where the commit is already durable. An exception from the hook propagates to
        the caller (the commit stands on the store's own connections). Returns
        ``hook``, so it works as a decorator. See docs/sqlalchemy.md."""
        if not callable(hook):
            raise InvalidInput(f"on_committed takes a callable, not {type(hook).__name__}")
        self._hooks.append(hook)
        return hook

    def _key(self, key: object) -> str | int:
        key = check_key(key)
        if self.target.kind == "collection" and not isinstance(key, str):
            raise InvalidIdentifier(f"collection keys are strings, not {type(key).__name__}")
        return key

    def _set_columns(self, columns: frozenset[str]) -> frozenset[str]:
        target = self.target
        for col in (target.key_column, target.version_column):
            if col is not None and col not in columns:
                raise SchemaError(f"table {target.name!r} has no column {col!r}")
        declared = self._declared
        if declared is not None:
            missing = declared - columns
            if missing:
                raise SchemaError(f"table {target.name!r} has no column(s) {sorted(missing)}")
            columns = declared | {c for c in (target.key_column, target.version_column) if c}
        self._columns = columns
        return columns

    def _new_intent(
        self, record: Record | None, key: object, transition: str, guard: Mapping[str, Any] | None
    ) -> Intent:
        if record is None:
            raise RecordNotFound(f"{self.kind} {self.name!r} has no record {key!r}")
        if self.target.kind == "table" and self.target.version_column is None and guard is None:
            raise InvalidIntent(
                f"table {self.name!r} has no version column: an intent needs a guard"
                " (the field values the row must still hold)"
            )
        expected = None if self.target.version_column is None else record.version
        if isinstance(guard, Mapping):  # a guard value binds as a write does
            guard = bind_mapped(self._binders, guard)
        return Intent.new(self.name, record.key, expected, transition, guard=guard, kind=self.kind)

    def _check_intent(self, intent: object) -> Intent:
        if not isinstance(intent, Intent):
            raise InvalidIntent(f"expected an Intent, got {type(intent).__name__}")
        target = self.target
        kind = target.kind
        if intent.collection != self.name or intent.kind != kind:
            raise InvalidIntent(
                f"intent for {intent.kind} {intent.collection!r} cannot commit to"
                f" {kind} {self.name!r}"
            )
        if kind == "collection" and not isinstance(intent.key, str):
            raise InvalidIntent("a collection intent's key must be a string")
        if target.version_column is None:
            if intent.expected_version is not None:
                raise InvalidIntent(f"table {self.name!r} has no version column to expect")
        elif intent.expected_version is None:
            raise InvalidIntent(f"an intent for {self.name!r} must carry an expected_version")
        return intent

    def _lease_ref(self, lease: object) -> LeaseRef | None:
        if lease is None:
            return None
        if not isinstance(lease, LeaseBase):
            raise InvalidInput(f"lease must be a Lease from this store, not {type(lease).__name__}")
        store = lease.store
        if store is not self._store and _root(store) is not _root(self._store):
            raise InvalidInput("lease was acquired from another store")
        return lease.ref

    def _state_json(self, state: object) -> str:
        text = dump_state(state, self._options.max_state_bytes)
        if self.target.kind == "table":
            assert isinstance(state, Mapping)
            self._check_columns(state)
        return text

    def _admit(self, column: object) -> str:
        """Check a column a state sets, once per front: then it is a set lookup."""
        if not isinstance(column, str):
            raise InvalidState(f"state keys must be strings, not {column!r}")
        if not is_unicode(column):
            raise InvalidState("a state key holds a lone surrogate")
        check_column(column)
        assert self._columns is not None and isinstance(column, str)
        target = self.target
        if column in (target.key_column, target.version_column):
            raise InvalidState(f"column {column!r} is managed by fencing and cannot be set")
        if column not in self._columns:
            if self._declared is not None:
                raise SchemaError(
                    f"column {column!r} is not among the columns table {self.name!r} was"
                    f" opened with ({', '.join(sorted(self._declared))})"
                )
            raise SchemaError(f"table {self.name!r} has no column {column!r}")
        self._writable = self._writable | {column}
        return column

    def _check_columns(self, state: Mapping[str, Any]) -> Mapping[str, Any]:
        """Check a table state's values and size (as ``dump_state`` would), then its
        columns against the table. The state to write: ``state`` itself, or a copy
        when a value is taken as another (an enum member as its value, a ``bytearray``
        as ``bytes``)."""
        if not state:
            raise InvalidState(f"a commit to table {self.name!r} must set at least one column")
        chars = 0
        taken: dict[str, Any] | None = None
        for column, value in state.items():
            kind = type(value)
            if kind is str:
                chars += len(value)
                if value.isascii() or is_unicode(value):
                    continue
                raise InvalidState(f"column {column!r} holds a lone surrogate")
            if kind is int:
                if -(2**63) <= value < 2**63:
                    continue
                raise InvalidState(f"column {column!r} takes integers within 64 bits")
            if value is None or kind is bool:
                continue
            if kind is float:
                if math.isfinite(value):
                    continue
                raise InvalidState(
                    f"column {column!r} must be finite, not {value!r} (NaN and infinity are"
                    " refused, even as read from a row: leave the column out, or set a number)"
                )
            # Decimal, datetime, date, time, UUID, bytes; an enum member as its value.
            # Other subclasses of str/int/float (numpy scalars, ...) are not column values.
            taken_value = column_value(value, f"column {column!r}")
            if isinstance(taken_value, str):
                if not is_unicode(taken_value):
                    raise InvalidState(f"column {column!r} holds a lone surrogate")
                chars += len(taken_value)
            elif isinstance(taken_value, bytes):
                chars += len(taken_value)  # 6 * len(...) bounds its base64 too
            elif isinstance(taken_value, Decimal):
                chars += decimal_chars(taken_value)  # as written out (SQLite binds it so)
            else:
                chars += 48  # a datetime, date, time, timedelta or UUID as text
            if taken_value is not value:
                if taken is None:
                    taken = dict(state)
                taken[column] = taken_value
        if taken is not None:
            state = taken
        # A JSON character takes at most 6 bytes (an escape); a column's name, number
        # and punctuation under 100. Below that bound the state surely fits; else measure
        # (a value beyond JSON as its text: bytes as base64).
        limit = self._options.max_state_bytes
        if 6 * chars + 100 * len(state) + 2 > limit:
            size = state_size(state)
            if size > limit:
                raise InvalidState(f"state is {size} bytes of JSON, above {limit}")
        writable = self._writable
        for column in state:
            if column not in writable:
                self._admit(column)
        return state

    def _request(self, intent: object, state: object, lease: object) -> CommitRequest:
        checked = self._check_intent(intent)
        ref = None if lease is None else self._lease_ref(lease)
        target = self.target
        if target.kind == "table":
            if self._updates is not None and isinstance(state, Mapping):
                return self._updated(checked, state, self._updates, ref)
            # flat column values, checked in full here; their JSON only if a backend asks
            if type(state) is dict:
                state = bind_mapped(self._binders, state)
                return CommitRequest(target, checked, self._check_columns(state), None, ref)
            if isinstance(state, Mapping):
                flat = self._check_columns(dict(bind_mapped(self._binders, state)))
                return CommitRequest(target, checked, flat, None, ref)
            self._state_json(state)  # not a mapping: refused, as a collection's state is
        text = dump_state(state, self._options.max_state_bytes)
        # dump_state took it: a dict, or another Mapping
        return CommitRequest(target, checked, state, text, ref)  # type: ignore[arg-type]

    def _updated(
        self, intent: Intent, state: Mapping[str, Any], updates: Updates, ref: LeaseRef | None
    ) -> CommitRequest:
        """A mapped table's request: the state, and its onupdate rules for the columns
        it leaves out (``_onupdate``), as the ORM applies them to the UPDATE it flushes."""
        if not state:
            raise InvalidState(f"a commit to table {self.name!r} must set at least one column")
        filled, sql = updates.fill(state)
        flat = self._check_columns(dict(bind_mapped(self._binders, filled)))
        for column, _ in sql:
            if column not in self._writable:
                self._admit(column)
        return CommitRequest(self.target, intent, flat, None, ref, sql)

    def _probe_request(self, intent: object, lease: object) -> CommitRequest:
        checked = self._check_intent(intent)
        return CommitRequest(self.target, checked, {}, "{}", self._lease_ref(lease))

    def _batch(
        self, items: Iterable[tuple[Intent, Mapping[str, Any]]], lease: object
    ) -> list[CommitRequest]:
        requests = [self._request(i, s, lease) for i, s in items]
        if len(requests) > MAX_BATCH:
            raise InvalidInput(f"a batch holds at most {MAX_BATCH} commits")
        # An intent id names work on one key: the same id may commit to two keys.
        ids = {(r.claim_id, r.intent.key) for r in requests}
        if len(ids) != len(requests):
            raise InvalidIntent(
                "a batch cannot hold the same intent (or its derivations) twice for one key"
            )
        return requests

    # -- effects ------------------------------------------------------------------
    def _new_effect(self, intent: object, name: object, detail: object) -> NewEffect:
        checked = self._check_intent(intent)
        name = check_name(name, "effect")
        return new_effect_row(self.target.scope, checked, name, dump_detail(detail))

    def _effect_change(self, effect: object, detail: object) -> tuple[str, str | None]:
        if not isinstance(effect, Effect):
            raise InvalidInput(f"expected an Effect, got {type(effect).__name__}")
        if effect.scope != self.target.scope:
            raise InvalidInput(
                f"effect {effect.idempotency_key} belongs to {effect.kind} {effect.collection!r},"
                f" not {self.kind} {self.name!r}"
            )
        return effect.idempotency_key, dump_detail(detail)

    def _effects_query(self, intent: object) -> EffectQuery:
        checked = self._check_intent(intent)
        return EffectQuery(self.target.scope, checked.root_id, limit=MAX_EFFECTS)

    def _report(self, op: str, outcome: Outcome, started: int, lease: object) -> None:
        """Tell the observers (and the ``fencing`` logger) what ``op`` came to."""
        intent = outcome.intent
        current = outcome.current
        seconds, wall = _timing(started)
        event = Event(
            op,
            _scheme(self._store),
            self.kind,
            self.name,
            outcome.kind,
            key=None if intent is None else intent.key,
            intent_id=None if intent is None else intent.id,
            root_id=None if intent is None else intent.root_id,
            expected_version=None if intent is None else intent.expected_version,
            current_version=None if current is None else current.version,
            token=lease.token if isinstance(lease, LeaseBase) else None,
            trace=None if intent is None else intent.trace,
            fence_reason=outcome.reason.value if isinstance(outcome, Fenced) else None,
            seconds=seconds,
            started_ns=wall,
            origin=_root(self._store),
        )
        HUB.emit(event)

    @classmethod
    def _outcome(cls, result: CommitResult, intent: Intent, lease: object) -> Outcome:
        outcome = outcome_for(result, intent)
        return outcome if lease is None else cls._seen(outcome, lease)

    @staticmethod
    def _seen(outcome: Outcome, lease: object) -> Outcome:
        """Tell the lease it was fenced (``lease.lost``); return the outcome."""
        if isinstance(outcome, Fenced) and isinstance(lease, LeaseBase):
            lease._saw_fenced(outcome)
        return outcome


class LeaseBase:
    """A held lease: ``token`` is strictly greater than every earlier token for ``name``.

    ``lost`` becomes True when the store says this token no longer holds the lease
    (a renewal or release refused, a heartbeat failed, or a commit under it came back
    ``Fenced``). Whatever this object believes, the store refuses a fenced commit
    by a token that no longer holds the lease.
    """

    __slots__ = (
        "_lost_reason",
        "_ref",
        "expires_at",
        "lost",
        "name",
        "owner",
        "released",
        "store",
        "token",
        "ttl",
    )

    def __init__(self, store: object, name: str, owner: str, ttl: float, answer: LeaseAnswer):
        assert answer.row is not None
        self.store = store
        self.name = name
        self.owner = owner
        self.ttl = ttl
        self.token: int = answer.row.token
        self.expires_at: float = answer.row.expires_at  # by the store's clock
        self.lost = False
        self.released = False
        self._lost_reason: str | None = None
        self._ref: LeaseRef | None = None

    def __repr__(self) -> str:
        state = "lost" if self.lost else "released" if self.released else "held"
        return (
            f"<{type(self).__name__} {self.name!r} token={self.token} owner={self.owner!r} {state}>"
        )

    @property
    def ref(self) -> LeaseRef:
        """The lease a commit under it names (made again once the token changes)."""
        ref = self._ref
        if ref is None or ref.token != self.token or ref.name != self.name:
            ref = self._ref = LeaseRef(self.name, self.token)
        return ref

    @property
    def lost_reason(self) -> str | None:
        """Why the lease was lost: ``"newer_owner"``, ``"expired"`` or an error text."""
        return self._lost_reason

    def _mark_lost(self, reason: str) -> None:
        if not self.lost:
            self.lost = True
            self._lost_reason = reason

    def _taken_again(self, answer: LeaseAnswer) -> None:
        """The lease was acquired again (``_retake``): hold the new token."""
        assert answer.row is not None
        self.token = answer.row.token
        self.expires_at = answer.row.expires_at
        self.lost = False
        self._lost_reason = None

    def _saw_fenced(self, outcome: Fenced) -> None:
        self._mark_lost(outcome.reason.value)

    def _reason(self, row: LeaseRow | None) -> str:
        if row is not None and row.token != self.token:
            return "newer_owner"
        return "expired"

    def _after_renew(self, answer: LeaseAnswer) -> bool:
        if answer.granted and answer.row is not None:
            self.expires_at = answer.row.expires_at
            return True
        self._mark_lost(self._reason(answer.row))
        return False

    def _after_release(self, answer: LeaseAnswer) -> bool:
        self.released = True
        if answer.granted:
            return True
        self._mark_lost(self._reason(answer.row))
        return False

    def _renew_ttl(self, ttl: float | None) -> float:
        if self.released:
            raise LeaseLost(f"lease {self.name!r} was released; acquire a new one")
        return self.ttl if ttl is None else check_ttl(ttl)

    def _heartbeat_interval(self, interval: float | None) -> float:
        if interval is None:
            return self.ttl / 3.0
        return check_ttl(interval, "heartbeat interval")


def _scheme(store: object) -> str:
    return str(getattr(getattr(store, "backend", None), "scheme", "?"))


def _timing(started: int) -> tuple[float | None, int | None]:
    """An operation's seconds and wall-clock start, from its ``now_ns()`` start (0: not
    timed, an observer was switched on meanwhile)."""
    if not started:
        return None, None
    elapsed = now_ns() - started
    return elapsed / 1e9, time.time_ns() - elapsed


def lease_event(
    op: str, store: object, name: str, outcome: str, token: int | None, started: int, waits: int = 0
) -> None:
    """Tell the observers what a lease operation came to."""
    seconds, wall = _timing(started)
    kind = "lease"
    HUB.emit(
        Event(
            op,
            _scheme(store),
            kind,
            name,
            outcome,
            token=token,
            waits=waits,
            seconds=seconds,
            started_ns=wall,
        )
    )


def _root(store: object) -> object:
    """The store itself, for a view of ``store.using()`` (a lease of the store is good for
    its views, and one taken through a view for the store)."""
    parent = getattr(store, "_parent", None)
    return store if parent is None else parent
