"""The asynchronous leases: ``AsyncLease`` (a held lease) and ``AsyncLeaseContext``.

The source of the sync twin ``_lease.py`` (``scripts/unasync.py``), as ``_astore.py``
is of ``_store.py``. A lease talks to its store through ``_LeaseStore``: the store's
live backend and its ``acquire``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from types import TracebackType
from typing import Any, Protocol

from ._errors import LeaseHeld, LeaseLost
from ._flow import Sleep, adrive
from ._observe import HUB, LEVEL, log, now_ns
from ._policy import heartbeat_flow
from ._request import LeaseAnswer
from ._runner import AsyncRunner, Stopped, maybe_await
from ._storebase import LeaseBase, lease_event
from .backends._contract import AsyncBackend

__all__ = ["AsyncLease", "AsyncLeaseContext", "held"]

logger = logging.getLogger("fencing.lease")


class _LeaseStore(Protocol):
    """What a lease needs of its store."""

    def _live(self) -> AsyncBackend: ...

    async def acquire(
        self,
        name: str,
        *,
        owner: str,
        ttl: float,
        wait: float | None = None,
        heartbeat: bool = False,
        on_lost: Callable[[AsyncLease], Any] | None = None,
    ) -> AsyncLease: ...


class AsyncLease(LeaseBase):
    """A held lease (see ``LeaseBase``); a context manager that releases on exit."""

    store: _LeaseStore
    __slots__ = ("_beat", "_heartbeat")

    def __init__(
        self, store: _LeaseStore, name: str, owner: str, ttl: float, answer: LeaseAnswer
    ) -> None:
        super().__init__(store, name, owner, ttl, answer)
        # made when a heartbeat starts: most leases never run one (3.6 µs an acquire)
        self._heartbeat: AsyncRunner | None = None
        self._beat: tuple[float | None, Callable[[AsyncLease], Any] | None] | None = None

    async def _retake(self) -> bool | None:
        """Take this lease again under a new token if it ran out and nobody holds it now
        (``apply`` does, when a commit under it was fenced as expired). The lease then
        holds the new token; a heartbeat it ran starts again. False if someone holds it,
        None if it was released (never taken again)."""
        if self.released:
            return None
        started = now_ns() if HUB.on else 0
        answer = await self.store._live().acquire(self.name, self.owner, self.ttl)
        retaken = answer.granted and answer.row is not None
        if HUB.on or log.isEnabledFor(LEVEL[True]):
            token = answer.row.token if retaken and answer.row is not None else None
            outcome = "retaken" if retaken else "held"
            lease_event("lease.retake", self.store, self.name, outcome, token, started)
        if not retaken:
            self._mark_lost("newer_owner")
            return False
        beat = self._beat
        await self.stop_heartbeat()
        self._taken_again(answer)
        if beat is not None:
            self.start_heartbeat(*beat)
        return True

    async def renew(self, ttl: float | None = None) -> None:
        """Extend the lease by ``ttl`` (default: its TTL) from now, by the store's clock."""
        ttl = self._renew_ttl(ttl)
        started = now_ns() if HUB.on else 0
        answer = await self.store._live().renew(self.name, self.token, ttl)
        renewed = self._after_renew(answer)
        if HUB.on or log.isEnabledFor(LEVEL[True]):
            outcome = "renewed" if renewed else "lost"
            lease_event("lease.renew", self.store, self.name, outcome, self.token, started)
        if not renewed:
            raise LeaseLost(f"lease {self.name!r} token {self.token} is lost ({self.lost_reason})")

    async def release(self) -> None:
        """Give the lease up; its token is never reused. ``LeaseLost`` if no longer held."""
        await self.stop_heartbeat()
        if self.released:
            return
        if not await self._release():
            raise LeaseLost(f"lease {self.name!r} token {self.token} was already lost")

    async def _release(self) -> bool:
        started = now_ns() if HUB.on else 0
        released = self._after_release(await self.store._live().release(self.name, self.token))
        if HUB.on or log.isEnabledFor(LEVEL[True]):
            outcome = "released" if released else "lost"
            lease_event("lease.release", self.store, self.name, outcome, self.token, started)
        return released

    def start_heartbeat(
        self,
        interval: float | None = None,
        on_lost: Callable[[AsyncLease], Any] | None = None,
    ) -> None:
        """Renew in the background every ``interval`` (default TTL/3) until released."""
        if self._heartbeat is not None and self._heartbeat.running:
            return
        every = self._heartbeat_interval(interval)
        self._beat = (interval, on_lost)
        runner = self._heartbeat = AsyncRunner()

        async def handle(step: Any) -> Any:
            if isinstance(step, Sleep):
                return await runner.sleep(step.seconds)
            try:
                await self.renew()
            except LeaseLost:
                return False
            except Exception as exc:
                return exc
            return True

        async def run() -> None:
            try:
                reason = await adrive(heartbeat_flow(self.ttl, every), handle)
            except Stopped:
                return
            if reason is not None:
                self._mark_lost(reason)
            if on_lost is not None:
                try:
                    await maybe_await(on_lost(self))
                except Exception:
                    # never raised over the body's own error (the lease context stops
                    # this task on exit): logged, and ``lease.lost`` says what happened
                    logger.exception("on_lost of lease %r token %s raised", self.name, self.token)

        runner.start(f"fencing-heartbeat-{self.name}", run)

    async def stop_heartbeat(self) -> None:
        """Stop renewing (the lease stays held until it expires or is released)."""
        if self._heartbeat is not None:
            await self._heartbeat.stop()

    async def __aenter__(self) -> AsyncLease:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # Never raise over the body's own error; a lost lease shows as ``lease.lost``.
        await self.stop_heartbeat()
        if not self.released:
            await self._release()


class AsyncLeaseContext:
    """``with store.lease(name, owner=..., ttl=...) as lease:`` acquires on entry."""

    def __init__(self, store: _LeaseStore, kwargs: dict[str, Any]) -> None:
        self._store = store
        self._kwargs = kwargs
        self._lease: AsyncLease | None = None

    async def __aenter__(self) -> AsyncLease:
        self._lease = await self._store.acquire(**self._kwargs)
        return self._lease

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._lease is not None:
            await self._lease.__aexit__(exc_type, exc, tb)


def held(name: str, answer: LeaseAnswer) -> LeaseHeld:
    row = answer.row
    if row is None or row.owner is None:
        return LeaseHeld(name)
    return LeaseHeld(name, row.owner, max(0.0, row.expires_at - answer.now))
