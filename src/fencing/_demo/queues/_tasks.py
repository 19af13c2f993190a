"""What the queue demo's worker processes run, whatever the queue.

The demo starts the workers with its settings in the environment (``FENCING_DEMO_*``,
see :class:`Settings`). A message carries only the intent captured when the task was
enqueued; its id names the run, the mode and the task of the seeded schedule
(``<run>.<mode>.t<task>``), and each worker re-makes the same schedule from the seed
to find the task's work (amount, pause, crash, lease).

Every process appends its outcomes to its own history file,
``history-<mode>-<pid>.jsonl`` in the control directory, and the end of every
delivery to the shared ``progress.jsonl`` (one whole line per ``write``, so the
processes never interleave): the demo follows that file, then merges the histories.

- naive: ``run_naive`` reads, decides and writes blindly (``worker.Worker``, the same
  code as the in-process demo);
- fencing: the contrib integration runs ``decide_credit`` / ``decide_order`` through
  ``FencedTask`` (``Recompute`` for credits, ``Drop`` for order decisions, the lease
  without heartbeat when the task is leased), and :func:`on_outcome` records each run.

The first delivery of a task (claimed with an ``O_EXCL`` file, whichever delivery
gets there first) is the one that pauses past its lease, and the one that crashes:
it SIGKILLs its own process after its commit, before the queue's acknowledgement,
and the queue runs the message again (on every queue of the demo, see ``CRASH`` in
each queue's module).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import os
import signal
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import fencing

from ..._values import Intent, Record
from ...contrib._common import (
    Action,
    Backoff,
    LeaseSpec,
    TaskReport,
    current_intent,
    record_lease_name,
)
from ...testing import HistoryWriter, outcome_event
from ..scenario import (
    LEASE_TTL,
    LEASE_WAIT,
    MAX_DELIVERIES,
    RECOMPUTE_ATTEMPTS,
    TaskSpec,
    collection_name,
    credit,
    make_schedule,
    order_allows,
    order_step,
    task_message,
)
from ..worker import Worker, WorkerSettings

ENV_PREFIX: Final = "FENCING_DEMO_"
KINDS: Final = ("accounts", "orders")
#: Bounded retries of a delivery that could not take its lease (``LeaseHeld``).
MAX_RETRIES: Final = MAX_DELIVERIES
BACKOFF: Final = Backoff(0.05, 0.3)
#: No heartbeat: a paused worker stalls its heartbeat too (a GC pause, SIGSTOP).
LEASE: Final = LeaseSpec(ttl=LEASE_TTL, wait=LEASE_WAIT, heartbeat=False)
PING: Final = "ping:"
#: How long a paused delivery waits, after its pause, for the takeover to hold the lease.
TAKEOVER_LIMIT: Final = 10.0


class DemoRetry(Exception):
    """A naive delivery that could not take its lease: the queue retries it."""


@dataclass(frozen=True)
class Settings:
    """One demo run, as the workers see it (through the environment)."""

    run_id: str
    store: str
    control: str
    broker: str
    queue: str
    seed: int
    tasks: int
    keys: int
    crash: bool

    @property
    def prefix(self) -> str:
        """Every broker key and queue of the run carries this."""
        return f"fencing-demo-{self.run_id}"

    def env(self) -> dict[str, str]:
        out = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            out[ENV_PREFIX + f.name.upper()] = str(int(value) if f.type == "bool" else value)
        return out

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            raw = env[ENV_PREFIX + f.name.upper()]
            kind = str(f.type)
            values[f.name] = int(raw) if kind == "int" else raw == "1" if kind == "bool" else raw
        return cls(**values)


def in_worker() -> bool:
    return ENV_PREFIX + "RUN_ID" in os.environ


@functools.cache
def settings() -> Settings:
    return Settings.from_env()


@functools.cache
def _schedule(seed: int, tasks: int, keys: int) -> tuple[TaskSpec, ...]:
    return tuple(make_schedule(seed, tasks, keys))


def intent_id(run_id: str, mode: str, task: int) -> str:
    return f"{run_id}.{mode}.t{task}"


def task_of(intent: Intent) -> tuple[str, TaskSpec]:
    """The mode and the schedule's task an intent was captured for."""
    s = settings()
    _run, mode, task = intent.root_id.split(".")
    return mode, _schedule(s.seed, s.tasks, s.keys)[int(task.removeprefix("t"))]


