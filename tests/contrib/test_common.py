"""The queue-independent half of the integrations: payloads, outcomes to actions, events."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

import fencing
from fencing.contrib._common import (
    Action,
    Backoff,
    FencedTask,
    LeaseSpec,
    TaskReport,
    aeffect,
    classify,
    current_intent,
    current_target,
    effect,
)

SIGNER = fencing.Signer(keys={"k1": b"0123456789abcdef0123"}, current="k1")


@pytest.fixture
def store(tmp_path: Path) -> Iterator[fencing.Store]:
    s = fencing.open(f"sqlite:///{tmp_path / 'store.db'}")
    yield s
    s.close()


def ship(record: fencing.Record) -> dict[str, Any]:
    return {**record.state, "status": "shipped"}


def task(target: Any, **options: Any) -> FencedTask:
    return FencedTask(
        name="test.ship", target=target, decide=options.pop("decide", ship), **options
    )


def fenced_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "fencing.task"]


# -- payloads ---------------------------------------------------------------------------------
def test_payload_is_the_intent_json_or_a_signed_token(store: fencing.Store) -> None:
    orders = store.collection("orders")
    record = orders.create("o-1", {"status": "packed"})
    plain, signed = task(orders), task(orders, signer=SIGNER)

    payload = plain.encode(record, "ship")
    intent = plain.decode(payload)
    assert json.loads(payload)["expected_version"] == 1 and intent.transition == "ship"
    assert plain.encode(intent) == intent.to_json()
    assert signed.decode(signed.encode(intent)) == intent
    assert signed.encode(intent).startswith("k1.")


@pytest.mark.parametrize(
    "payload",
    [
        "not json",
        '{"v": 1}',
        b"\xff\xfe",
        42,
        None,
        {"id": "x"},
    ],
)
def test_a_malformed_payload_is_invalid(store: fencing.Store, payload: Any) -> None:
    with pytest.raises(fencing.InvalidIntent):
        task(store.collection("orders")).decode(payload)


def test_an_unsigned_or_tampered_payload_is_refused_by_a_signer(store: fencing.Store) -> None:
    orders = store.collection("orders")
    record = orders.create("o-1", {"status": "packed"})
    signed = task(orders, signer=SIGNER)
    token = signed.encode(record, "ship")
    kid, body, mac = token.split(".")
    other = fencing.Signer(keys={"k1": b"another key, 16+ bytes"}, current="k1")
    for bad in (
        record.intent("ship").to_json(),
        f"{kid}.{body}.{mac[:-2]}AA",
        other.sign(record.intent("ship")),
        token.encode("utf-16"),
    ):
        with pytest.raises(fencing.InvalidIntent):
            signed.decode(bad)


def test_enqueue_side_checks(store: fencing.Store) -> None:
    orders = store.collection("orders")
    record = orders.create("o-1", {"status": "packed"})
    spec = task(orders)
    with pytest.raises(fencing.InvalidIntent, match="transition"):
        spec.encode(record)
    with pytest.raises(fencing.InvalidIntent, match="alone"):
        spec.encode(record.intent("ship"), "ship")
    with pytest.raises(fencing.InvalidIntent, match="Record or an Intent"):
        spec.encode("o-1", "ship")  # type: ignore[arg-type]
    invoices = store.collection("invoices").create("i-1", {})
    with pytest.raises(fencing.InvalidIntent, match="invoices"):
        spec.encode(invoices, "ship")  # the target is known: checked before sending


# -- outcomes -> actions -------------------------------------------------------------------------
def test_committed_then_duplicate_are_acknowledged(
    store: fencing.Store, caplog: pytest.LogCaptureFixture
) -> None:
    orders = store.collection("orders")
    record = orders.create("o-1", {"status": "packed"})
    spec = task(orders)
    payload = spec.encode(record, "ship")
    caplog.set_level(logging.INFO, "fencing.task")

    first, again = spec.run(payload), spec.run(payload, attempt=2)
    assert (first.action, first.kind) == (Action.ACK, "committed")
    assert (again.action, again.kind) == (Action.ACK, "duplicate")
    stored = orders.get("o-1")
    assert stored is not None and stored.version == 2 and stored.state["status"] == "shipped"

    records = fenced_records(caplog)
    assert len(records) == 2  # one record per run
    log = records[0]
    assert log.levelno == logging.INFO
    assert vars(log)["fencing_task"] == "test.ship"
    assert vars(log)["fencing_collection"] == "orders" and vars(log)["fencing_key"] == "o-1"
    assert vars(log)["fencing_intent_id"] == first.intent.id  # type: ignore[union-attr]
    assert vars(log)["fencing_expected_version"] == 1
    assert vars(log)["fencing_current_version"] == 2
    assert vars(log)["fencing_outcome"] == "committed" and vars(log)["fencing_action"] == "ack"
    assert vars(records[1])["fencing_outcome"] == "duplicate"
    assert vars(records[1])["fencing_attempt"] == 2


def test_stale_is_a_recorded_success_never_a_retry(
    store: fencing.Store, caplog: pytest.LogCaptureFixture
) -> None:
    orders = store.collection("orders")
    record = orders.create("o-1", {"status": "packed"})
    spec = task(orders)
    payload = spec.encode(record, "ship")
    orders.commit(record.intent("cancel"), {"status": "cancelled"})
    caplog.set_level(logging.INFO, "fencing.task")

    report = spec.run(payload)
    assert (report.action, report.kind) == (Action.ACK, "stale")
    assert report.to_dict()["current_version"] == 2 and report.error is None
    (log,) = fenced_records(caplog)
    assert log.levelno == logging.WARNING and vars(log)["fencing_outcome"] == "stale"
    json.dumps(report.to_dict())  # JSON-safe: any result backend can store it


def test_skipped_and_missing(store: fencing.Store) -> None:
    orders = store.collection("orders")
    record = orders.create("o-1", {"status": "packed"})
    skip = task(orders, decide=lambda r: fencing.SKIP)
    assert skip.run(skip.encode(record, "ship")).kind == "skipped"
    payload = task(orders).encode(record, "ship")
    orders.delete("o-1")
    report = task(orders).run(payload)
    assert (report.action, report.kind) == (Action.ACK, "missing")


def test_recompute_under_contention_then_contended(store: fencing.Store) -> None:
    orders = store.collection("orders")
    record = orders.create("c-1", {"count": 0})

    def bump_while_another_writes(rec: fencing.Record) -> dict[str, Any]:
        if rec.state["count"] < 2:  # someone else writes first, twice
            current = orders.get("c-1")
            assert current is not None
            orders.commit(current.intent("other"), {"count": current.state["count"] + 1})
        return {"count": rec.state["count"] + 1}

    patient = task(orders, decide=bump_while_another_writes, on_stale=fencing.Recompute(5, 0.0))
    report = patient.run(patient.encode(record, "bump"))
    assert report.kind == "committed" and report.judged is not None
    assert report.judged.root_id == report.intent.id != report.judged.id  # type: ignore[union-attr]
    final = orders.get("c-1")
    assert final is not None and final.state["count"] == 3

    record = orders.create("c-2", {"count": 0})

    def always_beaten(rec: fencing.Record) -> dict[str, Any]:
        current = orders.get("c-2")
        assert current is not None
        orders.commit(current.intent("other"), {"count": current.state["count"] + 1})
        return {"count": -1}

    hopeless = task(orders, decide=always_beaten, on_stale=fencing.Recompute(2, 0.0))
    report = hopeless.run(hopeless.encode(record, "bump"))
    assert (report.action, report.kind) == (Action.ACK, "contended")


def test_reconcile_handler_gets_the_recorded_effects(store: fencing.Store) -> None:
    orders = store.collection("orders")
    record = orders.create("o-1", {"status": "packed"})
    calls: list[tuple[str, int, Sequence[Any]]] = []

    def handler(intent: fencing.Intent, current: fencing.Record, effects: Sequence[Any]) -> None:
        calls.append((intent.id, current.version, effects))

    def charge_then_lose(rec: fencing.Record) -> dict[str, Any]:
        fx = effect("charge", detail={"amount": 5})
        current_target().effect_done(fx)
        orders.commit(orders.intent("o-1", "cancel"), {"status": "cancelled"})  # a rival wins
        return {**rec.state, "status": "charged"}

    spec = task(orders, decide=charge_then_lose, on_stale=fencing.Reconcile(handler))
    payload = spec.encode(record, "charge")
    assert spec.run(payload).kind == "stale"
    ((intent_id, version, effects),) = calls
    assert (intent_id, version) == (spec.decode(payload).id, 2)
    assert [(e.name, e.status, e.outcome) for e in effects] == [("charge", "done", "stale")]
    assert [e.idempotency_key for e in store.effects_to_reconcile()] == [effects[0].idempotency_key]
    with pytest.raises(RuntimeError, match="inside a fenced task"):
        effect("charge")  # outside a task there is no intent to record it against


def test_a_task_that_fails_for_good_abandons_its_effects(store: fencing.Store) -> None:
    orders = store.collection("orders")
    record = orders.create("o-1", {"status": "packed"})

    def charge_then_crash(rec: fencing.Record) -> dict[str, Any]:
        current_target().effect_done(effect("charge"))
        raise KeyError("bug after the charge")

    spec = task(orders, decide=charge_then_crash)
    report = spec.run(spec.encode(record, "charge"))
    assert (report.action, report.kind) == (Action.FAIL, "error")
    (listed,) = store.effects_to_reconcile()  # the charge was made for work that never will be
    assert (listed.name, listed.status, listed.outcome) == ("charge", "done", "abandoned")
    flaky = task(orders, decide=charge_then_crash, retry_on=(KeyError,))
    retried = flaky.run(flaky.encode(record, "charge"))
    assert retried.action is Action.RETRY  # it will run again: nothing is abandoned
    assert len(store.effects_to_reconcile()) == 1
    assert orders.get("o-1").version == 1  # type: ignore[union-attr]


def test_a_worker_paused_past_its_lease_is_fenced(store: fencing.Store) -> None:
    orders = store.collection("orders")
    record = orders.create("o-1", {"status": "packed"})

    def slow(rec: fencing.Record) -> dict[str, Any]:
        time.sleep(0.15)  # past the TTL, no heartbeat: the lease runs out...
        store.acquire("orders/o-1", owner="newer", ttl=5)  # ... and a newer owner takes it
        return ship(rec)

    spec = task(orders, decide=slow, lease=LeaseSpec(ttl=0.05, heartbeat=False))
    report = spec.run(spec.encode(record, "ship"))
    assert (report.action, report.kind) == (Action.ACK, "fenced")
    assert isinstance(report.outcome, fencing.Fenced)
    assert report.outcome.reason is fencing.FenceReason.NEWER_OWNER
    assert report.token is not None and report.to_dict()["token"] == report.token
    unchanged = orders.get("o-1")
    assert unchanged is not None and unchanged.version == 1


def test_a_worker_paused_past_its_lease_with_nobody_taking_over_commits(
    store: fencing.Store, caplog: pytest.LogCaptureFixture
) -> None:
    """The lease ran out, nobody took over, the record did not move: the work is not
    obsolete. The run takes the lease again and commits (it used to ack ``Fenced``)."""
    orders = store.collection("orders")
    record = orders.create("o-1", {"status": "paid"})

    def paused(rec: fencing.Record) -> dict[str, Any]:
        lease = store.try_acquire("orders/o-1", owner="probe", ttl=5)
        assert lease is None  # still held while decide starts
        time.sleep(0.35)  # a GC pause, SIGSTOP: past the TTL, the heartbeat paused too
        return ship(rec)

    spec = task(orders, decide=paused, lease=LeaseSpec(ttl=0.2, heartbeat=False))
    report = spec.run(spec.encode(record, "ship"))
    assert (report.action, report.kind) == (Action.ACK, "committed"), report
    assert report.fence_reason is None and report.to_dict()["fence_reason"] is None
    shipped = orders.get("o-1")
    assert shipped is not None and shipped.state["status"] == "shipped"
    assert shipped.fence == report.token


class _PausedClock:
    """A store clock that, once ``decide`` has paused, moves 10 s on every reading: each
    lease taken again has run out by the time its commit is judged (a worker that keeps
    outliving its TTL)."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.paused = False

    def __call__(self) -> float:
        if self.paused:
            self.now += 10.0
        return self.now


