"""``fencing demo``: the same seeded race run twice, naive and with fencing, then judged.

The race. Tasks come from a queue (a broker in this process) with seeded random
delivery delays, so they arrive out of order; some are delivered twice; some
workers "crash" between their commit and the ack, so the task is delivered again
after its commit landed; and some workers pause (a GC pause, a swap storm) past
their lease while another worker takes the lease over and commits. Every task
carries the intent captured when it was enqueued (``Intent.to_json`` in the
message). Two kinds of work, on a few keys each:

- ``accounts``: credits, commutative: fencing re-decides a stale credit against
  the current balance (``Recompute``).
- ``orders``: ship / cancel / reopen decisions, taken at enqueue time from the
  order's status: fencing drops a stale decision (``Drop``).

The two runs share the store, the schedule and the leases; they differ in one
thing, the write:

- naive: read the record, compute, write the result back whatever the record
  holds by then (a plain ORM ``save()``); it never looks at the version the task
  was decided against. On a backend-neutral store that unconditional write is done
  by writing at the version found just before, until it lands; its history records
  the version it really overwrote.
- fencing: ``apply`` with the intent from the message, under the lease when the
  task holds one.

Both runs record a history (``fencing.testing``) and the checker judges both. The
exit status is 0 only if the fencing run shows no anomaly.
"""

from __future__ import annotations

import argparse
import heapq
import json
import os
import queue
import random
import shutil
import signal
import tempfile
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Final, Protocol

from ._errors import ConfigurationError, InvalidInput, LeaseHeld, LeaseLost

if TYPE_CHECKING:
    from ._store import Collection, Lease, Store
    from ._values import Intent, Outcome, Record
    from .testing import HistoryWriter, Report

__all__ = ["DemoConfig", "TaskSpec", "add_arguments", "make_schedule", "run", "run_demo"]

MODES: Final = ("naive", "fencing")
TITLES: Final = {"naive": "naive read-modify-write", "fencing": "fencing"}

LEASE_TTL: Final = 0.3  # seconds; short, so a pause outlives it
LEASE_WAIT: Final = 2.0  # how long a worker waits for a held lease before giving the task back
PAUSE: Final = (0.9, 1.2)  # a paused worker sleeps this long inside its critical section
TAKEOVER_AFTER: Final = 0.05  # the takeover arrives this long after the pause began
RATE: Final = 60.0  # tasks enqueued per second
MAX_DELIVERIES: Final = 12  # a task is given up after this many deliveries
RECOMPUTE_ATTEMPTS: Final = 12
RUN_TIMEOUT: Final = 600.0

ORDER_STEPS: Final = {"ship": "shipped", "cancel": "cancelled", "reopen": "open"}


# -- the schedule --------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class TaskSpec:
    """One task of the seeded schedule (the same in both runs)."""

    task: int
    kind: str  # "accounts" (credit) or "orders" (decision)
    key: str
    enqueue_at: float  # seconds from the start of the run
    delay: float  # delivery delay: tasks arrive out of order
    work: float  # time the worker spends deciding
    amount: int  # a credit's amount
    choice: float  # which decision the producer takes for an open order
    duplicate: float | None  # a second delivery this long after the first, or None
    crash: bool  # the first delivery crashes between commit and ack
    leased: bool  # the worker holds the key's lease
    pause: float  # the first delivery pauses this long inside its critical section
    takes_over: int | None = None  # delivered once this (paused) task's worker has paused


