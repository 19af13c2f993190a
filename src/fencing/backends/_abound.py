"""A store's flows run on the caller's connection, inside the caller's transaction
(``store.using(conn_or_session)``).

A bound backend is a view of its store's backend (``parent``): the same flows, driven
on the connection the caller lent (``_borrow.Borrowed``) instead of the store's own.
What it writes there is the caller's to commit or roll back; fencing never commits,
rolls back or closes that connection. Each backend supplies

* ``_step(conn, step)``: one step of a flow on the caller's connection, inside the
  caller's transaction, so that a failed statement never aborts that transaction (a
  savepoint around it where the server would) and a refused commit (Stale, Duplicate,
  Fenced) leaves it usable; driver errors translated like the store's own driver;
* ``identity_flow()``: a flow answering which database (and schema) a connection
  reaches, run on the caller's connection and on the store's own; a connection to
  another one is refused, once per connection, with ``ConfigurationError``.

A refusal is never judged on a snapshot older than the latest commit: when the
caller's connection answers one that such a snapshot could explain
(``_request.snapshot_may_explain``: a record absent, older than the intent's version, a
lease row refusing), the backend's ``latest`` flow checks it against the latest
committed rows, and either lets it stand (they agree, or the caller's own uncommitted
writes are what refuses it), answers what they say (a read of the latest rows in the
caller's transaction: MySQL's locking reads), or raises ``SerializationFailure`` (a
``TransientStoreError``: run the transaction again). A fresh intent is never
``Stale`` nor ``Missing`` because the caller's transaction cannot see the row yet.

What is about the world outside the caller's data is written at once on the store's
own connections, never inside the caller's transaction: leases (a token handed out and
then rolled back would be handed out again) and recorded effects (an effect is on
record before the call it names is made, whatever becomes of the transaction), and so
is the settlement of an intent's effects when its commit through the view is refused
(``Stale``, ``Fenced``, ``Missing``, ``Contended``): the caller's usual reaction to a
refusal is to roll back, and the effects must stay listed for reconciliation; the
effects are read there too (a ``Reconcile`` handler's, ``effects()``). Schema changes
and pruning run on the store itself. ``_abound.py`` is the source;
``_bound.py`` (sync) is generated from it by ``scripts/unasync.py``.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from .._borrow import Borrowed
from .._effects import Effect, EffectQuery, NewEffect
from .._errors import ConfigurationError, SerializationFailure
from .._flow import Flow, adrive
from .._request import (
    CommitRequest,
    CommitResult,
    LeaseAnswer,
    Target,
    snapshot_may_explain,
)
from .._values import Record
from ._abase import AsyncFlowBackend

__all__ = ["AsyncBoundBackend", "snapshot_too_old"]

R = TypeVar("R")


def _checked_by(parent: Any) -> weakref.WeakSet[Any]:
    """The connections whose database a store's views have checked (weakly held)."""
    known: weakref.WeakSet[Any] | None = getattr(parent, "_fencing_checked", None)
    if known is None:
        known = parent._fencing_checked = weakref.WeakSet()
    return known


def snapshot_too_old(scheme: str, request: CommitRequest) -> SerializationFailure:
    """The error for a refusal judged on a snapshot older than the latest commit."""
    intent = request.intent
    return SerializationFailure(
        f"{scheme}: your transaction's snapshot is older than the latest commit to"
        f" {intent.kind} {intent.collection!r} key {intent.key!r} (or its lease), so it"
        " cannot judge this intent: roll your transaction back and run it again"
    )


#: A bound backend's ``latest``: ``(request, result, probing) -> Flow[CommitResult]``.
Latest = Callable[[CommitRequest, CommitResult, bool], Flow[CommitResult]]


def _judged(
    latest: Latest, request: CommitRequest, flow: Flow[CommitResult], probing: bool
) -> Flow[CommitResult]:
    """``flow``'s answer, checked against the latest committed rows (``latest``) when a
    snapshot could explain it."""
    result = yield from flow
    if snapshot_may_explain(request, result):
        result = yield from latest(request, result, probing)
    return result


def _all_judged(
    latest: Latest, requests: Sequence[CommitRequest], flow: Flow[list[CommitResult]]
) -> Flow[list[CommitResult]]:
    results = yield from flow
    judged = []
    for request, result in zip(requests, results, strict=True):
        if snapshot_may_explain(request, result):
            result = yield from latest(request, result, False)
        judged.append(result)
    return judged


