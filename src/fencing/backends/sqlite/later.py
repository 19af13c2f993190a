"""Effects settled later: a view of ``store.using(conn)`` whose commit is refused while the
caller's transaction holds SQLite's write lock (it wrote, or the refused commit's claim
did) cannot settle the intent's effects on the store's own connection at once: that
write would wait for a commit the caller cannot make while it waits, on the same thread.
Nor in the caller's transaction: rolled back, as a refusal usually is, the settlement
would be gone, and the effects never listed for reconciliation.

``Settler`` writes them on a connection of the store's own, from a thread of its own,
as soon as the lock is free (the caller's transaction committed or rolled back): each
is the store's ``settle_effects`` flow (it sets the outcome of the intent's effects not
yet settled: idempotent, and a no-op on effects settled since), run again while the lock
stays held. The view answers at once with the effects as they will be
(``bound.upcoming``, read on the caller's connection: a write transaction, so it reads
the latest rows; the store's connection may be waiting for its lock meanwhile).
``close()`` (the store's) waits for what is queued, up to ``busy_timeout``; so does the
interpreter's exit, briefly. Whatever a process leaves unsettled stays pending, and is
listed by ``store.pending_effects()``.
"""

from __future__ import annotations

import atexit
import functools
import logging
import sqlite3
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from typing import Final

from ..._errors import FencingError, TransientStoreError
from ..._flow import drive
from .._contract import Flows
from .bound import run_step

__all__ = ["Settler"]

logger = logging.getLogger("fencing.effects")

_AT_EXIT: Final = 5.0  # seconds the interpreter's exit waits for queued settlements
_AGAIN: Final = 0.05  # seconds between two waits for the lock (busy_timeout may be 0)
_LIVE: weakref.WeakSet[Settler] = weakref.WeakSet()


class Settler:
    """Settlements queued until SQLite's write lock is free (see the module docstring)."""

    def __init__(
        self, connect: Callable[[], sqlite3.Connection], flows: Flows, timeout: float
    ) -> None:
        self._connect = connect
        self._flows = flows
        self._timeout = timeout
        self._queue: deque[tuple[str, str, str]] = deque()
        self._changed = threading.Condition()
        self._running = False
        self._closed = False

    def put(self, scope: str, intent_id: str, outcome: str) -> None:
        """Queue a settlement; a thread writes it once the lock is free."""
        with self._changed:
            self._queue.append((scope, intent_id, outcome))
            _LIVE.add(self)
            if not self._running:
                self._running = True
                thread = threading.Thread(
                    target=self._run, name="fencing-sqlite-settler", daemon=True
                )
                thread.start()

    @property
    def pending(self) -> int:
        """How many settlements are queued (or being written)."""
        return len(self._queue)

    def drain(self, timeout: float) -> bool:
        """Wait until nothing is queued (True), at most ``timeout`` seconds (False)."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while self._queue:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._changed.wait(left)
        return True

    def close(self) -> None:
        """Wait for what is queued, up to the store's ``busy_timeout``; then stop (what is
        left is logged: its effects stay pending)."""
        done = self.drain(self._timeout)
        with self._changed:
            self._closed = True
            left = list(self._queue)
            self._changed.notify_all()
        if not done and left:
            logger.warning(
                "fencing: %d settlement(s) of refused commits made through store.using()"
                " could not be written before the store closed (SQLite's write lock stayed"
                " held): their effects stay pending (store.pending_effects()): %s",
                len(left),
                left,
            )

    def _run(self) -> None:
        conn: sqlite3.Connection | None = None
        try:
            while True:
                with self._changed:
                    if not self._queue or self._closed:
                        self._running = False
                        return
                    scope, intent_id, outcome = self._queue[0]
                try:
                    if conn is None:
                        conn = self._connect()
                    flow = self._flows.settle_effects(scope, intent_id, outcome)
                    drive(flow, functools.partial(run_step, conn))
                except TransientStoreError:  # the lock stayed held past busy_timeout
                    with self._changed:
                        self._changed.wait(_AGAIN)  # (a close() wakes it)
                    continue
                except FencingError as exc:  # (a schema gone, a disk error: not retried)
                    logger.warning(
                        "fencing: the effects of %s/%s could not be settled as %s: %s",
                        scope,
                        intent_id,
                        outcome,
                        exc,
                    )
                with self._changed:
                    self._queue.popleft()
                    self._changed.notify_all()
        finally:
            with self._changed:
                self._running = False
                self._changed.notify_all()
            if conn is not None:
                conn.close()


@atexit.register
def _at_exit() -> None:
    deadline = time.monotonic() + _AT_EXIT
    for settler in list(_LIVE):
        settler.drain(max(0.0, deadline - time.monotonic()))
