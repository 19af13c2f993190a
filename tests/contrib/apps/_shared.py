"""What the end-to-end worker apps share: the store, the decisions, the control hooks.

Worker processes are configured through the environment (set by ``tests/contrib/_e2e``):

- ``FENCING_E2E_STORE``: the SQLite store URL (a file in the test's tmp dir);
- ``FENCING_E2E_CONTROL``: a directory for control files and the recorded history;
- ``FENCING_E2E_WORKER=1``: install the ``fencing.task`` log handler (workers only).

The control hooks let a test steer a real worker without touching the queue: a task
whose intent (or naive message) id has a ``pause-<id>`` file writes ``paused-<id>``
with its pid and waits for ``resume-<id>`` (the test SIGSTOPs it meanwhile); one with
a ``hang-<id>`` file hangs right after its commit, before the queue acknowledges,
until the test SIGKILLs it; ``bump`` waits at a barrier until two decisions on the
same counter are in flight, so contention is certain rather than likely.

Every fenced outcome and every naive write is appended to ``history.jsonl`` in the
format of ``fencing.testing``; every ``fencing.task`` log record to ``reports.jsonl``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import fencing
from fencing.contrib._common import (
    LeaseSpec,
    TaskReport,
    aeffect,
    current_intent,
    current_target,
    effect,
)
from fencing.testing import HistoryWriter, outcome_event

SIGNER = fencing.Signer(keys={"e2e": b"fencing-e2e-test-key-not-secret"}, current="e2e")
COLLECTION = "orders"
LEASE = LeaseSpec(ttl=1.0, wait=15.0, heartbeat=True)
WAIT_LIMIT = 60.0  # no control wait lasts longer than this, whatever happens
BARRIER_WAIT = 5.0
POLL = 0.01


def control_dir() -> Path:
    return Path(os.environ["FENCING_E2E_CONTROL"])


def store_url() -> str:
    return os.environ["FENCING_E2E_STORE"]


def worker_name() -> str:
    return f"pid{os.getpid()}"


# -- stores, one per process (the task factories call these after fork) ---------------
_stores: dict[tuple[int, str], fencing.Store] = {}
_stores_lock = threading.Lock()


def _store(url: str, *, migrate: bool = True) -> fencing.Store:
    with _stores_lock:
        key = (os.getpid(), url)
        if key not in _stores:
            _stores[key] = fencing.open(url, migrate=migrate)
        return _stores[key]


def store() -> fencing.Store:
    return _store(store_url())


#: The SQLAlchemy adoption scenario's table (tests/contrib/test_sqlalchemy_celery.py):
#: shop_orders (id, version, status), in the store's own SQLite file.
SHOP_TABLE = "shop_orders"


def shop_orders() -> fencing.Table:
    return store().table(SHOP_TABLE)


def ship_order(record: fencing.Record) -> dict[str, Any]:
    return {"status": "shipped"}


def orders() -> fencing.Collection:
    return store().collection(COLLECTION)


def impatient_orders() -> fencing.Collection:
    """The same records through a store that gives up on a locked database at once.

    Opened without migrating (the schema exists), so opening writes nothing.
    """
    return _store(store_url() + "?busy_timeout=0.05", migrate=False).collection(COLLECTION)


async def async_orders() -> fencing.AsyncCollection:
    astore = await fencing.open_async(store_url())
    return astore.collection(COLLECTION)


async def async_impatient_orders() -> fencing.AsyncCollection:
    astore = await fencing.open_async(store_url() + "?busy_timeout=0.05", migrate=False)
    return astore.collection(COLLECTION)


# -- history ------------------------------------------------------------------------
_writers: dict[tuple[int, str], HistoryWriter] = {}


def _writer(name: str) -> HistoryWriter:
    with _stores_lock:
        key = (os.getpid(), name)
        if key not in _writers:
            _writers[key] = HistoryWriter(control_dir() / name)
        return _writers[key]


def history(event: Mapping[str, Any]) -> None:
    _writer("history.jsonl").write(event)


class ReportHandler(logging.Handler):
    """Appends every ``fencing.task`` record, with its ``fencing_*`` fields, as JSON."""

    def emit(self, record: logging.LogRecord) -> None:
        fields = {k: v for k, v in vars(record).items() if k.startswith("fencing_")}
        fields.update(pid=os.getpid(), level=record.levelname, message=record.getMessage())
        _writer("reports.jsonl").write(fields)


if os.environ.get("FENCING_E2E_WORKER") == "1":
    _log = logging.getLogger("fencing.task")
    _log.setLevel(logging.INFO)
    _log.addHandler(ReportHandler())


# -- control hooks --------------------------------------------------------------------
def _flag(name: str) -> Path:
    return control_dir() / name


def _announce(name: str) -> None:
    tmp = _flag(f".{name}.{os.getpid()}")
    tmp.write_text(str(os.getpid()))
    tmp.rename(_flag(name))  # appears whole: the test reads the pid as soon as it sees it


def pause_wanted(ident: str) -> bool:
    return _flag(f"pause-{ident}").exists()


def pause_point(ident: str) -> None:
    if not pause_wanted(ident):
        return
    _announce(f"paused-{ident}")
    deadline = time.monotonic() + WAIT_LIMIT
    while not _flag(f"resume-{ident}").exists() and time.monotonic() < deadline:
        time.sleep(POLL)


async def apause_point(ident: str) -> None:
    if not pause_wanted(ident):
        return
    _announce(f"paused-{ident}")
    deadline = time.monotonic() + WAIT_LIMIT
    while not _flag(f"resume-{ident}").exists() and time.monotonic() < deadline:
        await asyncio.sleep(POLL)


def hang_wanted(ident: str) -> bool:
    """Hang after this commit? Only the first time: a redelivery runs to the end."""
    return _flag(f"hang-{ident}").exists() and not _flag(f"hung-{ident}").exists()


def hang(ident: str) -> None:
    _announce(f"hung-{ident}")
    time.sleep(WAIT_LIMIT)  # the test SIGKILLs this process long before


async def ahang(ident: str) -> None:
    _announce(f"hung-{ident}")
    await asyncio.sleep(WAIT_LIMIT)


def _arrive(key: str) -> Path:
    mark = _flag(f"arrive-{key}-{uuid.uuid4().hex}")
    mark.touch()
    return mark


def _arrived(key: str) -> int:
    return sum(1 for _ in control_dir().glob(f"arrive-{key}-*"))


def barrier(key: str) -> None:
    _arrive(key)
    deadline = time.monotonic() + BARRIER_WAIT
    while _arrived(key) < 2 and time.monotonic() < deadline:
        time.sleep(POLL)


async def abarrier(key: str) -> None:
    _arrive(key)
    deadline = time.monotonic() + BARRIER_WAIT
    while _arrived(key) < 2 and time.monotonic() < deadline:
        await asyncio.sleep(POLL)


# -- decisions --------------------------------------------------------------------------
def _label() -> str:
    intent = current_intent()
    assert intent is not None, "decide runs inside a fenced task"
    return intent.transition


def marked(state: Mapping[str, Any], label: str) -> dict[str, Any]:
    return {**state, "status": label, "log": [*state.get("log", []), label]}


def mark(record: fencing.Record) -> dict[str, Any]:
    """Set the status to the transition's name and log it; pausable."""
    intent = current_intent()
    assert intent is not None
    state = marked(record.state, intent.transition)
    pause_point(intent.root_id)
    return state