def test_a_lease_that_keeps_running_out_is_retried_then_abandoned_and_listed(
    api: str, caplog: pytest.LogCaptureFixture, request: pytest.FixtureRequest
) -> None:
    """Fenced(EXPIRED) after every bounded retake: the work could still commit, so the
    run is retried with the same payload (never acked), its effects stay pending; when
    the retries are used up the task fails and its effects are listed as abandoned."""
    caplog.set_level(logging.INFO, logger="fencing.task")
    clock = _PausedClock()
    lease = LeaseSpec(ttl=5, heartbeat=False)

    def charge(rec: fencing.Record) -> dict[str, Any]:
        effect("charge")
        clock.paused = True
        return ship(rec)

    if api == "async":
        loop = asyncio.new_event_loop()
        request.addfinalizer(loop.close)
        astore = loop.run_until_complete(fencing.open_async("memory://", clock=clock))
        aorders = astore.collection("orders")
        record = loop.run_until_complete(aorders.create("o-1", {"status": "paid"}))

        async def acharge(rec: fencing.Record) -> dict[str, Any]:
            await aeffect("charge")
            clock.paused = True
            return ship(rec)

        spec = task(aorders, decide=acharge, lease=lease, max_retries=1)

        def run(attempt: int) -> TaskReport:
            return loop.run_until_complete(spec.arun(payload, attempt=attempt))

        def listed() -> list[fencing.Effect]:
            return loop.run_until_complete(astore.effects_to_reconcile())

        def waiting() -> list[fencing.Effect]:
            return loop.run_until_complete(astore.pending_effects(older_than=0))

        def version() -> int:
            return loop.run_until_complete(aorders.get("o-1")).version  # type: ignore[union-attr]
    else:
        store = fencing.open("memory://", clock=clock)
        orders = store.collection("orders")
        record = orders.create("o-1", {"status": "paid"})
        spec = task(orders, decide=charge, lease=lease, max_retries=1)

        def run(attempt: int) -> TaskReport:
            return spec.run(payload, attempt=attempt)

        listed, version = store.effects_to_reconcile, lambda: orders.get("o-1").version  # type: ignore[union-attr]

        def waiting() -> list[fencing.Effect]:
            return store.pending_effects(older_than=0)

    payload = spec.encode(record, "ship")
    report = run(1)
    assert (report.action, report.kind) == (Action.RETRY, "lease_expired"), report
    assert isinstance(report.error, fencing.LeaseExpired)
    assert isinstance(report.outcome, fencing.Fenced)
    assert report.fence_reason == "expired" and report.to_dict()["fence_reason"] == "expired"
    assert "fenced=expired" in fenced_records(caplog)[-1].getMessage()
    assert fenced_records(caplog)[-1].fencing_fence_reason == "expired"  # type: ignore[attr-defined]
    assert listed() == []  # not final: the effects stay pending, the retry may commit
    (pending,) = waiting()
    assert pending.outcome is None

    clock.paused = False
    report = run(2)
    assert (report.action, report.kind) == (Action.FAIL, "lease_expired_exhausted")
    (abandoned,) = listed()
    assert abandoned.outcome == "abandoned" and abandoned.name == "charge"
    assert version() == 1


