"""Superseded rows through the relay, on every store with an outbox: a burst of 100
superseding sends to one key is one publish and one worker run (Celery's in-memory
broker, the fenced task run on what the relay published); supersede mixed with plain
sends keeps each key's order; relays SIGKILLed again and again in the middle of bursts
lose nothing newer and never publish an older row of a key after a newer one."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

import fencing
from fencing.contrib.relay import OutboxRow, Relay

celery = pytest.importorskip("celery")

from fencing.contrib.celery import fenced_task, publisher  # noqa: E402

OUTBOX_STORES = {"memory", "sqlite-memory", "sqlite-file", "postgresql", "mysql"}
pytestmark = [
    pytest.mark.backends(only=lambda name: name in OUTBOX_STORES),
    pytest.mark.apis(only=["sync"]),
]


class Shop:
    """A Celery app on the in-memory broker, a fenced task on its own queue, and a worker
    that runs the task on every message the relay published."""

    def __init__(self, store: fencing.Store) -> None:
        self.store = store
        self.orders = store.collection("orders")
        self.app = celery.Celery("supersede", broker="memory://", set_as_current=False)
        self.queue = f"q-{uuid.uuid4().hex}"  # the memory broker is the process's
        self.runs: list[tuple[str, int]] = []  # (key, version decided against)

        def ship(record: fencing.Record) -> dict[str, Any]:
            self.runs.append((record.key, record.version))
            return {**record.state, "shipped": record.state["n"]}

        self.ship = fenced_task(self.app, target=self.orders, name="ship", queue=self.queue)(ship)

    def work(self) -> list[dict[str, Any]]:
        """Run the task on every message in its queue, as a worker would: the reports."""
        reports = []
        with self.app.connection_for_read() as conn:
            queue = conn.SimpleQueue(self.queue)
            while True:
                try:
                    message = queue.get(timeout=0.05)
                except queue.Empty:
                    return reports
                args, _, _ = message.payload
                reports.append(self.ship.apply(args=args).get())
                message.ack()


@pytest.fixture
def shop(store: Any) -> Shop:
    return Shop(store)


def test_a_burst_of_100_updates_is_one_publish_and_one_worker_run(shop: Shop) -> None:
    order = shop.orders.create("o-1", {"n": 0})
    for n in range(1, 101):  # the application updates the order 100 times
        order = shop.orders.commit(order.intent("edit"), {"n": n}).record
        shop.store.outbox.send(shop.ship, order, "ship", supersede=True)
    counts = Relay(shop.store, publisher(shop.app)).run_once()
    assert (counts.claimed, counts.published) == (1, 1)
    (report,) = shop.work()
    assert report["outcome"] == "committed"
    assert shop.runs == [("o-1", 101)]  # one run, on the newest state
    current = shop.orders.get("o-1")
    assert current is not None and current.state == {"n": 100, "shipped": 100}
    stats = shop.store.outbox.stats()
    assert (stats.pending, stats.superseded) == (0, 99)


def test_without_supersede_the_same_burst_is_100_publishes(shop: Shop) -> None:
    """What supersede saves: the same burst sent plain is 100 publishes and 100 runs, of
    which 99 end Stale (the record moved on after they were decided)."""
    order = shop.orders.create("o-1", {"n": 0})
    for n in range(1, 101):
        order = shop.orders.commit(order.intent("edit"), {"n": n}).record
        shop.store.outbox.send(shop.ship, order, "ship")
    counts = Relay(shop.store, publisher(shop.app)).run_once()
    assert counts.published == 100
    outcomes = [r["outcome"] for r in shop.work()]
    assert (outcomes.count("committed"), outcomes.count("stale")) == (1, 99)


def test_a_task_default_applies_when_the_send_says_nothing(shop: Shop) -> None:
    latest = fenced_task(
        shop.app, target=shop.orders, name="latest", queue=shop.queue, debounce=60
    )(_bill)
    order = shop.orders.create("o-1", {"n": 0})
    first = shop.store.outbox.send(latest, order, "bill")
    second = shop.store.outbox.send(latest, order, "bill")  # the task's: supersede, debounce
    assert second.due_at == pytest.approx(second.created_at + 60)
    assert second.burst_at == first.created_at
    third = shop.store.outbox.send(latest, order, "bill", supersede=False)  # the send's own
    assert third.due_at is None and third.burst_at is None
    assert [r.id for r in shop.store.outbox.pending()] == [second.id, third.id]
    assert shop.store.outbox.stats().superseded == 1
    with pytest.raises(fencing.ConfigurationError, match="max_wait"):
        fenced_task(shop.app, target=shop.orders, name="bad", max_wait=5)(_bill)


def test_supersede_mixed_with_plain_sends_keeps_each_keys_order(shop: Shop) -> None:
    """Ship (superseding two sends in three) and bill (plain) rows of four keys, a relay
    draining now and then in between: exactly the rows a model of supersede keeps are
    published, each once, in each key's order; the others are superseded."""
    bill = fenced_task(shop.app, target=shop.orders, name="bill", queue=shop.queue)(_bill)
    records = [shop.orders.create(f"o-{k}", {"n": 0}) for k in range(4)]
    published: list[OutboxRow] = []
    waiting: dict[tuple[str, str], list[int]] = defaultdict(list)  # (key, task): row ids
    expected: list[int] = []  # what the model publishes, in order
    sent = 0
    for i in range(90):
        record = records[i % 4]
        task, supersede = (bill, False) if i % 5 == 0 else (shop.ship, i % 3 != 0)
        row = shop.store.outbox.send(task, record, "go", supersede=supersede)
        sent += 1
        if supersede:
            waiting[(row.key, row.task)].clear()  # superseded: never published
        waiting[(row.key, row.task)].append(row.id)
        if i % 7 == 6:  # a relay drains everything waiting
            expected += sorted(r for ids in waiting.values() for r in ids)
            waiting.clear()
            assert Relay(shop.store, Recording(published)).run_once().failed == 0
    expected += sorted(r for ids in waiting.values() for r in ids)
    Relay(shop.store, Recording(published)).run_once()
    assert sorted(r.id for r in published) == sorted(expected)  # each once, none other
    by_key: dict[str, list[int]] = defaultdict(list)
    for row in published:
        by_key[row.key].append(row.id)
    assert all(ids == sorted(ids) for ids in by_key.values())
    stats = shop.store.outbox.stats()
    assert (stats.pending, stats.superseded) == (0, sent - len(expected))
    assert stats.superseded > 10  # the model did supersede


