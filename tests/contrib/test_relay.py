"""The relay's flow and the integrations' outbox messages, on the memory store and a SQLite
file, with recording publishers (the real brokers are tests/contrib/test_outbox_e2e.py
and test_relay_concurrency.py).

What they prove: rows are published in id order and marked; a failure stops only its
key (its later rows are held back, given back, and published in order next time); a
broker that is down is retried with backoff until every row is out, none dropped; a
relay paused past its claim's deadline, whose rows another relay took, marks nothing
and publishes nothing more; the sync and async relays run the same flow; each
integration writes the payload its own enqueue sends and refuses what its queue
cannot carry before anything is written.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

import fencing
from fencing import InvalidInput
from fencing._cli import main
from fencing.contrib._common import publish_id
from fencing.contrib.relay import AsyncRelay, Backoff, OutboxRow, Relay

celery = pytest.importorskip("celery")

from fencing.contrib.celery import fenced_task  # noqa: E402


class Recorder:
    """A publisher that records what it sent; ``fail(row)`` decides a failure."""

    kind = "celery"

    def __init__(self, fail: Any = None) -> None:
        self.sent: list[OutboxRow] = []
        self.calls = 0
        self.fail = fail
        self.lock = threading.Lock()

    def publish(self, row: OutboxRow) -> None:
        with self.lock:
            self.calls += 1
            if self.fail is not None and self.fail(row, self.calls):
                raise ConnectionError(f"broker down at call {self.calls}")
            self.sent.append(row)

    def close(self) -> None:
        pass


class World:
    def __init__(self, store: fencing.Store) -> None:
        self.store = store
        self.orders = store.collection("orders")
        self.app = celery.Celery("relay-tests", broker="memory://", set_as_current=False)
        self.ship = fenced_task(self.app, target=self.orders, name="ship")(_ship)

    def send(self, keys: int, per_key: int) -> list[OutboxRow]:
        records = [self.orders.create(f"o-{k}", {"n": 0}) for k in range(keys)]
        return [
            self.store.outbox.send(self.ship, record, f"t{i}")
            for i in range(per_key)
            for record in records
        ]


def _ship(record: fencing.Record) -> dict[str, Any]:
    return {**record.state, "shipped": True}


@pytest.fixture
def world() -> Iterator[World]:
    store = fencing.open("memory://")
    try:
        yield World(store)
    finally:
        store.close()


def per_key(rows: list[OutboxRow]) -> dict[str, list[int]]:
    found: dict[str, list[int]] = defaultdict(list)
    for row in rows:
        found[row.key].append(row.id)
    return found


def in_order(rows: list[OutboxRow]) -> bool:
    return all(ids == sorted(ids) for ids in per_key(rows).values())


def test_run_once_publishes_in_order_and_marks(world: World) -> None:
    rows = world.send(keys=3, per_key=5)
    pub = Recorder()
    relay = Relay(world.store, pub, batch=4, mark_every=2)
    counts = relay.run_once()
    assert [r.id for r in pub.sent] == [r.id for r in rows]
    assert counts.published == counts.marked == 15 and counts.failed == counts.lost == 0
    assert relay.backlog().pending == 0
    assert relay.run_once().claimed == 0
    # the payload is the one the task's own enqueue sends, the key the record's
    intent = world.ship.fencing.decode(pub.sent[0].payload)
    assert (intent.collection, intent.key, intent.transition) == ("orders", "o-0", "t0")
    assert pub.sent[0].key == "collection:orders:o-0"


def test_sent_rows_are_pruned_after_the_retention(world: World) -> None:
    world.send(keys=2, per_key=2)
    relay = Relay(world.store, Recorder(), retention=3600)
    assert relay.run_once().pruned == 0  # sent now: kept for an hour
    assert len(_all_rows(world)) == 4
    assert Relay(world.store, Recorder(), retention=0).run_once().pruned == 4
    assert _all_rows(world) == []


def test_a_failure_stops_its_key_only(world: World) -> None:
    rows = world.send(keys=3, per_key=4)
    bad = rows[3].id  # the second row of key o-0
    pub = Recorder(fail=lambda row, n: row.id == bad and n < 5)
    relay = Relay(world.store, pub, batch=100)
    first = relay.run_once()
    # the first batch: o-0 stopped at its failed row, its later rows held back; the
    # others published; the drain went on and published o-0's rows in order
    assert first.failed == 1 and first.held == 2
    assert sorted(r.id for r in pub.sent) == sorted(r.id for r in rows)
    assert len(pub.sent) == len(rows) and in_order(pub.sent)
    assert relay.backlog().pending == 0


def test_failed_rows_keep_their_error_and_attempts(world: World) -> None:
    world.send(keys=1, per_key=2)
    relay = Relay(world.store, Recorder(fail=lambda row, n: True), max_failures=5)
    counts = relay.run_once()
    assert (counts.published, counts.failed, counts.held) == (0, 1, 1)
    first, second = world.store.outbox.pending()
    assert first.attempts == 1 and first.last_error is not None
    assert first.last_error.startswith("ConnectionError: broker down")
    assert second.attempts == 1 and second.last_error is not None
    assert second.last_error.startswith("held back")
    assert first.claim_token is None and second.claim_token is None  # given back


def test_broker_down_backs_off_and_drops_nothing(world: World) -> None:
    rows = world.send(keys=20, per_key=5)
    down = threading.Event()
    down.set()
    pub = Recorder(fail=lambda row, n: down.is_set())
    batches: list[int] = []
    relay = Relay(
        world.store,
        pub,
        batch=10,
        poll=0.01,
        max_failures=3,
        backoff=Backoff(0.01, 0.05),
        on_batch=lambda counts, totals: batches.append(counts.failed),
    )
    runner = threading.Thread(target=relay.run)
    runner.start()
    try:
        deadline = time.monotonic() + 30
        while sum(1 for b in batches if b) < 5:  # failed batches, backing off
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert not pub.sent
        down.clear()  # the broker is back
        while relay.backlog().pending:
            assert time.monotonic() < deadline
            time.sleep(0.01)
    finally:
        relay.stop()
        runner.join(10)
    assert not runner.is_alive()
    assert sorted(r.id for r in pub.sent) == [r.id for r in rows]  # each once, none lost
    assert in_order(pub.sent)
    assert all(b <= 3 for b in batches)  # a batch stops after max_failures in a row


def test_a_paused_relay_whose_claim_was_taken_marks_nothing(world: World) -> None:
    """Relay A publishes its first row and pauses (inside publish) past its claim's
    deadline; relay B claims the rows and publishes them all. A, resumed, publishes
    nothing more, and its mark and give-back name a claim no longer its own: no row
    changes."""
    rows = world.send(keys=2, per_key=3)
    paused, resume = threading.Event(), threading.Event()

    class Pausing(Recorder):
        def publish(self, row: OutboxRow) -> None:
            super().publish(row)
            if len(self.sent) == 1:
                paused.set()
                resume.wait(10)

    a_pub, b_pub = Pausing(), Recorder()
    a = Relay(world.store, a_pub, name="relay-a", ttl=0.2, batch=100)
    b = Relay(world.store, b_pub, name="relay-b", ttl=30, batch=100)
    result: dict[str, Any] = {}
    runner = threading.Thread(target=lambda: result.update(a=a.run_once()))
    runner.start()
    try:
        assert paused.wait(10)
        assert b.run_once().claimed == 0  # A's claim is live: nothing for B yet
        time.sleep(0.3)  # A's claim lapses
        taken = b.run_once()
        assert taken.published == taken.marked == len(rows)
        sent = {r.id: r.sent_at for r in _all_rows(world)}
    finally:
        resume.set()
        runner.join(10)
    a_counts = result["a"]
    assert [r.id for r in a_pub.sent] == [rows[0].id]  # nothing after the pause
    assert (a_counts.published, a_counts.marked, a_counts.lost) == (1, 0, 1)
    assert {r.id: r.sent_at for r in _all_rows(world)} == sent  # A changed nothing
    assert [r.id for r in b_pub.sent] == [r.id for r in rows]


def _all_rows(world: World) -> list[OutboxRow]:
    """Every row, sent ones included (the memory backend's own dict)."""
    backend: Any = world.store._live()
    return list(backend._outbox.values())


def test_the_async_relay_runs_the_same_flow() -> None:
    async def go() -> None:
        store = await fencing.open_async("memory://")
        orders = store.collection("orders")
        app = celery.Celery("relay-tests", broker="memory://", set_as_current=False)
        ship = fenced_task(app, target=orders, name="ship")(_ship)
        sent: list[OutboxRow] = []

        class AsyncRecorder:
            kind = "celery"

            async def publish(self, row: OutboxRow) -> None:
                await asyncio.sleep(0)
                sent.append(row)

            async def close(self) -> None:
                pass

        record = await orders.create("o-1", {})
        rows = [await store.outbox.send(ship, record, f"t{i}") for i in range(7)]
        relay = AsyncRelay(store, AsyncRecorder(), batch=3)
        counts = await relay.run_once()
        assert counts.published == counts.marked == 7
        assert [r.id for r in sent] == [r.id for r in rows]
        assert (await relay.backlog()).pending == 0
        await relay.close()
        await store.close()

    asyncio.run(go())


def test_an_idle_relay_waits_through_its_waker(world: World) -> None:
    """The seam a notifying store plugs into: an idle relay waits through ``waker``
    (``wait(poll)``), a wake-up makes it claim at once, and ``stop()`` wakes it."""
    waits: list[float] = []
    woken = threading.Event()

    class Waker:
        def wait(self, timeout: float) -> None:
            waits.append(timeout)
            woken.wait(timeout)
            woken.clear()

        def wake(self) -> None:
            woken.set()

        def close(self) -> None:
            pass

    pub = Recorder()
    relay = Relay(world.store, pub, poll=60.0, waker=Waker())
    runner = threading.Thread(target=relay.run)
    runner.start()
    try:
        _until(lambda: waits)  # idle: waiting up to 60 s
        world.send(keys=1, per_key=1)
        relay.waker.wake()  # "a row was written" (what a LISTEN waker would say)
        _until(lambda: len(pub.sent) == 1)
    finally:
        relay.stop()
        runner.join(10)
    assert not runner.is_alive()  # stop() woke the 60 s wait
    assert set(waits) == {60.0}


def _until(check: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline
        time.sleep(0.005)


@pytest.mark.parametrize(
    "bad",
    [
        {"batch": 0},
        {"batch": True},
        {"ttl": 0.01},
        {"poll": float("nan")},
        {"mark_every": 0},
        {"name": "no spaces"},
        {"retention": -1},
    ],
)
def test_relay_settings_are_checked(world: World, bad: dict[str, Any]) -> None:
    with pytest.raises(InvalidInput):
        Relay(world.store, Recorder(), **bad)


def test_a_relay_needs_a_publisher_and_its_store(world: World) -> None:
    with pytest.raises(fencing.ConfigurationError):
        Relay(world.store, object())
    with pytest.raises(fencing.ConfigurationError):
        AsyncRelay(world.store, Recorder())


# -- the integrations' outbox messages -------------------------------------------------------
def test_celery_message_options(world: World) -> None:
    record = world.orders.create("o-1", {})
    row = world.store.outbox.send(world.ship, record, "ship", countdown=5, queue="orders")
    assert (row.kind, row.task, row.queue) == ("celery", "ship", "orders")
    assert row.options == {"countdown": 5, "queue": "orders"}
    for bad in ({"eta": datetime.now()}, {"task_id": "x"}, {"countdown": object()}):
        with pytest.raises(InvalidInput):
            world.store.outbox.send(world.ship, record, "ship", **bad)
    with pytest.raises(InvalidInput, match="fenced task"):
        world.store.outbox.send(object(), record, "ship")
    assert world.store.outbox.stats().pending == 1  # nothing refused was written


def test_signed_payload_is_what_enqueue_sends(world: World) -> None:
    signer = fencing.Signer(keys={"k": b"a-test-key-of-enough-length-0123"}, current="k")
    task = fenced_task(world.app, target=world.orders, name="signed", signer=signer)(_ship)
    record = world.orders.create("o-1", {})
    row = world.store.outbox.send(task, record, "ship")
    intent = signer.verify(row.payload)
    assert (intent.key, intent.expected_version) == ("o-1", record.version)
    with pytest.raises(fencing.InvalidIntent):
        fencing.Intent.from_json(row.payload)  # a token, not bare JSON


def test_rq_message_options(world: World) -> None:
    pytest.importorskip("rq")
    from .apps import rq_app

    record = world.orders.create("o-1", {})
    row = world.store.outbox.send(rq_app.mark, record, "ship", queue="q1", job_timeout=30)
    assert (row.kind, row.task, row.queue) == ("rq", "tests.contrib.apps.rq_app.mark", "q1")
    assert row.options == {"crash_retries": 3, "job_timeout": 30}
    for bad in ({"job_id": "x"}, {"crash_retries": -1}, {"depends_on": "j"}):
        with pytest.raises(InvalidInput):
            world.store.outbox.send(rq_app.mark, record, "ship", **bad)


def test_dramatiq_message_options(world: World) -> None:
    dramatiq = pytest.importorskip("dramatiq")
    from dramatiq.brokers.stub import StubBroker

    from fencing.contrib.dramatiq import fenced_actor

    broker = StubBroker()
    actor = fenced_actor(target=world.orders, broker=broker, queue_name="q2")(_ship)
    record = world.orders.create("o-1", {})
    row = world.store.outbox.send(actor, record, "ship", delay=1500)
    assert (row.kind, row.task, row.queue, row.options) == (
        "dramatiq",
        "_ship",
        "q2",
        {"delay": 1500},
    )
    for bad in ({"delay": 1.5}, {"priority": 3}):
        with pytest.raises(InvalidInput):
            world.store.outbox.send(actor, record, "ship", **bad)
    # the publisher sends the message the actor's own send would
    from fencing.contrib.dramatiq import publisher

    publisher(broker).publish(row)
    (message,) = broker.queues["q2.DQ"].queue
    decoded = dramatiq.Message.decode(message)
    assert decoded.actor_name == "_ship" and decoded.args == (row.payload,)
    assert decoded.message_id == publish_id(row)


def test_arq_message_options(world: World) -> None:
    pytest.importorskip("arq")
    from fencing.contrib.arq import fenced_function

    function = fenced_function(target=world.orders, name="ship_fn")(_ship)
    record = world.orders.create("o-1", {})
    row = world.store.outbox.send(function, record, "ship", _defer_by=2, _queue_name="q3")
    assert (row.kind, row.task, row.queue) == ("arq", "ship_fn", "q3")
    for bad in ({"_job_id": "x"}, {"_defer_by": -1}, {"_queue_name": 3}):
        with pytest.raises(InvalidInput):
            world.store.outbox.send(function, record, "ship", **bad)


def test_publish_id_is_the_rows_own(world: World) -> None:
    rows = world.send(keys=1, per_key=2)
    again = world.store.outbox.pending()
    assert publish_id(rows[0]) == publish_id(again[0]) != publish_id(rows[1])


# -- fencing outbox ----------------------------------------------------------------------------
def test_outbox_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'store.sqlite'}"
    with fencing.open(url) as store:
        w = World(store)
        assert main(["outbox", url, "--fail-if-older", "0"]) == 0  # nothing pending
        assert "no pending outbox row" in capsys.readouterr().out
        w.send(keys=2, per_key=2)
        time.sleep(0.05)
        assert main(["outbox", url, "--json", "--fail-if-older", "0.01"]) == 1
        lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
        assert [x["key"] for x in lines[:-1]] == [
            "collection:orders:o-0",
            "collection:orders:o-1",
        ] * 2
        assert lines[-1]["pending"] == 4 and lines[-1]["oldest_age"] > 0
        assert main(["outbox", url, "--fail-if-older", "3600"]) == 0
        assert "4 pending outbox row(s)" in capsys.readouterr().out
        Relay(store, Recorder()).run_once()
        assert main(["outbox", url, "--json"]) == 0
        assert json.loads(capsys.readouterr().out) == {
            "dead": 0,
            "oldest_age": 0.0,
            "pending": 0,
            "superseded": 0,
        }


# -- fencing relay ---------------------------------------------------------------------------
#: The Celery app ``fencing relay --app tests.contrib.test_relay:APP`` publishes with
#: (Celery's in-memory transport: the messages stay in this process).
APP = celery.Celery("relay-cli", broker="memory://", set_as_current=False)
DOWN = celery.Celery("relay-cli-down", broker="redis://127.0.0.1:1/0", set_as_current=False)


def test_relay_command_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'store.sqlite'}"
    with fencing.open(url) as store:
        World(store).send(keys=3, per_key=2)
    argv = ["relay", url, "--queue", "celery", "--once", "--name", "cli-relay"]
    # nothing listens on port 1: every publish fails, the rows stay
    assert main([*argv, "--app", "tests.contrib.test_relay:DOWN", "--quiet"]) == 1
    assert "published 0 row(s)" in capsys.readouterr().out
    assert main([*argv, "--app", "tests.contrib.test_relay:APP"]) == 0
    out = capsys.readouterr().out
    assert "published 6 row(s), marked 6" in out and "0 pending" in out
    with fencing.open(url) as store:
        assert store.outbox.stats().pending == 0


