"""``store.prune()`` (applied ids and effects) and ``store.outbox.prune()`` on the SQL
stores delete in batches of at most ``_contract.PRUNE_BATCH`` rows, each batch its own
transaction, so commits go on between them: every row past the horizon is deleted all
the same (however many batches it takes), the count is the rows deleted in all, rows
inside the horizon are kept, and each batch is one step of its own for the driver (a
transaction on SQLite, an autocommit statement on PostgreSQL and MariaDB), never one
statement for everything. Rows are put past the horizon by moving their times a day
back, straight in fencing's tables; nothing here waits for a clock."""

from __future__ import annotations

import sqlite3
import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest

from fencing import Duplicate, FencingError, Stale
from fencing._flow import Flow
from fencing.backends import _contract
from fencing.backends.mysql.steps import Batch
from fencing.backends.postgres.steps import Query
from fencing.backends.sqlite import driver
from fencing.backends.sqlite.steps import PRUNE_PAUSE, Txn

from .test_outbox import TASK, _records

SQL_STORES = {"sqlite-memory", "sqlite-file", "postgresql", "mysql"}
pytestmark = pytest.mark.backends(only=lambda name: name in SQL_STORES)

BATCH = 3
OLD, NEW = 10, 2  # OLD rows past the horizon: batches of 3, 3, 3 and 1
BATCHES = 4
DAY_BACK = "UPDATE {table} SET {column} = {column} - 86400 WHERE {column} IS NOT NULL"


@pytest.fixture(autouse=True)
def small_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_contract, "PRUNE_BATCH", BATCH)


def _sync_backend(store: Any) -> Any:
    backend = store.backend
    return getattr(backend, "sync", backend)


def _day_back(store: Any, backend_name: str, table: str, column: str) -> None:
    """Move every ``column`` time of ``table`` a day back (the rows are a day older)."""
    _run(store, backend_name, DAY_BACK.format(table=table, column=column))


def _run(store: Any, backend_name: str, statement: str) -> None:
    """Run ``statement`` on the store's database, straight (committed)."""
    if backend_name.startswith("sqlite"):
        backend = _sync_backend(store)
        with backend._lock:
            backend.conn.execute(statement)
        return
    if backend_name == "postgresql":
        from .backends_postgres import connect
    else:
        from .backends_mysql import connect
    conn = connect(store)
    try:
        with conn.cursor() as cur:
            cur.execute(statement)
        conn.commit()
    finally:
        conn.close()


def _applied(store: Any, first: int, count: int) -> list[Any]:
    """``count`` intents committed, each on a record of its own; returns them."""
    orders = store.collection("orders")
    done = []
    for i in range(first, first + count):
        intent = orders.create(f"k{i}", {"n": 0}).intent("ship")
        assert orders.commit(intent, {"n": 1}).committed
        done.append(intent)
    return done


def _old_and_new_applied(store: Any, backend_name: str) -> tuple[list[Any], list[Any]]:
    old = _applied(store, 0, OLD)
    _day_back(store, backend_name, "fencing_applied", "applied_at")
    return old, _applied(store, OLD, NEW)


def _spied(flow: Flow[Any], seen: list[Any]) -> Flow[Any]:
    """``flow``, its steps added to ``seen`` as it yields them."""
    try:
        step = next(flow)
        while True:
            seen.append(step)
            try:
                answer = yield step
            except FencingError as exc:
                step = flow.throw(exc)
            else:
                step = flow.send(answer)
    except StopIteration as stop:
        return stop.value


