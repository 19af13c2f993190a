"""Every backend is linearizable under churn: histories recorded and judged.

Create/get/commit/delete churn on a few hot keys (creates overlapping deletes),
batches, guarded table commits, and leases with short TTLs and fenced commits, by
8 threads on one store (sync API), 8 tasks on one event loop (async API), and 4
processes x 2 threads on a store they share; on the server stores a side thread
kills the store's connections at random moments (those operations are recorded
with an unknown outcome). Each history must be linearizable for the model of
``fencing.testing._linear_model`` (``check_linearizable``). The harness is shown to
fail: a memory store with the create/delete version bug planted, and one whose
commit checks and writes in two steps, are both found non-linearizable.

The numbers of histories and operations judged per backend are printed at the end
of the run ("linearizability" in the terminal summary).
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import shutil
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

import fencing
from fencing._request import CommitRequest, CommitResult
from fencing._rules import Status
from fencing.backends.memory import MemoryBackend
from fencing.testing import HistoryWriter, LinReport, check_linearizable, read_lin_file

from . import _lin_churn
from ._backends import CASES, TABLE_COLUMNS
from ._lin_churn import TABLE, AsyncDriver, Config, SyncDriver, plan, table_rows
from ._lin_kill import Killer, url_with_name

THREADS = 8
JOIN = 300.0  # a bound on waiting for workers, never a timing assertion


def _config(backend: str, **changes: Any) -> Config:
    redis = backend.startswith("redis")  # Redis batches are documented as not atomic
    return Config(batch_atomic=not redis, text_columns=redis, **changes)


def _prepare(store: Any, backend: str, config: Config, path: Path) -> None:
    CASES[backend].create_table(store, TABLE, "id", "version", TABLE_COLUMNS, table_rows(config))
    with HistoryWriter(path) as sink:
        for event in _lin_churn.init_events(config):
            sink.write(event)


def _judge(backend: str, path: Path) -> LinReport:
    ops, init = read_lin_file(path)
    report = check_linearizable(ops, init=init)
    unknown = sum(op.ret is None for op in ops)
    _lin_churn.count(backend, histories=1, ops=len(ops), unknown=unknown)
    return report


def _run_threads(store: Any, path: Path, config: Config, threads: int = THREADS) -> None:
    errors: list[BaseException] = []
    sink = HistoryWriter(path)

    def work(i: int) -> None:
        try:
            SyncDriver(store, sink, "p0", f"t{i}", config.batch_atomic).run(plan(config, f"t{i}"))
        except BaseException as exc:
            errors.append(exc)

    workers = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join(JOIN)
    sink.close()
    assert not any(t.is_alive() for t in workers), "a worker hung"
    if errors:
        raise errors[0]


def _verdict(report: LinReport, path: Path) -> None:
    if report.ok is not True:
        path = _keep(path)
    assert report.ok is True, f"{path}:\n{report.summary()}"


def _keep(path: Path) -> Path:
    """With ``FENCING_LIN_KEEP`` set to a directory, a failing history is copied there
    (pytest removes old temporary directories; a loop of runs keeps only the failures)."""
    keep = os.environ.get("FENCING_LIN_KEEP")
    if not keep:
        return path
    Path(keep).mkdir(parents=True, exist_ok=True)
    kept = Path(keep) / f"{path.parent.name}-{uuid.uuid4().hex[:8]}.jsonl"
    shutil.copyfile(path, kept)
    return kept


def test_threads_churn_is_linearizable(backend_name: str, store_url: str, tmp_path: Path) -> None:
    name = _lin_churn.new_name()
    url = url_with_name(backend_name, store_url, name)
    config = _config(backend_name, seed=1)
    path = tmp_path / "history.jsonl"
    store = fencing.open(url)
    try:
        _prepare(store, backend_name, config, path)
        with Killer(backend_name, url, name, seed=1):
            _run_threads(store, path, config)
    finally:
        store.close()
    _verdict(_judge(backend_name, path), path)


def test_async_churn_is_linearizable(backend_name: str, store_url: str, tmp_path: Path) -> None:
    name = _lin_churn.new_name()
    url = url_with_name(backend_name, store_url, name)
    config = _config(backend_name, seed=2)
    path = tmp_path / "history.jsonl"

    async def main() -> None:
        store = await fencing.open_async(url)
        try:
            _prepare(store, backend_name, config, path)  # before any task runs
            sink = HistoryWriter(path)
            drivers = [
                AsyncDriver(store, sink, "p0", f"a{i}", config.batch_atomic) for i in range(THREADS)
            ]
            with Killer(backend_name, url, name, seed=2):
                await asyncio.gather(*(d.run(plan(config, d.thread)) for d in drivers))
            sink.close()
        finally:
            await store.close()

    asyncio.run(main())
    gc.collect()  # a connection the store left open warns here, in this test
    _verdict(_judge(backend_name, path), path)


def test_processes_churn_is_linearizable(
    shared_backend_name: str, store_url: str, tmp_path: Path
) -> None:
    import multiprocessing

    spawn = multiprocessing.get_context("spawn")
    backend = shared_backend_name
    name = _lin_churn.new_name()
    url = url_with_name(backend, store_url, name)
    config = _config(backend, seed=3, ops=30)
    path = tmp_path / "history.jsonl"
    store = fencing.open(url)
    try:
        _prepare(store, backend, config, path)
        store.migrate()
    finally:
        store.close()
    ready, start = spawn.Semaphore(0), spawn.Event()
    args = (url, str(path), config)
    procs = [
        spawn.Process(target=_lin_churn.run_process, args=(*args, f"p{i}", 2, ready, start))
        for i in range(4)
    ]
    for p in procs:
        p.start()
    try:
        for _ in procs:  # every process has opened the store before connections are killed
            assert ready.acquire(timeout=JOIN), "a worker process did not start"
        with Killer(backend, url, name, seed=3):
            start.set()
            for p in procs:
                p.join(JOIN)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
    assert [p.exitcode for p in procs] == [0] * 4
    _verdict(_judge(backend, path), path)


def test_one_intent_committed_to_two_keys_is_linearizable(
    backend_name: str, store_url: str, tmp_path: Path
) -> None:
    """An intent id is applied per key: the same id committed to ``a`` and then to ``b``
    commits both (``Duplicate`` only for the key it was applied to)."""
    name = _lin_churn.new_name()
    url = url_with_name(backend_name, store_url, name)
    config = _config(backend_name, seed=4, ops=25, rows=0, cross_key=True)
    path = tmp_path / "history.jsonl"
    store = fencing.open(url)
    try:
        with Killer(backend_name, url, name, seed=4):
            _run_threads(store, path, config, threads=4)
    finally:
        store.close()
    _verdict(_judge(backend_name, path), path)


# -- the harness can fail --------------------------------------------------------------------
class TombstoneBug(MemoryBackend):
    """The bug the outside check found: a re-created record's version comes from a read
    made before a concurrent delete, so it reuses a version of the deleted record."""

    def create(self, target: Any, key: str | int, state_json: str) -> fencing.Record:
        with self._lock:
            tomb = self._tombstones.get((target.name, key), 0)
        time.sleep(0.001)
        with self._lock:
            if (target.name, key) in self._records:
                raise fencing.AlreadyExists(f"{target.name}/{key} already exists")
            self._records[(target.name, key)] = (tomb + 1, 0, state_json)
            return fencing.Record(target.name, key, tomb + 1, 0, json.loads(state_json))


class CheckThenWrite(MemoryBackend):
    """A commit that judges, then writes what it judged in a second step (a race)."""

    def commit(self, request: CommitRequest) -> CommitResult:
        with self._lock:
            status, record = self._judge(request, self.clock())
        if status is not Status.OK or record is None:
            return CommitResult(status, record)
        time.sleep(0.0005)
        with self._lock:
            key = (request.target.name, request.intent.key)
            lease = request.lease
            fence = max(record.fence, lease.token) if lease is not None else record.fence
            self._records[key] = (record.version + 1, fence, request.state_json)
            self._applied[(request.target.scope, request.claim_id)] = self.clock()
            state = json.loads(request.state_json)
            new = fencing.Record(record.collection, record.key, record.version + 1, fence, state)
            return CommitResult(Status.APPLIED, new)


@pytest.mark.parametrize("bug", [TombstoneBug, CheckThenWrite])
def test_a_broken_store_is_caught(bug: type[MemoryBackend], tmp_path: Path) -> None:
    config = Config(seed=5, rows=0)
    path = tmp_path / "history.jsonl"
    store = fencing.open("memory://")
    store.backend = bug()
    _run_threads(store, path, config)
    ops, init = read_lin_file(path)
    report = check_linearizable(ops, init=init)
    assert report.ok is False, report.summary()
    assert "NOT linearizable" in report.summary()
