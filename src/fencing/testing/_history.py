"""Recording histories: the JSON Lines format, writers and the :class:`Recorder`.

A history is a JSON Lines file: one JSON object per line, one event per object.
Blank lines are ignored. Every event has an ``"event"`` field naming its kind:

``outcome``: one commit's outcome, written after the store answered::

    {"event": "outcome", "t": 1718000000.25, "worker": "w3",
     "collection": "orders", "key": "o-1",
     "intent_id": "9f2c...~2", "root_id": "9f2c...", "transition": "ship",
     "expected_version": 4, "outcome": "committed", "version": 5,
     "applied_over": 4, "token": 12, "fence": 12}

    - ``t``: the recorder's clock (seconds, float); informative only, never judged.
    - ``intent_id`` / ``root_id``: the intent committed and the intent it derives
      from (``Intent.root_id``; a ``Recompute`` attempt shares its root). ``root_id``
      defaults to ``intent_id`` up to its first ``~``.
    - ``expected_version``: the version the decision was taken against (null for
      a guard-only intent).
    - ``outcome``: ``committed``, ``stale``, ``duplicate``, ``fenced``, ``missing``,
      ``skipped`` or ``contended``.
    - ``version``: the record's version after a commit, or its current version
      when refused (null when missing, or for a table without a version column).
    - ``applied_over``: for ``committed``, the version the write replaced. A
      fencing commit replaces exactly ``version - 1``; a naive writer records the
      version it really overwrote. Null for other outcomes.
    - ``token``: the lease token the commit was made under (null without a lease);
      ``fence``: the record's fence as the store answered.
    - optional: ``reason`` (why fenced), ``attempts`` (contended), ``decided_at``
      (when the decision was taken: the intent's ``decided_at``, same clock as ``t``;
      informative only, never judged).

``final``: the store's content at the end, one per key judged::

    {"event": "final", "collection": "orders", "key": "o-1",
     "version": 9, "fence": 12, "state": {"status": "shipped"}}

    ``version`` null means the record no longer exists (or, for a table without a
    version column, that there is no version to trace).

``lease``: optional, a lease changing hands::

    {"event": "lease", "t": 1718000000.1, "name": "orders/o-1",
     "action": "acquire", "token": 12, "owner": "w3"}

    ``action`` is ``acquire``, ``release`` or ``lost``.

``error``: a commit that raised (the store failed or timed out): its outcome is
unknown. A retry with the same intent shows ``duplicate`` if the first landed::

    {"event": "error", "t": ..., "worker": "w3", "collection": "orders",
     "key": "o-1", "intent_id": "...", "root_id": "...", "error": "TransientStoreError: ..."}

Writing: :class:`HistoryWriter` appends to a file opened with ``O_APPEND`` and
writes each event as one ``write()`` of one line, so threads and processes can
share one file on a local filesystem: each event lands whole (not over NFS).
:class:`Recorder` wraps a collection or a table and writes one ``outcome`` event
per outcome.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Final, Protocol

from .._errors import FencingError, InvalidInput, StoreError
from .._store import Collection, Store, Table
from .._values import (
    Committed,
    Contended,
    Duplicate,
    Fenced,
    Intent,
    Outcome,
    Record,
    Skipped,
    Stale,
)

if TYPE_CHECKING:
    from .._policy import StalePolicy
    from .._store import Lease

__all__ = [
    "LEASE_ACTIONS",
    "OUTCOMES",
    "EventSink",
    "HistoryError",
    "HistoryWriter",
    "MemoryHistory",
    "Recorder",
    "final_event",
    "outcome_event",
    "write_final",
]

#: The outcome names an ``outcome`` event may carry.
OUTCOMES: Final = (
    "committed",
    "stale",
    "duplicate",
    "fenced",
    "missing",
    "skipped",
    "contended",
)
#: The actions a ``lease`` event may carry.
LEASE_ACTIONS: Final = ("acquire", "release", "lost")

Event = dict[str, Any]


class HistoryError(InvalidInput):
    """A history that cannot be read: not JSON, or an event with missing or wrong fields."""


class EventSink(Protocol):
    """Anything events can be written to: :class:`HistoryWriter`, :class:`MemoryHistory`."""

    def write(self, event: Mapping[str, Any]) -> None: ...


def _line(event: Mapping[str, Any]) -> bytes:
    try:
        text = json.dumps(event, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise HistoryError(f"event is not JSON-serialisable: {exc}") from exc
    return (text + "\n").encode()


class HistoryWriter:
    """Appends events to a JSON Lines file; safe to share between threads and processes.

    The file is opened with ``O_APPEND`` and each event is written by one
    ``write()`` of one whole line, so events from many threads, or from many
    processes that each open the same path, never interleave within a line.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self._fd: int | None = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"<HistoryWriter {self.path!r}>"

    def write(self, event: Mapping[str, Any]) -> None:
        data = _line(event)
        with self._lock:
            if self._fd is None:
                raise HistoryError(f"history {self.path!r} is closed")
            written = os.write(self._fd, data)
            while written < len(data):  # pragma: no cover - only on a full disk or a signal
                written += os.write(self._fd, data[written:])

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def __enter__(self) -> HistoryWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class MemoryHistory:
    """Events kept in a list (``.events``), for tests and in-process checks."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self._lock = threading.Lock()

    def write(self, event: Mapping[str, Any]) -> None:
        copy = json.loads(_line(event))  # the same JSON a file would hold
        with self._lock:
            self.events.append(copy)


def _open_sink(sink: EventSink | str | os.PathLike[str]) -> tuple[EventSink, bool]:
    if isinstance(sink, str | os.PathLike):
        return HistoryWriter(sink), True
    if not callable(getattr(sink, "write", None)):
        raise InvalidInput(f"sink must be a path or have write(event), not {type(sink).__name__}")
    return sink, False


def _current(outcome: Outcome) -> Record | None:
    if isinstance(outcome, Committed | Duplicate):
        return outcome.record
    if isinstance(outcome, Stale | Fenced | Contended | Skipped):
        return outcome.current
    return None


def outcome_event(
    outcome: Outcome,
    intent: Intent,
    *,
    worker: str,
    token: int | None = None,
    versioned: bool = True,
    t: float | None = None,
) -> Event:
    """The ``outcome`` event for a fencing outcome of ``intent``.

    ``versioned=False`` for a table without a version column (versions are not
    meaningful there and are written as null).
    """
    used = getattr(outcome, "intent", None) or intent  # a Recompute commits a derived intent
    record = _current(outcome)
    version = record.version if record is not None and versioned else None
    applied_over = None
    if isinstance(outcome, Committed) and version is not None:
        applied_over = version - 1  # a guarded write replaces exactly the version before
    event: Event = {
        "event": "outcome",
        "t": time.time() if t is None else t,
        "worker": worker,
        "collection": used.collection,
        "key": used.key,
        "intent_id": used.id,
        "root_id": used.root_id,
        "transition": used.transition,
        "expected_version": used.expected_version,
        "outcome": outcome.kind,
        "version": version,
        "applied_over": applied_over,
        "token": token,
        "fence": record.fence if record is not None else None,
    }
    if used.decided_at:
        event["decided_at"] = used.decided_at
    if isinstance(outcome, Fenced):
        event["reason"] = outcome.reason.value
    if isinstance(outcome, Contended):
        event["attempts"] = outcome.attempts
    return event


def final_event(collection: str, key: str | int, record: Record | None) -> Event:
    """The ``final`` event for a key whose record is ``record`` (None: it is gone)."""
    return {
        "event": "final",
        "collection": collection,
        "key": key,
        "version": record.version if record is not None else None,
        "fence": record.fence if record is not None else None,
        "state": dict(record.state) if record is not None else None,
    }


def write_final(
    sink: EventSink,
    source: Collection | Table | Store,
    keys: Iterable[str | int] | Iterable[tuple[str, str | int]],
) -> int:
    """Write a ``final`` event per key with the store's current content; returns how many.

    ``source`` is a collection or table (``keys`` are its keys), or a store
    (``keys`` are ``(collection, key)`` pairs).
    """
    count = 0
    for item in keys:
        if isinstance(source, Store):
            if not (isinstance(item, tuple) and len(item) == 2):
                raise InvalidInput("with a store, keys must be (collection, key) pairs")
            name, key = item
            target: Collection | Table = source.collection(name)
        else:
            if isinstance(item, tuple):
                raise InvalidInput("with a collection or table, keys must be plain keys")
            target, key = source, item
        event = final_event(target.name, key, target.get(key))
        if target.target.version_column is None:
            event["version"] = None  # a table without versions: nothing to chain
        sink.write(event)
        count += 1
    return count


class Recorder:
    """A collection or table that writes one ``outcome`` event per outcome.

    ``Recorder(orders, HistoryWriter("history.jsonl"), worker="w1")`` has the same
    ``commit``, ``apply`` and ``commit_many`` as ``orders`` and returns the same
    outcomes. It keeps no state of its own besides the sink: share it between
    threads freely; in other processes, open a :class:`HistoryWriter` on the same
    path. A commit that raises is recorded as an ``error`` event and re-raised.
    """

    def __init__(
        self,
        target: Collection | Table,
        sink: EventSink | str | os.PathLike[str],
        *,
        worker: str = "",
    ) -> None:
        if not isinstance(target, Collection | Table):
            raise InvalidInput(
                f"Recorder wraps a Collection or a Table, not {type(target).__name__}"
            )
        self.target = target
        self.sink, self._owns_sink = _open_sink(sink)
        self.worker = worker or f"pid{os.getpid()}"
        self._versioned = target.target.version_column is not None

    def __repr__(self) -> str:
        return f"<Recorder {self.target!r} worker={self.worker!r}>"

    @property
    def name(self) -> str:
        return self.target.name

    # -- reads pass straight through --------------------------------------------
    def get(self, key: str | int) -> Record | None:
        return self.target.get(key)

    def intent(
        self, key: str | int, transition: str, *, guard: Mapping[str, Any] | None = None
    ) -> Intent:
        return self.target.intent(key, transition, guard=guard)

    # -- writes are recorded ------------------------------------------------------
    def _record(self, outcome: Outcome, intent: Intent, lease: Lease | None) -> Outcome:
        self.sink.write(
            outcome_event(
                outcome,
                intent,
                worker=self.worker,
                token=lease.token if lease is not None else None,
                versioned=self._versioned,
            )
        )
        return outcome

    def _error(self, intent: object, exc: FencingError) -> None:
        if not isinstance(intent, Intent):
            return  # refused before anything could be written: nothing to record
        self.sink.write(
            {
                "event": "error",
                "t": time.time(),
                "worker": self.worker,
                "collection": intent.collection,
                "key": intent.key,
                "intent_id": intent.id,
                "root_id": intent.root_id,
                "error": f"{type(exc).__name__}: {exc}",
            }
        )

    def _guarded(self, intent: object, call: Callable[[], Outcome]) -> Outcome:
        try:
            return call()
        except StoreError as exc:
            self._error(intent, exc)
            raise

    def commit(
        self, intent: Intent, state: Mapping[str, Any], *, lease: Lease | None = None
    ) -> Outcome:
        outcome = self._guarded(intent, lambda: self.target.commit(intent, state, lease=lease))
        return self._record(outcome, intent, lease)

    def apply(
        self,
        intent: Intent,
        decide: Callable[[Record], Any],
        *,
        on_stale: StalePolicy | None = None,
        lease: Lease | None = None,
    ) -> Outcome:
        outcome = self._guarded(
            intent, lambda: self.target.apply(intent, decide, on_stale=on_stale, lease=lease)
        )
        return self._record(outcome, intent, lease)

    def commit_many(
        self,
        items: Iterable[tuple[Intent, Mapping[str, Any]]],
        *,
        lease: Lease | None = None,
    ) -> list[Outcome]:
        pairs = list(items)
        try:
            outcomes = self.target.commit_many(pairs, lease=lease)
        except StoreError as exc:
            for intent, _ in pairs:
                self._error(intent, exc)
            raise
        for (intent, _), outcome in zip(pairs, outcomes, strict=True):
            self._record(outcome, intent, lease)
        return outcomes

    def write_final(self, keys: Iterable[str | int]) -> int:
        """Write the ``final`` event of each key (see :func:`write_final`)."""
        return write_final(self.sink, self.target, keys)

    def close(self) -> None:
        """Close the sink if the recorder opened it (it was given a path)."""
        if self._owns_sink and isinstance(self.sink, HistoryWriter):
            self.sink.close()

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
