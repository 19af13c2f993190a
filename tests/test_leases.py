"""Leases with fencing tokens, proven with real processes and real pauses.

The headline: a holder paused by SIGSTOP past its TTL (its heartbeat paused with it) cannot
commit when it wakes up, whether a newer owner took over (``Fenced(NEWER_OWNER)``) or
nobody did (``Fenced(EXPIRED)``). These run on every store that processes can share
(``shared_backend_name``: the SQLite file, and the server backends when registered).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import multiprocessing
import os
import random
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import fencing
from fencing import Committed, Fenced, FenceReason, LeaseLost

from ._backends import CASES
from ._syncify import Loop, Syncified

SPAWN = multiprocessing.get_context("spawn")
NAME = "orders/o-1"
WAIT = 60.0  # generous bounds on waiting for another process; never asserted as timing


# -- helpers -----------------------------------------------------------------------------
def lease_row(store: fencing.Store, name: str) -> Any:
    """The lease row and the store's clock, as the store answers (sync stores)."""
    return store.backend.lease_state(name)


def wait_until_expired(store: fencing.Store, name: str) -> None:
    """Poll the store until the lease is no longer held by the store's own clock."""
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        answer = lease_row(store, name)
        if answer.row is None or not answer.row.held_at(answer.now):
            return
        time.sleep(0.05)
    pytest.fail(f"lease {name} still held after {WAIT}s")


@contextlib.contextmanager
def paused(pid: int, store: fencing.Store) -> Iterator[None]:
    """SIGSTOP ``pid`` (and every thread of it) while it holds no lock of the store.

    A process stopped inside a store call could hold the store's write lock (SQLite)
    and block everyone; such a pause is retried: the probe, a write to an unrelated
    lease, must get through while the process is stopped.
    """
    try:
        for _ in range(50):
            os.kill(pid, signal.SIGSTOP)
            done = threading.Event()

            def probe(done: threading.Event = done) -> None:
                store.acquire(f"probe/{uuid.uuid4().hex}", owner="probe", ttl=1).release()
                done.set()

            prober = threading.Thread(target=probe)
            prober.start()
            if done.wait(5.0):
                prober.join()
                break
            os.kill(pid, signal.SIGCONT)  # it held a lock: let it finish, pause again
            prober.join()
            time.sleep(random.uniform(0.01, 0.1))
        else:  # pragma: no cover
            pytest.fail("could not pause the process outside a store call")
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def holder(url: str, ttl: float, keys: list[str], ready: Any, go: Any, results: Any) -> None:
    """Process A: acquire with a heartbeat, decide, wait for ``go``, commit under the lease."""
    store = fencing.open(url)
    orders = store.collection("orders")
    lease = store.acquire(NAME, owner="A", ttl=ttl, heartbeat=True)
    intents = [orders.intent(key, "by-a") for key in keys]
    ready.put({"token": lease.token, "expires_at": lease.expires_at})
    go.get(timeout=WAIT * 2)
    outcomes = [orders.commit(intent, {"by": "A"}, lease=lease) for intent in intents]
    lease.stop_heartbeat()
    results.put(
        {
            "outcomes": [
                (out.kind, out.reason.value if isinstance(out, Fenced) else None)
                for out in outcomes
            ],
            "lost": lease.lost,
            "lost_reason": lease.lost_reason,
        }
    )
    store.close()


def start_holder(url: str, ttl: float, keys: list[str]) -> tuple[Any, Any, Any, dict[str, Any]]:
    # ``go`` is a queue, not an Event: Event.set() waits for its sleepers to wake up,
    # and a stopped process never does.
    ready, results, go = SPAWN.Queue(), SPAWN.Queue(), SPAWN.Queue()
    proc = SPAWN.Process(target=holder, args=(url, ttl, keys, ready, go, results))
    proc.start()
    info = ready.get(timeout=WAIT)
    return proc, go, results, info


def finish(proc: Any, results: Any) -> dict[str, Any]:
    try:
        result: dict[str, Any] = results.get(timeout=WAIT)
        proc.join(WAIT)
        assert proc.exitcode == 0
        return result
    finally:
        if proc.is_alive():
            proc.kill()
            proc.join()


