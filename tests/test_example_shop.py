"""examples/shop, run as its README says: real processes, driven over HTTP, judged on
the database.

Per store (SQLite on a file; PostgreSQL and MariaDB in a database of their own,
dropped after): ``alembic upgrade head`` makes the shop's tables and fencing's (and
``alembic check`` finds the models and the migrations agree), then three processes
start: the Flask app (``flask --app shop.web run`` on a free port), a Celery worker
(``celery -A tests._shop_worker worker``: ``shop.tasks`` with the test's hooks, on Redis
database 11 under a key prefix of the run's own) and ``fencing relay``. The scenarios:

- pay: the order is shipped, has one shipment and is notified (ship -> notify, chained
  through the outbox);
- cancel before ship: the relay is stopped while the order is paid and cancelled, then
  started; ``ship`` ends ``Stale`` and nothing is shipped;
- a redelivered ship: the worker's process is SIGKILLed after ``ship`` committed and
  before Celery's ack; the redelivery is ``Duplicate``, one shipment, one notification;
- a worker paused (SIGSTOP) past its lease while nobody takes over: it commits.

Every process carries the run's marker in its environment and is killed at the end;
the run's Redis keys are deleted.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from ._backends import require_server

pytest.importorskip("flask", reason="pip install 'fencing[dev]' (the example needs Flask)")
pytest.importorskip("celery")
pytest.importorskip("alembic")
sqlalchemy = pytest.importorskip("sqlalchemy")

from .contrib._e2e import (  # noqa: E402
    REDIS_DB,
    REDIS_HOST,
    REDIS_PORT,
    Worker,
    _our_processes,
    _redis_delete,
    gone,
    kill,
    read_jsonl,
)

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "shop"
BIN = Path(sys.executable).parent
TIMEOUT = 60.0
T = TypeVar("T")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Shop:
    """The example's three processes on one database, and what the test reads."""

    def __init__(self, root: Path, url: str, kind: str) -> None:
        self.kind = kind
        self.run = uuid.uuid4().hex[:10]
        self.root = root
        self.url = url
        self.control = root / "control"
        self.control.mkdir()
        self.port = _free_port()
        self.prefix = f"fencing-shop-{self.run}:"
        self.broker = f"redis://{REDIS_HOST}:{REDIS_PORT}/{REDIS_DB['celery']}"
        self.engine = sqlalchemy.create_engine(url)
        self.web = self._worker("web", [str(BIN / "flask"), "--app", "shop.web", "run"])
        self.web.argv += ["--host", "127.0.0.1", "--port", str(self.port)]
        self.worker = self._worker("worker", [str(BIN / "celery"), "-A", "tests._shop_worker"])
        self.worker.argv += ["worker", "--pool=prefork", "--concurrency=2", "-Q", "celery"]
        self.worker.argv += ["--without-heartbeat", "--without-mingle", "--without-gossip"]
        self.worker.argv += ["--loglevel=INFO", "-n", f"shop-{self.run}@%h"]
        self.relay = self._worker("relay", [str(BIN / "fencing"), "relay", "env:SHOP_DATABASE_URL"])
        self.relay.argv += ["--queue", "celery", "--app", "shop.tasks:app", "--poll", "0.1"]

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
        path = [str(EXAMPLE), str(REPO), env.get("PYTHONPATH", "")]
        env.update(
            PYTHONPATH=os.pathsep.join(path).rstrip(os.pathsep),
            PYTHONDONTWRITEBYTECODE="1",
            PYTHONUNBUFFERED="1",
            SHOP_DATABASE_URL=self.url,
            SHOP_BROKER_URL=self.broker,
            SHOP_BROKER_PREFIX=self.prefix,
            SHOP_TEST_CONTROL=str(self.control),
            FENCING_E2E_RUN=self.run,  # what the cleanup finds every process by
        )
        return env

    def _worker(self, name: str, argv: list[str]) -> Worker:
        return Worker(name, argv, self.env(), self.root / f"{name}.log")

    # -- processes --------------------------------------------------------------------
    def alembic(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(BIN / "alembic"), "-c", str(EXAMPLE / "alembic.ini"), *args],
            cwd=self.root,
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    def migrate(self) -> None:
        done = self.alembic("upgrade", "head")
        assert done.returncode == 0, done.stdout + done.stderr

    def start(self) -> None:
        for process in (self.web, self.worker, self.relay):
            self._start(process)
        self.wait_for(lambda: self.get("/orders/0")[0] == 404, "the web app to answer")
        self.wait_relay()

    def _start(self, process: Worker) -> None:
        process.start()

    def wait_relay(self) -> None:
        self.wait_for(lambda: "started:" in self.relay.log.read_text(), "the relay to start")

    @contextlib.contextmanager
    def relay_stopped(self) -> Iterator[None]:
        """The relay is down (SIGTERM: it stops after the row it is publishing)."""
        assert self.relay.proc is not None
        self.relay.proc.send_signal(signal.SIGTERM)
        self.relay.proc.wait(timeout=TIMEOUT)
        self.relay.log.write_text("")
        try:
            yield
        finally:
            self._start(self.relay)
            self.wait_relay()

    def stop(self) -> None:
        for process in (self.web, self.worker, self.relay):
            process.kill_group()
        for pid in _our_processes(self.run):  # a forked pool child left behind, a stray
            kill(pid, signal.SIGCONT)
            kill(pid)
        self.engine.dispose()
        _redis_delete(self.broker, [f"{self.prefix}*"])

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.name} ---\n{p.tail()}" for p in (self.web, self.worker, self.relay)
        )

    def wait_for(self, check: Callable[[], T], what: str) -> T:
        deadline = time.monotonic() + TIMEOUT
        while True:
            value = check()
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}\n{self.logs()}")
            time.sleep(0.05)

    # -- HTTP ---------------------------------------------------------------------------
    def request(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.port}{path}",
            data=data,
            method=method,
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=30) as answer:
                return answer.status, json.loads(answer.read())
        except urllib.error.HTTPError as error:
            return error.code, None

    def get(self, path: str) -> tuple[int, Any]:
        try:
            return self.request("GET", path)
        except (urllib.error.URLError, ConnectionError):
            return 0, None  # not listening yet

    def post(self, path: str, body: Any = None) -> Any:
        status, answer = self.request("POST", path, body)
        assert status in (200, 201), (path, status, self.logs())
        return answer

    def new_order(self, total: int = 40_00) -> int:
        order_id: int = self.post("/orders", {"total": total})["id"]
        return order_id

    # -- what the worker did, what the database holds ------------------------------------
    def reports(self, order_id: int, task: str = "shop.ship") -> list[dict[str, Any]]:
        found = read_jsonl(self.control / "reports.jsonl")
        return [r for r in found if r["key"] == order_id and r["task"] == task]

    def wait_reports(self, order_id: int, count: int, task: str = "shop.ship") -> list[Any]:
        return self.wait_for(
            lambda: len(found := self.reports(order_id, task)) >= count and found,
            f"{count} report(s) of {task} on order {order_id}",
        )

    def flag(self, name: str) -> None:
        (self.control / name).touch()

    def wait_pid(self, name: str) -> int:
        path = self.control / name
        self.wait_for(path.exists, name)
        return int(path.read_text())

    def row(self, order_id: int) -> dict[str, Any]:
        query = "SELECT status, version, notified FROM orders WHERE id = :id"
        with self.engine.connect() as conn:
            status, version, notified = conn.execute(sqlalchemy.text(query), {"id": order_id}).one()
            shipments = conn.execute(
                sqlalchemy.text("SELECT carrier FROM shipments WHERE order_id = :id"),
                {"id": order_id},
            ).all()
            notes = conn.execute(
                sqlalchemy.text("SELECT message FROM notifications WHERE order_id = :id"),
                {"id": order_id},
            ).all()
            sent = conn.execute(
                sqlalchemy.text("SELECT task FROM fencing_outbox WHERE okey = :key"),
                {"key": f"table:orders:{order_id}"},
            ).all()
        return {
            "status": status,
            "version": version,
            "notified": bool(notified),
            "shipments": [s[0] for s in shipments],
            "notifications": [n[0] for n in notes],
            "outbox": sorted(t[0] for t in sent),
        }

    def lease_ran_out(self, order_id: int) -> bool:
        """The order's lease expired by the store's clock (nobody renews it)."""
        now = {
            "postgresql": "extract(epoch from now())",
            "mysql": "UNIX_TIMESTAMP(NOW(6))",
        }.get(self.engine.dialect.name, ":now")
        query = f"SELECT COUNT(*) FROM fencing_leases WHERE name = :name AND expires_at < {now}"
        with self.engine.connect() as conn:
            found = conn.execute(
                sqlalchemy.text(query), {"name": f"orders/{order_id}", "now": time.time()}
            ).scalar_one()
        return bool(found)


