"""The one small contract every backend implements, sync and async.

A backend only stores and answers; it never decides policy. Every commit is one
atomic conditional write that either applies or reports, from the same atomic
step, the current record and why it did not apply. No backend offers an
operation it cannot do atomically.

Effects (``fencing._effects``) are rows keyed by their idempotency key:

* ``record_effect`` inserts the row unless its key exists, atomically, and returns
  the stored row either way (the first recording wins; a retry gets it back);
* ``mark_effect`` sets ``status`` and ``detail`` when given, and ``reconciled_at``
  to the store's clock if ``reconcile`` and it is still NULL (idempotent); it
  returns the row after, or None if there is no such effect;
* ``settle_effects`` sets ``outcome`` on the intent's effects whose outcome is still
  NULL and returns all of the intent's effects;
* ``list_effects`` answers an ``EffectQuery``, oldest first (``recorded_at``, then key);
* ``prune_effects`` deletes the effects ``PRUNABLE`` at ``older_than`` seconds before the
  store's clock (never one that needs reconciling) and says how many.

``prune`` (applied intent ids) and ``outbox_prune`` (sent rows) delete in batches of at
most ``PRUNE_BATCH`` rows, each its own short transaction (``prune_batches``), so that
commits go on between them instead of waiting for one long delete.

Two reads for looking (``fencing inspect`` and ``fencing stats``): ``applied`` answers
the intent ids recorded as applied to one key, newest first, at most ``limit``; ``stats``
counts, per collection and table, records, applied intents, effects (``EFFECT_COUNTS``)
and unexpired leases named ``<name>/<key>``, and all leases held (``StoreStats``).

A guard trigger (``docs/guard.md``) is installed on a table the user owns by
``guard_table(target)`` (idempotent: installing again replaces it with the same) and
removed by ``unguard_table(target)`` (removing an absent one is fine). Named
``fencing_guard_<table>``, it bumps ``target.version_column`` by one on any UPDATE that
leaves it unchanged (``target.guard_mode == "strict"``: refuses it) and refuses, as
``GuardRefused``, one that sets it lower. A store
without foreign writers (memory, Redis) refuses both with ``ConfigurationError``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar, runtime_checkable

from .._effects import Effect, EffectQuery, NewEffect
from .._errors import ConfigurationError
from .._flow import Flow
from .._outbox import OutboxClaim, OutboxMessage, OutboxRow, OutboxStats
from .._request import (
    AppliedIntent,
    CommitRequest,
    CommitResult,
    LeaseAnswer,
    StoreStats,
    Target,
)
from .._values import Record

__all__ = [
    "PRUNE_BATCH",
    "AsyncBackend",
    "Backend",
    "Flows",
    "OutboxFlows",
    "ThreadedAsyncBackend",
    "no_guard",
    "no_outbox",
    "prune_batches",
]

T = TypeVar("T")

#: The most rows one batch of a prune deletes (one transaction): short enough that a
#: commit waiting for it waits milliseconds. Read at each prune (tests set it smaller).
PRUNE_BATCH: int = 5000


class Backend(Protocol):
    """The synchronous store contract."""

    scheme: str

    def migrate(self) -> None: ...
    # Read only: ``StoreNotMigrated`` unless fencing's schema is there at this version.
    def check_schema(self) -> None: ...
    def close(self) -> None: ...
    # A table's columns. A store without a schema (Redis) first adds ``declare`` (with
    # the key and version columns) to the table's declaration; one with a schema reads
    # it and ignores ``declare`` (the front checks the declared columns against it).
    def columns(self, target: Target, declare: frozenset[str] | None = None) -> frozenset[str]: ...
    def read(self, target: Target, key: str | int) -> Record | None: ...
    def probe(self, request: CommitRequest) -> CommitResult: ...
    def create(self, target: Target, key: str | int, state_json: str) -> Record: ...
    def delete(self, target: Target, key: str | int) -> bool: ...
    def commit(self, request: CommitRequest) -> CommitResult: ...
    def commit_many(self, requests: Sequence[CommitRequest]) -> list[CommitResult]: ...
    def acquire(self, name: str, owner: str, ttl: float) -> LeaseAnswer: ...
    def renew(self, name: str, token: int, ttl: float) -> LeaseAnswer: ...
    def release(self, name: str, token: int) -> LeaseAnswer: ...
    def lease_state(self, name: str) -> LeaseAnswer: ...
    def prune(self, older_than: float) -> int: ...
    # effects (see ``fencing._effects``): rows keyed by idempotency key
    def record_effect(self, row: NewEffect) -> Effect: ...
    def mark_effect(
        self, idempotency_key: str, status: str | None, detail_json: str | None, reconcile: bool
    ) -> Effect | None: ...
    def settle_effects(self, scope: str, intent_id: str, outcome: str) -> list[Effect]: ...
    def list_effects(self, query: EffectQuery) -> list[Effect]: ...
    def prune_effects(self, older_than: float) -> int: ...
    # reads for looking (see above)
    def applied(self, target: Target, key: str | int, limit: int) -> list[AppliedIntent]: ...
    def stats(self) -> StoreStats: ...
    # the guard trigger on a table the user owns (see above)
    def guard_table(self, target: Target) -> None: ...
    def unguard_table(self, target: Target) -> None: ...
    # the transactional outbox (see ``fencing._outbox``; OutboxFlows below)
    def outbox_add(self, message: OutboxMessage) -> OutboxRow: ...
    def outbox_claim(self, relay: str, kind: str, limit: int, ttl: float) -> OutboxClaim: ...
    def outbox_done(self, token: int, ids: Sequence[int]) -> int: ...
    def outbox_release(
        self, token: int, ids: Sequence[int], error: str | None, strike: bool
    ) -> int: ...
    def outbox_bury(self, token: int, ids: Sequence[int], error: str | None) -> int: ...
    def outbox_dead(self, kind: str | None, limit: int) -> list[OutboxRow]: ...
    def outbox_retry(self, ids: Sequence[int]) -> int: ...
    def outbox_drop(self, ids: Sequence[int]) -> int: ...
    def outbox_list(self, kind: str | None, limit: int) -> list[OutboxRow]: ...
    def outbox_stats(self, kind: str | None) -> OutboxStats: ...
    def outbox_prune(self, older_than: float) -> int: ...


class AsyncBackend(Protocol):
    """The asynchronous store contract: the same primitives, awaitable."""

    scheme: str

    async def migrate(self) -> None: ...
    async def check_schema(self) -> None: ...
    async def close(self) -> None: ...
    async def columns(
        self, target: Target, declare: frozenset[str] | None = None
    ) -> frozenset[str]: ...
    async def read(self, target: Target, key: str | int) -> Record | None: ...
    async def probe(self, request: CommitRequest) -> CommitResult: ...
    async def create(self, target: Target, key: str | int, state_json: str) -> Record: ...
    async def delete(self, target: Target, key: str | int) -> bool: ...
    async def commit(self, request: CommitRequest) -> CommitResult: ...
    async def commit_many(self, requests: Sequence[CommitRequest]) -> list[CommitResult]: ...
    async def acquire(self, name: str, owner: str, ttl: float) -> LeaseAnswer: ...
    async def renew(self, name: str, token: int, ttl: float) -> LeaseAnswer: ...
    async def release(self, name: str, token: int) -> LeaseAnswer: ...
    async def lease_state(self, name: str) -> LeaseAnswer: ...
    async def prune(self, older_than: float) -> int: ...
    async def record_effect(self, row: NewEffect) -> Effect: ...
    async def mark_effect(
        self, idempotency_key: str, status: str | None, detail_json: str | None, reconcile: bool
    ) -> Effect | None: ...
    async def settle_effects(self, scope: str, intent_id: str, outcome: str) -> list[Effect]: ...
    async def list_effects(self, query: EffectQuery) -> list[Effect]: ...
    async def prune_effects(self, older_than: float) -> int: ...
    async def applied(self, target: Target, key: str | int, limit: int) -> list[AppliedIntent]: ...
    async def stats(self) -> StoreStats: ...
    async def guard_table(self, target: Target) -> None: ...
    async def unguard_table(self, target: Target) -> None: ...
    async def outbox_add(self, message: OutboxMessage) -> OutboxRow: ...
    async def outbox_claim(self, relay: str, kind: str, limit: int, ttl: float) -> OutboxClaim: ...
    async def outbox_done(self, token: int, ids: Sequence[int]) -> int: ...
    async def outbox_release(
        self, token: int, ids: Sequence[int], error: str | None, strike: bool
    ) -> int: ...
    async def outbox_bury(self, token: int, ids: Sequence[int], error: str | None) -> int: ...
    async def outbox_dead(self, kind: str | None, limit: int) -> list[OutboxRow]: ...
    async def outbox_retry(self, ids: Sequence[int]) -> int: ...
    async def outbox_drop(self, ids: Sequence[int]) -> int: ...
    async def outbox_list(self, kind: str | None, limit: int) -> list[OutboxRow]: ...
    async def outbox_stats(self, kind: str | None) -> OutboxStats: ...
    async def outbox_prune(self, older_than: float) -> int: ...


class Flows(Protocol):
    """A backend's flows: one per operation of the contract (``_contract.Backend``)."""

    def migrate(self) -> Flow[None]: ...
    def check_schema(self) -> Flow[None]: ...
    def columns(self, target: Target, declare: frozenset[str] | None) -> Flow[frozenset[str]]: ...
    def read(self, target: Target, key: str | int) -> Flow[Record | None]: ...
    def probe(self, request: CommitRequest) -> Flow[CommitResult]: ...
    def create(self, target: Target, key: str | int, state_json: str) -> Flow[Record]: ...
    def delete(self, target: Target, key: str | int) -> Flow[bool]: ...
    def commit(self, request: CommitRequest) -> Flow[CommitResult]: ...
    def commit_many(self, requests: Sequence[CommitRequest]) -> Flow[list[CommitResult]]: ...
    def acquire(self, name: str, owner: str, ttl: float) -> Flow[LeaseAnswer]: ...
    def renew(self, name: str, token: int, ttl: float) -> Flow[LeaseAnswer]: ...
    def release(self, name: str, token: int) -> Flow[LeaseAnswer]: ...
    def lease_state(self, name: str) -> Flow[LeaseAnswer]: ...
    def prune(self, older_than: float) -> Flow[int]: ...
    def record_effect(self, row: NewEffect) -> Flow[Effect]: ...
    def mark_effect(
        self, idempotency_key: str, status: str | None, detail_json: str | None, reconcile: bool
    ) -> Flow[Effect | None]: ...
    def settle_effects(self, scope: str, intent_id: str, outcome: str) -> Flow[list[Effect]]: ...
    def list_effects(self, query: EffectQuery) -> Flow[list[Effect]]: ...
    def prune_effects(self, older_than: float) -> Flow[int]: ...
    def applied(self, target: Target, key: str | int, limit: int) -> Flow[list[AppliedIntent]]: ...
    def stats(self) -> Flow[StoreStats]: ...
    def guard_table(self, target: Target) -> Flow[None]: ...
    def unguard_table(self, target: Target) -> Flow[None]: ...


