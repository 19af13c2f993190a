"""Relays at scale and through a broker outage, on real Redis with Celery's own client.

- Two and four relay processes (``fencing relay``, in loop mode) drain 10,000 rows of
  200 keys written in one business transaction: the broker's queue then holds every row
  exactly once (no relay crashed), and each key's rows in the order they were written.
  What the broker received is read back from the queue's Redis list itself (Celery's
  Redis transport pushes on the left: the list reversed is the publish order), not
  from the relays' own accounts.
- A relay publishing to a private Redis server (started by the test, on its own port,
  with an fsync'd append-only file) that is shut down for 10 s mid-drain, rows written
  meanwhile, then started again: the relay backs off while it is down and every row
  reaches the broker, each key's rows in order (a publish whose answer was lost may
  arrive twice: at least once; the worker's ``Duplicate`` takes care of that).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

import fencing
from fencing.contrib.relay import Backoff, OutboxRow, Relay

from .._backends import CI, require_server
from ._e2e import REDIS_HOST, REDIS_PORT, REPO, redis_url

pytestmark = pytest.mark.slow
pytest.importorskip("celery")

ROWS, KEYS = 10_000, 200


def _queue_messages(client: redis.Redis, key: str) -> list[int]:
    """The row ids of the Celery messages in a Redis list, in the order published."""
    ids = []
    for raw in reversed(client.lrange(key, 0, -1)):
        message = json.loads(raw)
        task_id = message["headers"]["id"]
        assert task_id.startswith("fencing-outbox-"), task_id
        ids.append(int(task_id.split("-")[2]))
        body = json.loads(base64.b64decode(message["body"]))
        assert isinstance(body[0][0], str)  # the payload, the one argument
    return ids


def _check_order(received: list[int], rows: dict[int, OutboxRow]) -> None:
    """Each key's rows, first arrivals, in id (= written) order."""
    seen: set[int] = set()
    last: dict[str, int] = {}
    for rid in received:
        if rid in seen:
            continue
        seen.add(rid)
        key = rows[rid].key
        assert last.get(key, 0) < rid, f"row {rid} of {key} arrived after row {last[key]}"
        last[key] = rid


class Setup:
    def __init__(self, root: Path, broker: str) -> None:
        self.run = uuid.uuid4().hex[:10]
        self.root = root
        self.queue = f"fencing_relay_{self.run}"
        self.prefix = f"fencing-relay-{self.run}"
        self.broker = broker
        self.store_url = f"sqlite:///{root / 'store.sqlite'}"
        self.store = fencing.open(self.store_url)
        self.orders = self.store.collection("orders")
        from .apps.celery_app import build

        self.tasks = build(broker, self.queue, self.prefix)
        (root / "control").mkdir(exist_ok=True)

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
        env.update(
            PYTHONPATH=os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
            FENCING_E2E_RUN=self.run,
            FENCING_E2E_STORE=self.store_url,
            FENCING_E2E_CONTROL=str(self.root / "control"),
            FENCING_E2E_BROKER=self.broker,
            FENCING_E2E_QUEUE=self.queue,
            FENCING_E2E_PREFIX=self.prefix,
        )
        return env

    def write(self, count: int, keys: int, start: int = 0) -> list[OutboxRow]:
        """``count`` rows over ``keys`` records, in one business transaction."""
        records = [
            self.orders.get(f"o-{k}") or self.orders.create(f"o-{k}", {}) for k in range(keys)
        ]
        conn = sqlite3.connect(self.root / "store.sqlite", timeout=60)
        try:
            outbox = self.store.using(conn).outbox
            rows = [
                outbox.send(self.tasks.mark, records[i % keys], f"t{start + i}")
                for i in range(count)
            ]
            conn.commit()
        finally:
            conn.close()
        return rows

    @property
    def list_key(self) -> str:
        return f"{self.prefix}:{self.queue}"

    def close(self) -> None:
        self.store.close()
        self.tasks.app.close()


@pytest.fixture
def shared_redis(tmp_path: Path) -> Iterator[Setup]:
    require_server("Redis", REDIS_HOST, REDIS_PORT)
    setup = Setup(tmp_path, redis_url("celery"))
    try:
        yield setup
    finally:
        setup.close()
        client = redis.Redis.from_url(setup.broker)
        with contextlib.suppress(Exception):
            client.delete(setup.list_key)
            for key in client.scan_iter(match=f"{setup.prefix}*", count=500):
                client.delete(key)
        client.close()