def _database(kind: str, root: Path) -> tuple[str, Callable[[], None]]:
    """A fresh database of the shop's own on ``kind``, and what drops it."""
    if kind == "sqlite":
        return f"sqlite:///{root / 'shop.db'}", lambda: None
    name = f"fencing_shop_{uuid.uuid4().hex[:12]}"
    if kind == "postgresql":
        pg = pytest.importorskip("tests.backends_postgres")
        require_server("PostgreSQL", pg.HOST, pg.PORT)
        import psycopg

        admin = f"postgresql://root@{pg.HOST}:{pg.PORT}/test"
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")

        def drop() -> None:
            with psycopg.connect(admin, autocommit=True) as conn:
                conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")

        return f"postgresql+psycopg://root@{pg.HOST}:{pg.PORT}/{name}", drop
    my = pytest.importorskip("tests.backends_mysql")
    require_server("MariaDB", my.HOST, my.PORT)

    def run(statement: str) -> None:
        conn = my._admin()
        try:
            conn.cursor().execute(statement)
        finally:
            conn.close()

    run(f"CREATE DATABASE {name}")
    return f"mysql+pymysql://root@{my.HOST}:{my.PORT}/{name}", lambda: run(
        f"DROP DATABASE IF EXISTS {name}"
    )


@pytest.fixture(scope="module", params=["sqlite", "postgresql", "mysql"])
def shop(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Shop]:
    require_server("Redis", REDIS_HOST, REDIS_PORT)
    root = tmp_path_factory.mktemp(f"shop-{request.param}")
    url, drop = _database(request.param, root)
    running = Shop(root, url, request.param)
    try:
        running.migrate()
        running.start()
        yield running
    finally:
        running.stop()
        drop()


