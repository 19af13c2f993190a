"""A real Celery worker on the Django test project (tests/django/project), the standard
Django setup: ``celery -A testproject.celery worker`` (settings from ``CELERY_*``, the
tasks of shop/tasks.py found by ``app.autodiscover_tasks()``, each a ``fenced_task``
with ``target=Order``), a Redis broker, on SQLite, PostgreSQL (psycopg 3, psycopg2) and
MariaDB (PyMySQL, mysqlclient). A task
decided before an admin's save ends ``stale``; a message delivered twice is applied
once; a worker process SIGKILLed after its commit, before the ack, has the message
redelivered and answered ``duplicate``."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests._backends import require_server
from tests.django.test_django import require
from tests.django.test_migrations import PROJECT, Project

pytest.importorskip("django", reason="pip install 'fencing[django]'")
pytest.importorskip("celery", reason="pip install 'fencing[celery]'")

WAIT = 90.0  # a bound on waiting for the worker (never a timed assertion)

SEND = """
import json
from shop.models import Order
from shop.tasks import add_fee, ship
late = Order.objects.create(status="paid")
decided = late.intent("ship")  # a task decided on version 1 ...
late.fee = 3
late.save()  # ... then an admin saves the order: version 2
ship.enqueue(decided)
twice = Order.objects.create(status="paid")
fee = twice.intent("add-fee")
add_fee.enqueue(fee)
add_fee.enqueue(fee)  # the broker delivers it twice
killed = Order.objects.create(status="paid")
print(json.dumps({
    "late": [late.pk, decided.id],
    "twice": [twice.pk, fee.id],
    "killed": killed.pk,
}))
"""

SEND_KILLED = """
import os, pathlib
from shop.models import Order
from shop.tasks import ship
intent = Order.objects.get(pk={pk}).intent("ship")
# the worker is to hang after this commit, before the ack
(pathlib.Path(os.environ["FENCING_DJANGO_CONTROL"]) / f"hang-{{intent.id}}").touch()
ship.enqueue(intent)
print(intent.id)
"""


class Worker:
    """``celery worker`` in a session of its own, on the run's own queue and keys."""

    def __init__(self, project: Project, control: Path) -> None:
        self.run = uuid.uuid4().hex[:10]
        # the project's manage.py commands send to the same queue and keys
        project.env["FENCING_DJANGO_QUEUE"] = f"fdj_{self.run}"
        project.env["FENCING_DJANGO_PREFIX"] = f"fdj_{self.run}"
        self.env = {**project.env, "FENCING_DJANGO_CONTROL": str(control)}
        self.log = control.parent / "worker.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        argv = [sys.executable, "-m", "celery", "-A", "testproject.celery", "worker"]
        argv += ["--pool=prefork", "--concurrency=1", "-Q", self.env["FENCING_DJANGO_QUEUE"]]
        argv += ["--without-heartbeat", "--without-mingle", "--without-gossip"]
        argv += ["--loglevel=INFO", "-n", f"fdj_{self.run}@%h"]
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                argv,
                cwd=PROJECT,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        wait_for(lambda: "ready." in self.tail(), f"the worker to start\n{self.tail()}")

    def tail(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def stop(self) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=20)
        import redis

        broker = redis.Redis(host="127.0.0.1", port=6379, db=11)
        try:
            keys = list(broker.scan_iter(match=f"fdj_{self.run}:*"))
            if keys:
                broker.delete(*keys)
        finally:
            broker.close()


def wait_for(done: Callable[[], object], what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not done():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.1)


def outcomes(control: Path, intent_id: str) -> list[str]:
    found = sorted(control.glob(f"outcome-{intent_id}-*"), key=lambda p: p.stat().st_mtime_ns)
    return [p.read_text().split()[0] for p in found]


@pytest.fixture(
    params=["sqlite", "postgresql", "postgresql-psycopg2", "mysql", "mysql-mysqlclient"]
)
def project(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Project]:
    vendor = request.param
    require_server("Redis", "127.0.0.1", 6379)
    require(vendor)  # the server, and psycopg2 / mysqlclient (Django's default MySQL driver)
    made = Project(vendor, tmp_path)
    made.create()
    try:
        made.manage("migrate", "-v", "0")
        yield made
    finally:
        made.drop()


@pytest.mark.slow
def test_a_celery_worker_runs_the_django_project_fenced_tasks(
    project: Project, tmp_path: Path
) -> None:
    control = tmp_path / "control"
    control.mkdir()
    worker = Worker(project, control)
    try:
        worker.start()
        sent = json.loads(project.manage("shell", "-v", "0", "-c", SEND).stdout)
        late, twice, killed = sent["late"], sent["twice"], sent["killed"]
        project.env["FENCING_DJANGO_CONTROL"] = str(control)
        script = SEND_KILLED.format(pk=killed)
        killed = [killed, project.manage("shell", "-v", "0", "-c", script).stdout.strip()]

        # late -> stale, nothing written
        wait_for(lambda: outcomes(control, late[1]), f"the late task\n{worker.tail()}")
        assert outcomes(control, late[1]) == ["stale"]
        row = "SELECT status, fee, version FROM shop_order WHERE id = %s"
        assert project.query(row, late[0]) == [("paid", 3, 2)]

        # delivered twice -> applied once
        wait_for(lambda: len(outcomes(control, twice[1])) == 2, f"both deliveries\n{worker.tail()}")
        assert sorted(outcomes(control, twice[1])) == ["committed", "duplicate"]
        assert project.query(row, twice[0]) == [("paid", 5, 2)]

        # killed after the commit, before the ack -> redelivered -> duplicate
        hung = control / f"hung-{killed[1]}"
        wait_for(hung.exists, f"the task to hang after its commit\n{worker.tail()}")
        assert project.query(row, killed[0]) == [("shipped", 0, 2)]  # landed, not acked
        pid = int(hung.read_text())
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: len(outcomes(control, killed[1])) == 2, f"the redelivery\n{worker.tail()}")
        assert outcomes(control, killed[1]) == ["committed", "duplicate"]
        assert project.query(row, killed[0]) == [("shipped", 0, 2)]
        assert "WorkerLostError" in worker.tail()  # the process was lost, the message rejected
    finally:
        worker.stop()
