"""The asynchronous outbox front: ``AsyncOutbox`` (``store.outbox``).

The source of the sync twin ``_outbox_front.py`` (``scripts/unasync.py``). The rows,
the claim rule and the checks are ``_outbox``'s; the relay is ``fencing.contrib.relay``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

from ._errors import InvalidInput
from ._outbox import (
    QUEUE_KINDS,
    OutboxClaim,
    OutboxRow,
    OutboxStats,
    check_claim,
    check_ids,
    message_from,
)
from ._values import Intent, Record
from .backends._contract import AsyncBackend

__all__ = ["AsyncOutbox"]

MAX_LIST = 10_000


class _OutboxStore(Protocol):
    """What the outbox needs of its store (or of a view of ``store.using``)."""

    options: Any

    def _live(self) -> AsyncBackend: ...


class AsyncOutbox:
    """The store's outbox: fenced tasks sent in your transaction, relayed after it commits.

    ``store.using(conn).outbox.send(ship, intent)`` writes one row in your transaction
    (rolled back: no row, nothing sent). A relay (``fencing relay URL --queue ...``, or
    ``fencing.contrib.relay.Relay``) publishes committed rows through the queue's own
    client, at least once, and the worker's ``Duplicate`` makes the work happen once.
    """

    __slots__ = ("_store",)

    def __init__(self, store: _OutboxStore) -> None:
        self._store = store

    def __repr__(self) -> str:
        return f"<fencing.AsyncOutbox of {self._store!r}>"

    async def send(
        self,
        task: object,
        what: Record | Intent,
        transition: str | None = None,
        *,
        guard: Any = None,
        supersede: bool | None = None,
        debounce: float | None = None,
        max_wait: float | None = None,
        **options: Any,
    ) -> OutboxRow:
        """Write fenced ``task``'s message for ``what`` (an intent, or a record and the
        ``transition`` to decide) as one outbox row: on a view of ``store.using``, in your
        transaction. ``task`` is a fenced task of Celery, RQ, Dramatiq or arq
        (``fencing.contrib``); ``options`` are what its own enqueue takes (Celery's
        ``countdown``, ``queue``, ...), JSON values, applied when the relay publishes.

        ``supersede=True``: in the same transaction, the older rows of the same key and
        task still waiting (unsent, not dead, under no live claim) are superseded: never
        published, they no longer hold the key back. ``debounce=S``: the row is due only
        ``S`` seconds from now, or ``max_wait`` seconds (default ``10 * S``) after the
        first send of the burst it superseded, whichever is sooner (the store's clock);
        it implies ``supersede``. Left out, the task's own setting applies
        (``fenced_task(..., supersede=True, debounce=S)``)."""
        message = message_from(
            task, what, transition, guard, options, supersede, debounce, max_wait
        )
        return await self._store._live().outbox_add(message)

    async def pending(self, *, kind: str | None = None, limit: int = 100) -> list[OutboxRow]:
        """Rows to publish (not sent, not dead; of one queue kind, or all), oldest first."""
        return await self._store._live().outbox_list(_kind(kind), _limit(limit))

    async def stats(self, *, kind: str | None = None) -> OutboxStats:
        """The backlog: pending rows and the oldest one's age (the store's clock), and
        how many rows are dead."""
        return await self._store._live().outbox_stats(_kind(kind))

    # -- dead rows (``Relay(dead_after=N)`` gave them up; docs/outbox.md) -----------------
    async def dead(self, *, kind: str | None = None, limit: int = 100) -> list[OutboxRow]:
        """Rows a relay gave up as dead (of one queue kind, or all), oldest first, with
        their payload, attempts, last error and ``dead_at``."""
        return await self._store._live().outbox_dead(_kind(kind), _limit(limit))

    async def retry(self, rows: Iterable[OutboxRow | int] | OutboxRow | int) -> int:
        """Put dead rows back to pending (attempts and strikes reset; the relay publishes
        them next, by their id's place); how many. Every row or none: an id with no row
        raises ``UnknownOutboxRow``, a row that is not dead ``OutboxRowNotDead``."""
        return await self._store._live().outbox_retry(check_ids(rows))

    async def drop(self, rows: Iterable[OutboxRow | int] | OutboxRow | int) -> int:
        """Delete dead rows (they will never be published); how many. Every row or
        none, with the errors of :meth:`retry`."""
        return await self._store._live().outbox_drop(check_ids(rows))

    # -- for relays ---------------------------------------------------------------------
    async def claim(
        self, relay: str, kind: str, *, limit: int = 100, ttl: float = 30.0
    ) -> OutboxClaim:
        """Claim up to ``limit`` unsent rows of queue ``kind`` for ``ttl`` seconds, in the
        order to publish them (no row of a key while another relay's claim on an
        earlier row of that key is live)."""
        relay, kind, limit, ttl = check_claim(relay, kind, limit, ttl)
        return await self._store._live().outbox_claim(relay, kind, limit, ttl)

    async def done(self, claim: OutboxClaim | int, rows: Iterable[OutboxRow | int]) -> int:
        """Mark rows published under ``claim`` sent; how many were still its own (a claim
        that expired and was taken over marks nothing)."""
        return await self._store._live().outbox_done(_token(claim), _ids(rows))

    async def release(
        self,
        claim: OutboxClaim | int,
        rows: Iterable[OutboxRow | int],
        error: str | None = None,
        *,
        strike: bool = False,
    ) -> int:
        """Give rows of ``claim`` back unsent (a failed publish): ``attempts`` plus one,
        ``strikes`` plus one if ``strike`` (the publish failed while the broker took
        other rows), ``error`` kept (at most 2000 characters); how many were still its
        own."""
        text = None if error is None else str(error)[:2000]
        live = self._store._live()
        return await live.outbox_release(_token(claim), _ids(rows), text, bool(strike))

    async def bury(
        self, claim: OutboxClaim | int, rows: Iterable[OutboxRow | int], error: str | None = None
    ) -> int:
        """Give rows of ``claim`` up as dead (a poison row: see ``Relay(dead_after=)``):
        as :meth:`release` with a strike, and ``dead_at`` the store's clock; a dead row
        is not claimed again and no longer holds its key back. How many were still its
        own."""
        text = None if error is None else str(error)[:2000]
        return await self._store._live().outbox_bury(_token(claim), _ids(rows), text)

    async def prune(self, older_than: float | None = None) -> int:
        """Delete rows sent more than ``older_than`` seconds ago (default: the store's
        retention); never an unsent row. Returns how many."""
        age = self._store.options.retention if older_than is None else older_than
        if isinstance(age, bool) or not isinstance(age, int | float) or age < 0:
            raise InvalidInput("older_than is a number of seconds")
        return await self._store._live().outbox_prune(float(age))


def _kind(kind: str | None) -> str | None:
    if kind is not None and kind not in QUEUE_KINDS:
        raise InvalidInput(f"queue kind must be one of {QUEUE_KINDS} or None, not {kind!r}")
    return kind


def _limit(limit: object) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIST:
        raise InvalidInput(f"limit must be an integer from 1 to {MAX_LIST}")
    return limit


def _token(claim: object) -> int:
    token = claim.token if isinstance(claim, OutboxClaim) else claim
    if isinstance(token, bool) or not isinstance(token, int) or token < 1:
        raise InvalidInput("a claim is an OutboxClaim or its token (a positive integer)")
    return token


def _ids(rows: Iterable[object]) -> list[int]:
    ids = [r.id if isinstance(r, OutboxRow) else r for r in rows]
    if not all(isinstance(i, int) and not isinstance(i, bool) and i > 0 for i in ids):
        raise InvalidInput("rows are OutboxRow values or their ids (positive integers)")
    if len(ids) > MAX_LIST:
        raise InvalidInput(f"at most {MAX_LIST} rows at once")
    return ids  # type: ignore[return-value]
