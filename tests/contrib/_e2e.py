"""Real brokers, real worker processes: start them, send to them, watch, kill, clean up.

One :class:`Harness` per queue and broker. It starts the queue's own worker command
as subprocesses (each in its own session, so a whole worker tree can be signalled),
sends the app's fenced tasks and their naive twins, and recovers after a test killed
a worker. Workers write what happened to files in ``control`` (see
``tests/contrib/apps/_shared.py``); the tests read those and the store.

Isolation: every run has a unique id; queue names, Redis key prefixes and RabbitMQ
queues carry it, brokers use Redis databases 11-14 (never database 0), and nothing
is flushed: teardown deletes only the run's own keys and queues. Every process the
run started carries ``FENCING_E2E_RUN=<id>`` in its environment; teardown SIGKILLs
exactly those, work horses that left the worker's process group included.
"""

from __future__ import annotations

import asyncio
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
from typing import Any, TypeVar

import redis

import fencing
from fencing.testing import HistoryWriter, outcome_event

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
REDIS_HOST, REDIS_PORT = "127.0.0.1", 6379
AMQP_HOST, AMQP_PORT = "127.0.0.1", 5672
REDIS_DB = {"celery": 11, "rq": 12, "dramatiq": 13, "arq": 14}
START_TIMEOUT = 60.0

T = TypeVar("T")


class E2EFailure(AssertionError):
    pass


#: The stores a harness runs on: SQLite (a file of the test's own), and the server
#: cases of ``tests/backends_postgres.py`` and ``tests/backends_mysql.py`` (a fresh
#: schema / database per harness, dropped after; skipped without the server, failed
#: under ``CI``).
STORES = ("sqlite", "postgresql", "mysql")


def store_for(store: str, root: Path) -> tuple[str, Callable[[], None] | None]:
    """A fresh store's URL on ``store`` and what removes it afterwards."""
    if store == "sqlite":
        return f"sqlite:///{root / 'store.sqlite'}", None
    if store not in STORES:
        raise ValueError(f"unknown store {store!r}")
    import pytest

    from .._backends import CASES

    _register(store)
    case = CASES.get(store)
    if case is None:
        pytest.skip(f"the {store} test case is not registered (driver not installed)")
    url = case.url(root)
    cleanup = case.cleanup
    return url, (None if cleanup is None else lambda: cleanup(url))


def _register(store: str) -> None:
    """Import the server case's module (a subprocess has no conftest to do it)."""
    if store == "postgresql":
        from .. import backends_postgres  # noqa: F401
    elif store == "mysql":
        from .. import backends_mysql  # noqa: F401


def business_connection(url: str) -> Any:
    """A driver connection to a store's database as an application opens one
    (``sqlite3``, psycopg with the store's schema first on the search path, PyMySQL),
    not in autocommit mode: the business transaction is the caller's."""
    from .._lenders import LENDERS

    if url.startswith("sqlite:"):
        return LENDERS["sqlite-file"].connect(url)
    store = "postgresql" if url.startswith("postgresql") else "mysql"
    _register(store)
    return LENDERS[store].connect(url)


def redis_url(queue: str) -> str:
    return f"redis://{REDIS_HOST}:{REDIS_PORT}/{REDIS_DB[queue]}"


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    events = []
    for line in path.read_bytes().splitlines():
        if line.strip():
            events.append(json.loads(line))
    return events


def _our_processes(run: str) -> list[int]:
    """Pids of live processes whose environment carries this run's marker."""
    marker = f"FENCING_E2E_RUN={run}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if marker in environ.split(b"\0"):
            found.append(int(entry.name))
    return found


def kill(pid: int, sig: signal.Signals = signal.SIGKILL) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def gone(pid: int) -> bool:
    """True once ``pid`` has exited (a zombie waiting for its parent counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[0] in ("Z", "X")


class Worker:
    """One worker command, in its own session; its output goes to a log file."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log: Path) -> None:
        self.name = name
        self.argv = argv
        self.env = env
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                self.argv,
                cwd=REPO,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill_group(self) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)

    def tail(self, lines: int = 40) -> str:
        if not self.log.exists():
            return "(no output)"
        text = self.log.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])


