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
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol, TypeVar

from .._effects import Effect, EffectQuery, NewEffect
from .._errors import SchemaError
from .._rules import LeaseRef, LeaseRow, Status
from .._validate import compact_json
from .._values import Intent, Kind, Record

__all__ = [
    "AsyncBackend",
    "Backend",
    "CommitRequest",
    "CommitResult",
    "LeaseAnswer",
    "Target",
    "ThreadedAsyncBackend",
    "table_version",
]

T = TypeVar("T")


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

    @property
    def scope(self) -> str:
        """The namespace of applied intents and fences: ``c:name`` or ``t:name``."""
        return ("c:" if self.kind == "collection" else "t:") + self.name


@dataclass(frozen=True, slots=True)
class CommitRequest:
    """One conditional write: apply ``state`` if ``intent`` still holds (and ``lease``).

    ``state`` was validated before any I/O. ``json_text`` is its canonical JSON when
    the front made it (a collection's state); a table's state is flat column values
    that most backends bind one by one, so its JSON is made only if a backend asks
    for ``state_json``.
    """

    target: Target
    intent: Intent
    state: Mapping[str, Any]
    json_text: str | None
    lease: LeaseRef | None = None

    @property
    def state_json(self) -> str:
        """The canonical JSON of ``state`` (made once, on first use, for a table)."""
        text = self.json_text
        if text is None:
            text = compact_json(dict(self.state))
            object.__setattr__(self, "json_text", text)
        return text

    @property
    def claim_id(self) -> str:
        """The id under which the store records the intent as applied: its root id.

        A ``Recompute`` commits a derived intent (``<root>~<n>``) in place of the
        original; every derivation of one root shares one claim, so the work of one
        intent is applied at most once, however it is redelivered or recomputed.
        """
        return self.intent.root_id


class CommitResult(NamedTuple):
    """What the store did: the status and the record (new if applied, else current).

    A named tuple rather than a frozen dataclass: one is made per commit, and a tuple
    is made five times faster.
    """

    status: Status
    record: Record | None


@dataclass(frozen=True, slots=True)
class LeaseAnswer:
    """A lease operation's answer: the row after it, and whether it was granted.

    ``now`` is the store's clock at that moment, so callers can tell how long is left
    without trusting their own clock.
    """

    granted: bool
    row: LeaseRow | None
    now: float


class Backend(Protocol):
    """The synchronous store contract."""

    scheme: str

    def migrate(self) -> None: ...
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


class AsyncBackend(Protocol):
    """The asynchronous store contract: the same primitives, awaitable."""

    scheme: str

    async def migrate(self) -> None: ...
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