# -- per-process resources (opened after fork, in the process that uses them) ----------
_lock = threading.Lock()
_stores: dict[int, fencing.Store] = {}
_writers: dict[tuple[int, str], HistoryWriter] = {}


def store() -> fencing.Store:
    with _lock:
        pid = os.getpid()
        if pid not in _stores:
            _stores[pid] = fencing.open(settings().store, migrate=False)
        return _stores[pid]


def _writer(name: str) -> HistoryWriter:
    with _lock:
        key = (os.getpid(), name)
        if key not in _writers:
            _writers[key] = HistoryWriter(Path(settings().control) / name)
        return _writers[key]


def history(mode: str) -> HistoryWriter:
    return _writer(f"history-{mode}-{os.getpid()}.jsonl")


def progress(mode: str, task: int, verdict: str, detail: str = "") -> None:
    """Tell the demo how a delivery ended (ack, retry, crash, gave_up, error, paused)."""
    event = {"mode": mode, "task": task, "verdict": verdict, "pid": os.getpid()}
    if detail:
        event["detail"] = detail
    _writer("progress.jsonl").write(event)


def claim_first(mode: str, task: int) -> bool:
    """True for exactly one delivery of the task: the first to ask, in any process."""
    path = Path(settings().control) / f"first-{mode}-{task}"
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
    except FileExistsError:
        return False
    return True


def crash(mode: str, task: int) -> None:
    """Die here, after the commit and before the queue's acknowledgement."""
    progress(mode, task, "crash")
    os.kill(os.getpid(), signal.SIGKILL)


def ping(payload: str) -> bool:
    """A readiness ping (``ping:<token>``): answer with a file; True if it was one."""
    if not payload.startswith(PING):
        return False
    (Path(settings().control) / f"pong-{payload.removeprefix(PING)}").touch()
    return True


# -- naive: read, decide, write back whatever the record holds by then ---------------------
class _Announcer:
    """The naive worker's outbox: only its "paused" notes go anywhere (to the demo)."""

    def __init__(self, mode: str) -> None:
        self.mode = mode

    def put(self, item: Any) -> None:
        task, verdict, _ = item
        if verdict == "paused":
            progress(self.mode, task, "paused")


_naive_workers: dict[int, Worker] = {}


def _naive_worker() -> Worker:
    pid = os.getpid()
    worker = _naive_workers.get(pid)
    if worker is None:
        s = settings()
        worker = Worker(
            f"naive-{pid}", WorkerSettings("naive", s.store, ""), store(), history("naive")
        )
        worker.outbox = _Announcer("naive")
        _naive_workers[pid] = worker
    return worker


def run_naive(payload: str, attempt: int) -> str:
    """One delivery of a naive task; raises :class:`DemoRetry` to be retried."""
    if ping(payload):
        return "pong"
    intent = Intent.from_json(payload)
    mode, spec = task_of(intent)
    first = claim_first(mode, spec.task)
    message = {
        **task_message(spec, intent),
        "first": first,
        "crash": spec.crash and settings().crash,
    }
    try:
        verdict = _naive_worker().handle(message)
    except Exception as exc:  # reported, never retried: the table shows it
        detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        progress(mode, spec.task, "error", detail)
        return "error"
    if verdict == "retry":
        if attempt < MAX_RETRIES:
            progress(mode, spec.task, "retry")
            raise DemoRetry(f"task {spec.task}: lease held")
        verdict = "gave_up"
    elif verdict == "crash":
        crash(mode, spec.task)
        verdict = "ack"  # pragma: no cover - the process is gone
    progress(mode, spec.task, verdict)
    return verdict


# -- fencing: the contrib integration's decide functions and outcome hook -------------------
@dataclass
class _Delivery:
    root: str
    first: bool
    called: bool = False


