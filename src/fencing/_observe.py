"""The one observer hook: what an operation of a store came to, for logs, metrics and traces.

The fronts (``_astore``, ``_alease``, and their generated sync twins) report each commit,
apply and lease operation here once it has an answer. Logging is the built-in observer: a
refused commit is logged at INFO and a committed one at DEBUG on the ``fencing`` logger,
and only when that level is enabled. Other observers (``fencing.contrib.prometheus``,
``fencing.contrib.otel``) are switched on by :func:`add_observer`; while there is none,
what a front pays is one attribute check (``HUB.on``) and one ``isEnabledFor``.

This module is at the bottom of the layers (it imports nothing of fencing's): an event
carries plain values, taken from the outcome and intent by the front.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, Protocol

from ._errors import InvalidInput

__all__ = ["HUB", "Event", "Observer", "add_observer", "log", "remove_observer"]

log: Final = logging.getLogger("fencing")
#: The level a commit's record is logged at: indexed by ``outcome.committed``.
LEVEL: Final = (logging.INFO, logging.DEBUG)
now_ns: Final = time.perf_counter_ns


@dataclass(slots=True)  # not frozen: a frozen init costs a setattr call per field
class Event:
    """One operation's answer (read it, do not change it: every observer gets the same).

    ``op``: ``"commit"``, ``"commit_many"``, ``"apply"``, ``"lease.acquire"``,
    ``"lease.retake"``, ``"lease.renew"`` or ``"lease.release"``. ``outcome``: an
    outcome's kind (``"committed"``, ``"stale"``, ...) or, for a lease, ``"acquired"``,
    ``"retaken"``, ``"held"``, ``"renewed"``, ``"released"`` or ``"lost"``.
    ``fence_reason``: ``"newer_owner"`` or ``"expired"`` for a fenced outcome, else None.
    ``kind`` is ``"collection"``, ``"table"`` or ``"lease"``; ``name`` the collection,
    table or lease name. ``seconds`` and ``started_ns`` (wall clock) are set only while
    an observer is on. ``origin``: the store (see below).
    """

    op: str
    store: str
    kind: str
    name: str
    outcome: str
    key: str | int | None = None
    intent_id: str | None = None
    root_id: str | None = None
    expected_version: int | None = None
    current_version: int | None = None
    token: int | None = None
    trace: str | None = None  # the intent's W3C traceparent, if it carries one
    fence_reason: str | None = None  # a fenced outcome's FenceReason value
    waits: int = 0  # lease.acquire: how many times it slept while the lease was held
    seconds: float | None = None
    started_ns: int | None = None
    #: the store the operation ran on (the store itself for a view of ``store.using``):
    #: an observer may tell stores apart by it (an object: never put it in a label)
    origin: object = None

    @property
    def committed(self) -> bool:
        return self.outcome == "committed"

    def log_fields(self) -> dict[str, Any]:
        """The ``extra`` fields of its ``fencing`` log record (those of ``fencing.task``'s,
        plus the store, the operation and the target's kind)."""
        return {
            "fencing_store": self.store,
            "fencing_operation": self.op,
            "fencing_kind": self.kind,
            "fencing_collection": self.name,
            "fencing_key": self.key,
            "fencing_intent_id": self.intent_id,
            "fencing_root_id": self.root_id,
            "fencing_expected_version": self.expected_version,
            "fencing_current_version": self.current_version,
            "fencing_outcome": self.outcome,
            "fencing_fence_reason": self.fence_reason,
            "fencing_token": self.token,
        }


class Observer(Protocol):
    """Told of every operation's answer; must not raise (what it raises is logged)."""

    def observe(self, event: Event) -> None: ...


class Hub:
    """The observers switched on; ``on`` is True while there is at least one."""

    __slots__ = ("_lock", "observers", "on", "trace")

    def __init__(self) -> None:
        self.on = False
        self.observers: tuple[Observer, ...] = ()
        #: the current trace context as a W3C traceparent, stamped on new intents
        #: (set by ``fencing.contrib.otel.enable``)
        self.trace: Callable[[], str | None] | None = None
        self._lock = threading.Lock()

    def add(self, observer: Observer) -> None:
        with self._lock:
            if observer not in self.observers:
                self.observers = (*self.observers, observer)
            self.on = True

    def remove(self, observer: Observer) -> None:
        with self._lock:
            self.observers = tuple(o for o in self.observers if o is not observer)
            self.on = bool(self.observers)

    def emit(self, event: Event) -> None:
        """Log the event (if its level is enabled) and tell every observer."""
        if log.isEnabledFor(LEVEL[event.committed] if event.kind != "lease" else logging.DEBUG):
            _log(event)
        for observer in self.observers:
            try:
                observer.observe(event)
            except Exception:
                log.exception("fencing observer %r failed", observer)


HUB: Final = Hub()


def add_observer(observer: Observer) -> None:
    """Switch an observer on (idempotent)."""
    if not callable(getattr(observer, "observe", None)):
        raise InvalidInput(f"an observer needs an observe(event) method, not {observer!r}")
    HUB.add(observer)


def remove_observer(observer: Observer) -> None:
    """Switch an observer off (fine if it was not on)."""
    HUB.remove(observer)


def _log(event: Event) -> None:
    if event.kind == "lease":
        log.debug(
            "%s %s lease %r token=%s waits=%s",
            event.op,
            event.outcome,
            event.name,
            event.token,
            event.waits,
            extra=event.log_fields(),
        )
        return
    message = "%s: %s %s/%s intent=%s expected=%s current=%s"
    args: tuple[object, ...] = (
        event.op,
        event.outcome,
        event.name,
        event.key,
        event.intent_id,
        event.expected_version,
        event.current_version,
    )
    if event.fence_reason is not None:
        message += " fenced=%s"
        args += (event.fence_reason,)
    log.log(LEVEL[event.committed], message, *args, extra=event.log_fields())