class Harness:
    """The queue-independent half: files, waiting, killing, cleaning up."""

    queue_kind: str = ""
    broker_kind: str = ""
    #: A SIGKILLed worker's message comes back on its own (Celery, RQ: the parent
    #: survives) or only once the killed worker is started again (Dramatiq, arq).
    restart_after_kill = False

    def __init__(self, root: Path, *, store: str = "sqlite") -> None:
        self.run = uuid.uuid4().hex[:10]
        self.root = root
        self.control = root / "control"
        self.control.mkdir(parents=True, exist_ok=True)
        self.store_kind = store
        self.store_path = root / "store.sqlite"  # the SQLite store's file (sqlite only)
        self.store_url, self._store_cleanup = store_for(store, root)
        self.queue = f"fencing_e2e_{self.queue_kind}_{self.run}"
        self.prefix = f"fencing-e2e-{self.run}"
        self.workers: list[Worker] = []
        self.store = fencing.open(self.store_url)
        self.orders = self.store.collection("orders")
        self.writer = HistoryWriter(self.control / "history.jsonl")
        self._pings = 0

    @property
    def name(self) -> str:
        return f"{self.queue_kind}-{self.broker_kind}-{self.store_kind}"

    def connect(self) -> Any:
        """A connection to the store's database as the application opens one (its own
        transaction, not autocommit): what ``store.using(conn)`` is given."""
        return business_connection(self.store_url)

    @property
    def broker_url(self) -> str:
        raise NotImplementedError

    # -- processes --------------------------------------------------------------------
    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
        env.update(
            PYTHONPATH=os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
            FENCING_E2E_RUN=self.run,
            FENCING_E2E_WORKER="1",
            FENCING_E2E_STORE=self.store_url,
            FENCING_E2E_CONTROL=str(self.control),
            FENCING_E2E_BROKER=self.broker_url,
            FENCING_E2E_QUEUE=self.queue,
            FENCING_E2E_PREFIX=self.prefix,
            PYTHONUNBUFFERED="1",
            dramatiq_queue_prefetch="1",
        )
        return env

    def commands(self) -> list[tuple[str, list[str]]]:
        raise NotImplementedError

    def start(self) -> None:
        if not self.workers:
            self.workers = [
                Worker(name, argv, self.env(), self.root / f"{name}.log")
                for name, argv in self.commands()
            ]
        for worker in self.workers:
            if not worker.alive:
                worker.start()
        self.wait_ready()

    def wait_ready(self) -> None:
        self._pings += 1
        token = f"{self.run}-{self._pings}"
        self.send_ping(token)
        self.wait_for(
            lambda: (self.control / f"ping-{token}").exists(), START_TIMEOUT, "a worker to start"
        )

    def recover(self) -> None:
        """After a test killed worker processes: start again what must be started."""
        if self.restart_after_kill:
            for worker in self.workers:
                worker.kill_group()
            self.start()

    def kill_task_processes(self, pids: list[int]) -> None:
        for pid in pids:
            kill(pid)
        for pid in pids:
            self.wait_for(lambda pid=pid: gone(pid), 10, f"process {pid} to die")
        for worker in self.workers:  # reap killed worker processes, so they read as dead
            if worker.proc is not None and worker.proc.pid in pids:
                worker.proc.wait(timeout=10)

    def stop(self) -> None:
        for worker in self.workers:
            with contextlib.suppress(ProcessLookupError):
                if worker.proc is not None:
                    os.killpg(worker.proc.pid, signal.SIGCONT)
            worker.kill_group()
        for pid in _our_processes(self.run):  # work horses in their own groups, strays
            kill(pid, signal.SIGCONT)
            kill(pid)
        self.store.close()
        self.writer.close()
        with contextlib.suppress(Exception):
            self.cleanup_broker()
        if self._store_cleanup is not None:
            self._store_cleanup()

    def cleanup_broker(self) -> None:
        pass

    # -- the test's own writes, recorded like the workers' --------------------------------
    def create(self, state: dict[str, Any]) -> fencing.Record:
        return self.orders.create(f"k-{uuid.uuid4().hex[:12]}", state)

    def commit_direct(self, intent: fencing.Intent, state: dict[str, Any]) -> fencing.Outcome:
        outcome = self.orders.commit(intent, state)
        self.writer.write(outcome_event(outcome, intent, worker="test"))
        assert outcome.committed, outcome
        return outcome

    # -- watching ---------------------------------------------------------------------
    def logs(self) -> str:
        return "\n".join(f"--- {w.name} ---\n{w.tail()}" for w in self.workers)

    def wait_for(self, check: Callable[[], T], timeout: float, what: str) -> T:
        deadline = time.monotonic() + timeout
        while True:
            value = check()
            if value:
                return value
            if time.monotonic() > deadline:
                raise E2EFailure(
                    f"[{self.name}] timed out after {timeout:.0f}s waiting for {what}\n"
                    + self.logs()
                )
            time.sleep(0.05)

    def reports(self) -> list[dict[str, Any]]:
        return read_jsonl(self.control / "reports.jsonl")

    def history(self) -> list[dict[str, Any]]:
        return read_jsonl(self.control / "history.jsonl")

    def reports_for(self, root_id: str) -> list[dict[str, Any]]:
        return [r for r in self.reports() if r.get("fencing_root_id") == root_id]

    def wait_reports(self, root_id: str, count: int, timeout: float = 30.0) -> list[dict[str, Any]]:
        return self.wait_for(
            lambda: (found := self.reports_for(root_id)) and len(found) >= count and found,
            timeout,
            f"{count} report(s) of intent {root_id}",
        )

    def naive_writes(self, msg_id: str) -> list[dict[str, Any]]:
        return [e for e in self.history() if e.get("root_id") == msg_id]

    def wait_naive(self, msg_id: str, count: int, timeout: float = 30.0) -> list[dict[str, Any]]:
        return self.wait_for(
            lambda: (found := self.naive_writes(msg_id)) and len(found) >= count and found,
            timeout,
            f"{count} naive write(s) of message {msg_id}",
        )

    def flag(self, name: str) -> None:
        (self.control / name).touch()

    def wait_pid(self, name: str, timeout: float = 30.0) -> int:
        path = self.control / name
        self.wait_for(path.exists, timeout, f"{name}")
        return int(path.read_text())

    def drain(self) -> None:
        """Send a ping and wait for it: what was sent before has been taken."""
        self.wait_ready()

    @contextlib.contextmanager
    def stopped(self, pid: int) -> Iterator[None]:
        """SIGSTOP ``pid`` for the duration of the block (SIGCONT even on failure)."""
        kill(pid, signal.SIGSTOP)
        try:
            yield
        finally:
            kill(pid, signal.SIGCONT)

    # -- sending (per queue) ------------------------------------------------------------
    def send(self, task: str, payload: str) -> None:
        """Send a raw payload to one of the fenced tasks (mark, mark_leased, bump, ...)."""
        raise NotImplementedError

    def enqueue(self, task: str, intent: fencing.Intent) -> None:
        """Send an intent through the integration's own enqueue API."""
        raise NotImplementedError

    def send_naive_mark(
        self, key: str, label: str, msg_id: str, decided: int | None, locked: bool = False
    ) -> None:
        raise NotImplementedError

    def send_naive_bump(self, key: str, msg_id: str) -> None:
        raise NotImplementedError

    def send_ping(self, token: str) -> None:
        raise NotImplementedError