@runtime_checkable
class OutboxFlows(Protocol):
    """The outbox's flows, on a store that has an outbox table (the SQL stores; memory,
    for tests). The outbox is a table of the store's own schema:

    * ``outbox_add`` inserts a row (``created_at`` the store's clock) and returns it;
    * ``outbox_claim`` takes, in id order, up to ``limit`` unsent rows of queue ``kind``
      whose key has no unsent row under another live claim (so each key's rows go out
      in order), under a new token from a counter that only grows, until the store's
      clock plus ``ttl``; rows of a claim that expired are claimable again;
    * ``outbox_done`` marks rows sent, ``outbox_release`` gives them back (``attempts``
      plus one, ``strikes`` plus one if ``strike``, ``last_error``, the claim ended),
      ``outbox_bury`` gives them up as dead (the same, and ``dead_at`` the store's
      clock): all three only rows still under ``token``, unsent and not dead, and all
      three say how many;
    * a dead row is not claimed and holds no key back (its key's later rows go on);
    * ``outbox_list`` answers pending (unsent, not dead) rows oldest first,
      ``outbox_dead`` dead rows oldest first; ``outbox_stats`` the pending rows' count
      and the oldest one's age, and the dead rows' count; ``outbox_prune`` deletes rows
      sent more than ``older_than`` seconds before the store's clock (never an unsent
      or dead one);
    * ``outbox_retry`` puts dead rows back to pending (``attempts`` and ``strikes`` 0,
      ``dead_at`` NULL), ``outbox_drop`` deletes them: every id (sorted, distinct) or
      none, ``UnknownOutboxRow`` / ``OutboxRowNotDead`` (``_outbox.check_dead``) when
      one is missing or not dead.
    """

    def outbox_add(self, message: OutboxMessage) -> Flow[OutboxRow]: ...
    def outbox_claim(self, relay: str, kind: str, limit: int, ttl: float) -> Flow[OutboxClaim]: ...
    def outbox_done(self, token: int, ids: Sequence[int]) -> Flow[int]: ...
    def outbox_release(
        self, token: int, ids: Sequence[int], error: str | None, strike: bool
    ) -> Flow[int]: ...
    def outbox_bury(self, token: int, ids: Sequence[int], error: str | None) -> Flow[int]: ...
    def outbox_dead(self, kind: str | None, limit: int) -> Flow[list[OutboxRow]]: ...
    def outbox_retry(self, ids: Sequence[int]) -> Flow[int]: ...
    def outbox_drop(self, ids: Sequence[int]) -> Flow[int]: ...
    def outbox_list(self, kind: str | None, limit: int) -> Flow[list[OutboxRow]]: ...
    def outbox_stats(self, kind: str | None) -> Flow[OutboxStats]: ...
    def outbox_prune(self, older_than: float) -> Flow[int]: ...