def make_schedule(seed: int, tasks: int, keys: int) -> list[TaskSpec]:
    """The seeded schedule: the same tasks, delays and faults for every run."""
    rng = random.Random(seed)
    specs: list[TaskSpec] = []
    pauses = max(1, tasks // 40)
    span = range(5, max(6, tasks - 2 * pauses - 5))  # loop steps; a pause adds two tasks
    pause_at = set(rng.sample(span, min(pauses, len(span))))
    paused = 0
    i = 0
    while len(specs) < tasks:
        kind = "accounts" if rng.random() < 0.55 else "orders"
        pausing = i in pause_at and len(specs) + 2 <= tasks
        if pausing:  # pauses alternate: a credit (recomputed), then a decision (dropped)
            kind = ("accounts", "orders")[paused % 2]
            paused += 1
        key = f"{kind[0]}-{rng.randrange(keys) + 1}"
        at = i / RATE
        delay = rng.uniform(0.0, 0.15)
        common: dict[str, Any] = {
            "kind": kind,
            "key": key,
            "enqueue_at": at,
            "work": rng.uniform(0.005, 0.04),
            "amount": rng.randrange(1, 100),
            "choice": rng.random(),
        }
        if pausing:
            # a worker pauses past its lease; another takes the key's lease over
            pause = rng.uniform(*PAUSE)
            specs.append(
                TaskSpec(
                    task=len(specs),
                    delay=delay,
                    duplicate=None,
                    crash=False,
                    leased=True,
                    pause=pause,
                    **common,
                )
            )
            common = {**common, "amount": rng.randrange(1, 100), "choice": rng.random()}
            specs.append(
                TaskSpec(
                    task=len(specs),
                    delay=TAKEOVER_AFTER,
                    duplicate=None,
                    crash=False,
                    leased=True,
                    pause=0.0,
                    takes_over=len(specs) - 1,
                    **common,
                )
            )
        else:
            specs.append(
                TaskSpec(
                    task=len(specs),
                    delay=delay,
                    duplicate=rng.uniform(0.0, 0.25) if rng.random() < 0.08 else None,
                    crash=rng.random() < 0.06,
                    leased=rng.random() < 0.2,
                    pause=0.0,
                    **common,
                )
            )
        i += 1
    return specs


# -- what the workers do ---------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class WorkerSettings:
    """What a worker needs, picklable for worker processes."""

    mode: str
    url: str
    history: str


class _Inbox(Protocol):
    def get(self) -> Any: ...


class _Outbox(Protocol):
    def put(self, item: Any) -> None: ...


def order_step(state: Mapping[str, Any], transition: str) -> dict[str, Any]:
    """An order's state after ``transition`` (applied as asked: no questions)."""
    cycle = int(state.get("cycle", 0)) + (1 if transition == "reopen" else 0)
    return {"status": ORDER_STEPS[transition], "cycle": cycle}


def order_allows(status: object, transition: str) -> bool:
    if transition == "reopen":
        return status in ("shipped", "cancelled")
    return status == "open"


def choose_transition(state: Mapping[str, Any], choice: float) -> str:
    """The decision the producer takes from the order's status when it enqueues."""
    if state.get("status") == "open":
        return "ship" if choice < 0.6 else "cancel"
    return "reopen"


def credit(state: Mapping[str, Any], amount: int) -> dict[str, Any]:
    return {
        "balance": int(state.get("balance", 0)) + amount,
        "credits": int(state.get("credits", 0)) + 1,
    }


def task_message(spec: TaskSpec, intent: Intent) -> dict[str, Any]:
    """The message of a task: the intent captured at enqueue time and the task's work."""
    return {
        "task": spec.task,
        "kind": spec.kind,
        "intent": intent.to_json(),
        "amount": spec.amount,
        "work": spec.work,
        "leased": spec.leased,
        "pause": spec.pause,
        "crash": spec.crash,
    }


def collection_name(run_id: str, mode: str, kind: str) -> str:
    return f"demo.{run_id}.{mode}.{kind}"


def create_records(
    store: Store, specs: list[TaskSpec], run_id: str, mode: str
) -> tuple[dict[str, Collection], dict[str, list[str]]]:
    """A run's two collections, with every key of the schedule created; and the keys."""
    kinds = ("accounts", "orders")
    collections = {kind: store.collection(collection_name(run_id, mode, kind)) for kind in kinds}
    keys = {kind: sorted({s.key for s in specs if s.kind == kind}) for kind in kinds}
    for key in keys["accounts"]:
        collections["accounts"].create(key, {"balance": 0, "credits": 0})
    for key in keys["orders"]:
        collections["orders"].create(key, {"status": "open", "cycle": 0})
    return collections, keys


def capture_intent(collections: Mapping[str, Collection], spec: TaskSpec) -> Intent:
    """The producer's decision: the intent, captured now, from the record as it is now."""
    record = collections[spec.kind].get(spec.key)
    assert record is not None
    if spec.kind == "accounts":
        return record.intent("credit")
    return record.intent(choose_transition(record.state, spec.choice))


def finish_run(
    result: RunResult,
    writer: HistoryWriter,
    collections: Mapping[str, Collection],
    keys: Mapping[str, list[str]],
    credited: list[TaskSpec],
) -> None:
    """Final events, the balance against the credits expected, and the checker's report."""
    from .testing import check_file, write_final

    for kind, target in collections.items():
        write_final(writer, target, keys[kind])
    writer.close()
    for key in keys["accounts"]:
        record = collections["accounts"].get(key)
        result.balance += int(record.state["balance"]) if record is not None else 0
    result.expected_balance = sum(s.amount for s in credited)
    result.report = check_file(result.history)


class Worker:
    """Handles one delivery at a time; the same code in a thread or a process."""

    def __init__(
        self, name: str, settings: WorkerSettings, store: Store, writer: HistoryWriter
    ) -> None:
        self.name = name
        self.settings = settings
        self.store = store
        self.writer = writer
        self.outbox: _Outbox | None = None

    def loop(self, inbox: _Inbox, outbox: _Outbox) -> None:
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
        from ._values import Intent

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
        from . import SKIP, Contended, Drop, Fenced, Recompute
        from .testing import Recorder

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
        record = collection.get(intent.key)
        if record is None:
            return True
        first_call = [True]
        self._think(message, first_call)
        if message["kind"] == "accounts":
            state = credit(record.state, int(message["amount"]))
            decided_against: int | None = record.version  # it re-read, then computed
        else:
            state = order_step(record.state, intent.transition)
            decided_against = intent.expected_version  # the decision taken at enqueue
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
            }
        )
        return True