def _redis_delete(url: str, patterns: list[str]) -> None:
    client = redis.Redis.from_url(url)
    try:
        for pattern in patterns:
            keys = list(client.scan_iter(match=pattern, count=500))
            for start in range(0, len(keys), 500):
                client.delete(*keys[start : start + 500])
    finally:
        client.close()


def _amqp_delete(queues: list[str], exchanges: list[str]) -> None:
    import pika

    params = pika.ConnectionParameters(
        host=AMQP_HOST, port=AMQP_PORT, credentials=pika.PlainCredentials("guest", "guest")
    )
    connection = pika.BlockingConnection(params)
    try:
        channel = connection.channel()
        for queue in queues:
            channel.queue_delete(queue=queue)
        for exchange in exchanges:
            channel.exchange_delete(exchange=exchange)
    finally:
        connection.close()


# -- Celery ------------------------------------------------------------------------------
class CeleryHarness(Harness):
    queue_kind = "celery"

    def __init__(self, root: Path, broker_kind: str, *, store: str = "sqlite") -> None:
        self.broker_kind = broker_kind
        super().__init__(root, store=store)
        from .apps.celery_app import build

        self.tasks = build(self.broker_url, self.queue, self.prefix)

    @property
    def broker_url(self) -> str:
        if self.broker_kind == "redis":
            return redis_url("celery")
        return f"pyamqp://guest:guest@{AMQP_HOST}:{AMQP_PORT}//"

    def commands(self) -> list[tuple[str, list[str]]]:
        argv = [str(BIN / "celery"), "-A", "tests.contrib.apps.celery_app", "worker"]
        argv += ["--pool=prefork", "--concurrency=2", "-O", "fair", "-Q", self.queue]
        argv += ["--without-heartbeat", "--without-mingle", "--without-gossip"]
        argv += ["--loglevel=INFO", "-n", f"{self.run}@%h"]
        return [("celery", argv)]

    def _task(self, task: str) -> Any:
        return getattr(self.tasks, task)

    def send(self, task: str, payload: str) -> None:
        self._task(task).apply_async((payload,))

    def enqueue(self, task: str, intent: fencing.Intent) -> None:
        self._task(task).enqueue(intent)

    def send_naive_mark(
        self, key: str, label: str, msg_id: str, decided: int | None, locked: bool = False
    ) -> None:
        self.tasks.naive_mark.apply_async((key, label, msg_id, decided, locked))

    def send_naive_bump(self, key: str, msg_id: str) -> None:
        self.tasks.naive_bump.apply_async((key, msg_id))

    def send_ping(self, token: str) -> None:
        self.tasks.ping.apply_async((token,))

    def stop(self) -> None:
        super().stop()
        self.tasks.app.close()

    def cleanup_broker(self) -> None:
        if self.broker_kind == "redis":
            _redis_delete(self.broker_url, [f"{self.prefix}:*"])
        else:
            _amqp_delete([self.queue], [self.queue])