def test_a_held_lease_is_retried(store: fencing.Store) -> None:
    orders = store.collection("orders")
    record = orders.create("o-1", {"status": "packed"})
    spec = task(orders, lease=LeaseSpec(ttl=5))
    with store.lease("orders/o-1", owner="busy", ttl=5):
        report = spec.run(spec.encode(record, "ship"))
    assert (report.action, report.kind) == (Action.RETRY, "lease_held")
    assert isinstance(report.error, fencing.LeaseHeld)
    assert spec.run(spec.encode(report.intent)).kind == "committed"  # type: ignore[arg-type]


@contextlib.contextmanager
def write_locked(path: Path) -> Iterator[None]:
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("BEGIN EXCLUSIVE")
        yield
    finally:
        conn.execute("ROLLBACK")
        conn.close()


def test_a_transient_error_is_retried_then_exhausted(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    fencing.open(f"sqlite:///{path}").collection("orders").create("o-1", {"status": "packed"})
    impatient = fencing.open(f"sqlite:///{path}?busy_timeout=0.01", migrate=False)
    orders = impatient.collection("orders")
    spec = task(orders, max_retries=2)
    payload = spec.encode(orders.get("o-1"), "ship")  # type: ignore[arg-type]
    with write_locked(path):
        first = spec.run(payload, attempt=1)
        last = spec.run(payload, attempt=3)  # max_retries=2: the third attempt is the last
    assert (first.action, first.kind) == (Action.RETRY, "transient")
    assert isinstance(first.error, fencing.TransientStoreError)
    assert (last.action, last.kind) == (Action.FAIL, "transient_exhausted")
    assert spec.run(payload, attempt=2).kind == "committed"  # the same payload, later
    impatient.close()


class LostReply:
    """A real backend whose first commit lands but whose answer is lost on the way back."""

    def __init__(self, backend: Any) -> None:
        self._backend = backend
        self.lost = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)

    def commit(self, request: Any) -> Any:
        result = self._backend.commit(request)
        if not self.lost:
            self.lost = True
            raise fencing.TransientStoreError("connection reset after COMMIT")
        return result


