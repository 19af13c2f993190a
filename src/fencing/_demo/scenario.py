"""The demo's race: the seeded schedule, the two kinds of work, a run's records and result.

The race. Tasks come from a queue (a broker in this process, or a real task queue
with ``--queue``) with seeded random delivery delays, so they arrive out of order;
some are delivered twice; some workers "crash" between their commit and the ack, so
the task is delivered again after its commit landed; and some workers pause (a GC
pause, a swap storm) past their lease while another worker takes the lease over and
commits. Every task carries the intent captured when it was enqueued
(``Intent.to_json`` in the message). Two kinds of work, on a few keys each:

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

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from ..testing import check_file, write_final

if TYPE_CHECKING:
    from .._store import Collection, Store
    from .._values import Intent
    from ..testing import HistoryWriter, Report

MODES: Final = ("naive", "fencing")

LEASE_TTL: Final = 0.3  # seconds; short, so a pause outlives it
LEASE_WAIT: Final = 2.0  # how long a worker waits for a held lease before giving the task back
PAUSE: Final = (0.9, 1.2)  # a paused worker sleeps this long inside its critical section
TAKEOVER_AFTER: Final = 0.05  # the takeover arrives this long after the pause began
RATE: Final = 60.0  # tasks enqueued per second
MAX_DELIVERIES: Final = 12  # a task is given up after this many deliveries
RECOMPUTE_ATTEMPTS: Final = 12

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


# -- the work and its decisions ----------------------------------------------------------
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


# -- a run's result ------------------------------------------------------------------------
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


def finish_run(
    result: RunResult,
    writer: HistoryWriter,
    collections: Mapping[str, Collection],
    keys: Mapping[str, list[str]],
    credited: list[TaskSpec],
) -> None:
    """Final events, the balance against the credits expected, and the checker's report."""
    for kind, target in collections.items():
        write_final(writer, target, keys[kind])
    writer.close()
    for key in keys["accounts"]:
        record = collections["accounts"].get(key)
        result.balance += int(record.state["balance"]) if record is not None else 0
    result.expected_balance = sum(s.amount for s in credited)
    result.report = check_file(result.history)


def start_mode(
    mode: str,
    total: int,
    on_start: Callable[[str, int], None] | None,
    on_progress: Callable[[str, int], None] | None,
) -> Callable[[int], None]:
    """Say that ``mode``'s run of ``total`` tasks starts (``on_start``); what the run calls
    as tasks end (``on_progress`` for that mode)."""
    if on_start is not None:
        on_start(mode, total)

    def advance(n: int) -> None:
        if on_progress is not None:
            on_progress(mode, n)

    return advance