# -- RQ ------------------------------------------------------------------------------------
class RQHarness(Harness):
    queue_kind = "rq"
    broker_kind = "redis"

    def __init__(self, root: Path, *, store: str = "sqlite") -> None:
        super().__init__(root, store=store)
        from rq import Queue

        from .apps import rq_app

        self.app = rq_app
        self.redis = redis.Redis.from_url(self.broker_url)
        self.rq_queue = Queue(self.queue, connection=self.redis)

    @property
    def broker_url(self) -> str:
        return redis_url("rq")

    def commands(self) -> list[tuple[str, list[str]]]:
        return [
            (
                f"rq{n}",
                [
                    *(str(BIN / "rq"), "worker", "--url", self.broker_url, "--with-scheduler"),
                    *("--name", f"{self.prefix}-{n}", "--logging_level", "INFO", self.queue),
                ],
            )
            for n in (1, 2)
        ]

    def _job_id(self) -> str:
        return f"{self.prefix}-{uuid.uuid4().hex}"

    def send(self, task: str, payload: str) -> None:
        from rq import Retry

        self.rq_queue.enqueue(
            getattr(self.app, task), payload, retry=Retry(max=3), job_id=self._job_id()
        )

    def enqueue(self, task: str, intent: fencing.Intent) -> None:
        from fencing.contrib.rq import enqueue_intent

        enqueue_intent(self.rq_queue, getattr(self.app, task), intent, job_id=self._job_id())

    def send_naive_mark(
        self, key: str, label: str, msg_id: str, decided: int | None, locked: bool = False
    ) -> None:
        from rq import Retry

        self.rq_queue.enqueue(
            self.app.naive_mark,
            key,
            label,
            msg_id,
            decided,
            locked,
            retry=Retry(max=3),
            job_id=self._job_id(),
        )

    def send_naive_bump(self, key: str, msg_id: str) -> None:
        from rq import Retry

        self.rq_queue.enqueue(
            self.app.naive_bump, key, msg_id, retry=Retry(max=3), job_id=self._job_id()
        )

    def send_ping(self, token: str) -> None:
        self.rq_queue.enqueue(self.app.ping, token, job_id=self._job_id())

    def stop(self) -> None:
        try:
            super().stop()
        finally:
            self.redis.close()

    def cleanup_broker(self) -> None:
        _redis_delete(self.broker_url, [f"*{self.queue}*", f"*{self.prefix}*"])
        # RQ's registries of all workers and queues are shared sets: remove our members.
        self.redis.srem("rq:queues", f"rq:queue:{self.queue}")
        self.redis.srem("rq:workers", *(f"rq:worker:{self.prefix}-{n}" for n in (1, 2)))