class AsyncBoundBackend(AsyncFlowBackend):
    """A backend's flows on the caller's connection (see the module docstring)."""

    def __init__(self, parent: Any, borrowed: Borrowed) -> None:
        self.parent = parent
        self.borrowed = borrowed
        self.scheme = parent.scheme
        self.flows = parent.flows
        # connections whose database was checked, by id (held, so an id is not reused)
        self._checked: dict[int, object] = {}

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.scheme} on {self.borrowed!r}>"

    async def _step(self, conn: Any, step: Any) -> Any:
        """Carry out one step of a flow on the caller's connection ``conn``."""
        raise NotImplementedError

    def identity_flow(self) -> Flow[object]:
        """A flow answering which database a connection reaches (comparable values)."""
        raise NotImplementedError

    def latest(
        self, request: CommitRequest, result: CommitResult, probing: bool
    ) -> Flow[CommitResult]:
        """A flow checking ``result``, a refusal the caller's connection answered for
        ``request`` that a snapshot older than the latest commit could explain, against
        the latest committed rows: the result that stands, or ``SerializationFailure``.
        ``probing``: ``result`` is a probe's (``apply``'s first read), not a commit's.
        This one trusts it: the backend's reads on the caller's connection see the
        latest committed rows."""
        return result
        yield  # (a generator: no step)

    def _scoped(self, target: Target, flow: Flow[R]) -> Flow[R]:
        """``flow`` on the caller's connection for ``target`` (a backend may check
        something first)."""
        return flow

    # -- the caller's transaction: reads and commits --------------------------------------
    async def columns(
        self, target: Target, declare: frozenset[str] | None = None
    ) -> frozenset[str]:
        return await self._drive(self._scoped(target, self.flows.columns(target, declare)))

    async def read(self, target: Target, key: str | int) -> Record | None:
        return await self._drive(self._scoped(target, self.flows.read(target, key)))

    async def probe(self, request: CommitRequest) -> CommitResult:
        flow = _judged(self.latest, request, self.flows.probe(request), True)
        return await self._drive(self._scoped(request.target, flow))

    async def commit(self, request: CommitRequest) -> CommitResult:
        flow = _judged(self.latest, request, self.flows.commit(request), False)
        return await self._drive(self._scoped(request.target, flow))

    async def commit_many(self, requests: Sequence[CommitRequest]) -> list[CommitResult]:
        flow = _all_judged(self.latest, requests, self.flows.commit_many(requests))
        return await self._drive(self._scoped(requests[0].target, flow) if requests else flow)

    async def _drive(self, flow: Flow[R]) -> R:
        # One connection for the whole flow: asked for once (a session is flushed once).
        conn = await self.borrowed.aconnection()
        if not self._seen(conn):
            await self._check(conn)
        return await adrive(flow, self._runner(conn))

    def _runner(self, conn: Any) -> Any:
        """A flow's driver that runs each step on ``conn``."""

        async def run(step: Any) -> Any:
            return await self._step(conn, step)

        return run

    def _seen(self, conn: Any) -> bool:
        """Whether ``conn``'s database was checked already (by any view of the store,
        for a connection that can be weakly referenced; by this view otherwise)."""
        if id(conn) in self._checked:
            return True
        try:
            return conn in _checked_by(self.parent)
        except TypeError:  # cannot be weakly referenced (sqlite3)
            return False

    async def _check(self, conn: Any) -> None:
        theirs = await adrive(self.identity_flow(), self._runner(conn))
        ours = getattr(self.parent, "_fencing_identity", None)
        if ours is None:
            ours = await self.parent._drive(self.identity_flow())
            self.parent._fencing_identity = ours
        if theirs != ours:
            raise ConfigurationError(
                f"{self.scheme}: store.using() was given a connection to {theirs}, but"
                f" this store is {ours}: fencing joins a transaction on its own database only"
            )
        try:
            _checked_by(self.parent).add(conn)
        except TypeError:
            self._checked[id(conn)] = conn

    async def close(self) -> None:
        """Nothing: the connection is the caller's to close."""

    # -- on the store's own connections: leases and effects ---------------------------
    async def acquire(self, name: str, owner: str, ttl: float) -> LeaseAnswer:
        answer: LeaseAnswer = await self.parent.acquire(name, owner, ttl)
        return answer

    async def renew(self, name: str, token: int, ttl: float) -> LeaseAnswer:
        answer: LeaseAnswer = await self.parent.renew(name, token, ttl)
        return answer

    async def release(self, name: str, token: int) -> LeaseAnswer:
        answer: LeaseAnswer = await self.parent.release(name, token)
        return answer

    async def lease_state(self, name: str) -> LeaseAnswer:
        answer: LeaseAnswer = await self.parent.lease_state(name)
        return answer

    async def record_effect(self, row: NewEffect) -> Effect:
        effect: Effect = await self.parent.record_effect(row)
        return effect

    async def mark_effect(
        self, idempotency_key: str, status: str | None, detail_json: str | None, reconcile: bool
    ) -> Effect | None:
        found: Effect | None = await self.parent.mark_effect(
            idempotency_key, status, detail_json, reconcile
        )
        return found

    async def settle_effects(self, scope: str, intent_id: str, outcome: str) -> list[Effect]:
        effects: list[Effect] = await self.parent.settle_effects(scope, intent_id, outcome)
        return effects

    async def list_effects(self, query: EffectQuery) -> list[Effect]:
        effects: list[Effect] = await self.parent.list_effects(query)
        return effects

    # -- on the store itself only ------------------------------------------------------
    def _store_only(self, what: str) -> ConfigurationError:
        return ConfigurationError(
            f"{what} runs on the store itself (its own connections), not on a view bound"
            " to your transaction by store.using()"
        )

    async def migrate(self) -> None:
        raise self._store_only("migrate()")

    async def guard_table(self, target: Target) -> None:
        raise self._store_only("guard_table()")

    async def unguard_table(self, target: Target) -> None:
        raise self._store_only("unguard_table()")

    async def prune(self, older_than: float) -> int:
        raise self._store_only("prune()")

    async def prune_effects(self, older_than: float) -> int:
        raise self._store_only("prune()")