def _process_main(name: str, settings: WorkerSettings, inbox: _Inbox, outbox: _Outbox) -> None:
    """A worker process: its own store connection and its own append handle."""
    import fencing
    from fencing.testing import HistoryWriter

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops us on Ctrl-C
    store = fencing.open(settings.url, migrate=False)
    writer = HistoryWriter(settings.history)
    try:
        outbox.put((-1, "ready", name))
        Worker(name, settings, store, writer).loop(inbox, outbox)
    finally:
        writer.close()
        store.close()


# -- the broker --------------------------------------------------------------------------
@dataclass
class RunResult:
    """One run: what the broker saw, and the checker's report of its history."""

    mode: str
    tasks: int
    deliveries: int = 0
    duplicates: int = 0
    crashes: int = 0
    retries: int = 0
    gave_up: int = 0
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0
    balance: int = 0
    expected_balance: int = 0
    report: Report | None = None
    history: str = ""
    run_id: str = ""

    @property
    def drift(self) -> int:
        return self.balance - self.expected_balance

    def to_dict(self) -> dict[str, Any]:
        report = self.report
        return {
            "mode": self.mode,
            "tasks": self.tasks,
            "deliveries": self.deliveries,
            "duplicate_deliveries": self.duplicates,
            "crashes": self.crashes,
            "redeliveries": self.retries,
            "gave_up": self.gave_up,
            "errors": len(self.errors),
            "first_errors": self.errors[:3],
            "seconds": round(self.seconds, 3),
            "balance": self.balance,
            "expected_balance": self.expected_balance,
            "balance_drift": self.drift,
            "outcomes": dict(report.outcomes) if report else {},
            "anomalies": report.counts if report else {},
            "ok": bool(report and report.ok),
            "examples": report.to_dict(3)["examples"] if report else {},
            "history": self.history,
            "run_id": self.run_id,
        }