def _bill(record: fencing.Record) -> dict[str, Any]:
    return {**record.state, "billed": True}


class Recording:
    kind = "celery"

    def __init__(self, into: list[OutboxRow]) -> None:
        self.into = into

    def publish(self, row: OutboxRow) -> None:
        self.into.append(row)

    def close(self) -> None:
        pass


# -- relays killed in the middle of bursts ------------------------------------------------
#: a relay process whose publisher appends each publish to a log file (fsync'd before the
#: publish returns: what a SIGKILL cannot take back) after a broker's round trip of 20 ms,
#: marking every 3 rows, short claims of 1 s (a live relay stops publishing from a claim
#: 0.2 s before it lapses, counted from before it asked for the claim: counted from the
#: answer, a slow claim on a loaded host let a relay publish past its deadline beside
#: the relay that took its rows, an older row of a key after a newer one)
_RELAY = """
import os, sys, time
import fencing
from fencing.contrib.relay import Relay

url, log = sys.argv[1], sys.argv[2]


class Logged:
    kind = "celery"

    def __init__(self):
        self.fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT)

    def publish(self, row):
        time.sleep(0.02)
        os.write(self.fd, f"{row.id} {row.key}\\n".encode())
        os.fsync(self.fd)

    def close(self):
        os.close(self.fd)


store = fencing.open(url, migrate="check")
Relay(store, Logged(), batch=4, poll=0.01, ttl=1.0, mark_every=3).run()
"""
KEYS, SENDS, KILLS = 6, 240, 6


def _published(log: Path) -> list[tuple[int, str]]:
    if not log.exists():
        return []
    lines = log.read_text().splitlines()
    return [(int(i), k) for i, k in (line.split(" ", 1) for line in lines if line)]