_delivery: contextvars.ContextVar[_Delivery | None] = contextvars.ContextVar(
    "fencing_demo_delivery", default=None
)


def _think() -> tuple[Intent, TaskSpec]:
    """The work of deciding; a paused first delivery stalls here, past its lease."""
    intent = current_intent()
    assert intent is not None, "decide runs inside a fenced task"
    mode, spec = task_of(intent)
    delivery = _delivery.get()
    if delivery is None or delivery.root != intent.root_id:
        delivery = _Delivery(intent.root_id, claim_first(mode, spec.task))
        _delivery.set(delivery)
    seconds = spec.work
    pausing = not delivery.called and delivery.first and spec.pause > 0
    if pausing:
        seconds += spec.pause
        mine = _lease_token(intent)
        progress(mode, spec.task, "paused")  # the takeover may come now
    delivery.called = True
    time.sleep(seconds)
    if pausing:
        # A worker paused past its lease is fenced only if another took the lease over
        # meanwhile; nobody taking over, it would take the lease again and commit (right,
        # but not the race this pause stages): wake once the takeover holds the lease.
        _await_takeover(intent, mine)
    return intent, spec


def _lease_token(intent: Intent) -> int | None:
    answer = store().backend.lease_state(record_lease_name(intent))
    return None if answer.row is None else answer.row.token


def _await_takeover(intent: Intent, mine: int | None, limit: float = TAKEOVER_LIMIT) -> None:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline and _lease_token(intent) == mine:
        time.sleep(0.02)


def decide_credit(record: Record) -> Any:
    _intent, spec = _think()
    return credit(record.state, spec.amount)


def decide_order(record: Record) -> Any:
    intent, _spec = _think()
    if not order_allows(record.state.get("status"), intent.transition):
        return fencing.SKIP
    return order_step(record.state, intent.transition)


DECIDE: Final[Mapping[str, Callable[[Record], Any]]] = {
    "accounts": decide_credit,
    "orders": decide_order,
}


def policy(kind: str) -> fencing.StalePolicy:
    if kind == "accounts":
        return fencing.Recompute(attempts=RECOMPUTE_ATTEMPTS, backoff=0.002, max_backoff=0.05)
    return fencing.Drop()


def target(kind: str) -> Callable[[], fencing.Collection]:
    """The fencing run's collection of ``kind``, opened in the worker process."""

    def collection() -> fencing.Collection:
        return store().collection(collection_name(settings().run_id, "fencing", kind))

    return collection


def atarget(kind: str) -> Callable[[], Any]:
    async def collection() -> fencing.AsyncCollection:
        astore = await fencing.open_async(settings().store, migrate=False)
        return astore.collection(collection_name(settings().run_id, "fencing", kind))

    return collection


def task_name(kind: str, leased: bool) -> str:
    return f"fencing_demo.{kind}{'_leased' if leased else ''}"


def on_outcome(report: TaskReport) -> None:
    """Record the run's outcome, crash if this is the first delivery's commit, report."""
    delivery = _delivery.get()
    _delivery.set(None)
    intent = report.intent
    if intent is None:  # a message the demo did not send: nothing to record
        return
    mode, spec = task_of(intent)
    if report.outcome is not None:
        event = outcome_event(
            report.outcome, intent, worker=f"fencing-{os.getpid()}", token=report.token
        )
        history(mode).write(event)
    if report.action is Action.RETRY:
        progress(mode, spec.task, "retry")
        return
    if report.action is not Action.ACK:
        verdict = "gave_up" if report.kind.endswith("_exhausted") else "error"
        progress(mode, spec.task, verdict, f"{report.kind}: {report.error}")
        return
    first = delivery is not None and delivery.first and delivery.root == intent.root_id
    if report.kind == "committed" and first and spec.crash and settings().crash:
        crash(mode, spec.task)
    progress(mode, spec.task, "ack")


def close() -> None:
    """Close this process's store and files (a worker's shutdown hook)."""
    with _lock:
        for writer in _writers.values():
            writer.close()
        for s in _stores.values():
            with contextlib.suppress(Exception):
                s.close()
        _writers.clear()
        _stores.clear()