# -- the headline: SIGSTOP past the TTL ------------------------------------------------------
@pytest.mark.slow
def test_paused_holder_is_fenced_by_the_newer_owner(
    shared_backend_name: str, store_url: str
) -> None:
    store = fencing.open(store_url)
    orders = store.collection("orders")
    orders.create("o-1", {"by": None})
    orders.create("o-2", {"by": None})
    # One lease guarding two records: a Redis Cluster refuses a fenced commit whose lease
    # is in another hash slot than the record (test_redis.py), so there A writes o-1 only.
    cluster = shared_backend_name == "redis-cluster"
    keys = ["o-1"] if cluster else ["o-1", "o-2"]
    proc, go, results, a = start_holder(store_url, ttl=1.0, keys=keys)
    try:
        # While A runs, its heartbeat keeps the lease past its TTL: nobody can take it.
        time.sleep(1.2)
        assert store.try_acquire(NAME, owner="B", ttl=10) is None
        with paused(proc.pid, store):
            # A and its heartbeat are frozen: the lease runs out by the store's clock.
            b = store.acquire(NAME, owner="B", ttl=30, wait=WAIT)
            assert b.token > a["token"]
            # B writes o-1 at once; o-2 it has only acquired, not written yet.
            mine = orders.commit(orders.intent("o-1", "by-b"), {"by": "B"}, lease=b)
            assert isinstance(mine, Committed) and mine.record.fence == b.token
            go.put(True)  # A commits the moment it wakes up
        result = finish(proc, results)
    finally:
        go.put(True)
        if proc.is_alive():
            proc.join(WAIT)
    newer = (("fenced", FenceReason.NEWER_OWNER.value),) * len(keys)
    # o-1: B's token wrote it; o-2: untouched (fence 0, version 1), but the lease row now
    # holds B's token, so A's write is refused all the same (no read-side gap)
    assert tuple(map(tuple, result["outcomes"])) == newer
    assert result["lost"] and result["lost_reason"] == "newer_owner"
    record = orders.get("o-1")
    assert record.state["by"] == "B" and record.version == 2 and record.fence == b.token
    untouched = orders.get("o-2")
    assert untouched.state["by"] is None and untouched.version == 1 and untouched.fence == 0
    if not cluster:
        late = orders.commit(orders.intent("o-2", "by-b"), {"by": "B"}, lease=b)
        assert isinstance(late, Committed) and late.record.fence == b.token
    b.release()
    store.close()


@pytest.mark.slow
def test_paused_holder_is_fenced_when_its_lease_expired(
    shared_backend_name: str, store_url: str
) -> None:
    store = fencing.open(store_url)
    orders = store.collection("orders")
    before = orders.create("o-1", {"by": None})
    proc, go, results, a = start_holder(store_url, ttl=1.0, keys=["o-1"])
    try:
        with paused(proc.pid, store):
            wait_until_expired(store, NAME)  # nobody takes over
            go.put(True)
        result = finish(proc, results)
    finally:
        go.put(True)
        if proc.is_alive():
            proc.join(WAIT)
    assert [tuple(o) for o in result["outcomes"]] == [("fenced", FenceReason.EXPIRED.value)]
    assert result["lost"] and result["lost_reason"] == "expired"
    assert orders.get("o-1") == before  # state, version and fence unchanged
    nxt = store.acquire(NAME, owner="C", ttl=5)
    assert nxt.token == a["token"] + 1
    nxt.release()
    store.close()


# -- tokens never go back -----------------------------------------------------------------
def acquire_in_child(url: str, name: str, release: bool, results: Any) -> None:
    store = fencing.open(url)
    lease = store.acquire(name, owner=f"pid{os.getpid()}", ttl=0.3, wait=WAIT)
    results.put(lease.token)
    if release:
        lease.release()
    store.close()  # an unreleased lease simply expires