def test_relay_command_refuses_a_bad_app(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["relay", "memory://", "--queue", "celery", "--once"]
    assert main([*argv, "--app", "no_such_module_here:app"]) == 2
    assert "cannot import" in capsys.readouterr().err
    assert main([*argv, "--app", "tests.contrib.test_relay:NOTHING"]) == 2
    assert "has no" in capsys.readouterr().err


_SIGNAL_STORM = """
import signal, sys, threading
import fencing
from fencing.contrib.relay import Relay

class Quiet:
    kind = "celery"
    def publish(self, row): pass
    def close(self): pass

store = fencing.open("memory://")
relay = Relay(store, Quiet(), poll=0.001)
hits = 0

def on_alarm(*_):
    global hits
    hits += 1
    relay.waker.wake()  # a signal in the middle of the relay's waits, thousands of times
    if hits >= 3000:
        signal.setitimer(signal.ITIMER_REAL, 0)
        relay.stop()

signal.signal(signal.SIGALRM, on_alarm)
signal.setitimer(signal.ITIMER_REAL, 0.0002, 0.0002)
relay.run()
relay.close()
print("stopped after", hits, "signals", flush=True)
"""


def test_stop_from_a_signal_handler_never_deadlocks(tmp_path: Path) -> None:
    """``stop()`` and ``wake()`` take no lock: a handler that calls them while the
    relay's own thread is inside a wait cannot block on a lock that thread holds
    (``threading.Event.set()`` in a handler can). A hang here is that deadlock."""
    import subprocess
    import sys

    script = tmp_path / "storm.py"
    script.write_text(_SIGNAL_STORM)
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    # (a signal already pending when the timer is cancelled may still arrive: 3001)
    said, count, signals = done.stdout.rsplit(maxsplit=2)
    assert (said, signals) == ("stopped after", "signals") and int(count) >= 3000, done.stdout


def test_a_stop_before_run_makes_run_return_at_once(tmp_path: Path) -> None:
    with fencing.open(f"sqlite:///{tmp_path / 'store.db'}") as store:
        relay = Relay(store, Recorder(), poll=60.0)
        relay.stop()  # e.g. SIGTERM while the relay was being made
        started = time.monotonic()
        relay.run()
        assert time.monotonic() - started < 30  # not the 60 s poll
        relay.close()


def test_a_publisher_without_broker_confirms_is_refused() -> None:
    """On RabbitMQ a publish without confirms returns once the message is on the
    socket: a connection lost then loses it while the relay marks its row sent. Both
    RabbitMQ publishers refuse an app or broker made that way, before any row moves."""
    from fencing.contrib.celery import publisher as celery_publisher

    app = celery.Celery("no-confirms", broker="pyamqp://guest@127.0.0.1//", set_as_current=False)
    with pytest.raises(fencing.ConfigurationError, match="confirm_publish"):
        celery_publisher(app)
    app.conf.broker_transport_options = {"confirm_publish": True}
    assert celery_publisher(app).app is app
    redis_app = celery.Celery("redis", broker="redis://127.0.0.1:6379/0", set_as_current=False)
    celery_publisher(redis_app)  # Redis answers every push

    pytest.importorskip("dramatiq")
    pytest.importorskip("pika")
    from dramatiq.brokers.rabbitmq import RabbitmqBroker

    from fencing.contrib.dramatiq import publisher as dramatiq_publisher

    url = "amqp://guest:guest@127.0.0.1:5672/"
    with pytest.raises(fencing.ConfigurationError, match="confirm_delivery"):
        dramatiq_publisher(RabbitmqBroker(url=url))  # no connection is made to refuse it
    confirmed = RabbitmqBroker(url=url, confirm_delivery=True)
    try:
        assert dramatiq_publisher(confirmed).broker is confirmed
    finally:
        confirmed.close()


def test_relay_command_gives_sigterm_back(tmp_path: Path) -> None:
    """``fencing relay`` (looping) stops on SIGTERM; run in a process that goes on, it
    leaves SIGTERM as it found it, not its own handler behind."""
    before = signal.getsignal(signal.SIGTERM)
    url = f"sqlite:///{tmp_path / 'store.sqlite'}"
    fencing.open(url).close()  # made and migrated

    def stop_it() -> None:  # once the relay's handler is in place
        while signal.getsignal(signal.SIGTERM) == before:
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGTERM)

    stopper = threading.Thread(target=stop_it, daemon=True)
    stopper.start()
    argv = ["relay", url, "--queue", "celery", "--poll", "0.05", "--quiet"]
    assert main([*argv, "--app", "tests.contrib.test_relay:APP"]) == 0
    stopper.join()
    assert signal.getsignal(signal.SIGTERM) == before