def test_a_retry_after_a_landed_commit_reports_duplicate(store: fencing.Store) -> None:
    orders = store.collection("orders")
    record = orders.create("o-1", {"status": "packed"})
    store.backend = LostReply(store.backend)  # type: ignore[assignment]
    spec = task(orders)
    payload = spec.encode(record, "ship")
    assert spec.run(payload).action is Action.RETRY  # unknown outcome: retry the same payload
    assert spec.run(payload, attempt=2).kind == "duplicate"
    final = orders.get("o-1")
    assert final is not None and final.version == 2


def test_bad_messages_and_decide_errors_are_never_retried(
    store: fencing.Store, caplog: pytest.LogCaptureFixture
) -> None:
    orders = store.collection("orders")
    record = orders.create("o-1", {"status": "packed"})
    caplog.set_level(logging.INFO, "fencing.task")
    eager = task(orders, retry_on=(Exception,))  # even so: bad input is never retried
    report = eager.run("garbage")
    assert (report.action, report.kind) == (Action.REFUSE, "invalid")
    assert report.intent is None and report.to_dict()["intent_id"] is None
    wrong = store.collection("invoices").create("i-1", {}).intent("ship").to_json()
    assert eager.run(wrong).action is Action.REFUSE
    not_json = task(orders, decide=lambda r: {"when": object()})
    assert not_json.run(not_json.encode(record, "ship")).action is Action.REFUSE

    def broken(rec: fencing.Record) -> dict[str, Any]:
        raise KeyError("bug in decide")

    failing = task(orders, decide=broken)
    report = failing.run(failing.encode(record, "ship"))
    assert (report.action, report.kind) == (Action.FAIL, "error")
    assert isinstance(report.error, KeyError)
    flaky = task(orders, decide=broken, retry_on=(KeyError,))
    assert flaky.run(flaky.encode(record, "ship")).kind == "retryable"
    levels = [r.levelno for r in fenced_records(caplog)]
    assert levels == [logging.ERROR] * 4 + [logging.WARNING]
    unchanged = orders.get("o-1")
    assert unchanged is not None and unchanged.version == 1