@pytest.mark.backends(only=lambda name: name in {"sqlite-file", "postgresql", "mysql"})
def test_relays_killed_mid_burst_lose_nothing_newer_and_never_go_back(
    store: Any, store_url: str, tmp_path: Path
) -> None:
    """Two relay processes publish while bursts of superseding sends hit six keys; one of
    them is SIGKILLed after it published something new (between a publish and its mark,
    as often as not), and a fresh one started, six times. Then: every key's newest row
    was published; in the order of the publishes, no key's row comes after a newer row
    of that key (a row published again after its relay died is the same row); nothing
    is left pending."""
    log = tmp_path / "published.log"
    orders = store.collection("orders")
    records = [orders.create(f"o-{k}", {"n": 0}) for k in range(KEYS)]
    started: list[subprocess.Popen[bytes]] = []

    def start() -> subprocess.Popen[bytes]:
        argv = [sys.executable, "-c", _RELAY, store_url, str(log)]
        proc = subprocess.Popen(argv, cwd=Path(__file__).resolve().parents[2])
        started.append(proc)
        return proc

    task = Shop(store).ship
    relays = [start(), start()]
    newest: dict[str, int] = {}
    rng = random.Random(22)

    def a_publish_since(seen: int) -> None:
        deadline = time.monotonic() + 60
        while len(_published(log)) == seen:
            assert time.monotonic() < deadline, "no relay published anything"
            time.sleep(0.002)

    try:
        for i in range(SENDS):  # the keys in a random order: relays' batches differ
            row = store.outbox.send(task, rng.choice(records), "ship", supersede=True)
            newest[row.key] = row.id
            if i % (2 * KEYS) == 2 * KEYS - 1:  # the relays keep up with the bursts
                a_publish_since(len(_published(log)))
            if i % (SENDS // KILLS) == SENDS // KILLS - 1:  # after a publish: kill one
                a_publish_since(len(_published(log)))
                victim = relays.pop(0)
                victim.send_signal(signal.SIGKILL)
                victim.wait(timeout=10)
                relays.append(start())
        deadline = time.monotonic() + 120
        while store.outbox.stats().pending:  # the killed relays' claims lapse (1 s)
            assert time.monotonic() < deadline, "the outbox was never drained"
            time.sleep(0.05)
    finally:
        for proc in started:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in started:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
    assert sum(1 for p in started if p.returncode == -signal.SIGKILL) == KILLS
    published = _published(log)
    highest: dict[str, int] = {}
    for rid, key in published:
        assert rid >= highest.get(key, 0), f"row {rid} of {key} published after a newer one"
        highest[key] = rid
    assert highest == newest  # every key's newest row was published, nothing newer lost
    stats = store.outbox.stats()
    assert stats.pending == 0
    assert stats.superseded + len({rid for rid, _ in published}) >= SENDS
    assert stats.superseded > 0 and len(published) < SENDS  # the bursts were bursts


# -- what monitoring sees ---------------------------------------------------------------------
@pytest.mark.backends(only=lambda name: name == "sqlite-file")
def test_the_outbox_command_stats_and_gauges_count_superseded_rows(
    shop: Shop, store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from prometheus_client import CollectorRegistry

    from fencing._cli import main
    from fencing.contrib.prometheus import watch

    order = shop.orders.create("o-1", {"n": 0})
    rows = [shop.store.outbox.send(shop.ship, order, "ship", debounce=60) for _ in range(3)]
    assert main(["outbox", store_url, "--json"]) == 0
    *listed, totals = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["id"] for r in listed] == [rows[-1].id] and 59 <= listed[0]["due_in"] <= 60
    assert (totals["pending"], totals["superseded"]) == (1, 2)
    assert main(["outbox", store_url]) == 0
    assert "2 superseded outbox row(s)" in capsys.readouterr().out
    assert main(["stats", store_url, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["outbox"]["superseded"] == 2
    registry = CollectorRegistry()
    watch(shop.store, registry=registry, label="shop")
    assert registry.get_sample_value("fencing_outbox_superseded", {"store": "shop"}) == 2
    assert registry.get_sample_value("fencing_outbox_pending", {"store": "shop"}) == 1