def prune_batches(batch: Callable[[int], Flow[int]]) -> Flow[int]:
    """A prune in batches: the flow ``batch(limit)`` deletes at most ``limit`` rows in one
    transaction of its own and says how many; it runs again until one deletes fewer than
    ``limit`` (``PRUNE_BATCH``). The rows deleted in all."""
    limit = PRUNE_BATCH
    total = 0
    while True:
        gone = yield from batch(limit)
        total += gone
        if gone < limit:
            return total


def no_outbox(scheme: str) -> ConfigurationError:
    """The refusal of the outbox's operations by a store without an outbox table."""
    return ConfigurationError(
        f"{scheme}: the outbox is a table of the SQL stores (PostgreSQL, MySQL/MariaDB,"
        " SQLite): open one of those to send tasks through an outbox"
    )


def no_guard(scheme: str, why: str) -> ConfigurationError:
    """The refusal of ``guard_table`` / ``unguard_table`` by a store that has no tables
    written by anyone but fencing, so nothing for a trigger to guard against."""
    return ConfigurationError(
        f"{scheme}: a guard trigger is for SQL tables (PostgreSQL, MySQL/MariaDB, SQLite); {why}"
    )


class ThreadedAsyncBackend:
    """An async backend over a sync one whose calls block (SQLite), or that never block.

    With ``inline=True`` (the memory backend, which does no I/O) calls run directly
    on the event loop; otherwise each runs in a worker thread.
    """

    def __init__(self, sync: Backend, *, inline: bool = False) -> None:
        self.sync = sync
        self.scheme = sync.scheme
        self._inline = inline

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        if self._inline:
            return fn(*args)
        return await asyncio.to_thread(fn, *args)

    async def migrate(self) -> None:
        await self._call(self.sync.migrate)

    async def check_schema(self) -> None:
        await self._call(self.sync.check_schema)

    async def close(self) -> None:
        await self._call(self.sync.close)

    async def columns(
        self, target: Target, declare: frozenset[str] | None = None
    ) -> frozenset[str]:
        return await self._call(self.sync.columns, target, declare)

    async def read(self, target: Target, key: str | int) -> Record | None:
        return await self._call(self.sync.read, target, key)

    async def probe(self, request: CommitRequest) -> CommitResult:
        return await self._call(self.sync.probe, request)

    async def create(self, target: Target, key: str | int, state_json: str) -> Record:
        return await self._call(self.sync.create, target, key, state_json)

    async def delete(self, target: Target, key: str | int) -> bool:
        return await self._call(self.sync.delete, target, key)

    async def commit(self, request: CommitRequest) -> CommitResult:
        return await self._call(self.sync.commit, request)

    async def commit_many(self, requests: Sequence[CommitRequest]) -> list[CommitResult]:
        return await self._call(self.sync.commit_many, requests)

    async def acquire(self, name: str, owner: str, ttl: float) -> LeaseAnswer:
        return await self._call(self.sync.acquire, name, owner, ttl)

    async def renew(self, name: str, token: int, ttl: float) -> LeaseAnswer:
        return await self._call(self.sync.renew, name, token, ttl)

    async def release(self, name: str, token: int) -> LeaseAnswer:
        return await self._call(self.sync.release, name, token)

    async def lease_state(self, name: str) -> LeaseAnswer:
        return await self._call(self.sync.lease_state, name)

    async def prune(self, older_than: float) -> int:
        return await self._call(self.sync.prune, older_than)

    async def record_effect(self, row: NewEffect) -> Effect:
        return await self._call(self.sync.record_effect, row)

    async def mark_effect(
        self, idempotency_key: str, status: str | None, detail_json: str | None, reconcile: bool
    ) -> Effect | None:
        return await self._call(
            self.sync.mark_effect, idempotency_key, status, detail_json, reconcile
        )

    async def settle_effects(self, scope: str, intent_id: str, outcome: str) -> list[Effect]:
        return await self._call(self.sync.settle_effects, scope, intent_id, outcome)

    async def list_effects(self, query: EffectQuery) -> list[Effect]:
        return await self._call(self.sync.list_effects, query)

    async def prune_effects(self, older_than: float) -> int:
        return await self._call(self.sync.prune_effects, older_than)

    async def applied(self, target: Target, key: str | int, limit: int) -> list[AppliedIntent]:
        return await self._call(self.sync.applied, target, key, limit)

    async def stats(self) -> StoreStats:
        return await self._call(self.sync.stats)

    async def guard_table(self, target: Target) -> None:
        await self._call(self.sync.guard_table, target)

    async def unguard_table(self, target: Target) -> None:
        await self._call(self.sync.unguard_table, target)

    async def outbox_add(self, message: OutboxMessage) -> OutboxRow:
        return await self._call(self.sync.outbox_add, message)

    async def outbox_claim(self, relay: str, kind: str, limit: int, ttl: float) -> OutboxClaim:
        return await self._call(self.sync.outbox_claim, relay, kind, limit, ttl)

    async def outbox_done(self, token: int, ids: Sequence[int]) -> int:
        return await self._call(self.sync.outbox_done, token, ids)

    async def outbox_release(
        self, token: int, ids: Sequence[int], error: str | None, strike: bool
    ) -> int:
        return await self._call(self.sync.outbox_release, token, ids, error, strike)

    async def outbox_bury(self, token: int, ids: Sequence[int], error: str | None) -> int:
        return await self._call(self.sync.outbox_bury, token, ids, error)

    async def outbox_dead(self, kind: str | None, limit: int) -> list[OutboxRow]:
        return await self._call(self.sync.outbox_dead, kind, limit)

    async def outbox_retry(self, ids: Sequence[int]) -> int:
        return await self._call(self.sync.outbox_retry, ids)

    async def outbox_drop(self, ids: Sequence[int]) -> int:
        return await self._call(self.sync.outbox_drop, ids)

    async def outbox_list(self, kind: str | None, limit: int) -> list[OutboxRow]:
        return await self._call(self.sync.outbox_list, kind, limit)

    async def outbox_stats(self, kind: str | None) -> OutboxStats:
        return await self._call(self.sync.outbox_stats, kind)

    async def outbox_prune(self, older_than: float) -> int:
        return await self._call(self.sync.outbox_prune, older_than)