def test_decide_sees_the_intent_and_the_hook_sees_the_report(store: fencing.Store) -> None:
    orders = store.collection("orders")
    record = orders.create("o-1", {"status": "packed"})
    seen: list[Any] = []

    def decide(rec: fencing.Record) -> dict[str, Any]:
        seen.append(current_intent())
        return ship(rec)

    spec = task(orders, decide=decide, on_outcome=seen.append)
    payload = spec.encode(record, "ship")
    report = spec.run(payload)
    assert seen == [spec.decode(payload), report]
    assert current_intent() is None


def test_a_target_factory_is_called_once_per_process(store: fencing.Store) -> None:
    store.collection("orders").create("o-1", {"status": "packed"})
    calls: list[int] = []

    def orders() -> fencing.Collection:
        calls.append(1)
        return store.collection("orders")

    spec = task(orders)
    record = store.collection("orders").get("o-1")
    threads = [
        threading.Thread(target=spec.run, args=(spec.encode(record, "ship"),)) for _ in range(4)
    ]  # type: ignore[arg-type]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert calls == [1]

    broken = task(lambda: "not a collection")
    report = broken.run(spec.encode(record, "ship"))  # type: ignore[arg-type]
    assert (report.action, report.kind) == (Action.FAIL, "error")
    assert isinstance(report.error, fencing.ConfigurationError)


