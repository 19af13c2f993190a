"""The outbox relay: publishes committed outbox rows through the queue's own client.

::

    import fencing
    from fencing.contrib.celery import publisher
    from fencing.contrib.relay import Relay

    store = fencing.open("postgresql://localhost/app")
    relay = Relay(store, publisher(celery_app))
    relay.run_once()        # drain and return the counts (cron, tests)
    relay.run()             # or: relay until relay.stop() (another thread, a signal)

``AsyncRelay`` is the same for an ``AsyncStore`` and an async publisher (arq's).
``fencing relay URL --queue celery --app shop:app`` runs one from the command line.

What a relay guarantees (``docs/outbox.md``): every committed row is published at
least once (a relay that dies between the publish and the mark publishes again after
its claim lapses; the worker answers ``Duplicate``); several relays share the work
without sending a row twice while none crashes (claims with a token: a relay paused
past its claim's deadline marks and gives back nothing); one key's rows are published
in the order they were written; a broker that is down is retried with bounded,
jittered backoff and no row is dropped; sent rows are pruned after ``retention``.

Every publish logs one record on the ``fencing.relay`` logger, with ``extra`` fields
``fencing_row_id``, ``fencing_task``, ``fencing_key``, ``fencing_lag`` (seconds from
the row's commit to its publish, by the store's clock), ``fencing_relay``,
``fencing_queue``, ``fencing_attempts`` and ``fencing_claim``; a failed publish logs a
warning with ``fencing_error``; a row given up as dead (``dead_after``) logs an error
with the row's fields (``fencing_payload``, ``fencing_strikes``, ...). ``backlog()``
gives the pending rows, the oldest one's age and the dead rows' count, for metrics.

Wake-ups: a relay with nothing to do waits ``poll`` seconds, through its
:class:`Waker`. The default polls; a waker that listens for the store's
notifications (PostgreSQL's ``LISTEN fencing_outbox``) returns as soon as a row is
written, so the publish latency is no longer bounded below by ``poll``.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import select
import socket
import time
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, runtime_checkable

from .._astore import AsyncStore
from .._errors import ConfigurationError
from .._flow import adrive, drive
from .._outbox import OutboxClaim, OutboxMessage, OutboxRow, OutboxStats
from .._store import Store
from ._options import Backoff
from ._relayflow import (
    BatchCounts,
    Bury,
    Claim,
    Clock,
    Done,
    Failed,
    Prune,
    Publish,
    RelayConfig,
    RelayCounts,
    Release,
    Stopping,
    Wait,
    drain,
    loop,
)

__all__ = [
    "AsyncPollWaker",
    "AsyncPublisher",
    "AsyncRelay",
    "AsyncWaker",
    "Backoff",
    "BatchCounts",
    "OutboxClaim",
    "OutboxMessage",
    "OutboxRow",
    "OutboxStats",
    "PollWaker",
    "Publisher",
    "Relay",
    "RelayCounts",
    "Waker",
    "default_name",
]

BatchHook = Callable[[BatchCounts, RelayCounts], None]


@runtime_checkable
class Publisher(Protocol):
    """Sends one outbox row through a queue's own client; raises if it could not.

    ``kind`` is the queue kind whose rows it sends (``celery``, ``rq``, ``dramatiq``).
    Made by ``fencing.contrib.<queue>.publisher(...)``."""

    kind: str

    def publish(self, row: OutboxRow) -> None: ...

    def close(self) -> None: ...


@runtime_checkable
class AsyncPublisher(Protocol):
    """:class:`Publisher` for an event loop (arq's ``publisher``)."""

    kind: str

    async def publish(self, row: OutboxRow) -> None: ...

    async def close(self) -> None: ...


class Waker(Protocol):
    """How an idle relay waits for new rows. ``wait(timeout)`` returns after at most
    ``timeout`` seconds, earlier when rows may have been written (a notification) or
    when ``wake()`` is called (the relay is stopping; any thread)."""

    def wait(self, timeout: float) -> None: ...

    def wake(self) -> None: ...

    def close(self) -> None: ...


class AsyncWaker(Protocol):
    """:class:`Waker` for an event loop."""

    async def wait(self, timeout: float) -> None: ...

    def wake(self) -> None: ...

    async def close(self) -> None: ...


class _Alarm:
    """A flag that wakes a waiting thread. ``set()`` takes no lock (a plain attribute
    and one byte on a pipe), so a signal handler may call it while the thread it
    interrupts is inside ``wait``: ``threading.Event.set()`` there can deadlock, the
    handler waiting for the lock its own thread holds."""

    def __init__(self) -> None:
        self.flag = False
        self._r, self._w = os.pipe()
        os.set_blocking(self._r, False)
        os.set_blocking(self._w, False)
        self._fds = weakref.finalize(self, _close_fds, self._r, self._w)

    def set(self) -> None:
        self.flag = True
        with contextlib.suppress(OSError):  # full (already woken) or closed
            os.write(self._w, b"!")

    def clear(self) -> None:
        self.flag = False
        self._drain()

    def wait(self, timeout: float) -> bool:
        """Wait until set or ``timeout`` seconds; return the flag."""
        if not self.flag and self._fds.alive:
            with contextlib.suppress(InterruptedError):
                select.select([self._r], [], [], max(timeout, 0.0))
            self._drain()
        return self.flag

    def _drain(self) -> None:
        with contextlib.suppress(OSError):
            while os.read(self._r, 512):
                pass

    def close(self) -> None:
        self._fds()


def _close_fds(*fds: int) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


class PollWaker:
    """Waits the whole timeout (polling), unless woken (``wake`` is safe from any
    thread and from a signal handler)."""

    def __init__(self) -> None:
        self._alarm = _Alarm()

    def wait(self, timeout: float) -> None:
        self._alarm.wait(timeout)
        self._alarm.clear()

    def wake(self) -> None:
        self._alarm.set()

    def close(self) -> None:
        self._alarm.close()


class AsyncPollWaker:
    """:class:`PollWaker` for an event loop (``wake`` from the loop's own thread)."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    async def wait(self, timeout: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._event.wait(), timeout)
        self._event.clear()

    def wake(self) -> None:
        self._event.set()

    async def close(self) -> None:
        pass


def default_name() -> str:
    """``<host>:<pid>``, trimmed to a valid relay name."""
    host = "".join(c if c.isalnum() or c in "_-.:" else "-" for c in socket.gethostname())
    return f"{host.lstrip('_-.:') or 'relay'}:{os.getpid()}"[:128]


def _config(publisher: Any, name: str | None, options: dict[str, Any]) -> RelayConfig:
    kind = getattr(publisher, "kind", None)
    if kind is None:
        raise ConfigurationError(
            "a relay needs a publisher: fencing.contrib.<queue>.publisher(app), not"
            f" {type(publisher).__name__}"
        )
    return RelayConfig(name=name or default_name(), kind=kind, **options)


class _RelayBase:
    """What both relays hold: the configuration, the totals, the stop flag."""

    def __init__(
        self,
        publisher: Any,
        *,
        name: str | None,
        on_batch: BatchHook | None,
        options: dict[str, Any],
    ) -> None:
        self.config = _config(publisher, name, options)
        self.publisher = publisher
        self.counts = RelayCounts()
        self.on_batch = on_batch
        self._stopping = False
        self._suspects: set[int] = set()  # rows whose publish failed (the flow's)

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def kind(self) -> str:
        return self.config.kind

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} of {self.kind} rows>"


class Relay(_RelayBase):
    """Publishes a sync store's outbox rows of one queue kind with ``publisher``.

    ``name`` identifies the relay in claims (default ``<host>:<pid>``); ``batch`` rows
    per claim, held for ``ttl`` seconds; ``poll``: seconds an idle relay waits for new
    rows (through ``waker``); published rows are marked every ``mark_every``;
    ``max_failures`` failed publishes in a row end a batch, then the next claim waits
    ``backoff``; sent rows older than ``retention`` seconds are pruned every
    ``prune_every``; ``on_batch(batch_counts, totals)`` is called after each batch.

    ``dead_after``: a row whose publish failed this many times while the broker took
    other rows of the same batch (a poison row) is given up as dead: logged at ERROR,
    kept in the outbox (``store.outbox.dead()``, ``retry``, ``drop``), and its key's
    later rows go on without it. A broker outage kills no row (nothing is published,
    so no failure counts). None: never; a poison row then holds its key back until it
    is published. ``docs/outbox.md`` says why the default is 10.
    """

    def __init__(
        self,
        store: Store,
        publisher: Publisher,
        *,
        name: str | None = None,
        batch: int = 100,
        ttl: float = 30.0,
        poll: float = 1.0,
        mark_every: int = 20,
        max_failures: int = 3,
        backoff: Backoff | None = None,
        retention: float = 7 * 86400.0,
        prune_every: float = 600.0,
        dead_after: int | None = 10,
        waker: Waker | None = None,
        on_batch: BatchHook | None = None,
    ) -> None:
        if not isinstance(store, Store):
            raise ConfigurationError(
                f"Relay takes a sync Store (AsyncRelay an AsyncStore), not {type(store).__name__}"
            )
        if isinstance(publisher, AsyncPublisher) and inspect.iscoroutinefunction(publisher.publish):
            raise ConfigurationError("this publisher is async: use AsyncRelay")
        options: dict[str, Any] = {
            "batch": batch,
            "ttl": ttl,
            "poll": poll,
            "mark_every": mark_every,
            "max_failures": max_failures,
            "retention": retention,
            "prune_every": prune_every,
            "dead_after": dead_after,
        }
        if backoff is not None:
            options["backoff"] = backoff
        super().__init__(publisher, name=name, on_batch=on_batch, options=options)
        self.store = store
        self.waker: Waker = waker if waker is not None else PollWaker()
        self._stopped = _Alarm()

    def _handle(self, step: Any) -> Any:
        outbox = self.store.outbox
        cfg = self.config
        if isinstance(step, Publish):
            try:
                self.publisher.publish(step.row)
            except Exception as exc:
                return Failed(exc)
            return None
        if isinstance(step, Clock):
            return time.monotonic()
        if isinstance(step, Claim):
            return outbox.claim(cfg.name, cfg.kind, limit=cfg.batch, ttl=cfg.ttl)
        if isinstance(step, Done):
            return outbox.done(step.token, step.ids)
        if isinstance(step, Release):
            return outbox.release(step.token, step.ids, step.error, strike=step.strike)
        if isinstance(step, Bury):
            return outbox.bury(step.token, step.ids, step.error)
        if isinstance(step, Prune):
            return outbox.prune(cfg.retention)
        if isinstance(step, Wait):
            if step.wake:
                self.waker.wait(step.seconds)
            else:
                self._stopped.wait(step.seconds)
            return None
        if isinstance(step, Stopping):
            return self._stopped.flag
        raise AssertionError(f"unknown relay step {step!r}")  # pragma: no cover

    def run_once(self) -> RelayCounts:
        """Publish until nothing is left to claim (or a batch publishes nothing: the
        broker is down); return this drain's counts."""
        totals = RelayCounts()
        drive(drain(self.config, totals, self._batch_hook, self._suspects), self._handle)
        return totals

    def run(self) -> RelayCounts:
        """Relay until :meth:`stop`; return the counts of this run (a stop asked for
        before ``run`` makes it return at once)."""
        totals = RelayCounts()
        try:
            drive(loop(self.config, totals, self._batch_hook, self._suspects), self._handle)
        finally:
            self._stopped.clear()
        return totals

    def stop(self) -> None:
        """Ask :meth:`run` to return after the row it is publishing: from any thread,
        or from a signal handler (it takes no lock)."""
        self._stopped.set()
        self.waker.wake()

    def backlog(self) -> OutboxStats:
        """Unsent rows of this relay's queue kind and the oldest one's age (seconds)."""
        return self.store.outbox.stats(kind=self.kind)

    def close(self) -> None:
        """Close the publisher and the waker (not the store)."""
        self.publisher.close()
        self.waker.close()
        self._stopped.close()

    def _batch_hook(self, counts: BatchCounts, totals: RelayCounts) -> None:
        self.counts.add(counts)
        if self.on_batch is not None:
            self.on_batch(counts, totals)


class AsyncRelay(_RelayBase):
    """:class:`Relay` for an ``AsyncStore`` (and an async publisher, such as arq's;
    a sync publisher's ``publish`` runs in a worker thread)."""

    def __init__(
        self,
        store: AsyncStore,
        publisher: AsyncPublisher | Publisher,
        *,
        name: str | None = None,
        batch: int = 100,
        ttl: float = 30.0,
        poll: float = 1.0,
        mark_every: int = 20,
        max_failures: int = 3,
        backoff: Backoff | None = None,
        retention: float = 7 * 86400.0,
        prune_every: float = 600.0,
        dead_after: int | None = 10,
        waker: AsyncWaker | None = None,
        on_batch: BatchHook | None = None,
    ) -> None:
        if not isinstance(store, AsyncStore):
            raise ConfigurationError(
                f"AsyncRelay takes an AsyncStore (Relay a Store), not {type(store).__name__}"
            )
        options: dict[str, Any] = {
            "batch": batch,
            "ttl": ttl,
            "poll": poll,
            "mark_every": mark_every,
            "max_failures": max_failures,
            "retention": retention,
            "prune_every": prune_every,
            "dead_after": dead_after,
        }
        if backoff is not None:
            options["backoff"] = backoff
        super().__init__(publisher, name=name, on_batch=on_batch, options=options)
        self.store = store
        self.waker: AsyncWaker = waker if waker is not None else AsyncPollWaker()
        self._stopped = asyncio.Event()
        self._async_publish = inspect.iscoroutinefunction(publisher.publish)

    async def _publish(self, row: OutboxRow) -> None:
        if self._async_publish:
            await self.publisher.publish(row)
        else:
            await asyncio.to_thread(self.publisher.publish, row)

    async def _handle(self, step: Any) -> Any:
        outbox = self.store.outbox
        cfg = self.config
        if isinstance(step, Publish):
            try:
                await self._publish(step.row)
            except Exception as exc:
                return Failed(exc)
            return None
        if isinstance(step, Clock):
            return time.monotonic()
        if isinstance(step, Claim):
            return await outbox.claim(cfg.name, cfg.kind, limit=cfg.batch, ttl=cfg.ttl)
        if isinstance(step, Done):
            return await outbox.done(step.token, step.ids)
        if isinstance(step, Release):
            return await outbox.release(step.token, step.ids, step.error, strike=step.strike)
        if isinstance(step, Bury):
            return await outbox.bury(step.token, step.ids, step.error)
        if isinstance(step, Prune):
            return await outbox.prune(cfg.retention)
        if isinstance(step, Wait):
            if step.wake:
                await self.waker.wait(step.seconds)
            else:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopped.wait(), step.seconds)
            return None
        if isinstance(step, Stopping):
            return self._stopped.is_set()
        raise AssertionError(f"unknown relay step {step!r}")  # pragma: no cover

    async def run_once(self) -> RelayCounts:
        """:meth:`Relay.run_once`."""
        totals = RelayCounts()
        flow = drain(self.config, totals, self._batch_hook, self._suspects)
        await adrive(flow, self._handle)
        return totals

    async def run(self) -> RelayCounts:
        """Relay until :meth:`stop` (or cancellation); a stop asked for before ``run``
        makes it return at once."""
        totals = RelayCounts()
        try:
            flow = loop(self.config, totals, self._batch_hook, self._suspects)
            await adrive(flow, self._handle)
        finally:
            self._stopped.clear()
        return totals

    def stop(self) -> None:
        """Ask :meth:`run` to return (from the relay's event loop)."""
        self._stopped.set()
        self.waker.wake()

    async def backlog(self) -> OutboxStats:
        """:meth:`Relay.backlog`."""
        return await self.store.outbox.stats(kind=self.kind)

    async def close(self) -> None:
        """Close the publisher and the waker (not the store)."""
        closing = self.publisher.close()
        if isinstance(closing, Awaitable):
            await closing
        await self.waker.close()

    def _batch_hook(self, counts: BatchCounts, totals: RelayCounts) -> None:
        self.counts.add(counts)
        if self.on_batch is not None:
            self.on_batch(counts, totals)