class Broker:
    """Delivers messages when due (out of order), duplicates and redelivers them."""

    def __init__(
        self,
        specs: list[TaskSpec],
        capture: Callable[[TaskSpec], dict[str, Any]],
        inbox: _Outbox,
        seed: int,
        on_progress: Callable[[int], None],
    ) -> None:
        self.specs = specs
        self.capture = capture
        self.inbox = inbox
        self.rng = random.Random(seed ^ 0x5EED)
        self.on_progress = on_progress
        self.heap: list[tuple[float, int, dict[str, Any]]] = []
        self.seq = 0
        self.messages: dict[int, dict[str, Any]] = {}
        self.outstanding: dict[int, int] = {}
        self.delivered: dict[int, int] = {}
        self.completed = 0
        # takeover tasks held until the paused task's worker has paused (or answered)
        self.held: dict[int, list[tuple[float, dict[str, Any]]]] = {}
        self.released: set[int] = set()

    def _release(self, task: int, now: float) -> None:
        self.released.add(task)
        for delay, message in self.held.pop(task, []):
            self._push(now + delay, message)

    def _push(self, at: float, message: dict[str, Any]) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (at, self.seq, message))
        task = message["task"]
        self.outstanding[task] = self.outstanding.get(task, 0) + 1

    def run(self, outbox: queue.Queue[Any] | Any, result: RunResult) -> None:
        start = time.monotonic()
        pending = iter(self.specs)
        upcoming = next(pending, None)
        while self.completed < len(self.specs):
            now = time.monotonic() - start
            if now > RUN_TIMEOUT:
                raise TimeoutError(f"the {result.mode} run did not finish in {RUN_TIMEOUT:.0f}s")
            while upcoming is not None and upcoming.enqueue_at <= now:
                message = self.capture(upcoming)
                self.messages[upcoming.task] = message
                first = {**message, "first": True}
                paused = upcoming.takes_over
                if paused is not None and paused not in self.released:
                    self.held.setdefault(paused, []).append((upcoming.delay, first))
                else:
                    self._push(now + upcoming.delay, first)
                if upcoming.duplicate is not None:
                    result.duplicates += 1
                    self._push(
                        now + upcoming.delay + upcoming.duplicate, {**message, "first": False}
                    )
                upcoming = next(pending, None)
            while self.heap and self.heap[0][0] <= now:
                _, _, message = heapq.heappop(self.heap)
                task = message["task"]
                self.delivered[task] = self.delivered.get(task, 0) + 1
                result.deliveries += 1
                self.inbox.put(message)
            due = [self.heap[0][0]] if self.heap else []
            if upcoming is not None:
                due.append(upcoming.enqueue_at)
            wait = min([0.02, *(d - now for d in due)])
            try:
                answer = outbox.get(timeout=max(0.001, wait))
            except queue.Empty:
                continue
            self._answer(answer, time.monotonic() - start, result)
            while True:
                try:
                    answer = outbox.get_nowait()
                except queue.Empty:
                    break
                self._answer(answer, time.monotonic() - start, result)
        result.seconds = time.monotonic() - start

    def _answer(self, answer: tuple[int, str, str], now: float, result: RunResult) -> None:
        task, verdict, detail = answer
        if task < 0:
            return
        self._release(task, now)
        if verdict == "paused":
            return
        self.outstanding[task] -= 1
        if verdict == "error":
            result.errors.append(detail)
        if verdict in ("crash", "retry", "error"):
            if verdict == "crash":
                result.crashes += 1
            if self.delivered[task] + self.outstanding[task] < MAX_DELIVERIES:
                result.retries += 1
                later = self.rng.uniform(0.05, 0.3 if verdict == "crash" else 0.15)
                self._push(now + later, {**self.messages[task], "first": False})
            else:
                result.gave_up += 1
        if self.outstanding[task] == 0:
            self.completed += 1
            self.on_progress(1)


# -- running the two modes ---------------------------------------------------------------
@dataclass(frozen=True)
class DemoConfig:
    seed: int = 7
    tasks: int = 400
    workers: int = 8
    keys: int = 4
    store: str | None = None
    processes: bool = False
    history_dir: str | None = None
    queue: str | None = None  # celery, rq, dramatiq or arq: real worker processes of that queue
    broker: str | None = None  # the queue's broker URL (default: a local Redis database)


QUEUES: Final = ("celery", "rq", "dramatiq", "arq")
QUEUE_DEFAULTS: Final = {"tasks": 120, "workers": 4}