async def amark(record: fencing.Record) -> dict[str, Any]:
    intent = current_intent()
    assert intent is not None
    state = marked(record.state, intent.transition)
    await apause_point(intent.root_id)
    return state


def bump(record: fencing.Record) -> dict[str, Any]:
    """Add one to the counter, after waiting for a second decision to be in flight."""
    barrier(str(record.key))
    return {**record.state, "count": record.state.get("count", 0) + 1}


async def abump(record: fencing.Record) -> dict[str, Any]:
    await abarrier(str(record.key))
    return {**record.state, "count": record.state.get("count", 0) + 1}


def _provider_charge(fx: fencing.Effect) -> dict[str, Any]:
    """The "payment provider": appends to ``charges.jsonl``, keyed by the idempotency key."""
    _writer("charges.jsonl").write({"key": fx.idempotency_key, "pid": os.getpid()})
    return {"charge_id": f"ch-{fx.idempotency_key[3:11]}"}


def charge(record: fencing.Record) -> dict[str, Any]:
    """Charge (an effect recorded first, skipped if a retry finds it done), then set the
    status; pausable after the charge."""
    intent = current_intent()
    assert intent is not None
    fx = effect("charge", detail={"amount": record.state.get("total", 0)})
    if fx.status != "done":
        current_target().effect_done(fx, detail=_provider_charge(fx))
    state = marked(record.state, intent.transition)
    pause_point(intent.root_id)
    return state