@pytest.mark.parametrize("relays", [2, 4])
def test_relays_drain_10000_rows_exactly_once_in_key_order(
    shared_redis: Setup, relays: int
) -> None:
    s = shared_redis
    rows = {r.id: r for r in s.write(ROWS, KEYS)}
    argv = [sys.executable, "-m", "fencing", "relay", s.store_url, "--queue", "celery"]
    argv += ["--app", "tests.contrib.apps.relay_app:celery", "--batch", "50", "--poll", "0.05"]
    procs = []
    for n in range(relays):
        with open(s.root / f"relay{n}.log", "wb") as log:
            procs.append(
                subprocess.Popen(
                    [*argv, "--name", f"relay-{n}"],
                    env=s.env(),
                    cwd=REPO,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
    try:
        deadline = time.monotonic() + 600
        while s.store.outbox.stats().pending:
            dead = [p for p in procs if p.poll() is not None]
            assert not dead, (s.root / "relay0.log").read_text()
            assert time.monotonic() < deadline, "the relays did not drain the outbox"
            time.sleep(0.2)
    finally:
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    logs = [(s.root / f"relay{n}.log").read_text() for n in range(relays)]
    assert all(p.returncode == 0 for p in procs), logs
    shares = [int(log.rsplit("published ", 1)[1].split(" ")[0]) for log in logs]
    print(f"{relays} relays published {shares}")
    assert sum(shares) == ROWS, shares  # each row published once, by one relay
    client = redis.Redis.from_url(s.broker)
    try:
        received = _queue_messages(client, s.list_key)
    finally:
        client.close()
    assert sorted(received) == sorted(rows)  # every row, exactly once
    _check_order(received, rows)


# -- a broker outage ----------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PrivateRedis:
    """A redis-server of the test's own (never the machine's shared one)."""

    def __init__(self, root: Path) -> None:
        self.port = _free_port()
        self.root = root
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        binary = shutil.which("redis-server")
        assert binary is not None
        argv = [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
        argv += ["--appendonly", "yes", "--appendfsync", "always", "--dir", str(self.root)]
        with open(self.root / "redis.log", "ab") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        while True:
            try:
                client = redis.Redis(port=self.port)
                client.ping()
                client.close()
                return
            except redis.ConnectionError:
                assert time.monotonic() < deadline, (self.root / "redis.log").read_text()
                time.sleep(0.05)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # a clean shutdown: the AOF is complete
            self.proc.wait(timeout=20)


def test_broker_down_for_10s_then_back_delivers_every_row(tmp_path: Path) -> None:
    if shutil.which("redis-server") is None:
        if CI:
            pytest.fail("redis-server is not installed, and CI is set")
        pytest.skip("redis-server is not installed (the test runs a private one)")
    server = PrivateRedis(tmp_path)
    server.start()
    s = Setup(tmp_path, f"redis://127.0.0.1:{server.port}/0")
    failed_batches: list[int] = []
    relay = Relay(
        s.store,
        _celery_publisher(s),
        batch=20,
        poll=0.05,
        backoff=Backoff(0.2, 2.0),
        on_batch=lambda counts, totals: failed_batches.append(counts.failed),
    )
    runner = threading.Thread(target=relay.run)
    try:
        rows = {r.id: r for r in s.write(300, 30)}
        runner.start()
        _wait(lambda: relay.counts.published >= 100, 60, "100 rows published")
        server.stop()
        rows |= {r.id: r for r in s.write(100, 30, start=300)}  # written while it is down
        time.sleep(10)
        assert relay.counts.failed > 0 and s.store.outbox.stats().pending > 0
        published_while_down = relay.counts.published
        server.start()
        _wait(lambda: not s.store.outbox.stats().pending, 120, "the outbox to drain")
        assert relay.counts.published > published_while_down
    finally:
        relay.stop()
        if runner.is_alive():
            runner.join(30)
        s.close()
        client = redis.Redis(port=server.port)
        try:
            received = _queue_messages(client, s.list_key)
        finally:
            client.close()
            server.stop()
    assert set(received) == set(rows)  # every row reached the broker, none dropped
    _check_order(received, rows)
    assert max(failed_batches) <= relay.config.max_failures


def _celery_publisher(s: Setup) -> Any:
    from fencing.contrib.celery import publisher

    return publisher(s.tasks.app)


def _wait(check: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