def _validate(config: DemoConfig) -> None:
    for name, low, high in (("tasks", 10, 100_000), ("workers", 1, 64), ("keys", 1, 1000)):
        value = getattr(config, name)
        if not low <= value <= high:
            raise InvalidInput(f"--{name} must be from {low} to {high}, not {value}")
    if config.queue is not None and config.queue not in QUEUES:
        raise InvalidInput(f"--queue must be one of {', '.join(QUEUES)}, not {config.queue!r}")
    if config.broker is not None and config.queue is None:
        raise InvalidInput("--broker needs --queue")
    if config.queue is not None and config.processes:
        raise InvalidInput("--queue runs worker processes of its own: drop --processes")
    shared = "--queue" if config.queue is not None else "--processes" if config.processes else ""
    if shared and config.store is not None:
        lowered = config.store.lower()
        if lowered.startswith("memory:") or ":memory:" in lowered:
            raise ConfigurationError(
                f"{shared} needs a store shared between processes: a file"
                " (sqlite:///demo.db) or a server, not an in-memory store"
            )


def _run_mode(
    mode: str,
    config: DemoConfig,
    specs: list[TaskSpec],
    store: Store,
    url: str,
    history: str,
    run_id: str,
    on_progress: Callable[[int], None],
) -> RunResult:
    from .testing import HistoryWriter

    collections, keys = create_records(store, specs, run_id, mode)

    def capture(spec: TaskSpec) -> dict[str, Any]:
        return task_message(spec, capture_intent(collections, spec))

    settings = WorkerSettings(mode, url, history)
    result = RunResult(mode, len(specs), history=history)
    with HistoryWriter(history) as writer:
        pool = _Pool(config, settings, store, writer)
        try:
            Broker(specs, capture, pool.inbox, config.seed, on_progress).run(pool.outbox, result)
        finally:
            pool.stop()
        finish_run(result, writer, collections, keys, [s for s in specs if s.kind == "accounts"])
    return result


class _Pool:
    """The workers of one run: threads sharing the store, or processes of their own."""

    def __init__(
        self, config: DemoConfig, settings: WorkerSettings, store: Store, writer: HistoryWriter
    ) -> None:
        import multiprocessing

        self.size = config.workers
        self.threads: list[threading.Thread] = []
        self.procs: list[Any] = []
        self.shared = config.processes
        self.inbox: Any
        self.outbox: Any
        if not config.processes:
            self.inbox, self.outbox = queue.Queue(), queue.Queue()
            for n in range(self.size):
                worker = Worker(f"{settings.mode}-t{n + 1}", settings, store, writer)
                thread = threading.Thread(
                    target=worker.loop,
                    args=(self.inbox, self.outbox),
                    name=f"fencing-demo-{settings.mode}-{n + 1}",
                    daemon=True,
                )
                thread.start()
                self.threads.append(thread)
            return
        ctx = multiprocessing.get_context("spawn")
        self.inbox, self.outbox = ctx.Queue(), ctx.Queue()
        try:
            for n in range(self.size):
                proc = ctx.Process(
                    target=_process_main,
                    args=(f"{settings.mode}-p{n + 1}", settings, self.inbox, self.outbox),
                    name=f"fencing-demo-{settings.mode}-{n + 1}",
                    daemon=True,
                )
                proc.start()
                self.procs.append(proc)
            self._wait_ready()
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self) -> None:
        ready = 0
        deadline = time.monotonic() + 60.0
        while ready < self.size:
            try:
                task, verdict, _ = self.outbox.get(timeout=0.5)
            except queue.Empty:
                if time.monotonic() > deadline or not all(p.is_alive() for p in self.procs):
                    raise RuntimeError("the demo's worker processes failed to start") from None
                continue
            if task < 0 and verdict == "ready":
                ready += 1

    def stop(self) -> None:
        for _ in range(self.size):
            self.inbox.put(None)
        for thread in self.threads:
            thread.join(timeout=30.0)
        for proc in self.procs:
            proc.join(timeout=30.0)
            if proc.is_alive():  # pragma: no cover - a stuck worker process of ours
                proc.terminate()
                proc.join()
        if self.shared:
            for q in (self.inbox, self.outbox):
                q.close()
                q.join_thread()