async def acharge(record: fencing.Record) -> dict[str, Any]:
    intent = current_intent()
    assert intent is not None
    fx = await aeffect("charge", detail={"amount": record.state.get("total", 0)})
    if fx.status != "done":
        await current_target().effect_done(fx, detail=_provider_charge(fx))
    state = marked(record.state, intent.transition)
    await apause_point(intent.root_id)
    return state


def refund(intent: fencing.Intent, current: fencing.Record, effects: Any) -> None:
    """The ``Reconcile`` handler: the charge was made for a decision that lost."""
    _writer("refunds.jsonl").write(
        {
            "root_id": intent.root_id,
            "version": current.version,
            "effects": [[e.idempotency_key, e.status, e.outcome] for e in effects],
            "pid": os.getpid(),
        }
    )


# -- after each fenced run ---------------------------------------------------------------
def record_outcome(report: TaskReport) -> None:
    if report.outcome is not None and report.intent is not None:
        history(
            outcome_event(report.outcome, report.intent, worker=worker_name(), token=report.token)
        )


def after_run(report: TaskReport) -> None:
    record_outcome(report)
    intent = report.intent
    if report.kind == "committed" and intent is not None and hang_wanted(intent.root_id):
        hang(intent.root_id)


async def aafter_run(report: TaskReport) -> None:
    record_outcome(report)
    intent = report.intent
    if report.kind == "committed" and intent is not None and hang_wanted(intent.root_id):
        await ahang(intent.root_id)


# -- the naive baseline: read, decide, blind write (what a plain task does) ----------------
def _naive_event(
    key: str, msg_id: str, transition: str, decided: int, over: int, new: int
) -> dict[str, Any]:
    return {
        "event": "outcome",
        "t": time.time(),
        "worker": worker_name(),
        "collection": COLLECTION,
        "key": key,
        "intent_id": msg_id,
        "root_id": msg_id,
        "transition": transition,
        "expected_version": decided,
        "outcome": "committed",
        "version": new,
        "applied_over": over,
        "token": None,
        "fence": None,
    }


def _blind_write(
    collection: fencing.Collection, key: str, state: Mapping[str, Any]
) -> tuple[int, int]:
    """An unconditional UPDATE: whatever the record holds now is replaced."""
    while True:
        current = collection.get(key)
        assert current is not None
        outcome = collection.commit(current.intent("naive"), state)
        if isinstance(outcome, fencing.Committed):
            return current.version, outcome.record.version


def naive_mark(key: str, label: str, msg_id: str, decided: int | None, locked: bool) -> str:
    """The naive twin of ``mark``: reads the record when it runs, writes blindly.

    ``decided`` is the version the sender saw (the message is about that version, but a
    naive task has no way to use it); ``locked`` takes a lease as a plain lock (no token
    on the write), the way lock add-ons are used.
    """
    collection = orders()
    lease = None
    if locked:
        lease = store().acquire(
            f"{COLLECTION}/{key}",
            owner=worker_name(),
            ttl=LEASE.ttl,
            wait=LEASE.wait,
            heartbeat=True,
        )
    try:
        record = collection.get(key)
        assert record is not None
        state = marked(record.state, label)
        pause_point(msg_id)
        over, new = _blind_write(collection, key, state)
        basis = record.version if decided is None else decided
        history(_naive_event(key, msg_id, label, basis, over, new))
        if hang_wanted(msg_id):
            hang(msg_id)
    finally:
        if lease is not None:
            with contextlib.suppress(fencing.LeaseLost):  # a plain lock: nobody checks it
                lease.release()
    return f"wrote v{new}"


def naive_bump(key: str, msg_id: str) -> str:
    collection = orders()
    record = collection.get(key)
    assert record is not None
    barrier(key)
    state = {**record.state, "count": record.state.get("count", 0) + 1}
    over, new = _blind_write(collection, key, state)
    history(_naive_event(key, msg_id, "bump", record.version, over, new))
    return f"wrote v{new}"


async def anaive_mark(key: str, label: str, msg_id: str, decided: int | None, locked: bool) -> str:
    # The naive work is synchronous store I/O; run it off the event loop, pauses included.
    return await asyncio.to_thread(naive_mark, key, label, msg_id, decided, locked)


async def anaive_bump(key: str, msg_id: str) -> str:
    return await asyncio.to_thread(naive_bump, key, msg_id)


def ping(token: str) -> str:
    """Proves a worker consumes: announces ``ping-<token>`` with its pid."""
    _announce(f"ping-{token}")
    return json.dumps({"pid": os.getpid()})