# -- issue 18, item 10: the confirms check asks kombu, not the URL string --------------------
_NOWHERE = "pyamqp://guest@127.0.0.1:1//"  # nothing listens: a refusal made after connecting
_REDIS = "redis://127.0.0.1:1/0"  # would be a connection error, not a ConfigurationError


@pytest.mark.parametrize(
    "conf",
    [
        pytest.param({"broker_url": f"{_REDIS};{_NOWHERE}"}, id="failover-string"),
        pytest.param({"broker_url": [_REDIS, _NOWHERE]}, id="failover-list"),
        pytest.param({"broker_url": [_NOWHERE.replace("pyamqp", "amqp")]}, id="amqp-alias"),
        pytest.param({}, id="celery-default-broker"),
        pytest.param({"broker_url": _REDIS, "broker_write_url": _NOWHERE}, id="write-url"),
        pytest.param({"broker_url": f" {_NOWHERE}"}, id="leading-space"),
        pytest.param({"broker_url": f"\t{_NOWHERE}"}, id="leading-tab"),
        pytest.param(
            {"broker_url": _NOWHERE, "broker_transport_options": {"confirm_publish": False}},
            id="confirms-off",
        ),
        pytest.param(
            {
                "broker_url": f"{_NOWHERE};{_REDIS};{_NOWHERE.replace('1//', '2//')}",
                "broker_write_url": None,
            },
            id="failover-amqp-first",
        ),
        pytest.param({"broker_url": "librabbitmq://guest@127.0.0.1:1//"}, id="librabbitmq"),
    ],
)
def test_every_way_to_publish_to_amqp_without_confirms_is_refused(
    conf: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    from fencing.contrib.celery import publisher as celery_publisher

    monkeypatch.delenv("CELERY_BROKER_URL", raising=False)
    monkeypatch.delenv("CELERY_BROKER_WRITE_URL", raising=False)
    app = celery.Celery("bypass", set_as_current=False)
    app.conf.update(conf)
    with pytest.raises(fencing.ConfigurationError, match="confirm"):
        celery_publisher(app)


@pytest.mark.parametrize(
    "conf",
    [
        pytest.param({"broker_url": _REDIS}, id="redis"),
        pytest.param({"broker_url": "memory://"}, id="memory"),
        pytest.param(
            {
                "broker_url": [_NOWHERE, _REDIS],
                "broker_transport_options": {"confirm_publish": True},
            },
            id="failover-with-confirms",
        ),
        pytest.param(
            {
                "broker_url": _NOWHERE,
                "broker_write_url": _REDIS,  # publishes to Redis; consumes from AMQP
            },
            id="write-url-redis",
        ),
    ],
)
def test_a_publisher_that_waits_for_its_broker_is_taken(
    conf: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    from fencing.contrib.celery import publisher as celery_publisher

    monkeypatch.delenv("CELERY_BROKER_URL", raising=False)
    monkeypatch.delenv("CELERY_BROKER_WRITE_URL", raising=False)
    app = celery.Celery("confirmed", set_as_current=False)
    app.conf.update(conf)
    assert celery_publisher(app).app is app  # and nothing connected (port 1)


def test_a_dramatiq_rabbitmq_broker_without_confirms_is_refused_however_made() -> None:
    pytest.importorskip("dramatiq")
    pytest.importorskip("pika")
    from dramatiq.brokers.rabbitmq import RabbitmqBroker

    from fencing.contrib.dramatiq import publisher as dramatiq_publisher

    url = "amqp://guest:guest@127.0.0.1:1/"

    class Unset(RabbitmqBroker):  # a subclass that never sets the switch
        def __init__(self) -> None:
            super().__init__(url=url, confirm_delivery=True)
            del self.confirm_delivery

    class Forgets(RabbitmqBroker):  # a class attribute saying nothing either way
        confirm_delivery = None

    brokers = [
        RabbitmqBroker(url=url, confirm_delivery=0),
        RabbitmqBroker(url=url, confirm_delivery=None),
        Unset(),
        Forgets(url=url, confirm_delivery=None),
    ]
    for broker in brokers:
        try:
            with pytest.raises(fencing.ConfigurationError, match="confirm_delivery"):
                dramatiq_publisher(broker)
        finally:
            broker.close()
