"""The outbox relay's throughput and publish latency, beside a hand-written relay loop.

Usage: ``python scripts/bench_relay.py [--store URL] [--rows 10000]
[--broker redis://127.0.0.1:6379/11]``. ``--store``: ``sqlite`` (default: a store file
in a temporary directory), or a PostgreSQL / MySQL / MariaDB server URL
(``postgresql://root@127.0.0.1:5432/test``, ``mysql://root@127.0.0.1:3306/test``): the
run makes a schema (PostgreSQL) or a database (MySQL) of its own, ``fencing_bench_<hex>``,
and drops it at the end. Celery on Redis; only this run's own queue keys are created
and deleted. Rows are written by a business transaction on the caller's own connection
(``sqlite3``, psycopg, PyMySQL) through ``store.using(conn).outbox.send``.

- throughput: ``--rows`` rows written in one transaction, then drained by one
  ``Relay.run_once()`` (claim 100, publish with ``app.send_task``, mark every 20) and,
  on a second set of rows, by the hand-written loop (one transaction per batch: select
  100 unsent rows, ``FOR UPDATE SKIP LOCKED`` on the servers, publish each with the
  same ``send_task``, one UPDATE marking them, commit): rows per second.
- latency, commit to broker: rows committed one by one (paced, ``--rate`` per second)
  while a relay runs in loop mode (``poll`` seconds; on PostgreSQL it waits on the
  ``LISTEN`` waker, ``poll`` only being its longest wait); a consumer BRPOPs the queue
  and stamps each message on arrival: p50/p99 of arrival minus commit time. The same
  for the hand-written loop polling at the same interval.
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
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

import redis
from celery import Celery

import fencing
from fencing.contrib.celery import fenced_task, publisher
from fencing.contrib.relay import Relay


def _ship(record: fencing.Record) -> dict[str, Any]:
    return dict(record.state)


class Bench:
    def __init__(self, root: Path, broker: str, store: str) -> None:
        self.run = uuid.uuid4().hex[:8]
        self.queue = f"fencing_bench_{self.run}"
        self.prefix = f"fencing-bench-{self.run}"
        self.db = Database(store, root, f"fencing_bench_{self.run}")
        self.store = fencing.open(self.db.url)
        self.waker_kind = "LISTEN" if hasattr(self.store.backend, "outbox_waiter") else "poll"
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
        self.rolled_back = 0

    def write(self, count: int) -> None:
        conn = self.db.connect()
        outbox = self.store.using(conn).outbox
        for i in range(count):
            outbox.send(self.ship, self.records[i % 100], f"t{i}")
        conn.commit()
        conn.close()

    def commit_one(self, conn: Any, i: int) -> float:
        """One business transaction; run again when the server rolled it back (on
        MariaDB, a deadlock with the hand-written loop's gap locks), as an application
        does: ``self.rolled_back`` counts those."""
        while True:
            try:
                self.store.using(conn).outbox.send(self.ship, self.records[i % 100], f"t{i}")
                conn.commit()
                return time.time()
            except fencing.TransientStoreError:
                conn.rollback()
                self.rolled_back += 1

    def hand_written_once(self, conn: Any) -> int:
        """A hand-written relay pass, one transaction per batch: select 100 unsent rows
        (``FOR UPDATE SKIP LOCKED`` on a server), publish each, mark them in one UPDATE,
        commit."""
        sent = 0
        mark = "?" if self.db.kind == "sqlite" else "%s"
        lock = "" if self.db.kind == "sqlite" else " FOR UPDATE SKIP LOCKED"
        while True:
            cur = conn.cursor()
            if self.db.kind == "sqlite":
                cur.execute("BEGIN IMMEDIATE")
            cur.execute(
                "SELECT id, task, payload FROM fencing_outbox WHERE sent_at IS NULL"
                f" ORDER BY id LIMIT 100{lock}"
            )
            rows = cur.fetchall()
            if not rows:
                conn.commit()
                return sent
            for rid, task, payload in rows:
                self.app.send_task(task, args=(payload,), task_id=f"hand-{rid}")
            ids = ", ".join(str(int(r[0])) for r in rows)
            cur.execute(
                f"UPDATE fencing_outbox SET sent_at = {mark} WHERE id IN ({ids})", (time.time(),)
            )
            conn.commit()
            sent += len(rows)

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
        self.db.drop()


class Database:
    """The bench's own store: a SQLite file, or a fresh schema (PostgreSQL) or database
    (MySQL / MariaDB) on the server of ``url``, dropped by :meth:`drop`; and connections
    to it as an application opens them (a transaction of their own, not autocommit)."""

    def __init__(self, url: str, root: Path, name: str) -> None:
        self.name = name
        parts = urlsplit(url)
        self.kind = "sqlite" if url == "sqlite" else parts.scheme.split("+")[0]
        if self.kind == "sqlite":
            self.url = f"sqlite:///{root / 'store.sqlite'}"
        elif self.kind == "postgresql":
            query = urlencode([*parse_qsl(parts.query), ("schema", name)])
            self.url = urlunsplit(parts._replace(query=query))
            self.plain = urlunsplit(parts._replace(scheme="postgresql", query=""))
        elif self.kind == "mysql":
            import pymysql

            self.server = {
                "host": parts.hostname or "127.0.0.1",
                "port": parts.port or 3306,
                "user": unquote(parts.username or "root"),
                "password": unquote(parts.password or ""),
                "charset": "utf8mb4",
            }
            admin = pymysql.connect(**self.server, autocommit=True)
            with admin.cursor() as cur:
                cur.execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")
            admin.close()
            self.url = urlunsplit(parts._replace(path="/" + name))
        else:
            raise SystemExit(f"--store: sqlite, postgresql://... or mysql://..., not {url!r}")

    def connect(self) -> Any:
        if self.kind == "sqlite":
            return sqlite3.connect(self.url.removeprefix("sqlite:///"), timeout=60)
        if self.kind == "postgresql":
            import psycopg

            return psycopg.connect(self.plain, options=f"-c search_path={self.name}")
        import pymysql

        return pymysql.connect(**self.server, database=self.name)

    def drop(self) -> None:
        if self.kind == "postgresql":
            import psycopg

            with psycopg.connect(self.plain, autocommit=True) as conn:
                conn.execute(f'DROP SCHEMA IF EXISTS "{self.name}" CASCADE')
        elif self.kind == "mysql":
            import pymysql

            admin = pymysql.connect(**self.server, autocommit=True)
            with admin.cursor() as cur:
                cur.execute(f"DROP DATABASE IF EXISTS `{self.name}`")
            admin.close()


def throughput(b: Bench, rows: int) -> dict[str, float]:
    out = {}
    b.write(rows)
    started = time.perf_counter()
    counts = Relay(b.store, publisher(b.app)).run_once()
    out["relay"] = counts.published / (time.perf_counter() - started)
    assert counts.published == rows and b.redis.llen(b.key) == rows
    b.clear()
    b.write(rows)
    conn = b.db.connect()
    started = time.perf_counter()
    sent = b.hand_written_once(conn)
    out["hand-written"] = sent / (time.perf_counter() - started)
    conn.close()
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

    waker = b.store.backend.outbox_waiter("celery") if b.waker_kind == "LISTEN" else None
    relay = Relay(b.store, publisher(b.app), poll=poll, waker=waker)

    def hand_loop() -> None:
        conn = b.db.connect()
        try:
            while not stop.is_set():
                if not b.hand_written_once(conn):
                    stop.wait(poll)
        finally:
            conn.close()

    runner = threading.Thread(target=hand_loop if hand else relay.run)
    consumer = threading.Thread(target=consume)
    consumer.start()
    runner.start()
    conn = b.db.connect()
    try:
        time.sleep(0.5)  # the relay's first claim, and its LISTEN, are done
        for i in range(count):
            committed[i] = b.commit_one(conn, i)
            time.sleep(1 / rate)
        deadline = time.monotonic() + 60
        while len(arrived) < count and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        conn.close()
        relay.stop()
        stop.set()
        runner.join()
        consumer.join()
        relay.close()
    b.clear()
    return sorted(arrived[i] - committed[i] for i in arrived)


def pct(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, int(q * len(values)))] * 1000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--store", default="sqlite", help="sqlite, or a server URL")
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--broker", default="redis://127.0.0.1:6379/11")
    parser.add_argument("--latency-rows", type=int, default=400)
    parser.add_argument("--rate", type=float, default=100.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        b = Bench(Path(tmp), args.broker, args.store)
        print(f"store: {b.db.kind} (relay wakes by {b.waker_kind}), broker: {args.broker}")
        try:
            for name, value in throughput(b, args.rows).items():
                print(f"throughput {name:>12}: {value:8.0f} rows/s ({args.rows} rows)")
            for poll in (0.05, 1.0):
                for hand in (False, True):
                    b.rolled_back = 0
                    lat = latency(b, args.latency_rows, args.rate, poll, hand)
                    name = "hand-written" if hand else "relay"
                    print(
                        f"latency {name:>12} poll {poll:4.2f}s: p50 {pct(lat, 0.5):7.1f} ms"
                        f"  p99 {pct(lat, 0.99):7.1f} ms  (n={len(lat)},"
                        f" mean {statistics.mean(lat) * 1000:.1f} ms"
                        f"{f', {b.rolled_back} sends rolled back' if b.rolled_back else ''})"
                    )
        finally:
            b.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
