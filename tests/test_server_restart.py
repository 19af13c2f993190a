"""A server restarted mid-run: no acknowledged commit is lost, none applies twice, and
lease tokens keep their order across the restart.

Workers take turns on one record under a lease: acquire (a new token), read, commit
fenced by the lease, release. Meanwhile the server is killed and started again:
PostgreSQL by an immediate shutdown (no checkpoint, crash recovery from the WAL on
start), MariaDB by SIGKILL of ``mariadbd`` (InnoDB crash recovery), and a private Redis
with ``appendonly yes`` and ``appendfsync always`` (the configuration the README asks
for) by SIGKILL. Every ``TransientStoreError`` is retried with the same intent, so a
commit that landed before the connection died reports ``Duplicate``.

PostgreSQL and MariaDB are the machine's shared servers: restarting them runs only in
CI (``CI`` set) or with ``FENCING_TEST_RESTARTS=1``, and skips with that reason on a
laptop. The Redis server is the test's own, on a free port in a temporary directory.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import pytest

import fencing
from fencing import Committed, Duplicate, Fenced, Stale, TransientStoreError

from ._backends import CI, require_server, server_up

RESTARTS_ALLOWED = CI or os.environ.get("FENCING_TEST_RESTARTS") == "1"
WORKERS = 4
BEFORE, AFTER = 12, 12  # commits acknowledged before the restart, and after it
DEADLINE = 120.0  # seconds for the whole run, restart included


def _need(command: str) -> str:
    path = shutil.which(command)
    if path is None:
        message = f"{command} is not installed: cannot restart the server"
        if CI:
            pytest.fail(message)
        pytest.skip(message)
    return path


def _shared_server(name: str) -> None:
    if not RESTARTS_ALLOWED:
        pytest.skip(
            f"restarts this machine's {name} server: runs in CI (CI=true) or with"
            " FENCING_TEST_RESTARTS=1"
        )
    if os.geteuid() != 0:
        message = f"restarting {name} needs root"
        if CI:
            pytest.fail(message)
        pytest.skip(message)


def _wait_port(port: int, up: bool, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while server_up("127.0.0.1", port, timeout=0.2) != up:
        if time.monotonic() > deadline:
            raise AssertionError(f"port {port} did not go {'up' if up else 'down'}")
        time.sleep(0.05)


# -- the run ----------------------------------------------------------------------------
@dataclass
class Run:
    tokens: list[tuple[float, int]] = field(default_factory=list)  # (granted at, token)
    acked: list[str] = field(default_factory=list)
    transient: int = 0
    duplicates: int = 0
    fenced: int = 0
    restart_began: float = 0.0
    restart_ended: float = 0.0
    errors: list[BaseException] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


def _retry(run: Run, stop: threading.Event, call: Callable[[], Any]) -> Any:
    """``call()`` until it does not raise ``TransientStoreError`` (the server is back)."""
    while True:
        try:
            return call()
        except TransientStoreError:
            with run.lock:
                run.transient += 1
            if stop.is_set():
                raise
            time.sleep(0.05)


def _worker(store: Any, run: Run, w: int, stop: threading.Event) -> None:
    log = store.collection("log")
    try:
        i = 0
        while not stop.is_set():
            lease = _retry(run, stop, lambda: store.acquire("log/k", owner=f"w{w}", ttl=5, wait=30))
            with run.lock:
                run.tokens.append((time.monotonic(), lease.token))
            entry = f"{lease.token}:{w}-{i}"
            i += 1
            while True:
                rec = _retry(run, stop, lambda: log.get("k"))
                intent = rec.intent("append")
                state = {"log": [*rec.state["log"], entry]}
                out = _retry(run, stop, partial(log.commit, intent, state, lease=lease))
                if isinstance(out, Committed | Duplicate):
                    with run.lock:
                        run.acked.append(entry)
                        run.duplicates += isinstance(out, Duplicate)
                    break
                if isinstance(out, Fenced):  # the lease ran out while the server was down
                    with run.lock:
                        run.fenced += 1
                    break
                assert isinstance(out, Stale), out
            with contextlib.suppress(fencing.LeaseLost):  # it ran out while down
                _retry(run, stop, lease.release)
    except TransientStoreError:
        assert stop.is_set()
    except BaseException as exc:  # reported by the test
        run.errors.append(exc)
        stop.set()


def _acked(run: Run) -> int:
    with run.lock:
        return len(run.acked)


def _until(run: Run, count: int, stop: threading.Event) -> None:
    deadline = time.monotonic() + DEADLINE
    while _acked(run) < count and not stop.is_set():
        assert time.monotonic() < deadline, f"only {_acked(run)} of {count} commits acked"
        time.sleep(0.01)


def run_through_restart(url: str, restart: Callable[[], None], api: str) -> Run:
    """The run through the sync API, or through the async one (a loop in a thread)."""
    from .backends_postgres import opened

    run, stop = Run(), threading.Event()
    with opened(url, api) as store:
        store.collection("log").create("k", {"log": []})
        threads = [
            threading.Thread(target=_worker, args=(store, run, w, stop)) for w in range(WORKERS)
        ]
        for t in threads:
            t.start()
        try:
            _until(run, BEFORE, stop)
            run.restart_began = time.monotonic()
            restart()
            run.restart_ended = time.monotonic()
            _until(run, _acked(run) + AFTER, stop)
        finally:
            stop.set()
            for t in threads:
                t.join(DEADLINE)
        if run.errors:
            raise run.errors[0]
        final = _retry(run, threading.Event(), lambda: store.collection("log").get("k"))
    _judge(run, final)
    return run


def _judge(run: Run, final: fencing.Record) -> None:
    entries = list(final.state["log"])
    assert len(entries) == len(set(entries)), "an intent was applied twice"
    assert final.version == 1 + len(entries)
    assert set(run.acked) <= set(entries), "an acknowledged commit was lost in the restart"
    assert set(entries) - set(run.acked) == set(), "a commit landed that was never acked"
    # the store checks the fence: the tokens along the log never go down
    written = [int(e.split(":")[0]) for e in entries]
    assert written == sorted(written), "a lower token wrote after a higher one"
    assert final.fence == written[-1]
    tokens = [t for _, t in run.tokens]
    assert len(tokens) == len(set(tokens)), "a lease token was handed out twice"
    before = [t for at, t in run.tokens if at < run.restart_began]
    after = [t for at, t in run.tokens if at > run.restart_ended]
    assert before and after
    assert max(before) < min(after), "the restart set the lease tokens back"
    assert run.transient > 0, "no call met the restart: nothing was tested"


# -- PostgreSQL -------------------------------------------------------------------------
@pytest.fixture
def pg_restart() -> Iterator[Callable[[], None]]:
    from .backends_postgres import HOST, PORT

    require_server("PostgreSQL", HOST, PORT)
    _shared_server("PostgreSQL")
    ctl = _need("pg_ctlcluster")
    version = sorted(os.listdir("/etc/postgresql"))[-1]

    def start() -> None:
        subprocess.run(
            [ctl, "--skip-systemctl-redirect", version, "main", "start"],
            check=False,
            capture_output=True,
        )
        _wait_port(PORT, up=True)

    def restart() -> None:
        # immediate: no shutdown checkpoint, so the start is a crash recovery from WAL
        subprocess.run(
            [ctl, "--skip-systemctl-redirect", "-m", "immediate", version, "main", "stop"],
            check=True,
            capture_output=True,
        )
        _wait_port(PORT, up=False)
        start()

    try:
        yield restart
    finally:
        if not server_up(HOST, PORT):
            start()


def test_postgresql_restart_mid_run(pg_restart: Callable[[], None], api: str) -> None:
    from .backends_postgres import cleanup, new_setup

    setup = new_setup(max_size="8")
    try:
        run_through_restart(setup.url, pg_restart, api)
    finally:
        cleanup(setup.url)


# -- MariaDB ----------------------------------------------------------------------------
def _mariadbd_pids() -> list[int]:
    found = subprocess.run(["pidof", "mariadbd"], capture_output=True, text=True, check=False)
    return [int(p) for p in found.stdout.split()]


@pytest.fixture
def mysql_restart() -> Iterator[Callable[[], None]]:
    from .backends_mysql import HOST, PORT

    require_server("MariaDB", HOST, PORT)
    _shared_server("MariaDB")
    daemon = _need("mariadbd")
    ssd = _need("start-stop-daemon")

    def start() -> None:
        subprocess.run(
            [ssd, "--start", "--oknodo", "--background", "--exec", daemon],
            check=True,
            capture_output=True,
        )
        _wait_port(PORT, up=True)

    def restart() -> None:
        pids = _mariadbd_pids()
        assert pids, "mariadbd is not running"
        for pid in pids:
            os.kill(pid, signal.SIGKILL)  # a crash: InnoDB recovers from its redo log
        _wait_port(PORT, up=False)
        deadline = time.monotonic() + 30
        while _mariadbd_pids():
            assert time.monotonic() < deadline, "mariadbd did not exit"
            time.sleep(0.05)
        start()

    try:
        yield restart
    finally:
        if not server_up(HOST, PORT):
            start()


def test_mariadb_restart_mid_run(mysql_restart: Callable[[], None], api: str) -> None:
    from .backends_mysql import cleanup, make_url

    url = make_url(Path("."))
    try:
        run_through_restart(url, mysql_restart, api)
    finally:
        cleanup(url)


# -- Redis (a private server, persisted as the README asks) ----------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture
def redis_aof(tmp_path: Path) -> Iterator[tuple[str, Callable[[], None]]]:
    server = _need("redis-server")
    port = _free_port()
    command = [
        server,
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--dir",
        str(tmp_path),
        "--save",
        "",
        "--appendonly",
        "yes",
        "--appendfsync",
        "always",
        "--logfile",
        str(tmp_path / "redis.log"),
    ]
    procs: list[subprocess.Popen[bytes]] = []

    def start() -> None:
        procs.append(subprocess.Popen(command, stdout=subprocess.DEVNULL))
        _wait_port(port, up=True)

    def restart() -> None:
        proc = procs[-1]
        proc.send_signal(signal.SIGKILL)  # no shutdown: only what the AOF holds survives
        proc.wait()
        start()

    start()
    try:
        url = f"redis://127.0.0.1:{port}/0?prefix=fencing-test-{uuid.uuid4().hex[:8]}"
        yield url, restart
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_redis_with_aof_restart_mid_run(
    redis_aof: tuple[str, Callable[[], None]], api: str
) -> None:
    url, restart = redis_aof
    run_through_restart(url, restart, api)