def test_a_model_target_is_asked_at_every_run(store: fencing.Store) -> None:
    """``target=Order`` (a Django FencedModel): a class with ``__fencing_target__`` is not
    a factory to call (calling it would make an instance); its target is asked at every
    run, never kept (the model's store follows Django's test database by itself)."""
    store.collection("orders").create("o-1", {"status": "packed"})
    calls: list[int] = []

    class Model:
        @classmethod
        def __fencing_target__(cls) -> fencing.Collection:
            calls.append(1)
            return store.collection("orders")

    spec = task(Model)
    record = store.collection("orders").get("o-1")
    assert record is not None
    first = spec.run(spec.encode(record, "ship"))
    again = spec.run(spec.encode(record, "ship"))
    assert (first.kind, again.kind) == ("committed", "stale")
    assert calls == [1, 1]


def test_async_run_with_an_async_store() -> None:
    async def scenario() -> list[TaskReport]:
        astore = await fencing.open_async("memory://")
        orders = astore.collection("orders")
        record = await orders.create("o-1", {"status": "packed"})
        hooked: list[TaskReport] = []

        async def decide(rec: fencing.Record) -> dict[str, Any]:
            await asyncio.sleep(0)
            assert current_intent() is not None
            return ship(rec)

        async def after(report: TaskReport) -> None:
            hooked.append(report)

        async def target() -> fencing.AsyncCollection:
            return orders

        spec = task(target, decide=decide, on_outcome=after, lease=LeaseSpec(ttl=5))
        payload = spec.encode(record, "ship")
        reports = [await spec.arun(payload), await spec.arun(payload)]
        assert hooked == reports
        with pytest.raises(fencing.ConfigurationError, match="async"):
            task(orders)._target.sync()
        await astore.close()
        return reports

    first, again = asyncio.run(scenario())
    assert (first.kind, again.kind) == ("committed", "duplicate")
    assert first.token is not None


def test_sync_target_refuses_arun(store: fencing.Store) -> None:
    spec = task(store.collection("orders"))
    report = asyncio.run(spec.arun(fencing.Intent.new("orders", "o-1", 1, "ship").to_json()))
    assert report.action is Action.FAIL and isinstance(report.error, fencing.ConfigurationError)


# -- small values and configuration ---------------------------------------------------------------
def test_backoff_is_bounded_and_jittered() -> None:
    backoff = Backoff(0.5, 4.0)
    rng = random.Random(7)
    for retry, ceiling in [(1, 0.5), (2, 1.0), (3, 2.0), (4, 4.0), (30, 4.0), (10_000, 4.0)]:
        delay = backoff.delay(retry, rng)
        assert ceiling / 2 <= delay <= ceiling
    for bad in [(0, 1), (-1, 1), (2, 1), (float("nan"), 1), (True, 2)]:
        with pytest.raises(ValueError):
            Backoff(*bad)