@pytest.fixture
def steps(store: Any, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The steps the (sync) backend's prune flows yield from here on."""
    flows = type(store.backend.flows)
    seen: list[Any] = []
    for name in ("prune", "outbox_prune", "prune_effects"):
        make = getattr(flows, name)
        monkeypatch.setattr(
            flows, name, lambda self, *args, make=make: _spied(make(self, *args), seen)
        )
    return seen


def _alone(step: Any) -> bool:
    """Whether a step is a transaction of its own for its backend's driver."""
    if isinstance(step, Txn):  # SQLite: BEGIN IMMEDIATE, the body, COMMIT
        return step.begin and step.write
    if isinstance(step, Query):  # PostgreSQL: one statement in autocommit
        return True
    assert isinstance(step, Batch)  # MariaDB: autocommit statements, no transaction begun
    return not (step.begin or step.end)


def _after(step: Query | Batch) -> Any:
    """The time a server's batch starts at (``after``)."""
    if isinstance(step, Query):
        return step.params["after"]
    assert step.params is not None
    return step.params[0]


def test_prune_forgets_every_id_past_the_horizon_however_many_batches(
    store: Any, backend_name: str
) -> None:
    old, new = _old_and_new_applied(store, backend_name)
    assert store.prune(3600) == OLD
    orders = store.collection("orders")
    for intent in new:  # inside the horizon: still known, a replay is a Duplicate
        assert isinstance(orders.commit(intent, {"n": 2}), Duplicate)
    for intent in old:  # forgotten: a replay is refused as Stale, not told a Duplicate
        assert isinstance(orders.commit(intent, {"n": 2}), Stale)
    assert store.prune(3600) == 0


def test_a_batch_exactly_full_is_followed_by_one_that_finds_nothing(
    store: Any, backend_name: str
) -> None:
    _applied(store, 0, 2 * BATCH)
    _day_back(store, backend_name, "fencing_applied", "applied_at")
    assert store.prune(3600) == 2 * BATCH
    assert store.prune(0) == 0


def test_ids_applied_at_the_same_time_are_all_forgotten_across_batches(
    store: Any, backend_name: str
) -> None:
    # (a batch starts at the time the one before it ended: at that time, not after it)
    _applied(store, 0, OLD)
    _run(store, backend_name, "UPDATE fencing_applied SET applied_at = 1000000000")
    assert store.prune(3600) == OLD


@pytest.mark.apis(only=["sync"])
def test_each_batch_of_a_prune_is_a_step_of_its_own(
    store: Any, backend_name: str, steps: list[Any]
) -> None:
    _old_and_new_applied(store, backend_name)
    steps.clear()
    assert store.backend.prune(3600) == OLD
    assert len(steps) == BATCHES  # one statement for all of it would be one step
    assert all(_alone(step) for step in steps)
    if not backend_name.startswith("sqlite"):  # (SQLite's deleted entries are gone at once)
        # each batch after the first starts at the time the one before it ended
        starts = [_after(step) for step in steps]
        assert starts[0] == 0 and all(start > 0 for start in starts[1:])


@pytest.mark.apis(only=["sync"])
@pytest.mark.backends(only=lambda name: name in {"sqlite-memory", "sqlite-file"})
def test_sqlite_commits_each_batch_before_the_next(store: Any) -> None:
    _old_and_new_applied(store, "sqlite")
    said: list[str] = []
    conn: sqlite3.Connection = store.backend.conn
    conn.set_trace_callback(said.append)
    try:
        assert store.backend.prune(3600) == OLD
    finally:
        conn.set_trace_callback(None)
    framing = [s for s in said if s in ("BEGIN IMMEDIATE", "COMMIT")]
    deletes = [s for s in said if s.startswith("DELETE FROM fencing_applied")]
    assert len(deletes) == BATCHES
    assert framing == ["BEGIN IMMEDIATE", "COMMIT"] * BATCHES  # the write lock let go


@pytest.mark.apis(only=["sync"])
@pytest.mark.backends(only=lambda name: name in {"sqlite-memory", "sqlite-file"})
def test_sqlite_leaves_its_lock_free_after_each_batch(
    store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Its lock is not handed over in turn: a commit waiting for it gets in only while
    # the prune pauses with the lock free.
    _old_and_new_applied(store, "sqlite")
    lock = store.backend._lock
    free: list[bool] = []

    def try_lock() -> None:
        if lock.acquire(blocking=False):
            lock.release()
            free.append(True)
        else:
            free.append(False)

    def pause(seconds: float) -> None:
        assert seconds == PRUNE_PAUSE
        other = threading.Thread(target=try_lock)  # (the lock is reentrant: not this one)
        other.start()
        other.join()

    monkeypatch.setattr(driver, "time", SimpleNamespace(time=time.time, sleep=pause))
    assert store.backend.prune(3600) == OLD
    assert free == [True] * BATCHES


def _finished_and_kept_effects(store: Any, backend_name: str) -> tuple[list[str], list[str]]:
    """OLD effects a day untouched whose work committed (prunable), and as many whose
    work never ended (kept however old): their keys. Keys are digests, so the two kinds
    lie mixed in key order, the order the batches go in."""
    orders = store.collection("orders")
    finished, kept = [], []
    for i in range(OLD):
        done = orders.create(f"d{i}", {"n": 0}).intent("charge")
        finished.append(orders.effect_done(orders.effect(done, "charge")).idempotency_key)
        assert orders.commit(done, {"n": 1}).committed
        waiting = orders.create(f"w{i}", {"n": 0}).intent("charge")
        kept.append(orders.effect(waiting, "charge").idempotency_key)
    _day_back(store, backend_name, "fencing_effects", "updated_at")
    return finished, kept


def test_effects_prune_forgets_every_finished_effect_however_many_batches(
    store: Any, backend_name: str
) -> None:
    finished, kept = _finished_and_kept_effects(store, backend_name)
    assert store.prune(3600) == OLD  # the effects (the applied ids are new)
    assert [key for key in finished if store.get_effect(key) is not None] == []
    assert all(store.get_effect(key) is not None for key in kept)
    assert store.prune(3600) == 0


@pytest.mark.apis(only=["sync"])
def test_each_batch_of_an_effects_prune_is_a_step_of_its_own(
    store: Any, backend_name: str, steps: list[Any]
) -> None:
    finished, _ = _finished_and_kept_effects(store, backend_name)
    steps.clear()
    said: list[str] = []
    if backend_name.startswith("sqlite"):  # the statements with their parameters
        store.backend.conn.set_trace_callback(said.append)
    try:
        assert store.backend.prune_effects(3600) == OLD
    finally:
        if backend_name.startswith("sqlite"):
            store.backend.conn.set_trace_callback(None)
    assert len(steps) == BATCHES  # one statement for all of it would be one step
    assert all(_alone(step) for step in steps)
    # each batch after the first starts after the last key the one before deleted (the
    # kept effects before it are not read again)
    if backend_name.startswith("sqlite"):
        deletes = [s for s in said if s.startswith("DELETE FROM fencing_effects")]
        starts = [s.split("idempotency_key > '", 1)[1].split("'", 1)[0] for s in deletes]
    else:
        starts = [_after(step) for step in steps]
    assert starts[0] == "" and starts[1:] == sorted(finished)[BATCH - 1 :: BATCH]


def _old_and_new_sent(store: Any, backend_name: str) -> Any:
    """OLD rows sent a day ago, NEW rows sent now, and one row never sent (returned)."""
    (a,) = _records(store, "a")

    def sent(count: int) -> None:
        for i in range(count):
            store.outbox.send(TASK, a, f"t{i}")
        claim = store.outbox.claim("r", "celery", limit=100)
        assert store.outbox.done(claim, claim.rows) == count

    sent(OLD)
    _day_back(store, backend_name, "fencing_outbox", "sent_at")
    if backend_name != "postgresql":  # (claim tokens come from a sequence there)
        _day_back(store, backend_name, "fencing_outbox_claims", "claimed_at")
    sent(NEW)
    return store.outbox.send(TASK, a, "later")


def test_outbox_prune_deletes_every_old_sent_row_however_many_batches(
    store: Any, backend_name: str
) -> None:
    unsent = _old_and_new_sent(store, backend_name)
    assert store.outbox.prune(older_than=3600) == OLD
    assert store.outbox.prune(older_than=3600) == 0
    assert store.outbox.prune(older_than=0) == NEW  # never an unsent row
    assert [r.id for r in store.outbox.pending()] == [unsent.id]


@pytest.mark.apis(only=["sync"])
def test_each_batch_of_an_outbox_prune_is_a_step_of_its_own(
    store: Any, backend_name: str, steps: list[Any]
) -> None:
    _old_and_new_sent(store, backend_name)
    steps.clear()
    assert store.backend.outbox_prune(3600) == OLD
    # then the old claims, one batch (SQLite and MariaDB keep them in a table)
    claims = 0 if backend_name == "postgresql" else 1
    assert len(steps) == BATCHES + claims
    assert all(_alone(step) for step in steps)


def test_batches_go_on_until_one_is_short() -> None:
    def batches(found: list[int]) -> tuple[int, list[int]]:
        limits: list[int] = []
        counts = iter(found)

        def batch(limit: int) -> Any:
            limits.append(limit)
            gone: int = yield limit
            return gone

        flow = _contract.prune_batches(batch)
        step = next(flow)
        try:
            while True:
                assert step == BATCH
                step = flow.send(next(counts))
        except StopIteration as stop:
            return stop.value, limits

    assert batches([3, 3, 3, 1]) == (10, [BATCH] * 4)
    assert batches([3, 0]) == (3, [BATCH] * 2)
    assert batches([0]) == (0, [BATCH])
