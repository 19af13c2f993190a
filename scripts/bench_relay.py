"""The outbox relay's throughput and publish latency, beside a hand-written relay loop.

Usage: ``python scripts/bench_relay.py [--rows 10000] [--broker redis://127.0.0.1:6379/11]``
(a SQLite store file in a temporary directory; Celery on Redis; only this run's own
queue keys are created and deleted).

- throughput: ``--rows`` rows written in one transaction, then drained by one
  ``Relay.run_once()`` (claim 100, publish with ``app.send_task``, mark every 20) and,
  on a second set of rows, by the hand-written loop (select 100 unsent rows, publish,
  one UPDATE marking them): rows per second.
- latency, commit to broker: rows committed one by one (paced, ``--rate`` per second)
  while a relay runs in loop mode (``poll`` seconds); a consumer BRPOPs the queue and
  stamps each message on arrival: p50/p99 of arrival minus commit time. The same for
  the hand-written loop polling at the same interval.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import redis
from celery import Celery

import fencing
from fencing.contrib.celery import fenced_task, publisher
from fencing.contrib.relay import Relay


def _ship(record: fencing.Record) -> dict[str, Any]:
    return dict(record.state)


class Bench:
    def __init__(self, root: Path, broker: str) -> None:
        self.run = uuid.uuid4().hex[:8]
        self.queue = f"fencing_bench_{self.run}"
        self.prefix = f"fencing-bench-{self.run}"
        self.path = root / "store.sqlite"
        self.store = fencing.open(f"sqlite:///{self.path}")
        self.orders = self.store.collection("orders")
        self.app = Celery("bench", broker=broker, set_as_current=False)
        self.app.conf.update(
            task_default_queue=self.queue,
            task_serializer="json",
            broker_transport_options={"global_keyprefix": f"{self.prefix}:"},
        )
        self.ship = fenced_task(self.app, target=self.orders, name="bench.ship")(_ship)
        self.redis = redis.Redis.from_url(broker)
        self.key = f"{self.prefix}:{self.queue}"
        self.records = [self.orders.create(f"o-{k}", {}) for k in range(100)]

    def write(self, count: int) -> None:
        conn = sqlite3.connect(self.path, timeout=60)
        outbox = self.store.using(conn).outbox
        for i in range(count):
            outbox.send(self.ship, self.records[i % 100], f"t{i}")
        conn.commit()
        conn.close()

    def commit_one(self, i: int) -> float:
        conn = sqlite3.connect(self.path, timeout=60)
        self.store.using(conn).outbox.send(self.ship, self.records[i % 100], f"t{i}")
        conn.commit()
        at = time.time()
        conn.close()
        return at

    def hand_written_once(self) -> int:
        """A hand-written relay pass: select unsent rows, publish, mark them in one UPDATE."""
        conn = sqlite3.connect(self.path, timeout=60, isolation_level=None)
        sent = 0
        try:
            while True:
                rows = conn.execute(
                    "SELECT id, task, payload FROM fencing_outbox WHERE sent_at IS NULL"
                    " ORDER BY id LIMIT 100"
                ).fetchall()
                if not rows:
                    return sent
                for rid, task, payload in rows:
                    self.app.send_task(task, args=(payload,), task_id=f"hand-{rid}")
                conn.execute(
                    "UPDATE fencing_outbox SET sent_at = ? WHERE id IN (SELECT value FROM"
                    " json_each(?))",
                    (time.time(), json.dumps([r[0] for r in rows])),
                )
                sent += len(rows)
        finally:
            conn.close()

    def clear(self) -> None:
        self.redis.delete(self.key)
        self.store.outbox.prune(0)

    def close(self) -> None:
        self.clear()
        for key in self.redis.scan_iter(match=f"{self.prefix}*"):
            self.redis.delete(key)
        self.redis.close()
        self.store.close()
        self.app.close()


def throughput(b: Bench, rows: int) -> dict[str, float]:
    out = {}
    b.write(rows)
    started = time.perf_counter()
    counts = Relay(b.store, publisher(b.app)).run_once()
    out["relay"] = counts.published / (time.perf_counter() - started)
    assert counts.published == rows and b.redis.llen(b.key) == rows
    b.clear()
    b.write(rows)
    started = time.perf_counter()
    sent = b.hand_written_once()
    out["hand-written"] = sent / (time.perf_counter() - started)
    assert sent == rows
    b.clear()
    return out


def latency(b: Bench, count: int, rate: float, poll: float, hand: bool) -> list[float]:
    committed: dict[int, float] = {}
    arrived: dict[int, float] = {}
    stop = threading.Event()

    def consume() -> None:
        client = redis.Redis(connection_pool=b.redis.connection_pool)
        while len(arrived) < count and not stop.is_set():
            got = client.brpop([b.key], timeout=1)
            if got is None:
                continue
            at = time.time()
            message = json.loads(got[1])
            payload = json.loads(json.loads(__import__("base64").b64decode(message["body"]))[0][0])
            arrived[int(payload["transition"][1:])] = at

    relay = Relay(b.store, publisher(b.app), poll=poll)

    def hand_loop() -> None:
        while not stop.is_set():
            if not b.hand_written_once():
                stop.wait(poll)

    runner = threading.Thread(target=hand_loop if hand else relay.run)
    consumer = threading.Thread(target=consume)
    consumer.start()
    runner.start()
    try:
        for i in range(count):
            committed[i] = b.commit_one(i)
            time.sleep(1 / rate)
        deadline = time.monotonic() + 60
        while len(arrived) < count and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        relay.stop()
        stop.set()
        runner.join()
        consumer.join()
    b.clear()
    return sorted(arrived[i] - committed[i] for i in arrived)


def pct(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, int(q * len(values)))] * 1000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--broker", default="redis://127.0.0.1:6379/11")
    parser.add_argument("--latency-rows", type=int, default=400)
    parser.add_argument("--rate", type=float, default=100.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        b = Bench(Path(tmp), args.broker)
        try:
            for name, value in throughput(b, args.rows).items():
                print(f"throughput {name:>12}: {value:8.0f} rows/s ({args.rows} rows)")
            for poll in (0.05, 1.0):
                for hand in (False, True):
                    lat = latency(b, args.latency_rows, args.rate, poll, hand)
                    name = "hand-written" if hand else "relay"
                    print(
                        f"latency {name:>12} poll {poll:4.2f}s: p50 {pct(lat, 0.5):7.1f} ms"
                        f"  p99 {pct(lat, 0.99):7.1f} ms  (n={len(lat)},"
                        f" mean {statistics.mean(lat) * 1000:.1f} ms)"
                    )
        finally:
            b.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
