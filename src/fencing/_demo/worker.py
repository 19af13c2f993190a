"""A demo worker: one delivery at a time, naive or fencing.

The same code runs in a thread or a process of the in-process demo (``broker.Pool``)
and, for the naive run, in a task of a real queue (``queues._tasks``).
"""

from __future__ import annotations

import signal
import time
import traceback
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import fencing

from .. import SKIP, Contended, Drop, Fenced, Recompute
from .._errors import LeaseHeld, LeaseLost
from .._values import Intent
from ..testing import HistoryWriter, Recorder
from .scenario import LEASE_TTL, LEASE_WAIT, RECOMPUTE_ATTEMPTS, credit, order_allows, order_step

if TYPE_CHECKING:
    from .._store import Collection, Lease, Store
    from .._values import Outcome, Record


@dataclass(frozen=True, slots=True)
class WorkerSettings:
    """What a worker needs, picklable for worker processes."""

    mode: str
    url: str
    history: str


class Inbox(Protocol):
    def get(self) -> Any: ...


class Outbox(Protocol):
    def put(self, item: Any) -> None: ...


class Worker:
    """Handles one delivery at a time; the same code in a thread or a process."""

    def __init__(
        self, name: str, settings: WorkerSettings, store: Store, writer: HistoryWriter
    ) -> None:
        self.name = name
        self.settings = settings
        self.store = store
        self.writer = writer
        self.outbox: Outbox | None = None

    def loop(self, inbox: Inbox, outbox: Outbox) -> None:
        self.outbox = outbox
        while True:
            message = inbox.get()
            if message is None:
                return
            try:
                verdict = self.handle(message)
            except Exception as exc:  # a delivery that failed: redeliver, and report it
                detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
                outbox.put((message["task"], "error", detail))
            else:
                outbox.put((message["task"], verdict, ""))

    def _lease_event(self, lease: Lease, action: str) -> None:
        self.writer.write(
            {
                "event": "lease",
                "t": time.time(),
                "name": lease.name,
                "action": action,
                "token": lease.token,
                "owner": self.name,
            }
        )

    def handle(self, message: Mapping[str, Any]) -> str:
        """Process a delivery; ``ack``, ``retry`` (give it back) or ``crash`` (after work)."""
        intent = Intent.from_json(message["intent"])
        collection = self.store.collection(intent.collection)
        lease = None
        if message["leased"]:
            try:
                lease = self.store.acquire(
                    f"{intent.collection}/{intent.key}",
                    owner=self.name,
                    ttl=LEASE_TTL,
                    wait=LEASE_WAIT,
                )
            except LeaseHeld:
                return "retry"
            self._lease_event(lease, "acquire")
        try:
            if self.settings.mode == "fencing":
                done = self._fencing(collection, intent, message, lease)
            else:
                done = self._naive(collection, intent, message, lease)
        finally:
            if lease is not None:
                try:
                    lease.release()
                    self._lease_event(lease, "release")
                except LeaseLost:
                    self._lease_event(lease, "lost")
        if not done:
            return "retry"
        return "crash" if message["first"] and message["crash"] else "ack"

    def _think(self, message: Mapping[str, Any], first_call: list[bool]) -> None:
        """The work of deciding; a paused delivery stalls here, past its lease."""
        seconds = float(message["work"])
        if first_call[0] and message["first"] and message["pause"] > 0:
            seconds += float(message["pause"])
            if self.outbox is not None:  # tell the broker: the takeover may come now
                self.outbox.put((message["task"], "paused", ""))
        first_call[0] = False
        time.sleep(seconds)

    def _fencing(
        self,
        collection: Collection,
        intent: Intent,
        message: Mapping[str, Any],
        lease: Lease | None,
    ) -> bool:
        recorder = Recorder(collection, self.writer, worker=self.name)
        first_call = [True]

        def decide_credit(record: Record) -> Any:
            self._think(message, first_call)
            return credit(record.state, int(message["amount"]))

        def decide_order(record: Record) -> Any:
            self._think(message, first_call)
            if not order_allows(record.state.get("status"), intent.transition):
                return SKIP
            return order_step(record.state, intent.transition)

        outcome: Outcome
        if message["kind"] == "accounts":
            policy = Recompute(attempts=RECOMPUTE_ATTEMPTS, backoff=0.002, max_backoff=0.05)
            outcome = recorder.apply(intent, decide_credit, on_stale=policy, lease=lease)
        else:
            outcome = recorder.apply(intent, decide_order, on_stale=Drop(), lease=lease)
        # Fenced: a newer owner has the key; Contended: try later. Both give the task back.
        return not isinstance(outcome, Fenced | Contended)

    def _naive(
        self,
        collection: Collection,
        intent: Intent,
        message: Mapping[str, Any],
        lease: Lease | None,
    ) -> bool:
        read_at = time.time()
        record = collection.get(intent.key)
        if record is None:
            return True
        first_call = [True]
        self._think(message, first_call)
        if message["kind"] == "accounts":
            state = credit(record.state, int(message["amount"]))
            decided_against: int | None = record.version  # it re-read, then computed
            decided_at = read_at
        else:
            state = order_step(record.state, intent.transition)
            decided_against = intent.expected_version  # the decision taken at enqueue
            decided_at = intent.decided_at
        # The unconditional write: whatever the record holds now is replaced.
        while True:
            current = collection.get(intent.key)
            if current is None:
                return True
            outcome = collection.commit(current.intent("save"), state)
            if outcome.committed:
                break
        written = outcome.current
        assert written is not None
        self.writer.write(
            {
                "event": "outcome",
                "t": time.time(),
                "worker": self.name,
                "collection": intent.collection,
                "key": intent.key,
                "intent_id": intent.id,
                "root_id": intent.root_id,
                "transition": intent.transition,
                "expected_version": decided_against,
                "outcome": "committed",
                "version": written.version,
                "applied_over": current.version,
                "token": lease.token if lease is not None else None,
                "fence": written.fence,
                "decided_at": decided_at,
            }
        )
        return True


def process_main(name: str, settings: WorkerSettings, inbox: Inbox, outbox: Outbox) -> None:
    """A worker process: its own store connection and its own append handle."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops us on Ctrl-C
    store = fencing.open(settings.url, migrate=False)
    writer = HistoryWriter(settings.history)
    try:
        outbox.put((-1, "ready", name))
        Worker(name, settings, store, writer).loop(inbox, outbox)
    finally:
        writer.close()
        store.close()
