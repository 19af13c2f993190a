"""The one shape of a flow-driven backend: every operation of the contract is "run
this flow".

A backend is its flows plus one driver. It supplies

* ``flows``: an object with one flow per operation (``_contract.Flows``), built from the
  backend's settings. A flow is an I/O-free generator (``fencing._flow``) that yields
  the backend's own steps (a statement, a pipeline, a script call, a ``Sleep``) and
  receives their results; it never sees a connection, so the same flow runs on the
  store's pool or on a connection the caller gives;
* ``_run(step)``: how one step meets the driver (check a connection out, execute,
  return the result), raising only ``FencingError`` (driver errors translated by the
  backend's ``translate``). A retryable error is thrown back into the flow at the step
  that failed, and the flow decides: run the step again, re-read, or let it propagate.
  That is the only way any backend retries;
* ``close()``.

It may override an operation where a measured hot path needs it (Redis sends a commit's
one script call without a flow). ``_abase.py`` is the source; ``_base.py`` (the sync
``FlowBackend``) is generated from it by ``scripts/unasync.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

from .._effects import Effect, EffectQuery, NewEffect
from .._flow import Flow, adrive
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
from ._contract import Flows, OutboxFlows, no_outbox

__all__ = ["AsyncFlowBackend"]

R = TypeVar("R")


class AsyncFlowBackend:
    """The contract (``_contract.AsyncBackend``) as "run this flow", on an event loop."""

    scheme: str
    flows: Flows

    async def _run(self, step: Any) -> Any:
        """Carry out one step of a flow (the backend's driver)."""
        raise NotImplementedError

    async def _drive(self, flow: Flow[R]) -> R:
        return await adrive(flow, self._run)

    async def close(self) -> None:
        raise NotImplementedError

    async def migrate(self) -> None:
        await self._drive(self.flows.migrate())

    async def check_schema(self) -> None:
        await self._drive(self.flows.check_schema())

    async def columns(
        self, target: Target, declare: frozenset[str] | None = None
    ) -> frozenset[str]:
        return await self._drive(self.flows.columns(target, declare))

    async def read(self, target: Target, key: str | int) -> Record | None:
        return await self._drive(self.flows.read(target, key))

    async def probe(self, request: CommitRequest) -> CommitResult:
        return await self._drive(self.flows.probe(request))

    async def create(self, target: Target, key: str | int, state_json: str) -> Record:
        return await self._drive(self.flows.create(target, key, state_json))

    async def delete(self, target: Target, key: str | int) -> bool:
        return await self._drive(self.flows.delete(target, key))

    async def commit(self, request: CommitRequest) -> CommitResult:
        return await self._drive(self.flows.commit(request))

    async def commit_many(self, requests: Sequence[CommitRequest]) -> list[CommitResult]:
        return await self._drive(self.flows.commit_many(requests))

    async def acquire(self, name: str, owner: str, ttl: float) -> LeaseAnswer:
        return await self._drive(self.flows.acquire(name, owner, ttl))

    async def renew(self, name: str, token: int, ttl: float) -> LeaseAnswer:
        return await self._drive(self.flows.renew(name, token, ttl))

    async def release(self, name: str, token: int) -> LeaseAnswer:
        return await self._drive(self.flows.release(name, token))

    async def lease_state(self, name: str) -> LeaseAnswer:
        return await self._drive(self.flows.lease_state(name))

    async def prune(self, older_than: float) -> int:
        return await self._drive(self.flows.prune(older_than))

    async def record_effect(self, row: NewEffect) -> Effect:
        return await self._drive(self.flows.record_effect(row))

    async def mark_effect(
        self, idempotency_key: str, status: str | None, detail_json: str | None, reconcile: bool
    ) -> Effect | None:
        flow = self.flows.mark_effect(idempotency_key, status, detail_json, reconcile)
        return await self._drive(flow)

    async def settle_effects(self, scope: str, intent_id: str, outcome: str) -> list[Effect]:
        return await self._drive(self.flows.settle_effects(scope, intent_id, outcome))

    async def list_effects(self, query: EffectQuery) -> list[Effect]:
        return await self._drive(self.flows.list_effects(query))

    async def prune_effects(self, older_than: float) -> int:
        return await self._drive(self.flows.prune_effects(older_than))

    async def applied(self, target: Target, key: str | int, limit: int) -> list[AppliedIntent]:
        return await self._drive(self.flows.applied(target, key, limit))

    async def stats(self) -> StoreStats:
        return await self._drive(self.flows.stats())

    async def guard_table(self, target: Target) -> None:
        await self._drive(self.flows.guard_table(target))

    async def unguard_table(self, target: Target) -> None:
        await self._drive(self.flows.unguard_table(target))

    # -- the outbox (a store whose flows have none refuses, ``no_outbox``) ---------------
    def _outbox(self) -> OutboxFlows:
        flows = self.flows
        if not isinstance(flows, OutboxFlows):
            raise no_outbox(self.scheme)
        return flows

    async def outbox_add(self, message: OutboxMessage) -> OutboxRow:
        return await self._drive(self._outbox().outbox_add(message))

    async def outbox_claim(self, relay: str, kind: str, limit: int, ttl: float) -> OutboxClaim:
        return await self._drive(self._outbox().outbox_claim(relay, kind, limit, ttl))

    async def outbox_done(self, token: int, ids: Sequence[int]) -> int:
        return await self._drive(self._outbox().outbox_done(token, ids))

    async def outbox_release(
        self, token: int, ids: Sequence[int], error: str | None, strike: bool
    ) -> int:
        return await self._drive(self._outbox().outbox_release(token, ids, error, strike))

    async def outbox_bury(self, token: int, ids: Sequence[int], error: str | None) -> int:
        return await self._drive(self._outbox().outbox_bury(token, ids, error))

    async def outbox_dead(self, kind: str | None, limit: int) -> list[OutboxRow]:
        return await self._drive(self._outbox().outbox_dead(kind, limit))

    async def outbox_retry(self, ids: Sequence[int]) -> int:
        return await self._drive(self._outbox().outbox_retry(ids))

    async def outbox_drop(self, ids: Sequence[int]) -> int:
        return await self._drive(self._outbox().outbox_drop(ids))

    async def outbox_list(self, kind: str | None, limit: int) -> list[OutboxRow]:
        return await self._drive(self._outbox().outbox_list(kind, limit))

    async def outbox_stats(self, kind: str | None) -> OutboxStats:
        return await self._drive(self._outbox().outbox_stats(kind))

    async def outbox_prune(self, older_than: float) -> int:
        return await self._drive(self._outbox().outbox_prune(older_than))