# -- Dramatiq --------------------------------------------------------------------------------
class DramatiqHarness(Harness):
    queue_kind = "dramatiq"
    restart_after_kill = True

    def __init__(self, root: Path, broker_kind: str, *, store: str = "sqlite") -> None:
        self.broker_kind = broker_kind
        super().__init__(root, store=store)
        from .apps.dramatiq_app import build, make_broker

        self.broker = make_broker(self.broker_url, self.prefix)
        self.actors = build(self.broker, self.queue)

    @property
    def broker_url(self) -> str:
        if self.broker_kind == "redis":
            return redis_url("dramatiq")
        return f"amqp://guest:guest@{AMQP_HOST}:{AMQP_PORT}/%2F"

    def commands(self) -> list[tuple[str, list[str]]]:
        argv = [str(BIN / "dramatiq"), "tests.contrib.apps.dramatiq_app:broker"]
        argv += ["--processes", "2", "--threads", "1", "--queues", self.queue]
        return [("dramatiq", argv)]

    def kill_task_processes(self, pids: list[int]) -> None:
        # Dramatiq's parent stops every worker when one dies: kill the whole tree at
        # once, so that no worker gets to finish (and acknowledge) anything.
        for worker in self.workers:
            worker.kill_group()

    def _actor(self, task: str) -> Any:
        return getattr(self.actors, task)

    def send(self, task: str, payload: str) -> None:
        self._actor(task).send(payload)

    def enqueue(self, task: str, intent: fencing.Intent) -> None:
        self._actor(task).enqueue(intent)

    def send_naive_mark(
        self, key: str, label: str, msg_id: str, decided: int | None, locked: bool = False
    ) -> None:
        self.actors.naive_mark.send(key, label, msg_id, decided, locked)

    def send_naive_bump(self, key: str, msg_id: str) -> None:
        self.actors.naive_bump.send(key, msg_id)

    def send_ping(self, token: str) -> None:
        self.actors.ping.send(token)

    def stop(self) -> None:
        super().stop()
        self.broker.close()

    def cleanup_broker(self) -> None:
        if self.broker_kind == "redis":
            _redis_delete(self.broker_url, [f"{self.prefix}*"])
        else:
            names = [self.queue, f"{self.queue}.DQ", f"{self.queue}.XQ"]
            _amqp_delete(names, [])


# -- arq ----------------------------------------------------------------------------------------
class ArqHarness(Harness):
    queue_kind = "arq"
    broker_kind = "redis"
    restart_after_kill = True

    def __init__(self, root: Path, *, store: str = "sqlite") -> None:
        super().__init__(root, store=store)
        from arq import create_pool

        from .apps import arq_app

        self.app = arq_app
        self.loop = asyncio.new_event_loop()
        self.pool = self.loop.run_until_complete(
            create_pool(arq_app.redis_settings(self.broker_url), default_queue_name=self.queue)
        )

    @property
    def broker_url(self) -> str:
        return redis_url("arq")

    def commands(self) -> list[tuple[str, list[str]]]:
        argv = [str(BIN / "arq"), "tests.contrib.apps.arq_app.WorkerSettings"]
        return [("arq1", argv), ("arq2", list(argv))]

    def recover(self) -> None:
        # Restart only the killed workers: the survivors keep their jobs.
        for worker in self.workers:
            if not worker.alive:
                worker.kill_group()
        self.start()

    def _job_id(self) -> str:
        return f"{self.prefix}-{uuid.uuid4().hex}"

    def _enqueue(self, name: str, *args: Any) -> None:
        job = self.loop.run_until_complete(
            self.pool.enqueue_job(name, *args, _job_id=self._job_id())
        )
        assert job is not None, "arq refused the job"

    def send(self, task: str, payload: str) -> None:
        self._enqueue(getattr(self.app, task).name, payload)

    def enqueue(self, task: str, intent: fencing.Intent) -> None:
        from fencing.contrib.arq import enqueue_intent

        job = self.loop.run_until_complete(
            enqueue_intent(self.pool, getattr(self.app, task), intent, _job_id=self._job_id())
        )
        assert job is not None

    def send_naive_mark(
        self, key: str, label: str, msg_id: str, decided: int | None, locked: bool = False
    ) -> None:
        self._enqueue("e2e.naive_mark", key, label, msg_id, decided, locked)

    def send_naive_bump(self, key: str, msg_id: str) -> None:
        self._enqueue("e2e.naive_bump", key, msg_id)

    def send_ping(self, token: str) -> None:
        self._enqueue("e2e.ping", token)

    def stop(self) -> None:
        super().stop()
        self.loop.run_until_complete(self.pool.aclose())
        self.loop.close()

    def cleanup_broker(self) -> None:
        _redis_delete(self.broker_url, [f"*{self.queue}*", f"*{self.prefix}*"])


#: ``HARNESSES[name](root, store="sqlite")``: a harness on a store of ``STORES``.
HARNESSES: dict[str, Callable[..., Harness]] = {
    "celery-redis": lambda root, **kw: CeleryHarness(root, "redis", **kw),
    "celery-rabbitmq": lambda root, **kw: CeleryHarness(root, "rabbitmq", **kw),
    "rq-redis": RQHarness,
    "dramatiq-redis": lambda root, **kw: DramatiqHarness(root, "redis", **kw),
    "dramatiq-rabbitmq": lambda root, **kw: DramatiqHarness(root, "rabbitmq", **kw),
    "arq-redis": ArqHarness,
}
