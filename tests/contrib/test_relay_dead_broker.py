"""Poison rows and broker outages with a real broker (Celery on Redis) and real relay
processes (``fencing relay --once``), on a SQLite store file.

- A poison row: a Celery send option of the wrong type (``countdown="soon"``, valid
  JSON, so ``outbox.send`` takes it) makes ``send_task`` raise for that row alone. With
  ``--dead-after 1`` the relay gives it up as dead in the batch whose other rows Redis
  took; its key's later row goes on; ``fencing outbox --fail-if-dead`` then fails, and
  ``--drop`` clears it.
- An outage: a relay whose broker is down (nothing listens on port 1), run again and
  again, kills no row even with ``--dead-after 1``; once the broker is up, every row is
  in Redis and none is dead.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import fencing
from fencing.contrib._common import publish_id

from .._backends import require_server
from ._e2e import REDIS_HOST, REDIS_PORT, REPO

celery = pytest.importorskip("celery")
redis = pytest.importorskip("redis")

from fencing.contrib.celery import fenced_task  # noqa: E402

REDIS_DB = 11  # the Celery tests' database; this test's queue is its own
#: what ``fencing relay --app tests.contrib.test_relay_dead_broker:APP`` publishes with
APP = celery.Celery(
    "relay-dead", broker=f"redis://{REDIS_HOST}:{REDIS_PORT}/{REDIS_DB}", set_as_current=False
)
DOWN = celery.Celery("relay-dead-down", broker="redis://127.0.0.1:1/0", set_as_current=False)
DOWN.conf.broker_connection_retry = False
DOWN.conf.broker_connection_max_retries = 0


class Shop:
    def __init__(self, url: str, queue: str) -> None:
        self.url, self.queue = url, queue
        self.store = fencing.open(url)
        self.orders = self.store.collection("orders")
        self.ship = fenced_task(APP, target=self.orders, name="ship-dead")(_ship)

    def send(self, key: str, **options: Any) -> Any:
        record = self.orders.get(key) or self.orders.create(key, {"n": 0})
        return self.store.outbox.send(self.ship, record, "ship", queue=self.queue, **options)

    def queued(self) -> list[str]:
        """The task ids in the Redis list of this test's queue."""
        conn = redis.Redis(host=REDIS_HOST, port=REDIS_PORT, db=REDIS_DB)
        try:
            raw = conn.lrange(self.queue, 0, -1)
        finally:
            conn.close()
        return sorted(json.loads(m)["headers"]["id"] for m in raw)


def _ship(record: fencing.Record) -> dict[str, Any]:
    return {**record.state, "shipped": True}


@pytest.fixture
def shop(tmp_path: Path) -> Iterator[Shop]:
    require_server("Redis", REDIS_HOST, REDIS_PORT)
    queue = f"fencing-dead-{uuid.uuid4().hex[:8]}"
    found = Shop(f"sqlite:///{tmp_path / 'shop.db'}", queue)
    try:
        yield found
    finally:
        found.store.close()
        conn = redis.Redis(host=REDIS_HOST, port=REDIS_PORT, db=REDIS_DB)
        try:
            conn.delete(queue)
        finally:
            conn.close()


def fencing_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fencing", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def relay(shop: Shop, app: str, *options: str) -> subprocess.CompletedProcess[str]:
    spec = f"tests.contrib.test_relay_dead_broker:{app}"
    return fencing_cli(
        "relay", shop.url, "--queue", "celery", "--app", spec, "--once", "--quiet", *options
    )


def test_a_poison_row_dies_in_a_real_relay_and_its_key_goes_on(shop: Shop) -> None:
    poison = shop.send("p", countdown="soon")  # JSON, but not a number of seconds
    later = shop.send("p")
    others = [shop.send(f"o-{k}") for k in range(3)]
    done = relay(shop, "APP", "--dead-after", "1")
    assert done.returncode == 1, done.stderr  # a publish failed
    assert "published 4 row(s)" in done.stdout and "dead 1" in done.stdout, done.stdout
    assert "is dead after 1 attempt(s)" in done.stderr  # the ERROR line, on stderr
    (dead,) = shop.store.outbox.dead()
    assert dead.id == poison.id and dead.last_error is not None
    assert dead.last_error.startswith("TypeError")
    assert shop.queued() == sorted(publish_id(r) for r in [later, *others])
    assert shop.store.outbox.stats().pending == 0

    check = fencing_cli("outbox", shop.url, "--fail-if-dead", "--dead", "--json")
    assert check.returncode == 1
    lines = [json.loads(x) for x in check.stdout.splitlines()]
    assert lines[0]["id"] == poison.id and lines[0]["options"]["countdown"] == "soon"
    assert lines[-1]["dead"] == 1
    assert fencing_cli("outbox", shop.url, "--drop", str(poison.id)).returncode == 0
    assert fencing_cli("outbox", shop.url, "--fail-if-dead").returncode == 0


def test_a_real_outage_kills_no_row_and_every_row_is_delivered(shop: Shop) -> None:
    rows = [shop.send(f"k-{k}") for k in range(2) for _ in range(3)]
    for _ in range(4):  # the broker is down, relay after relay
        down = relay(shop, "DOWN", "--dead-after", "1")
        assert down.returncode == 1 and "published 0 row(s)" in down.stdout, down.stdout
    assert shop.store.outbox.dead() == []
    pending = shop.store.outbox.pending()
    assert len(pending) == len(rows) and all(r.strikes == 0 for r in pending)
    assert min(r.attempts for r in pending) >= 4
    up = relay(shop, "APP", "--dead-after", "1")
    assert up.returncode == 0 and "published 6 row(s)" in up.stdout, up.stdout + up.stderr
    assert shop.queued() == sorted(publish_id(r) for r in rows)
    assert shop.store.outbox.dead() == [] and shop.store.outbox.stats().pending == 0
