"""The transactional outbox end to end: real brokers, real worker processes, real relays.

For every queue and broker of ``tests/contrib/_e2e.py`` (Celery on Redis and RabbitMQ,
RQ, Dramatiq on Redis and RabbitMQ, arq), each against a SQLite store file, a
PostgreSQL schema and a MariaDB database of its own (``_e2e.STORES``):

- a business transaction on the caller's own connection (``sqlite3``, psycopg,
  PyMySQL) sends through
  ``store.using(conn).outbox``: rolled back, it leaves no row and nothing is sent;
  committed, ``fencing relay --once`` (the CLI, a separate process) publishes it and
  the worker commits it;
- a business process SIGKILLed right after its commit, before anything was published,
  loses nothing: the relay publishes the row later;
- a relay SIGKILLed after a publish and before marking it sent: the next relay
  publishes the row again and the worker answers ``Duplicate`` (arq, whose job id is
  the row's, drops the second publish itself while it keeps the job's result).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fencing.contrib.relay import OutboxRow

from .._backends import require_server
from ._e2e import (
    AMQP_HOST,
    AMQP_PORT,
    HARNESSES,
    REDIS_HOST,
    REDIS_PORT,
    REPO,
    STORES,
    Harness,
    kill,
)

pytestmark = pytest.mark.slow

CASES = [(name, store) for store in STORES for name in HARNESSES]


@pytest.fixture(scope="module", params=CASES, ids=[f"{n}-{s}" for n, s in CASES])
def harness(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Harness]:
    name, store = request.param
    pytest.importorskip(name.split("-")[0])
    require_server("Redis", REDIS_HOST, REDIS_PORT)
    if name.endswith("rabbitmq"):
        require_server("RabbitMQ", AMQP_HOST, AMQP_PORT)
    h = HARNESSES[name](tmp_path_factory.mktemp(f"outbox-{name}-{store}"), store=store)
    try:
        h.start()
        yield h
    finally:
        h.stop()


def task_of(h: Harness, name: str = "mark") -> Any:
    """The harness's fenced task ``name``, as the sending process holds it."""
    holder = {"celery": "tasks", "dramatiq": "actors"}.get(h.queue_kind, "app")
    return getattr(getattr(h, holder), name)


def send_options(h: Harness) -> dict[str, Any]:
    """The harness's queue, for the queues whose publisher does not know it."""
    if h.queue_kind == "rq":
        return {"queue": h.queue}
    if h.queue_kind == "arq":
        return {"_queue_name": h.queue}
    return {}


def relay_cli(h: Harness, *extra: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "fencing", "relay", h.store_url, "--queue", h.queue_kind]
    argv += ["--app", f"tests.contrib.apps.relay_app:{h.queue_kind}", "--once", "--quiet"]
    return subprocess.run(
        [*argv, *extra], env=h.env(), cwd=REPO, capture_output=True, text=True, timeout=120
    )


def pending(h: Harness) -> int:
    return h.store.outbox.stats(kind=h.queue_kind).pending


def drain(h: Harness, timeout: float = 30.0) -> None:
    """Run ``fencing relay --once`` until the outbox is empty (a lapsing claim of a
    killed relay holds its rows until it expires)."""
    deadline = time.monotonic() + timeout
    while pending(h):
        done = relay_cli(h)
        assert done.returncode == 0, done.stderr + done.stdout
        if time.monotonic() > deadline:
            raise AssertionError(f"the outbox still holds {pending(h)} row(s)")
        if pending(h):
            time.sleep(0.3)


def business(h: Harness, key: str, *, commit: bool) -> OutboxRow:
    """The application's transaction: its own write and the outbox row, on its own
    connection (``sqlite3``, psycopg or PyMySQL)."""
    conn = h.connect()
    try:
        record = h.orders.get(key)
        assert record is not None
        mark = "?" if h.store_kind == "sqlite" else "%s"
        cur = conn.cursor()
        cur.execute("CREATE TABLE IF NOT EXISTS audit (record_key VARCHAR(64), what TEXT)")
        cur.execute(f"INSERT INTO audit VALUES ({mark}, 'ship requested')", (key,))
        row = h.store.using(conn).outbox.send(task_of(h), record, "ship", **send_options(h))
        if commit:
            conn.commit()
        else:
            conn.rollback()
        return row
    finally:
        conn.close()


