"""The ``memory://`` backend: a real backend with the full contract, in one process.

It runs the pure rules of ``fencing._rules`` under one lock; it is what unit tests
use, and the reference the other backends are held to. Nothing survives the process.

The one backend not on the flow-driven base (``_base.FlowBackend``): it has no connection,
no I/O and nothing to retry, so a step would only wrap a call under its lock.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from .._effects import Effect, EffectQuery, NewEffect, effect_from_row, pending, prunable
from .._errors import AlreadyExists, ConfigurationError, SchemaError, StoreNotMigrated
from .._outbox import (
    OutboxClaim,
    OutboxMessage,
    OutboxRow,
    OutboxStats,
    check_dead,
    claimable,
    due_times,
    supersedes,
)
from .._request import (
    AppliedIntent,
    CommitRequest,
    CommitResult,
    LeaseAnswer,
    StoreStats,
    Target,
    scope_stats,
    stats_scopes,
    table_version,
)
from .._rules import LeaseRow, Status, judge, lease_grant, lease_renewal
from .._url import StoreURL
from .._values import Record
from ._contract import ThreadedAsyncBackend, no_guard

__all__ = ["MemoryBackend"]


class _Table:
    __slots__ = ("columns", "key", "rows", "version")

    def __init__(self, key: str, version: str | None, columns: Iterable[str]) -> None:
        self.key = key
        self.version = version
        self.columns = frozenset(columns) | {key} | ({version} if version else set())
        self.rows: dict[str | int, dict[str, Any]] = {}


_ABSENT: Any = object()
_UNCLAIMED: dict[str, Any] = {"claim_token": None, "claimed_by": None, "claimed_until": None}


class _Undo:
    """The writes of one call, undone if anything interrupts it (a signal handler's
    exception included), so that a call is applied whole or not at all."""

    __slots__ = ("writes",)

    def __init__(self) -> None:
        self.writes: list[tuple[dict[Any, Any], Any, Any]] = []

    def put(self, mapping: dict[Any, Any], key: Any, value: Any) -> None:
        # noted before it is written: undoing a write that never happened is harmless
        self.writes.append((mapping, key, mapping.get(key, _ABSENT)))
        mapping[key] = value

    def __enter__(self) -> _Undo:
        return self

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        if kind is None:
            return
        for mapping, key, old in reversed(self.writes):
            if old is _ABSENT:
                mapping.pop(key, None)
            else:
                mapping[key] = old


class MemoryBackend:
    """All state in dicts under one lock; ``clock`` is the store's clock (monotonic)."""

    scheme = "memory"

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        # (version, fence, state JSON): records are decoded afresh on every read, as a
        # real store does, so no caller ever shares a mutable state with the store
        self._records: dict[tuple[str, str | int], tuple[int, int, str]] = {}
        self._tombstones: dict[tuple[str, str | int], int] = {}  # last version of deleted
        self._tables: dict[str, _Table] = {}
        # applied intents: (scope, root id, key) -> when; an id names work on one key
        self._applied: dict[tuple[str, str, str | int], float] = {}
        self._applied_ids: Counter[tuple[str, str]] = Counter()  # (scope, root id) -> keys
        self._fences: dict[tuple[str, str | int], int] = {}
        self._leases: dict[str, LeaseRow] = {}
        self._effects: dict[str, tuple[Any, ...]] = {}  # rows in EFFECT_COLUMNS order
        self._outbox: dict[int, OutboxRow] = {}  # by id, in id order
        self._outbox_id = 0
        self._claims = 0  # the last claim token

    # -- tables the "user owns": the memory store's stand-in for CREATE TABLE / INSERT
    def create_table(
        self, name: str, *, key: str = "id", version: str | None = "version", columns: Iterable[str]
    ) -> None:
        with self._lock:
            self._tables[name] = _Table(key, version, columns)

    def insert_row(self, name: str, row: Mapping[str, Any]) -> None:
        with self._lock:
            table = self._tables[name]
            unknown = set(row) - table.columns
            if unknown:
                raise SchemaError(f"no column(s) {sorted(unknown)} in table {name!r}")
            table.rows[row[table.key]] = dict(row)

    def migrate(self) -> None:
        return None

    def check_schema(self) -> None:
        raise StoreNotMigrated("a memory store is made empty by each open", None, None)

    def close(self) -> None:
        return None

    def _table(self, target: Target) -> _Table:
        table = self._tables.get(target.name)
        if table is None:
            raise SchemaError(f"table {target.name!r} does not exist")
        for col in (target.key_column, target.version_column):
            if col is not None and col not in table.columns:
                raise SchemaError(f"table {target.name!r} has no column {col!r}")
        return table

    def columns(self, target: Target, declare: frozenset[str] | None = None) -> frozenset[str]:
        with self._lock:
            return self._table(target).columns

    def _read(self, target: Target, key: str | int) -> Record | None:
        if target.kind == "collection":
            found = self._records.get((target.name, key))
            if found is None:
                return None
            return Record(target.name, key, found[0], found[1], json.loads(found[2]))
        row = self._table(target).rows.get(key)
        if row is None:
            return None
        vcol = target.version_column
        state = {c: v for c, v in row.items() if c not in (target.key_column, vcol)}
        return Record(
            target.name,
            key,
            table_version(row[vcol], target, key) if vcol else 0,
            self._fences.get((target.scope, key), 0),
            state,
            "table",
        )

    def read(self, target: Target, key: str | int) -> Record | None:
        with self._lock:
            return self._read(target, key)

    def _judge(self, request: CommitRequest, now: float) -> tuple[Status, Record | None]:
        target, intent, lease = request.target, request.intent, request.lease
        record = self._read(target, intent.key)
        applied = (target.scope, request.claim_id, intent.key) in self._applied
        row = self._leases.get(lease.name) if lease is not None else None
        return judge(record, applied, intent, lease, row, now), record

    def probe(self, request: CommitRequest) -> CommitResult:
        with self._lock:
            status, record = self._judge(request, self.clock())
            return CommitResult(status, record)

    def create(self, target: Target, key: str | int, state_json: str) -> Record:
        with self._lock:
            if (target.name, key) in self._records:
                raise AlreadyExists(f"{target.name}/{key} already exists")
            # a re-created record continues the deleted one's versions: never reused
            version = self._tombstones.get((target.name, key), 0) + 1
            self._records[(target.name, key)] = (version, 0, state_json)
            return Record(target.name, key, version, 0, json.loads(state_json))

    def delete(self, target: Target, key: str | int) -> bool:
        with self._lock:
            gone = self._records.get((target.name, key))
            if gone is None:
                return False
            # the tombstone first: a record is never gone without one
            self._tombstones[(target.name, key)] = gone[0]
            del self._records[(target.name, key)]
            return True

    def _commit(self, request: CommitRequest, now: float, undo: _Undo) -> CommitResult:
        status, record = self._judge(request, now)
        if status is not Status.OK or record is None:
            return CommitResult(status, record)
        target, intent, lease = request.target, request.intent, request.lease
        fence = max(record.fence, lease.token) if lease is not None else record.fence
        if target.kind == "collection":
            state = json.loads(request.state_json)  # a copy the caller cannot change
            new = Record(target.name, intent.key, record.version + 1, fence, state)
            undo.put(
                self._records, (target.name, intent.key), (new.version, fence, request.state_json)
            )
        else:
            rows = self._table(target).rows
            # a new row: the old one stays as it was (column values are immutable)
            row = {**rows[intent.key], **request.state}
            if target.version_column:
                row[target.version_column] = record.version + 1
            undo.put(rows, intent.key, row)
            if lease is not None:
                undo.put(self._fences, (target.scope, intent.key), fence)
            new = self._read(target, intent.key) or record
        undo.put(self._applied, (target.scope, request.claim_id, intent.key), now)
        ids = (target.scope, request.claim_id)
        undo.put(self._applied_ids, ids, self._applied_ids[ids] + 1)
        return CommitResult(Status.APPLIED, new)

    def commit(self, request: CommitRequest) -> CommitResult:
        with self._lock, _Undo() as undo:
            return self._commit(request, self.clock(), undo)

    def commit_many(self, requests: Sequence[CommitRequest]) -> list[CommitResult]:
        with self._lock, _Undo() as undo:
            now = self.clock()
            return [self._commit(r, now, undo) for r in requests]

    def _answer(self, granted: bool, name: str, now: float) -> LeaseAnswer:
        return LeaseAnswer(granted, self._leases.get(name), now)

    def acquire(self, name: str, owner: str, ttl: float) -> LeaseAnswer:
        with self._lock:
            now = self.clock()
            row = lease_grant(name, self._leases.get(name), owner, ttl, now)
            if row is not None:
                self._leases[name] = row
            return self._answer(row is not None, name, now)

    def renew(self, name: str, token: int, ttl: float) -> LeaseAnswer:
        with self._lock:
            now = self.clock()
            row = lease_renewal(self._leases.get(name), token, ttl, now)
            if row is not None:
                self._leases[name] = row
            return self._answer(row is not None, name, now)

    def release(self, name: str, token: int) -> LeaseAnswer:
        with self._lock:
            now = self.clock()
            row = self._leases.get(name)
            ok = row is not None and row.token == token and row.held_at(now)
            if row is not None and ok:
                self._leases[name] = LeaseRow(name, None, row.token, 0.0)
            return self._answer(ok, name, now)

    def lease_state(self, name: str) -> LeaseAnswer:
        with self._lock:
            return self._answer(False, name, self.clock())

    def prune(self, older_than: float) -> int:
        with self._lock:
            cutoff = self.clock() - older_than
            old = [k for k, at in self._applied.items() if at < cutoff]
            for k in old:
                del self._applied[k]
                self._applied_ids[k[:2]] -= 1
                if not self._applied_ids[k[:2]]:
                    del self._applied_ids[k[:2]]
            return len(old)

    # -- effects ------------------------------------------------------------------
    def record_effect(self, row: NewEffect) -> Effect:
        with self._lock:
            stored = self._effects.get(row[0])
            if stored is None:
                now = self.clock()
                stored = self._effects[row[0]] = (*row, None, None, now, now)
            return effect_from_row(stored)

    def mark_effect(
        self, idempotency_key: str, status: str | None, detail_json: str | None, reconcile: bool
    ) -> Effect | None:
        with self._lock:
            stored = self._effects.get(idempotency_key)
            if stored is None:
                return None
            now = self.clock()
            row = list(stored)
            if status is not None:
                row[6] = status
            if detail_json is not None:
                row[7] = detail_json
            if reconcile and row[9] is None:
                row[9] = now
            row[11] = now
            self._effects[idempotency_key] = tuple(row)
            return effect_from_row(row)

    def settle_effects(self, scope: str, intent_id: str, outcome: str) -> list[Effect]:
        with self._lock, _Undo() as undo:
            now = self.clock()
            for key, row in list(self._effects.items()):
                if row[1] == scope and row[3] == intent_id and row[8] is None:
                    undo.put(self._effects, key, (*row[:8], outcome, row[9], row[10], now))
            return self._list(EffectQuery(scope, intent_id, limit=len(self._effects) or 1))

    def _list(self, query: EffectQuery) -> list[Effect]:
        found = [effect_from_row(row) for row in self._effects.values()]
        if query.pending_for is not None:
            cutoff = self.clock() - query.pending_for
            found = [
                e for e in found if pending(e, cutoff, (e.scope, e.intent_id) in self._applied_ids)
            ]
        found = [e for e in found if query.matches(e)]
        found.sort(key=lambda e: (e.recorded_at, e.idempotency_key))
        return found[: query.limit]

    def list_effects(self, query: EffectQuery) -> list[Effect]:
        with self._lock:
            return self._list(query)

    def prune_effects(self, older_than: float) -> int:
        with self._lock:
            cutoff = self.clock() - older_than
            old = [
                k
                for k, row in self._effects.items()
                if prunable(effect_from_row(row), cutoff, (row[1], row[3]) in self._applied_ids)
            ]
            for k in old:
                del self._effects[k]
            return len(old)

    # -- reads for looking (``_contract``) -------------------------------------------------
    def applied(self, target: Target, key: str | int, limit: int) -> list[AppliedIntent]:
        with self._lock:
            scope = target.scope
            found = [
                AppliedIntent(k[1], at)
                for k, at in self._applied.items()
                if k[0] == scope and k[2] == key and type(k[2]) is type(key)
            ]
        found.sort(key=lambda a: (a.applied_at, a.intent_id), reverse=True)
        return found[:limit]

    def stats(self) -> StoreStats:
        with self._lock:
            now = self.clock()
            records: dict[str, int | None] = dict(Counter(f"c:{name}" for name, _ in self._records))
            records.update({f"t:{name}": len(t.rows) for name, t in self._tables.items()})
            applied: Counter[str] = Counter(scope for scope, _, _ in self._applied)
            effects: dict[str, Counter[str]] = {}
            for row in self._effects.values():
                counts = effects.setdefault(row[1], Counter())
                counts[row[6]] += 1
                counts["reconcile"] += row[8] is not None and row[9] is None
            held = [name for name, row in self._leases.items() if row.held_at(now)]
        by_name = {
            scope[2:]: sum(1 for name in held if name.startswith(f"{scope[2:]}/"))
            for scope in stats_scopes(records, applied, effects)
        }
        return StoreStats(scope_stats(records, applied, effects, by_name), len(held), now)

    # -- the outbox (kept in id order; the claim rule is ``_outbox.claimable``) ------------
    def outbox_add(self, message: OutboxMessage) -> OutboxRow:
        with self._lock:
            now = self.clock()
            old = [r for r in self._outbox.values() if supersedes(r, message, now)]
            burst = min((r.burst_at or r.created_at for r in old), default=None)
            for r in old:  # settled, never published: no claim, no key held back
                self._outbox[r.id] = replace(r, sent_at=now, superseded_at=now, **_UNCLAIMED)
            due, began = due_times(message, now, burst)
            self._outbox_id += 1
            row = OutboxRow(
                self._outbox_id, message.kind, message.task, message.queue, message.payload,
                json.loads(message.options_json()), message.key, now, 0, None,
                None, None, None, None, due_at=due, burst_at=began,
            )  # fmt: skip
            self._outbox[row.id] = row
            return row

    def outbox_claim(self, relay: str, kind: str, limit: int, ttl: float) -> OutboxClaim:
        with self._lock:
            now = self.clock()
            self._claims += 1
            token, until = self._claims, now + ttl
            taken = claimable(list(self._outbox.values()), kind, now, limit)
            rows = tuple(
                replace(r, claim_token=token, claimed_by=relay, claimed_until=until) for r in taken
            )
            self._outbox.update((r.id, r) for r in rows)
            return OutboxClaim(token, rows, until, now)

    def _claimed(self, token: int, ids: Sequence[int]) -> list[OutboxRow]:
        found = (self._outbox.get(i) for i in ids)
        return [
            r
            for r in found
            if r is not None and r.claim_token == token and r.sent_at is None and not r.dead
        ]

    def outbox_done(self, token: int, ids: Sequence[int]) -> int:
        with self._lock:
            now, rows = self.clock(), self._claimed(token, ids)
            self._outbox.update((r.id, replace(r, sent_at=now, claimed_until=None)) for r in rows)
            return len(rows)

    def _give_back(
        self, token: int, ids: Sequence[int], error: str | None, strike: bool, dead: bool
    ) -> int:
        with self._lock:
            rows, now = self._claimed(token, ids), self.clock()
            self._outbox.update(
                (
                    r.id,
                    replace(
                        r,
                        attempts=r.attempts + 1,
                        strikes=r.strikes + int(strike),
                        last_error=error,
                        dead_at=now if dead else None,
                        **_UNCLAIMED,
                    ),
                )
                for r in rows
            )
            return len(rows)

    def outbox_release(
        self, token: int, ids: Sequence[int], error: str | None, strike: bool
    ) -> int:
        return self._give_back(token, ids, error, strike, False)

    def outbox_bury(self, token: int, ids: Sequence[int], error: str | None) -> int:
        return self._give_back(token, ids, error, True, True)

    def _rows(self, kind: str | None, state: str) -> list[OutboxRow]:
        return [r for r in self._outbox.values() if r.state == state and kind in (None, r.kind)]

    def outbox_list(self, kind: str | None, limit: int) -> list[OutboxRow]:
        with self._lock:
            return self._rows(kind, "pending")[:limit]

    def outbox_dead(self, kind: str | None, limit: int) -> list[OutboxRow]:
        with self._lock:
            return self._rows(kind, "dead")[:limit]

    def outbox_stats(self, kind: str | None) -> OutboxStats:
        with self._lock:
            now = self.clock()
            rows = self._rows(kind, "pending")
            oldest = min((r.created_at for r in rows), default=now)
            dead = len(self._rows(kind, "dead"))
            superseded = len(self._rows(kind, "superseded"))
            return OutboxStats(len(rows), max(0.0, now - oldest), now, dead, superseded)

    def _dead_ones(self, ids: Sequence[int], verb: str) -> None:
        found = {i: self._outbox[i].dead for i in ids if i in self._outbox}
        check_dead(ids, found, verb)

    def outbox_retry(self, ids: Sequence[int]) -> int:
        with self._lock:
            self._dead_ones(ids, "retry")
            for i in ids:
                row = self._outbox[i]
                self._outbox[i] = replace(row, attempts=0, strikes=0, dead_at=None)
            return len(ids)

    def outbox_drop(self, ids: Sequence[int]) -> int:
        with self._lock:
            self._dead_ones(ids, "drop")
            for i in ids:
                del self._outbox[i]
            return len(ids)

    def outbox_prune(self, older_than: float) -> int:
        with self._lock:
            horizon = self.clock() - older_than
            gone = [
                i for i, r in self._outbox.items() if r.sent_at is not None and r.sent_at < horizon
            ]
            for i in gone:
                del self._outbox[i]
            return len(gone)

    def guard_table(self, target: Target) -> None:
        raise no_guard("memory", "a memory store's tables are written by fencing alone")

    def unguard_table(self, target: Target) -> None:
        raise no_guard("memory", "a memory store's tables are written by fencing alone")


def _memory(url: StoreURL, options: dict[str, Any]) -> MemoryBackend:
    unknown = sorted(set(url.options) | (set(options) - {"clock"}))
    if unknown:
        raise ConfigurationError(f"unknown memory:// option(s) {unknown}")
    clock = options.get("clock", time.monotonic)
    if not callable(clock):
        raise ConfigurationError("memory:// clock must be a callable returning seconds")
    return MemoryBackend(clock)


def open_backend(url: StoreURL, **options: Any) -> MemoryBackend:
    """``memory://``: a fresh, empty store private to this call."""
    return _memory(url, options)


async def open_async_backend(url: StoreURL, **options: Any) -> ThreadedAsyncBackend:
    """The same store for asyncio: its calls run inline on the event loop (no I/O)."""
    return ThreadedAsyncBackend(_memory(url, options), inline=True)