def test_the_migrations_match_the_models_and_leave_fencing_s_tables_alone(shop: Shop) -> None:
    """`alembic check`: autogenerate finds nothing to do, so the migrations made the
    models' tables, and env.py's exclude_fencing() keeps fencing's tables (made by
    upgrade_fencing in 0002_fencing) out of the comparison."""
    done = shop.alembic("check")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "No new upgrade operations detected" in done.stdout + done.stderr
    with shop.engine.connect() as conn:
        tables = set(sqlalchemy.inspect(conn).get_table_names())
    assert {"orders", "shipments", "notifications", "fencing_outbox", "fencing_applied"} <= tables


def test_pay_ships_books_one_shipment_and_notifies(shop: Shop) -> None:
    order = shop.new_order()
    paid = shop.post(f"/orders/{order}/pay")
    assert (paid["status"], paid["version"]) == ("paid", 2)

    (shipped,) = shop.wait_reports(order, 1)
    assert (shipped["outcome"], shipped["expected_version"]) == ("committed", 2)
    assert shipped["token"] is not None  # under the order's lease
    (notified,) = shop.wait_reports(order, 1, task="shop.notify")
    assert (notified["outcome"], notified["expected_version"]) == ("committed", 3)  # fresh
    assert shop.row(order) == {
        "status": "shipped",
        "version": 4,
        "notified": True,
        "shipments": ["post"],
        "notifications": [f"order {order} shipped"],
        "outbox": ["shop.notify", "shop.ship"],
    }
    status, shown = shop.request("GET", f"/orders/{order}")
    assert status == 200 and shown["shipments"] == ["post"] and shown["notified"] is True


def test_cancel_before_ship_is_stale_and_ships_nothing(shop: Shop) -> None:
    order = shop.new_order()
    with shop.relay_stopped():  # ship's message waits in the outbox meanwhile
        shop.post(f"/orders/{order}/pay")
        cancelled = shop.post(f"/orders/{order}/cancel")
        assert (cancelled["status"], cancelled["version"]) == ("cancelled", 3)
    (report,) = shop.wait_reports(order, 1)
    assert (report["outcome"], report["action"]) == ("stale", "ack")
    assert (report["expected_version"], report["current_version"]) == (2, 3)
    assert shop.row(order) == {
        "status": "cancelled",
        "version": 3,
        "notified": False,
        "shipments": [],
        "notifications": [],
        "outbox": ["shop.ship"],  # no notify: the stale run wrote nothing
    }


def test_a_redelivered_ship_is_duplicate_with_one_shipment(shop: Shop) -> None:
    order = shop.new_order()
    shop.flag(f"hang-{order}")
    shop.post(f"/orders/{order}/pay")
    pid = shop.wait_pid(f"hung-{order}")  # committed; Celery has not acknowledged it
    assert shop.row(order)["shipments"] == ["post"]
    kill(pid)  # the worker's process dies before the ack: Celery redelivers the message
    shop.wait_for(lambda: gone(pid), f"process {pid} to die")

    first, again = shop.wait_reports(order, 2)
    assert (first["outcome"], again["outcome"]) == ("committed", "duplicate")
    assert first["intent_id"] == again["intent_id"] and again["pid"] != pid
    (notified,) = shop.wait_reports(order, 1, task="shop.notify")
    assert notified["outcome"] == "committed"
    assert shop.row(order) == {
        "status": "shipped",
        "version": 4,
        "notified": True,
        "shipments": ["post"],
        "notifications": [f"order {order} shipped"],
        "outbox": ["shop.notify", "shop.ship"],  # the next step, sent once
    }


def test_a_worker_paused_past_its_lease_with_nobody_taking_over_commits(shop: Shop) -> None:
    order = shop.new_order(250_00)
    shop.flag(f"pause-{order}")
    shop.post(f"/orders/{order}/pay")
    pid = shop.wait_pid(f"paused-{order}")  # holds the lease, deciding
    kill(pid, signal.SIGSTOP)  # its heartbeat stops too
    try:
        shop.wait_for(lambda: shop.lease_ran_out(order), "the lease to run out")
    finally:
        shop.flag(f"resume-{order}")
        kill(pid, signal.SIGCONT)
    (report,) = shop.wait_reports(order, 1)
    assert (report["outcome"], report["action"], report["pid"]) == ("committed", "ack", pid)
    assert report["attempt"] == 1, report  # the lease taken again within the run
    shop.wait_reports(order, 1, task="shop.notify")
    assert shop.row(order) == {
        "status": "shipped",
        "version": 4,
        "notified": True,
        "shipments": ["freight"],
        "notifications": [f"order {order} shipped"],
        "outbox": ["shop.notify", "shop.ship"],
    }
