"""Relays at scale and through a broker outage, with Celery's own client, on every store.

Each scenario runs against a SQLite store file, a PostgreSQL schema and a MariaDB
database of its own (``_e2e.STORES``); the business transaction that writes the rows
runs on the caller's own connection (``sqlite3``, psycopg, PyMySQL).

- Two and four relay processes (``fencing relay``, in loop mode; on PostgreSQL with the
  ``LISTEN`` waker; four only on the servers: ``DRAINS``) drain 10,000 rows of 200
  keys written in one business transaction: the broker's queue then holds every row
  exactly once (no relay crashed), and each key's rows in the order they were written.
  What the broker received is read back from the queue's Redis list itself (Celery's
  Redis transport pushes on the left: the list reversed is the publish order), not
  from the relays' own accounts.
- A relay publishing to a private Redis server (started by the test, on its own port,
  with an fsync'd append-only file) that is shut down for 10 s mid-drain, rows written
  meanwhile, then started again: the relay backs off while it is down and every row
  reaches the broker, each key's rows in order (a publish whose answer was lost may
  arrive twice: at least once; the worker's ``Duplicate`` takes care of that).
- The same on RabbitMQ: the relay reaches the machine's shared RabbitMQ through a TCP
  proxy of the test's own (``_proxy.TcpProxy``), which is cut for 10 s (open
  connections dropped, new ones refused), then restored; what the queue received is
  read back with pika. The Celery app publishes with confirms (``confirm_publish``):
  without them a message the connection drops after ``send_task`` returned is lost
  while the relay marks its row sent.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import signal
import socket
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
from ._e2e import (
    AMQP_HOST,
    AMQP_PORT,
    REDIS_HOST,
    REDIS_PORT,
    REPO,
    STORES,
    _amqp_delete,
    business_connection,
    redis_url,
    store_for,
)
from ._proxy import TcpProxy

pytestmark = pytest.mark.slow
pytest.importorskip("celery")

ROWS, KEYS = 10_000, 200


def _queue_messages(client: redis.Redis, key: str) -> list[int]:
    """The row ids of the Celery messages in a Redis list, in the order published."""
    ids = []
    for raw in reversed(client.lrange(key, 0, -1)):
        message = json.loads(raw)
        ids.append(_row_id(message["headers"]["id"]))
        body = json.loads(base64.b64decode(message["body"]))
        assert isinstance(body[0][0], str)  # the payload, the one argument
    return ids


def _row_id(task_id: str) -> int:
    assert task_id.startswith("fencing-outbox-"), task_id
    return int(task_id.split("-")[2])


def _amqp_messages(queue: str) -> list[int]:
    """The row ids of the Celery messages in a RabbitMQ queue, in the order published
    (taken off the queue)."""
    import pika

    params = pika.ConnectionParameters(
        host=AMQP_HOST, port=AMQP_PORT, credentials=pika.PlainCredentials("guest", "guest")
    )
    connection = pika.BlockingConnection(params)
    ids = []
    try:
        channel = connection.channel()
        while True:
            method, properties, body = channel.basic_get(queue=queue, auto_ack=True)
            if method is None:
                return ids
            ids.append(_row_id(properties.headers["id"]))
            assert isinstance(json.loads(body)[0][0], str)
    finally:
        connection.close()


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


def _handles_sigterm(pid: int) -> bool:
    """Has the process installed its own SIGTERM handling (caught or blocked)? Before
    that, SIGTERM kills it outright (exit -15, nothing logged): a relay still importing
    when the test stops the relays is not a relay that failed."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return True  # gone: nothing left to wait for
    masks = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
    bit = 1 << (signal.SIGTERM - 1)
    return bool((int(masks["SigCgt"], 16) | int(masks["SigBlk"], 16)) & bit)


class Setup:
    def __init__(self, root: Path, broker: str, store: str) -> None:
        self.run = uuid.uuid4().hex[:10]
        self.root = root
        self.queue = f"fencing_relay_{self.run}"
        self.prefix = f"fencing-relay-{self.run}"
        self.broker = broker
        self.store_url, self._cleanup = store_for(store, root)
        self.store = fencing.open(self.store_url)
        self.orders = self.store.collection("orders")
        from .apps.celery_app import build

        self.tasks = build(broker, self.queue, self.prefix)
        if broker.startswith("pyamqp"):
            self.tasks.app.conf.broker_transport_options = {"confirm_publish": True}
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
        conn = business_connection(self.store_url)
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
        if self._cleanup is not None:
            self._cleanup()


@pytest.fixture(params=STORES)
def store_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def shared_redis(tmp_path: Path, store_kind: str) -> Iterator[Setup]:
    require_server("Redis", REDIS_HOST, REDIS_PORT)
    setup = Setup(tmp_path, redis_url("celery"), store_kind)
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