def root_of(h: Harness, row: OutboxRow) -> str:
    from .apps import _shared

    return _shared.SIGNER.verify(row.payload).root_id


def test_rolled_back_leaves_no_row_committed_is_delivered(harness: Harness) -> None:
    h = harness
    record = h.create({"status": "new"})
    before = pending(h)
    business(h, str(record.key), commit=False)
    assert pending(h) == before  # rolled back: no row
    row = business(h, str(record.key), commit=True)
    assert pending(h) == before + 1
    drain(h)
    reports = h.wait_reports(root_of(h, row), 1)
    assert [r["fencing_outcome"] for r in reports] == ["committed"]
    current = h.orders.get(record.key)
    assert current is not None and current.state["status"] == "ship"


def test_business_process_killed_after_commit_loses_nothing(
    harness: Harness, tmp_path: Path
) -> None:
    """The business process commits its transaction (row included) and is SIGKILLed
    before it could publish anything: the relay publishes the row afterwards."""
    h = harness
    record = h.create({"status": "new"})
    script = tmp_path / "business.py"
    script.write_text(_BUSINESS.format(kind=h.queue_kind))
    out = subprocess.run(
        [sys.executable, str(script), str(record.key), json.dumps(send_options(h))],
        env=h.env(),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == -9, out.stderr  # SIGKILLed, by itself, after the commit
    rows = [r for r in h.store.outbox.pending(kind=h.queue_kind) if r.key.endswith(record.key)]
    assert len(rows) == 1
    drain(h)
    reports = h.wait_reports(root_of(h, rows[0]), 1)
    assert [r["fencing_outcome"] for r in reports] == ["committed"]


#: The business process of the test above: commit, then die before any publish.
_BUSINESS = """
import json, os, signal, sys

import fencing
from tests.contrib._e2e import business_connection
from tests.contrib.apps import _shared

kind = {kind!r}
key, options = sys.argv[1], json.loads(sys.argv[2])
if kind == "celery":
    from tests.contrib.apps.celery_app import tasks
    task = tasks.mark
elif kind == "dramatiq":
    from tests.contrib.apps import dramatiq_app
    task = dramatiq_app.actors.mark
elif kind == "rq":
    from tests.contrib.apps import rq_app as app
    task = app.mark
else:
    from tests.contrib.apps import arq_app as app
    task = app.mark
store = fencing.open(_shared.store_url())
conn = business_connection(_shared.store_url())  # sqlite3, psycopg or PyMySQL
record = store.collection("orders").get(key)
store.using(conn).outbox.send(task, record, "ship", **options)
conn.commit()
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_relay_killed_after_publish_before_mark(harness: Harness) -> None:
    """At least once, applied once: the relay dies between publishing a row and marking
    it; the next relay publishes it again and the worker answers ``Duplicate``."""
    h = harness
    record = h.create({"status": "new"})
    row = business(h, str(record.key), commit=True)
    h.flag("relay-hang")
    with open(h.root / "hanging-relay.log", "ab") as log:
        relay = subprocess.Popen(
            [sys.executable, "-m", "tests.contrib.apps.relay_app", h.queue_kind],
            env=h.env(),
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        pid = h.wait_pid(f"relay-published-{row.id}", 60)
        assert pid == relay.pid
        kill(relay.pid)
        relay.wait(timeout=10)
    finally:
        kill(relay.pid)
        (h.control / "relay-hang").unlink()
    root = root_of(h, row)
    h.wait_reports(root, 1)
    assert pending(h) >= 1  # published, never marked
    drain(h)  # once the killed relay's claim (1 s) lapsed
    if h.queue_kind == "arq":
        # arq knows the row's job id (it keeps the result 60 s): the re-publish is
        # dropped by arq itself; the worker ran the intent once.
        time.sleep(1.5)
        assert [r["fencing_outcome"] for r in h.reports_for(root)] == ["committed"]
        return
    reports = h.wait_reports(root, 2)
    assert sorted(r["fencing_outcome"] for r in reports) == ["committed", "duplicate"]
    current = h.orders.get(record.key)
    assert current is not None and current.version == record.version + 1