@pytest.mark.slow
def test_tokens_increase_across_reopen_and_processes(
    shared_backend_name: str, store_url: str
) -> None:
    tokens: list[int] = []

    def in_parent(release: bool = True) -> None:
        store = fencing.open(store_url)
        lease = store.acquire(NAME, owner="parent", ttl=0.3, wait=WAIT)
        tokens.append(lease.token)
        if release:
            lease.release()
        store.close()

    def in_child(release: bool = True) -> None:
        results = SPAWN.Queue()
        proc = SPAWN.Process(target=acquire_in_child, args=(store_url, NAME, release, results))
        proc.start()
        tokens.append(results.get(timeout=WAIT))
        proc.join(WAIT)
        assert proc.exitcode == 0

    in_parent()
    in_parent()  # closed and reopened
    in_child()
    in_child(release=False)  # expires instead
    in_parent(release=False)  # waits for the expiry, then expires too
    in_parent()
    assert tokens == list(range(tokens[0], tokens[0] + len(tokens))), tokens


# -- many processes contending for one lease -------------------------------------------------
def contender(url: str, worker: int, rounds: int, ttl: float, out_path: str, start: Any) -> None:
    """Acquire (waiting), read, commit under the lease, release (or crash, now and then)."""
    store = fencing.open(url)
    jobs = store.collection("jobs")
    fd = os.open(out_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    start.wait(WAIT)
    for i in range(rounds):
        lease = store.acquire("jobs/counter", owner=f"w{worker}", ttl=ttl, wait=WAIT)
        event: dict[str, Any] = {
            "worker": worker,
            "token": lease.token,
            "expires_at": lease.expires_at,
            "ttl": ttl,
        }
        record = jobs.get("counter")
        intent = record.intent("inc")
        time.sleep(random.uniform(0, ttl / 10))  # the work, inside the critical section
        out = jobs.commit(intent, {"n": record.state["n"] + 1, "by": lease.token}, lease=lease)
        event.update(
            intent_id=intent.id,
            expected_version=intent.expected_version,
            outcome=out.kind,
            reason=out.reason.value if isinstance(out, Fenced) else None,
            version=out.current.version if out.current is not None else None,
            fence=out.current.fence if out.current is not None else None,
        )
        if i == 1 and worker % 2 == 0:
            event["released"] = False  # a crash: the lease is left to expire
        else:
            try:
                lease.release()
                event["released"] = True
            except LeaseLost:
                event["released"] = False
        os.write(fd, (json.dumps(event) + "\n").encode())
    os.close(fd)
    store.close()


@pytest.mark.slow
def test_processes_contending_for_one_lease(
    shared_backend_name: str, store_url: str, tmp_path: Path
) -> None:
    store = fencing.open(store_url)
    store.collection("jobs").create("counter", {"n": 0, "by": None})
    processes, rounds, ttl = 4, 3, 0.3
    start = SPAWN.Barrier(processes)
    path = tmp_path / "leases.jsonl"
    procs = [
        SPAWN.Process(target=contender, args=(store_url, w, rounds, ttl, str(path), start))
        for w in range(processes)
    ]
    for p in procs:
        p.start()
    try:
        for p in procs:
            p.join(WAIT * 4)
        assert [p.exitcode for p in procs] == [0] * processes
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
    events = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(events) == processes * rounds

    # tokens: strictly increasing, one per acquisition, none skipped or reused
    grants = sorted(events, key=lambda e: e["token"])
    tokens = [e["token"] for e in grants]
    assert tokens == list(range(tokens[0], tokens[0] + len(tokens)))

    # no two grants overlap in store time: a grant starts after the previous one started,
    # and after it expired unless it was released first
    eps = 1e-3  # float rounding of the store's clock; never a timing margin
    for prev, cur in itertools.pairwise(grants):
        acquired_prev = prev["expires_at"] - prev["ttl"]
        acquired_cur = cur["expires_at"] - cur["ttl"]
        assert acquired_cur >= acquired_prev - eps, (prev, cur)
        if not prev["released"]:
            assert acquired_cur >= prev["expires_at"] - eps, (prev, cur)

    # the record's version chain: every commit applied once, in token order, no regression
    committed = sorted(
        (e for e in events if e["outcome"] == "committed"), key=lambda e: e["version"]
    )
    assert committed, "no commit went through"
    assert [e["version"] for e in committed] == list(range(2, 2 + len(committed)))
    assert all(e["expected_version"] == e["version"] - 1 for e in committed)
    assert all(e["fence"] == e["token"] for e in committed)
    fences = [e["fence"] for e in committed]
    assert fences == sorted(fences) and len(set(fences)) == len(fences)
    refused = [e for e in events if e["outcome"] != "committed"]
    assert all(e["outcome"] == "fenced" for e in refused), refused  # only by a lost lease
    final = store.collection("jobs").get("counter")
    assert final.version == 1 + len(committed)
    assert final.state == {"n": len(committed), "by": committed[-1]["token"]}
    assert final.fence == committed[-1]["token"]

    # the same history, judged by fencing's checker when it is there
    try:
        from fencing.testing import check_history
    except ImportError:  # pragma: no cover - the checker is written alongside this suite
        check_history = None
    if check_history is not None:
        history = [
            {
                "event": "outcome",
                "t": 0.0,
                "worker": f"w{e['worker']}",
                "collection": "jobs",
                "key": "counter",
                "intent_id": e["intent_id"],
                "root_id": e["intent_id"],
                "transition": "inc",
                "expected_version": e["expected_version"],
                "outcome": e["outcome"],
                "version": e["version"],
                "applied_over": e["version"] - 1 if e["outcome"] == "committed" else None,
                "token": e["token"],
                "fence": e["fence"],
            }
            for e in events
        ]
        final_event = {
            "event": "final",
            "collection": "jobs",
            "key": "counter",
            "version": final.version,
            "fence": final.fence,
            "state": dict(final.state),
        }
        report = check_history([*history, final_event])
        assert report.ok, report.summary()
    store.close()


# -- heartbeats -----------------------------------------------------------------------------
@contextlib.contextmanager
def every_store(tmp_path: Path) -> Iterator[list[tuple[str, Any]]]:
    """A fresh store on every backend, through the sync and the async API, all open at once.

    A server that is not running is left out on a laptop and fails the test in CI, the
    same rule ``require_server`` applies everywhere.
    """
    opened: list[tuple[str, Any]] = []
    cleanups: list[Any] = []
    loop = Loop()
    try:
        for name, case in CASES.items():
            for api in ("sync", "async"):
                where = tmp_path / f"{name}-{api}"
                where.mkdir()
                try:
                    url = case.url(where)
                except pytest.skip.Exception:
                    continue
                if api == "sync":
                    opened.append((f"{name}-sync", fencing.open(url)))
                else:
                    store = Syncified(loop.run(fencing.open_async(url)), loop)
                    opened.append((f"{name}-async", store))
                if case.cleanup is not None:
                    cleanups.append((case.cleanup, url))
        yield opened
    finally:
        for _, store in opened:
            store.close()
        for cleanup, url in cleanups:
            cleanup(url)
        loop.close()


@pytest.mark.slow
def test_heartbeat_keeps_the_lease_while_the_body_runs_past_its_ttl(tmp_path: Path) -> None:
    with every_store(tmp_path) as stores:
        held = []
        for label, store in stores:
            orders = store.collection("orders")
            orders.create("o-1", {"by": None})
            context = store.lease(NAME, owner=label, ttl=0.6, heartbeat=True)
            lease = context.__enter__()
            held.append((label, store, orders, orders.intent("o-1", "slow"), context, lease))
        time.sleep(2.0)  # the body: more than three TTLs, on every store at once
        failures = []
        for label, store, orders, intent, context, lease in held:
            other = store.try_acquire(NAME, owner="other", ttl=5)
            out = orders.commit(intent, {"by": label}, lease=lease)
            context.__exit__(None, None, None)
            if other is not None or not out.committed or lease.lost:
                failures.append(f"{label}: other={other} out={out} lost={lease.lost_reason}")
        assert not failures, failures
        assert len(stores) >= 6  # memory, sqlite-memory and sqlite-file, sync and async


def steal(store: Any, name: str, token: int) -> None:
    """Release ``token`` behind the holder's back, straight through the backend."""
    if isinstance(store, Syncified):
        store._loop.run(store.unwrapped.backend.release(name, token))
    else:
        store.backend.release(name, token)


def wait_for(flag: threading.Event) -> None:
    assert flag.wait(WAIT), "the heartbeat never noticed"


def test_heartbeat_that_cannot_renew_flips_lost_and_calls_on_lost(store: Any) -> None:
    orders = store.collection("orders")
    orders.create("o-1", {"by": None})
    called: list[int] = []
    noticed = threading.Event()

    def on_lost(lease: Any) -> None:
        called.append(lease.token)
        noticed.set()

    lease = store.acquire(NAME, owner="A", ttl=0.6, on_lost=on_lost)  # on_lost starts it
    intent = orders.intent("o-1", "by-a")
    assert not lease.lost
    steal(store, NAME, lease.token)
    wait_for(noticed)
    assert called == [lease.token]
    assert lease.lost and lease.lost_reason == "expired"
    out = orders.commit(intent, {"by": "A"}, lease=lease)
    assert isinstance(out, Fenced) and out.reason is FenceReason.EXPIRED
    newer = store.acquire(NAME, owner="B", ttl=5)
    assert newer.token > lease.token
    out = orders.commit(intent, {"by": "A"}, lease=lease)
    assert isinstance(out, Fenced) and out.reason is FenceReason.NEWER_OWNER
    assert orders.get("o-1").version == 1
    with pytest.raises(LeaseLost):
        lease.release()  # the store no longer holds this token for us
    newer.release()
    assert called == [lease.token]  # exactly once


def test_heartbeat_notices_a_newer_owner(store: Any) -> None:
    noticed = threading.Event()
    lease = store.acquire(NAME, owner="A", ttl=0.6, heartbeat=True, on_lost=lambda _: noticed.set())
    steal(store, NAME, lease.token)
    newer = store.acquire(NAME, owner="B", ttl=30)
    wait_for(noticed)
    assert lease.lost and lease.lost_reason in ("newer_owner", "expired")
    with pytest.raises(LeaseLost):
        lease.renew()
    newer.release()


def test_leaving_a_lost_lease_does_not_hide_the_users_error(store: Any) -> None:
    with (  # noqa: PT012
        pytest.raises(ValueError, match="the body's own error"),
        store.lease(NAME, owner="A", ttl=30) as lease,
    ):
        steal(store, NAME, lease.token)
        raise ValueError("the body's own error")
    assert lease.lost and lease.released
    assert lease.lost_reason == "expired"


def test_an_on_lost_that_raises_does_not_hide_the_users_error(
    store: Any, caplog: pytest.LogCaptureFixture
) -> None:
    noticed = threading.Event()

    def on_lost(lease: Any) -> None:
        noticed.set()
        raise RuntimeError("on_lost's own error")

    with (  # noqa: PT012
        pytest.raises(KeyError, match="body"),
        store.lease(NAME, owner="A", ttl=0.6, on_lost=on_lost) as lease,
    ):
        steal(store, NAME, lease.token)
        wait_for(noticed)
        raise KeyError("body")
    assert lease.lost and lease.released
    logged = [r for r in caplog.records if r.name == "fencing.lease"]
    assert len(logged) == 1 and "on_lost" in logged[0].getMessage()
    assert logged[0].exc_info is not None and "on_lost's own" in str(logged[0].exc_info[1])


def test_leaving_a_lost_lease_without_error_reports_it(store: Any) -> None:
    with store.lease(NAME, owner="A", ttl=30) as lease:
        steal(store, NAME, lease.token)
        newer = store.acquire(NAME, owner="B", ttl=30)
    assert lease.lost and lease.lost_reason == "newer_owner"
    assert newer.token > lease.token and not newer.lost
    newer.release()


def test_leaving_a_lost_lease_with_a_heartbeat(store: Any) -> None:
    noticed = threading.Event()
    with (  # noqa: PT012
        pytest.raises(KeyError),
        store.lease(
            NAME, owner="A", ttl=0.6, heartbeat=True, on_lost=lambda _: noticed.set()
        ) as lease,
    ):
        steal(store, NAME, lease.token)
        wait_for(noticed)
        raise KeyError("body")
    assert lease.lost and lease.released
    token = store.acquire(NAME, owner="B", ttl=5).token
    assert token == lease.token + 1