#: (store, relays): two and four relays on SQLite, four on each server (two on a server
#: adds minutes of CI on 2 cores and nothing four does not show: claims that skip each
#: other's keys, on every store)
DRAINS = [("sqlite", 2), ("sqlite", 4), ("postgresql", 4), ("mysql", 4)]


@pytest.mark.parametrize(("store_kind", "relays"), DRAINS, ids=[f"{s}-{n}" for s, n in DRAINS])
def test_relays_drain_10000_rows_exactly_once_in_key_order(
    shared_redis: Setup, relays: int
) -> None:
    s = shared_redis
    rows = {r.id: r for r in s.write(ROWS, KEYS)}
    argv = [sys.executable, "-m", "fencing", "relay", s.store_url, "--queue", "celery"]
    argv += ["--app", "tests.contrib.apps.relay_app:celery", "--batch", "50", "--poll", "0.05"]
    procs = []
    started = time.monotonic()
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

    def log_of(n: int) -> str:
        return f"relay-{n} (exit {procs[n].returncode}): " + (s.root / f"relay{n}.log").read_text()

    try:
        deadline = time.monotonic() + 600
        while s.store.outbox.stats().pending:
            dead = [n for n, p in enumerate(procs) if p.poll() is not None]
            assert not dead, [log_of(n) for n in dead]
            assert time.monotonic() < deadline, "the relays did not drain the outbox"
            time.sleep(0.2)
        drained = time.monotonic() - started
        # A relay still starting up has no SIGTERM handler yet: stopping it then would
        # kill it (exit -15) without a word. Wait until each one handles the signal.
        for proc in procs:
            _wait(lambda proc=proc: _handles_sigterm(proc.pid), 120, f"relay {proc.pid} to start")
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
    logs = [log_of(n) for n in range(relays)]
    assert all(p.returncode == 0 for p in procs), logs
    shares = [int(log.rsplit("published ", 1)[1].split(" ")[0]) for log in logs]
    print(f"{relays} relays drained {ROWS} rows in {drained:.1f} s, published {shares}")
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


def _outage(s: Setup, cut: Any, restore: Any) -> tuple[dict[int, OutboxRow], list[int]]:
    """A relay (thread) drains 300 rows; after 100 the broker goes away (``cut``) for
    10 s, 100 more rows are written meanwhile, then it is back (``restore``): the rows
    written and the failed publishes of each batch."""
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
        cut()
        rows |= {r.id: r for r in s.write(100, 30, start=300)}  # written while it is down
        time.sleep(10)
        assert relay.counts.failed > 0 and s.store.outbox.stats().pending > 0
        published_while_down = relay.counts.published
        restore()
        _wait(lambda: not s.store.outbox.stats().pending, 120, "the outbox to drain")
        assert relay.counts.published > published_while_down
    finally:
        relay.stop()
        if runner.is_alive():
            runner.join(30)
    assert max(failed_batches) <= relay.config.max_failures
    return rows, failed_batches


def test_broker_down_for_10s_then_back_delivers_every_row(tmp_path: Path, store_kind: str) -> None:
    if shutil.which("redis-server") is None:
        if CI:
            pytest.fail("redis-server is not installed, and CI is set")
        pytest.skip("redis-server is not installed (the test runs a private one)")
    server = PrivateRedis(tmp_path)
    server.start()
    try:
        s = Setup(tmp_path, f"redis://127.0.0.1:{server.port}/0", store_kind)
        try:
            rows, _ = _outage(s, server.stop, server.start)
        finally:
            s.close()
        client = redis.Redis(port=server.port)
        try:
            received = _queue_messages(client, s.list_key)
        finally:
            client.close()
    finally:
        server.stop()
    assert set(received) == set(rows)  # every row reached the broker, none dropped
    _check_order(received, rows)


def test_rabbitmq_unreachable_for_10s_then_back_delivers_every_row(
    tmp_path: Path, store_kind: str
) -> None:
    pytest.importorskip("pika")
    require_server("RabbitMQ", AMQP_HOST, AMQP_PORT)
    with TcpProxy(AMQP_HOST, AMQP_PORT) as proxy:
        s = Setup(tmp_path, f"pyamqp://guest:guest@127.0.0.1:{proxy.port}//", store_kind)
        try:
            rows, _ = _outage(s, proxy.cut, proxy.restore)
            assert proxy.connections >= 2  # the relay did reconnect after the outage
        finally:
            s.close()
    try:
        received = _amqp_messages(s.queue)
    finally:
        with contextlib.suppress(Exception):
            _amqp_delete([s.queue], [s.queue])
    assert set(received) == set(rows)  # every row reached the broker, none dropped
    _check_order(received, rows)


def _celery_publisher(s: Setup) -> Any:
    from fencing.contrib.celery import publisher

    return publisher(s.tasks.app)


def _wait(check: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