def test_classify() -> None:
    assert classify(fencing.TransientStoreError("x")) == (Action.RETRY, "transient")
    assert classify(fencing.LeaseHeld("orders/o-1")) == (Action.RETRY, "lease_held")
    assert classify(fencing.InvalidState("x"), (ValueError,)) == (Action.REFUSE, "invalid")
    assert classify(OSError("x"), (OSError,)) == (Action.RETRY, "retryable")
    assert classify(fencing.SchemaError("x")) == (Action.FAIL, "error")


@pytest.mark.parametrize(
    "options",
    [
        {"name": ""},
        {"decide": "ship"},
        {"on_stale": "drop"},
        {"lease": 30},
        {"signer": "secret"},
        {"max_retries": -1},
        {"max_retries": 1.5},
        {"backoff": 1.0},
        {"retry_on": [ValueError]},
        {"retry_on": (str,)},
        {"on_outcome": 3},
        {"target": "orders"},
    ],
)
def test_bad_configuration_is_refused(store: fencing.Store, options: dict[str, Any]) -> None:
    arguments: dict[str, Any] = {
        "name": "t",
        "target": store.collection("orders"),
        "decide": ship,
        **options,
    }
    with pytest.raises(fencing.FencingError):
        FencedTask(**arguments)


@pytest.mark.parametrize(
    "options",
    [{"ttl": 0}, {"ttl": 5, "wait": -1}, {"ttl": 5, "owner": ""}, {"ttl": 5, "name": "fixed"}],
)
def test_bad_lease_spec_is_refused(options: dict[str, Any]) -> None:
    with pytest.raises(fencing.InvalidInput):
        LeaseSpec(**options)


# -- issue 20, item 5: decide can see that its lease was lost before an external call -----
def test_decide_sees_its_lease_and_a_lost_one_is_retried(store: fencing.Store) -> None:
    from fencing.contrib._common import current_lease

    orders = store.collection("orders")
    orders.create("o-1", {"status": "packed"})
    seen: list[Any] = []

    def decide(record: fencing.Record) -> dict[str, Any]:
        lease = current_lease()
        seen.append(lease)
        if len(seen) == 1:  # a newer owner took the lease (a pause past the TTL, say)
            store.backend.release(lease.name, lease.token)
            store.acquire(lease.name, owner="newer", ttl=30).release()
        lease.renew()  # before the external call: is it still ours?
        return {"status": "shipped"}

    spec = task(orders, decide=decide, lease=LeaseSpec(ttl=30))
    payload = spec.encode(orders.get("o-1"), "ship")
    lost = spec.run(payload)
    assert (lost.action, lost.kind) == (Action.RETRY, "lease_lost")
    assert isinstance(lost.error, fencing.LeaseLost) and orders.get("o-1").version == 1
    again = spec.run(payload, attempt=2)  # the queue's retry: a new lease, a new token
    assert isinstance(again.outcome, fencing.Committed) and again.token == seen[1].token
    assert seen[1].token > seen[0].token and current_lease() is None  # outside a task
    assert (
        task(orders, decide=lambda r: seen.append(current_lease()) or {"n": 1})
        .run(spec.encode(orders.get("o-1"), "x"))
        .outcome.committed
    )
    assert seen[-1] is None  # a task without lease=


def test_an_async_decide_sees_its_async_lease() -> None:
    from fencing.contrib._common import current_lease

    async def main() -> None:
        astore = await fencing.open_async("memory://")
        orders = astore.collection("orders")
        await orders.create("o-1", {"status": "packed"})
        seen: list[Any] = []

        async def decide(record: fencing.Record) -> dict[str, Any]:
            seen.append(current_lease())
            await current_lease().renew()
            return {"status": "shipped"}

        spec = task(orders, decide=decide, lease=LeaseSpec(ttl=30))
        report = await spec.arun(spec.encode(await orders.get("o-1"), "ship"))
        assert report.outcome is not None and report.outcome.committed
        assert isinstance(seen[0], fencing.AsyncLease) and seen[0].token == report.token
        await astore.close()

    asyncio.run(main())