def run_demo(
    config: DemoConfig,
    on_start: Callable[[str, int], None] | None = None,
    on_progress: Callable[[str, int], None] | None = None,
) -> dict[str, RunResult]:
    """Run the schedule naive, then with fencing; returns each run's result."""
    import fencing

    _validate(config)
    if config.queue is not None:
        from ._queue_demo import run_queue_demo

        return run_queue_demo(config, on_start, on_progress)
    specs = make_schedule(config.seed, config.tasks, config.keys)
    temp = tempfile.mkdtemp(prefix="fencing-demo-")
    try:
        url = config.store or f"sqlite:///{os.path.join(temp, 'demo.db')}"
        history_dir = config.history_dir or temp
        os.makedirs(history_dir, exist_ok=True)
        run_id = uuid.uuid4().hex[:8]
        results: dict[str, RunResult] = {}
        with fencing.open(url) as store:
            for mode in MODES:
                history = os.path.join(history_dir, f"{mode}.jsonl")
                if os.path.exists(history):
                    os.remove(history)
                if on_start is not None:
                    on_start(mode, len(specs))

                def progress(n: int, mode: str = mode) -> None:
                    if on_progress is not None:
                        on_progress(mode, n)

                results[mode] = _run_mode(
                    mode, config, specs, store, url, history, run_id, progress
                )
                if config.history_dir is None:
                    results[mode].history = ""
        return results
    finally:
        shutil.rmtree(temp, ignore_errors=True)


# -- the command ---------------------------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = DemoConfig()
    parser.add_argument("--seed", type=int, default=defaults.seed, help="schedule seed")
    parser.add_argument(
        "--tasks",
        type=int,
        help=f"tasks per run (default {defaults.tasks}; {QUEUE_DEFAULTS['tasks']} with --queue)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        help=f"workers per run (default {defaults.workers};"
        f" {QUEUE_DEFAULTS['workers']} worker processes with --queue)",
    )
    parser.add_argument(
        "--keys", type=int, default=defaults.keys, help="accounts and orders raced over (each)"
    )
    parser.add_argument(
        "--store",
        metavar="URL",
        help="store URL (default: a temporary SQLite file, sqlite:///...)",
    )
    parser.add_argument(
        "--processes",
        action="store_true",
        help="workers are real processes sharing the store (a file or a server)",
    )
    parser.add_argument("--history", metavar="DIR", help="keep naive.jsonl and fencing.jsonl here")
    parser.add_argument(
        "--queue",
        choices=QUEUES,
        help="run the schedule through this task queue, with real worker processes",
    )
    parser.add_argument(
        "--broker",
        metavar="URL",
        help="the queue's broker (default redis://127.0.0.1:6379/10; celery and dramatiq"
        " also take amqp://guest:guest@127.0.0.1:5672//)",
    )
    parser.add_argument("--json", action="store_true", help="machine output: no table, no bar")


def _config(args: argparse.Namespace) -> DemoConfig:
    defaults: Mapping[str, int] = asdict(DemoConfig())
    if args.queue is not None:
        defaults = QUEUE_DEFAULTS
    return DemoConfig(
        seed=args.seed,
        tasks=defaults["tasks"] if args.tasks is None else args.tasks,
        workers=defaults["workers"] if args.workers is None else args.workers,
        keys=args.keys,
        store=args.store,
        processes=args.processes,
        history_dir=args.history,
        queue=args.queue,
        broker=args.broker,
    )


def _summary(config: DemoConfig, results: dict[str, RunResult]) -> dict[str, Any]:
    fencing_report = results["fencing"].report
    ok = bool(fencing_report is not None and fencing_report.ok)
    return {
        "ok": ok,
        "config": asdict(config),
        "lease_ttl": LEASE_TTL,
        "runs": {mode: result.to_dict() for mode, result in results.items()},
    }


def run(args: argparse.Namespace) -> int:
    config = _config(args)
    _validate(config)
    if args.json:
        results = run_demo(config)
        summary = _summary(config, results)
        print(json.dumps(summary, indent=2, sort_keys=True))
        return 0 if summary["ok"] else 1
    return _run_rich(config)


def _intro(config: DemoConfig, specs: list[TaskSpec]) -> str:
    paused = sum(1 for s in specs if s.pause > 0)
    if config.queue is not None:
        from ._queue_demo import intro

        return intro(config, specs)
    where = "processes" if config.processes else "threads"
    return (
        f"Racing {len(specs)} tasks on {config.workers} worker {where} over {config.keys}"
        f" accounts (credits) and {config.keys} orders (ship/cancel decisions): random delays,"
        f" reordering, duplicate deliveries, crashes between commit and ack, and {paused}"
        f" workers paused past their {LEASE_TTL:g}s lease. The same seeded schedule"
        f" (seed {config.seed}) runs twice: naive read-modify-write, then fencing."
    )


def _run_rich(config: DemoConfig) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    console = Console()
    if config.queue is not None:  # a missing extra or a broker down: say so before anything
        from ._queue_demo import preflight

        preflight(config)
    specs = make_schedule(config.seed, config.tasks, config.keys)
    console.print(_intro(config, specs))
    if config.store:
        console.print(f"[dim]store: {config.store}[/]")
    if config.queue is not None:
        from ._queue_demo import shown_broker

        console.print(f"[dim]broker: {shown_broker(config)}[/]")
    progress = Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    )
    bars: dict[str, Any] = {}

    def on_start(mode: str, total: int) -> None:
        bars[mode] = progress.add_task(f"{TITLES[mode]:>24}", total=total)

    def on_progress(mode: str, n: int) -> None:
        progress.advance(bars[mode], n)

    with progress:
        results = run_demo(config, on_start, on_progress)
    console.print(_table(results))
    for mode, result in results.items():
        for error in result.errors[:3]:
            console.print(f"[yellow]{mode} worker error:[/] {error}")
        if result.history:
            console.print(f"[dim]{mode} history: {result.history}[/]")
    return _verdict(console, results)


def _table(results: dict[str, RunResult]) -> Any:
    from rich.table import Table

    from .testing import ANOMALY_KINDS, LABELS

    table = Table(title="the same schedule, judged by the history checker")
    table.add_column("")
    for mode in MODES:
        table.add_column(TITLES[mode], justify="right")

    def cell(value: int, bad: bool = False) -> str:
        if bad and value:
            return f"[bold red]{value}[/]"
        return f"[green]{value}[/]" if bad else str(value)

    def row(label: str, values: list[str]) -> None:
        table.add_row(label, *values)

    runs = [results[m] for m in MODES]
    reports = [r.report for r in runs]
    row("tasks", [str(r.tasks) for r in runs])
    row("deliveries", [str(r.deliveries) for r in runs])
    for name, label in (
        ("committed", "committed"),
        ("stale", "stale (refused)"),
        ("duplicate", "duplicate (refused)"),
        ("fenced", "fenced (refused)"),
    ):
        row(label, [str(rep.outcomes[name]) if rep else "-" for rep in reports])
    table.add_section()
    labels = {"fence_regression": "fence regressions (zombie overwrites)"}
    for kind in ANOMALY_KINDS:
        row(
            labels.get(kind, LABELS[kind]),
            [cell(rep.counts[kind], bad=True) if rep else "-" for rep in reports],
        )
    row("account balance drift", [cell(r.drift, bad=True) for r in runs])
    if any(r.gave_up for r in runs):
        row("tasks given up", [cell(r.gave_up, bad=True) for r in runs])
    return table


def _verdict(console: Any, results: dict[str, RunResult]) -> int:
    naive, fenced = results["naive"], results["fencing"]
    assert naive.report is not None and fenced.report is not None
    if not fenced.report.ok:
        console.print(
            f"[bold red]FAIL[/]: the fencing run shows anomalies: {fenced.report.summary()}"
        )
        return 1
    console.print(
        "[bold green]PASS[/]: the fencing run has no anomaly: no decision committed over a"
        " newer version, none twice, no zombie write, nothing acknowledged lost."
    )
    if naive.report.ok:
        console.print(
            "[yellow]The naive run shows no anomaly on this schedule either: try more --tasks.[/]"
        )
    else:
        console.print(f"The naive run on the same schedule: {naive.report.summary()}.")
    return 0
