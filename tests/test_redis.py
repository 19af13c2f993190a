"""Redis-specific tests: connection kills, threads and processes on a hot key against a
naive baseline, hash-tag slots, token durability across reopen and expiry, and the Lua
scripts held to ``fencing._rules.judge()``.

The contract suite (tests/test_contract.py) runs on Redis and on a real Redis Cluster
(``scripts/redis-cluster.sh start``) too, through tests/backends_redis.py; the Cluster
tests at the end cover what only a Cluster has: slots on several nodes, MOVED, script
caches per node, refusals of what cannot be atomic there.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import random
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import fencing
from fencing import Committed, Duplicate, Recompute, TransientStoreError
from fencing._request import CommitRequest, Target
from fencing._rules import LeaseRef, LeaseRow, Status, judge
from fencing._url import StoreURL
from fencing._values import Intent, Record
from fencing.backends.redis import RedisBackend, open_backend
from fencing.backends.redis.flows import RedisFlows
from fencing.backends.redis.layout import Layout, key_slot
from fencing.backends.redis.replies import commit_result, judge_reply
from fencing.backends.redis.scripts import SCRIPTS, Call, Script, check_slots, judge_call
from fencing.backends.redis.settings import settings_from_url
from fencing.backends.redis.steps import Each, Send

from ._backends import TABLE_COLUMNS, require_server
from ._syncify import Loop, Syncified
from .backends_redis import (
    CLUSTER_PORT,
    HOST,
    PORT,
    cleanup,
    cluster_cleanup,
    cluster_url,
    redis_url,
)

pytest.importorskip("redis", reason="the redis extra is not installed")

ORDERS = Target("collection", "orders")


@pytest.fixture
def url() -> Iterator[str]:
    require_server("Redis", HOST, PORT)
    u = redis_url()
    yield u
    cleanup(u)


@pytest.fixture
def opener(api: str, request: pytest.FixtureRequest) -> Iterator[Callable[..., Any]]:
    """open_(url) -> a store through the sync API, or the async API made to look sync."""
    opened: list[Any] = []
    # the loop is set up first, so that it is torn down after the stores are closed
    loop: Loop | None = request.getfixturevalue("loop") if api == "async" else None

    def open_(u: str) -> Any:
        if loop is None:
            store: Any = fencing.open(u)
        else:
            store = Syncified(loop.run(fencing.open_async(u)), loop)
        opened.append(store)
        return store

    yield open_
    for store in opened:
        store.close()


def _raw(url: str) -> Any:
    import redis

    return redis.Redis(host=HOST, port=PORT, db=0)


def _backend(url: str) -> RedisBackend:
    backend = open_backend(StoreURL.parse(url))
    backend.migrate()
    return backend


# -- (a) connections killed mid-commit --------------------------------------------------
def _kill_named(admin: Any, name: str, cmd: str | None = None) -> int:
    killed = 0
    for client in admin.client_list():
        if client.get("name") == name and (cmd is None or client.get("cmd") == cmd):
            killed += admin.client_kill_filter(_id=client["id"])
    return killed


def test_kill_after_the_write_is_transient_and_retry_is_duplicate(
    url: str, opener: Callable[..., Any]
) -> None:
    """The commit ran, then its connection died while waiting (WAIT): the outcome is
    unknown to the caller; retrying the same intent reports Duplicate, applied once."""
    name = f"fencing-kill-{uuid.uuid4().hex[:8]}"
    plain = opener(url)
    orders = plain.collection("orders")
    rec = orders.create("o-1", {"status": "new"})
    intent = rec.intent("ship")
    waiting = opener(f"{url}&wait_replicas=1&wait_timeout_ms=20000&client_name={name}")
    admin = _raw(url)
    killed: list[int] = []

    def killer() -> None:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and not killed:
            if _kill_named(admin, name, cmd="wait"):
                killed.append(1)
            time.sleep(0.005)

    thread = threading.Thread(target=killer)
    thread.start()
    with pytest.raises(TransientStoreError) as caught:
        waiting.collection("orders").commit(intent, {"status": "shipped"})
    thread.join()
    admin.close()
    import redis

    assert killed, "the connection was never seen waiting"
    assert isinstance(caught.value.__cause__, redis.ConnectionError)
    again = orders.commit(intent, {"status": "shipped"})
    assert isinstance(again, Duplicate)
    final = orders.get("o-1")
    assert (final.version, final.state["status"]) == (2, "shipped")


def test_wait_shortfall_is_transient_and_retry_is_duplicate(
    url: str, opener: Callable[..., Any]
) -> None:
    # This Redis has no replicas: WAIT 1 can never be satisfied.
    waiting = opener(f"{url}&wait_replicas=1&wait_timeout_ms=20")
    orders = waiting.collection("orders")
    with pytest.raises(TransientStoreError, match="replicas acknowledged"):
        orders.create("o-1", {"n": 0})
    plain = opener(url).collection("orders")
    rec = plain.get("o-1")
    assert rec is not None and rec.version == 1  # it is on the primary
    intent = rec.intent("inc")
    with pytest.raises(TransientStoreError, match="outcome is unknown"):
        orders.commit(intent, {"n": 1})
    assert isinstance(plain.commit(intent, {"n": 1}), Duplicate)
    assert plain.get("o-1").version == 2
    with pytest.raises(TransientStoreError):
        waiting.acquire("jobs/w", owner="a", ttl=5)


def test_random_kills_never_double_apply_or_lose(url: str, opener: Callable[..., Any]) -> None:
    """A killer drops the store's connections at random moments; every TransientStoreError
    is retried with the same intent. Each intent lands exactly once, none is lost."""
    name = f"fencing-kill-{uuid.uuid4().hex[:8]}"
    orders = opener(f"{url}&client_name={name}").collection("orders")
    setup = opener(url).collection("orders")
    setup.create("k", {"log": []})
    admin = _raw(url)
    stop = threading.Event()
    rng = random.Random(7)

    def killer() -> None:
        while not stop.is_set():
            _kill_named(admin, name)
            time.sleep(rng.uniform(0, 0.004))

    thread = threading.Thread(target=killer)
    thread.start()
    acked: list[str] = []
    transient = duplicates = 0
    try:
        for i in range(600):
            while True:
                try:
                    rec = orders.get("k")
                    break
                except TransientStoreError:
                    transient += 1
            intent = rec.intent("append")
            new = {"log": [*rec.state["log"], intent.id]}
            while True:
                try:
                    out = orders.commit(intent, new)
                    break
                except TransientStoreError:
                    transient += 1
            assert isinstance(out, Committed | Duplicate), out
            duplicates += isinstance(out, Duplicate)
            acked.append(intent.id)
            if transient >= 5 and duplicates >= 1 and i >= 40:
                break  # kills have landed before and after writes: enough
    finally:
        stop.set()
        thread.join()
        admin.close()
    assert transient >= 1, "no kill ever landed mid-command"
    final = setup.get("k")
    assert list(final.state["log"]) == acked
    assert final.version == 1 + len(acked)


# -- (b) threads and processes on one hot key, and the naive baseline -------------------
PAUSE = 0.002
THREADS, PROCESSES, OPS = 16, 4, 5


def _worker(url: str, mode: str, name: str) -> int:
    """OPS increments of one hot counter; returns how many were acknowledged."""
    prefix = StoreURL.parse(url).options["prefix"]
    if mode == "naive":
        client = _raw(url)
        try:
            for _ in range(OPS):
                n = int(client.get(f"{prefix}:naive"))
                time.sleep(PAUSE)  # the same decide time as the fenced run
                client.set(f"{prefix}:naive", n + 1)
        finally:
            client.close()
        return OPS

    def decide(record: Record) -> dict[str, int]:
        time.sleep(PAUSE)
        return {"n": record.state["n"] + 1}

    policy = Recompute(attempts=300, backoff=0.002, max_backoff=0.05)
    committed = 0
    with fencing.open(url) as store:
        orders = store.collection("orders")
        for op in range(OPS):
            intent = orders.intent("hot", "inc")
            if op % 2:
                with store.lease("orders/hot", owner=name, ttl=30, wait=120) as lease:
                    out = orders.apply(intent, decide, on_stale=policy, lease=lease)
            else:
                out = orders.apply(intent, decide, on_stale=policy)
            committed += out.committed
    return committed


def _run_everywhere(url: str, mode: str) -> int:
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(PROCESSES) as pool:
        procs = pool.starmap_async(_worker, [(url, mode, f"p{i}") for i in range(PROCESSES)])
        with ThreadPoolExecutor(THREADS) as threads:
            counts = list(threads.map(lambda i: _worker(url, mode, f"t{i}"), range(THREADS)))
        counts += procs.get(timeout=240)
    return sum(counts)


@pytest.mark.slow
def test_hot_key_threads_and_processes(url: str) -> None:
    prefix = StoreURL.parse(url).options["prefix"]
    with fencing.open(url) as store:
        store.collection("orders").create("hot", {"n": 0})
    committed = _run_everywhere(url, "fenced")
    with fencing.open(url) as store:
        final = store.collection("orders").get("hot")
        token = store.backend.lease_state("orders/hot").row.token
    assert final.version == 1 + committed
    assert final.state["n"] == committed
    assert committed > 0 and final.fence <= token

    raw = _raw(url)
    raw.set(f"{prefix}:naive", 0)
    done = _run_everywhere(url, "naive")
    naive = int(raw.get(f"{prefix}:naive"))
    raw.close()
    assert done == (THREADS + PROCESSES) * OPS
    assert naive < done, "the naive read-modify-write lost no update: the test proves nothing"


# -- (c) hash tags and Cluster slots ---------------------------------------------------
def test_record_applied_and_lease_share_a_slot() -> None:
    layout = Layout("fencing")
    keys = [
        layout.record(ORDERS, "o-1"),
        layout.applied(ORDERS, "o-1"),
        layout.fence(ORDERS, "o-1"),
        layout.lease("orders/o-1"),
    ]
    assert keys[0] == "fencing:c:orders:{orders/o-1}:rec"
    assert keys[1] == "fencing:c:orders:{orders/o-1}:applied"
    assert keys[3] == "fencing:lease:{orders/o-1}"
    assert len({key_slot(k) for k in keys}) == 1
    assert key_slot(keys[0]) == key_slot("orders/o-1")
    assert key_slot(layout.lease("orders/o-2")) != key_slot(keys[0])

    table = Target("table", "orders", "id", "version")
    tkeys = [
        layout.record(table, 42),
        layout.applied(table, 42),
        layout.fence(table, 42),
        layout.lease("orders:42"),
    ]
    assert tkeys[0] == "orders:42"  # the user's own hash
    assert len({key_slot(k) for k in tkeys}) == 1


def test_key_slot_is_redis_cluster_crc16() -> None:
    # The reference value of the Redis Cluster specification: CRC16("123456789") = 0x31C3.
    assert key_slot("123456789") == 0x31C3
    assert key_slot("{user1000}.following") == key_slot("{user1000}.followers")
    # the specification's examples: an empty tag hashes the whole key; the first {...} counts
    assert key_slot("foo{}{bar}") != key_slot("bar")
    assert key_slot("foo{{bar}}zap") == key_slot("{bar")
    assert key_slot("foo{bar}{zap}") == key_slot("bar")


def test_keys_never_collide_across_collections() -> None:
    layout = Layout("fencing")
    a = layout.record(Target("collection", "a"), "b/c")
    b = layout.record(Target("collection", "a/b"), "c")
    assert a != b


def _request(
    target: Target, key: str | int, lease: str | None, *, guard: dict[str, Any] | None = None
) -> CommitRequest:
    intent = Intent.new(target.name, key, 1, "t", guard=guard, kind=target.kind)
    ref = None if lease is None else LeaseRef(lease, 3)
    return CommitRequest(target, intent, {"n": 1}, '{"n":1}', ref)


def test_cluster_refuses_a_lease_in_another_slot_before_sending() -> None:
    cluster = Layout("fencing", cluster=True)
    ok = judge_call(cluster, _request(ORDERS, "o-1", "orders/o-1"), "commit")
    assert len({key_slot(k) for k in ok.keys}) == 1
    judge_call(cluster, _request(ORDERS, "o-1", None), "commit")  # unfenced: one slot
    with pytest.raises(fencing.InvalidInput, match="name the lease 'orders/o-1'"):
        judge_call(cluster, _request(ORDERS, "o-1", "jobs/x"), "commit")
    # the same request is fine on a single server
    judge_call(Layout("fencing"), _request(ORDERS, "o-1", "jobs/x"), "commit")
    table = Target("table", "orders", "id", "version")
    judge_call(cluster, _request(table, 42, "orders:42"), "commit")
    with pytest.raises(fencing.InvalidInput, match="'orders:42'"):
        judge_call(cluster, _request(table, 42, "orders/42"), "commit")
    spread = Call(SCRIPTS["commit"], ("{a}x", "{b}y"), ())
    with pytest.raises(fencing.InvalidInput):
        check_slots(spread)


def test_cluster_settings() -> None:
    settings = settings_from_url(StoreURL.parse("redis://h:7000?cluster=true"), {})
    assert settings.layout.cluster and (settings.host, settings.port) == ("h", 7000)
    with pytest.raises(fencing.ConfigurationError, match="wait_replicas"):
        settings_from_url(StoreURL.parse("redis://h?cluster=1&wait_replicas=1"), {})
    with pytest.raises(fencing.ConfigurationError, match="database 0"):
        settings_from_url(StoreURL.parse("redis://h/3?cluster=1"), {})


# -- (d) tokens only grow ----------------------------------------------------------------
def test_tokens_increase_across_reopen_and_expiry(url: str, opener: Callable[..., Any]) -> None:
    first = opener(url)
    expired = first.acquire("jobs/t", owner="a", ttl=0.05)
    first.close()
    time.sleep(0.1)  # let it expire, unreleased
    second = opener(url)
    taken = second.acquire("jobs/t", owner="b", ttl=5)
    assert taken.token > expired.token
    taken.release()
    second.close()
    third = opener(url)
    again = third.acquire("jobs/t", owner="c", ttl=5)
    assert again.token > taken.token
    raw = _raw(url)
    lease_key = Layout(StoreURL.parse(url).options["prefix"]).lease("jobs/t")
    assert raw.pttl(lease_key) == -1  # no TTL: the counter is never dropped
    raw.close()
    again.release()


# -- the scripts against judge() ---------------------------------------------------------
_ABSENT = object()
_STATE_VALUES = [1, 1.0, True, False, None, "1", 0, "x", [1], {"a": 1}, _ABSENT]
_GUARD_VALUES = [1, 1.0, True, False, None, "1", 0, "x", _ABSENT]


@st.composite
def _scenario(draw: st.DrawFn) -> dict[str, Any]:
    # Weighted towards the interesting cases: a record that exists, not yet applied, a
    # lease row whose token is the commit's (so expiry and ownership decide).
    guard = draw(st.sampled_from(_GUARD_VALUES))
    token = draw(st.sampled_from([None, 2, 2, 2, 2]))
    lease = None
    if draw(st.sampled_from([True, True, True, False])):
        held = draw(st.sampled_from([2, 2, 2, 1, 3]))
        lease = (held, draw(st.booleans()), draw(st.booleans()))  # token, owned, live
    return {
        "exists": draw(st.sampled_from([True, True, True, False])),
        "version": draw(st.integers(1, 2)),
        "expected": draw(st.sampled_from([None, 1, 2]))
        if guard is not _ABSENT
        else draw(st.integers(1, 2)),
        "fence": draw(st.sampled_from([0, 1, 2, 3])),
        "applied": draw(st.sampled_from([False, False, False, True])),
        "token": token,
        "lease": lease,
        "state": draw(st.sampled_from(_STATE_VALUES)),
        "guard": guard,
    }


def test_scripts_decide_as_judge(url: str) -> None:
    """Every status the commit and probe scripts decide is what judge() says about the
    same facts: missing, duplicate, fenced (newer / expired), stale (version, guard with
    JSON equality: true is not 1, 1 is 1.0)."""
    backend = _backend(url)
    layout, client = backend.layout, backend.client

    @given(_scenario())
    def check(sc: dict[str, Any]) -> None:
        key = uuid.uuid4().hex
        sec, usec = client.time()
        now_us = sec * 1_000_000 + usec
        guard = None if sc["guard"] is _ABSENT else {"g": sc["guard"]}
        intent = Intent.new("orders", key, sc["expected"], "t", guard=guard)
        state = {} if sc["state"] is _ABSENT else {"g": sc["state"]}
        lease_name = f"orders/{key}"
        record = None
        if sc["exists"]:
            record = Record("orders", key, sc["version"], sc["fence"], state)
            client.hset(
                layout.record(ORDERS, key),
                mapping={"v": sc["version"], "f": sc["fence"], "s": fencing_json(state)},
            )
        if sc["applied"]:
            client.zadd(layout.applied(ORDERS, key), {intent.root_id: now_us})
        row = None
        if sc["lease"] is not None:
            token, owned, live = sc["lease"]
            expires = now_us + (10_000_000 if live else -1_000_000)
            fields: dict[str, Any] = {"token": token, "exp": expires if owned else 0}
            if owned:
                fields["owner"] = "o"
            client.hset(layout.lease(lease_name), mapping=fields)
            row = LeaseRow(lease_name, "o" if owned else None, token, fields["exp"] / 1e6)
        ref = None if sc["token"] is None else LeaseRef(lease_name, sc["token"])
        expected = judge(record, sc["applied"], intent, ref, row, now_us / 1e6)
        request = CommitRequest(ORDERS, intent, {"g": "new"}, '{"g":"new"}', ref)
        probe = client.execute_command(*judge_call(layout, request, "probe").command())
        assert commit_result(request, probe).status is expected
        assert judge_reply(request, probe) is expected
        done = backend.commit(request)
        assert done.status is (Status.APPLIED if expected is Status.OK else expected)
        after = backend.read(ORDERS, key)
        if record is None:
            assert after is None
        else:
            assert after is not None
            applied = done.status is Status.APPLIED
            assert after.version == record.version + applied
            if applied and ref is not None:
                assert done.record is not None and done.record.fence == max(record.fence, ref.token)

    try:
        check()
    finally:
        backend.close()


def fencing_json(state: dict[str, Any]) -> str:
    from fencing._validate import dump_state

    return dump_state(state)


@pytest.mark.parametrize(
    ("stored", "guard", "holds"),
    [
        ("10", 10, True),
        ("10", "10", True),
        ("10", 10.0, False),  # text: repr(10.0) is "10.0"
        ("true", True, True),
        ("1", True, False),
        (None, None, True),  # None: the field is absent
        ("", None, False),
        ("x", "y", False),
    ],
)
def test_table_guards_compare_text(
    url: str, stored: str | None, guard: object, holds: bool
) -> None:
    backend = _backend(url)
    try:
        backend.declare_table("items", key="id", version=None, columns=["status", "g"])
        fields = {"status": "a"} if stored is None else {"status": "a", "g": stored}
        backend.client.hset(backend.layout.row("items", 5), mapping=fields)
        target = Target("table", "items", "id", None)
        intent = Intent.new("items", 5, None, "t", guard={"g": guard}, kind="table")
        request = CommitRequest(target, intent, {"status": "b"}, '{"status":"b"}')
        result = backend.commit(request)
        assert result.status is (Status.APPLIED if holds else Status.STALE)
    finally:
        backend.close()


# -- other behaviour -------------------------------------------------------------------
def test_commit_many_is_one_round_trip(url: str) -> None:
    backend = _backend(url)
    sends: list[int] = []
    step = backend._run

    def counting(s: Any) -> object:
        if isinstance(s, Send):
            sends.append(len(s.commands))
        return step(s)

    backend._run = counting  # type: ignore[method-assign]
    try:
        for i in range(30):
            backend.create(ORDERS, f"k{i}", '{"n":0}')
        sends.clear()
        requests = [
            CommitRequest(ORDERS, Intent.new("orders", f"k{i}", 1, "t"), {"n": 1}, '{"n":1}')
            for i in range(30)
        ]
        results = backend.commit_many(requests)
        assert sends == [30]
        assert all(r.status is Status.APPLIED for r in results)
    finally:
        backend.close()


def test_lost_script_cache_is_reloaded(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """NOSCRIPT (a restarted server) loads the scripts and re-sends: single and batch.
    A script variant nobody loaded stands in for a flushed cache (SCRIPT FLUSH would
    disturb everyone else using this server)."""
    backend = _backend(url)
    try:
        backend.create(ORDERS, "a", '{"n":0}')
        original = SCRIPTS["commit"]
        text = f"{original.text}\n-- {uuid.uuid4().hex}"
        import hashlib

        variant = Script("commit", text, hashlib.sha1(text.encode()).hexdigest())
        assert not backend.client.script_exists(variant.sha)[0]
        monkeypatch.setitem(SCRIPTS, "commit", variant)
        one = CommitRequest(ORDERS, Intent.new("orders", "a", 1, "t"), {"n": 1}, '{"n":1}')
        assert backend.commit(one).status is Status.APPLIED
        text2 = f"{original.text}\n-- {uuid.uuid4().hex}"
        variant2 = Script("commit", text2, hashlib.sha1(text2.encode()).hexdigest())
        monkeypatch.setitem(SCRIPTS, "commit", variant2)
        two = CommitRequest(ORDERS, Intent.new("orders", "a", 2, "t"), {"n": 2}, '{"n":2}')
        results = backend.commit_many([one, two])
        assert [r.status for r in results] == [Status.DUPLICATE, Status.APPLIED]
    finally:
        backend.close()


def test_prune_forgets_old_intents(url: str, opener: Callable[..., Any]) -> None:
    store = opener(url)
    orders = store.collection("orders")
    rec = orders.create("o-1", {"n": 0})
    first = rec.intent("a")
    assert orders.commit(first, {"n": 1}).committed
    assert store.prune(3600) == 0
    assert isinstance(orders.commit(first, {"n": 1}), Duplicate)
    time.sleep(0.01)
    assert store.prune(0.001) == 1
    assert isinstance(orders.commit(first, {"n": 1}), fencing.Stale)  # version moved on


def test_newer_schema_is_refused(url: str) -> None:
    raw = _raw(url)
    raw.set(f"{StoreURL.parse(url).options['prefix']}:schema", 99)
    raw.close()
    with pytest.raises(fencing.SchemaError, match="newer"):
        fencing.open(url)


def test_evicting_server_is_refused_unless_allowed() -> None:
    """The migrate flow is pure: fed INFO replies of an allkeys-lru server, it refuses."""
    settings = settings_from_url(StoreURL.parse("redis://h"), {})
    flow = RedisFlows(settings).migrate()
    assert next(flow) == Each((("INFO", "server"), ("INFO", "memory")))
    with pytest.raises(fencing.ConfigurationError, match="allkeys-lru"):
        flow.send([[{"redis_version": "7.2.4"}, {"maxmemory_policy": "allkeys-lru"}]])
    old = RedisFlows(settings).migrate()
    next(old)
    with pytest.raises(fencing.ConfigurationError, match=r"Redis 7\.0 or newer"):
        old.send([[{"redis_version": "6.2.0"}, {"maxmemory_policy": "noeviction"}]])
    # a Cluster answers per primary: one evicting node is enough to refuse
    many = RedisFlows(settings).migrate()
    next(many)
    with pytest.raises(fencing.ConfigurationError, match="allkeys-lru"):
        many.send(
            [
                [{"redis_version": "7.2.4"}, {"maxmemory_policy": "noeviction"}],
                [{"redis_version": "7.2.4"}, {"maxmemory_policy": "allkeys-lru"}],
            ]
        )
    allowed = settings_from_url(StoreURL.parse("redis://h?allow_eviction=true"), {})
    flow = RedisFlows(allowed).migrate()
    next(flow)
    step = flow.send([[{"redis_version": "7.2.4"}, {"maxmemory_policy": "allkeys-lru"}]])
    assert isinstance(step, Send)  # goes on to the schema key


def test_big_integer_guard_refused_before_sending(url: str, opener: Callable[..., Any]) -> None:
    orders = opener(url).collection("orders")
    rec = orders.create("o-1", {"n": 2**60})
    with pytest.raises(fencing.InvalidState, match="2\\*\\*53"):
        orders.commit(rec.intent("x", guard={"n": 2**60}), {"n": 0})
    assert orders.get("o-1").version == 1


def test_missing_driver_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "redis", None)
    with pytest.raises(fencing.MissingDependency, match=r"fencing\[redis\]"):
        fencing.open("redis://127.0.0.1:6379/0")
    with pytest.raises(fencing.MissingDependency, match=r"fencing\[redis\]"):
        asyncio.run(fencing.open_async("redis://127.0.0.1:6379/0"))


def test_url_options_are_checked() -> None:
    def parse(u: str, **options: Any) -> Any:
        return settings_from_url(StoreURL.parse(u), dict(options))

    s = parse("redis://user:p%40ss@h:6380/2?prefix=app&wait_replicas=2&wait_timeout_ms=50")
    assert (s.host, s.port, s.db, s.username, s.password) == ("h", 6380, 2, "user", "p@ss")
    assert (s.layout.prefix, s.wait_replicas, s.wait) == ("app", 2, ("WAIT", 2, 50))
    assert parse("rediss://h").ssl
    assert "p@ss" not in repr(s)
    assert parse("redis://h", prefix="other").layout.prefix == "other"
    for bad in (
        "redis://h?nope=1",
        "redis://h?prefix=a{b}",
        "redis://h?prefix=a*",
        "redis://h?table_prefix=x y",
        "redis://h/abc",
        "redis://h?wait_replicas=-1",
        "redis://h?socket_timeout=soon",
        "redis://h?cluster=maybe",
    ):
        with pytest.raises(fencing.ConfigurationError):
            parse(bad)
    with pytest.raises(fencing.ConfigurationError, match="bad client option"):
        fencing.open("redis://127.0.0.1?prefix=x", migrate=False, no_such_redis_option=1)


def test_unreachable_server_is_transient() -> None:
    with pytest.raises(TransientStoreError):
        fencing.open("redis://127.0.0.1:1?connect_timeout=0.5")


# -- effects -------------------------------------------------------------------------------
def _effect_keys(url: str) -> list[bytes]:
    prefix = StoreURL.parse(url).options["prefix"]
    raw = _raw(url)
    try:
        return sorted(raw.scan_iter(match=f"{prefix}:fx:*", count=1000))
    finally:
        raw.close()


def test_effect_keys_share_one_slot_under_the_prefix() -> None:
    layout = Layout("app:one")
    keys = [
        layout.effect_rows,
        layout.effects_open,
        layout.effect_intent("c:orders", "i-1"),
        layout.effect_intent("t:a:b", "c:d~2"),
    ]
    assert keys[0] == "app:one:fx:{app:one}:rows"
    assert keys[1] == "app:one:fx:{app:one}:open"
    assert all(k.startswith("app:one:fx:{app:one}:intent:") for k in keys[2:])
    assert len({key_slot(k) for k in keys}) == 1
    assert key_slot(keys[0]) == key_slot("app:one")
    # a scope and an intent id that both hold ':' never share an intent's index
    assert layout.effect_intent("c:a:b", "c") != layout.effect_intent("c:a", "b:c")
    # prune scans P:*:applied: an effects key never ends so
    assert not any(k.endswith(":applied") for k in keys)
    assert key_slot(Layout("app:two").effect_rows) != key_slot(keys[0])


def test_store_from_before_effects_gains_them_on_migrate(
    url: str, opener: Callable[..., Any]
) -> None:
    """A store of the previous release (schema 1, no effects keys) is raised to schema 2
    by migrate, keeps its records, and records, settles and lists effects."""
    prefix = StoreURL.parse(url).options["prefix"]
    first = opener(url)
    orders = first.collection("orders")
    orders.create("o-1", {"status": "new"})
    late = orders.intent("o-1", "charge")
    first.close()
    raw = _raw(url)
    try:
        fx_keys = _effect_keys(url)
        if fx_keys:
            raw.unlink(*fx_keys)
        raw.set(f"{prefix}:schema", 1)
        store = opener(url)  # migrates
        assert raw.get(f"{prefix}:schema") == b"2"
    finally:
        raw.close()
    orders = store.collection("orders")
    assert orders.get("o-1").state == {"status": "new"}
    fx = orders.effect(late, "charge", detail={"amount": 10})
    assert orders.effect(late, "charge") == fx
    assert orders.commit(orders.intent("o-1", "cancel"), {"status": "cancelled"}).committed
    assert isinstance(orders.commit(late, {"status": "charged"}), fencing.Stale)
    (listed,) = store.effects_to_reconcile()
    assert (listed.idempotency_key, listed.outcome) == (fx.idempotency_key, "stale")
    # migrating again changes nothing
    opener(url)
    raw = _raw(url)
    assert raw.get(f"{prefix}:schema") == b"2"
    raw.close()
    assert store.effects_to_reconcile() == [listed]


def _record_in_process(url: str, intent: Intent, barrier: Any, results: Any) -> None:
    with fencing.open(url) as store:
        barrier.wait(timeout=60)
        fx = store.collection("orders").effect(intent, "charge", detail={"pid": os.getpid()})
        results.put((fx.idempotency_key, fx.recorded_at, fx.detail))


def test_processes_recording_one_effect_make_one_row(url: str) -> None:
    """4 processes record the same effect at the same moment: one row, and every one of
    them gets that row back (same recorded_at, the winner's detail)."""
    with fencing.open(url) as store:
        orders = store.collection("orders")
        orders.create("o-1", {"n": 0})
        intent = orders.intent("o-1", "charge")
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(4)
    results = ctx.Queue()
    procs = [
        ctx.Process(target=_record_in_process, args=(url, intent, barrier, results))
        for _ in range(4)
    ]
    for p in procs:
        p.start()
    got = [results.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert len(set(map(repr, got))) == 1, got
    key, recorded_at, detail = got[0]
    assert detail["pid"] in {p.pid for p in procs}
    raw = _raw(url)
    layout = Layout(StoreURL.parse(url).options["prefix"])
    try:
        assert raw.hlen(layout.effect_rows) == 1
        assert raw.zcard(layout.effect_intent("c:orders", intent.root_id)) == 1
    finally:
        raw.close()
    with fencing.open(url) as store:
        (fx,) = store.collection("orders").effects(intent)
        assert (fx.idempotency_key, fx.recorded_at) == (key, recorded_at)


def test_prune_keeps_effects_and_settle_loses_none(url: str, opener: Callable[..., Any]) -> None:
    """prune forgets applied ids only: an unsettled effect is still there to settle after
    it, and a settled one stays listed until reconciled."""
    store = opener(url)
    orders = store.collection("orders")
    orders.create("o-1", {"n": 0})
    orders.create("o-2", {"n": 0})
    settled_first = orders.intent("o-1", "a")
    settled_later = orders.intent("o-2", "b")
    one = orders.effect(settled_first, "charge")
    two = orders.effect(settled_later, "charge")
    orders.commit(orders.intent("o-1", "move"), {"n": 1})
    orders.commit(orders.intent("o-2", "move"), {"n": 1})
    assert isinstance(orders.commit(settled_first, {"n": 2}), fencing.Stale)
    time.sleep(0.01)
    assert store.prune(0.001) == 2  # the two "move" ids
    assert [e.idempotency_key for e in store.effects_to_reconcile()] == [one.idempotency_key]
    assert isinstance(orders.commit(settled_later, {"n": 2}), fencing.Stale)
    listed = store.effects_to_reconcile()
    assert [(e.idempotency_key, e.outcome) for e in listed] == [
        (one.idempotency_key, "stale"),
        (two.idempotency_key, "stale"),
    ]
    assert listed[1].updated_at >= listed[1].recorded_at == two.recorded_at


def test_effects_keep_text_exactly(url: str, opener: Callable[..., Any]) -> None:
    """Rows go through Lua's cjson: non-ASCII, escapes, slashes, big and float numbers in
    detail and keys come back as given (the detail is text to cjson); times are the
    server's clock in seconds."""
    store = opener(url)
    orders = store.collection("orders")
    key = 'ü/✓ "q" \\ 𝄞'
    orders.create(key, {"n": 0})
    detail = {"text": 'Zoë\n\t/\\"✓\u2028', "big": 2**62, "f": 0.1, "none": None, "l": [1, []]}
    intent = orders.intent(key, "charge")
    fx = orders.effect(intent, "charge", detail=detail)
    assert (fx.key, fx.detail) == (key, detail)
    assert abs(fx.recorded_at - time.time()) < 600  # epoch seconds, not microseconds
    done = orders.effect_done(fx, detail={"ref": "ch_/1"})
    assert done.detail == {"ref": "ch_/1"} and done.recorded_at == fx.recorded_at
    assert store.get_effect(fx.idempotency_key) == done


def test_effect_writes_wait_for_replicas(url: str, opener: Callable[..., Any]) -> None:
    """With wait_replicas, an effect write that too few replicas acknowledged is
    TransientStoreError; it is on the primary, and a retry gets the same row."""
    plain = opener(url)
    orders = plain.collection("orders")
    orders.create("o-1", {"n": 0})
    intent = orders.intent("o-1", "charge")
    waiting = opener(f"{url}&wait_replicas=1&wait_timeout_ms=20").collection("orders")
    with pytest.raises(TransientStoreError, match="replicas acknowledged"):
        waiting.effect(intent, "charge", detail={"try": 1})
    fx = orders.effect(intent, "charge", detail={"try": 2})
    assert fx.detail == {"try": 1}  # the first recording won
    with pytest.raises(TransientStoreError, match="replicas acknowledged"):
        waiting.effect_done(fx)
    assert plain.get_effect(fx.idempotency_key).status == "done"
    assert waiting.effects(intent) == [plain.get_effect(fx.idempotency_key)]  # reads: no WAIT


# -- Redis Cluster (a real one: scripts/redis-cluster.sh start) --------------------------------
@pytest.fixture
def curl() -> Iterator[str]:
    """A fresh prefix on the test Redis Cluster."""
    require_server("Redis Cluster", HOST, CLUSTER_PORT)
    u = cluster_url()
    yield u
    cluster_cleanup(u)


def _nodes() -> dict[int, Any]:
    """A plain client per primary of the test Cluster, by port."""
    import redis

    seed = redis.Redis(host=HOST, port=CLUSTER_PORT)
    try:
        ports = sorted({int(shard[2][1]) for shard in seed.execute_command("CLUSTER SLOTS")})
    finally:
        seed.close()
    return {port: redis.Redis(host=HOST, port=port) for port in ports}


def _owner(nodes: dict[int, Any], slot: int) -> int:
    """The port of the primary serving ``slot``."""
    for shard in next(iter(nodes.values())).execute_command("CLUSTER SLOTS"):
        if shard[0] <= slot <= shard[1]:
            return int(shard[2][1])
    raise AssertionError(f"slot {slot} is not served")


def _keys_on_every_node(nodes: dict[int, Any], count: int) -> list[str]:
    """``count`` record keys of collection ``orders`` spread over every primary."""
    by_node: dict[int, list[str]] = {port: [] for port in nodes}
    i = 0
    while any(len(keys) < count for keys in by_node.values()):
        key = f"o-{i}"
        port = _owner(nodes, key_slot(f"orders/{key}"))
        if len(by_node[port]) < count:
            by_node[port].append(key)
        i += 1
    return [key for keys in by_node.values() for key in keys]


def _close_all(nodes: dict[int, Any]) -> None:
    for node in nodes.values():
        node.close()


def test_cluster_keys_of_one_record_share_the_slot_the_server_computes(curl: str) -> None:
    prefix = StoreURL.parse(curl).options["prefix"]
    store = fencing.open(curl)
    nodes = _nodes()
    try:
        orders = store.collection("orders")
        orders.create("o-1", {"n": 0})
        lease = store.acquire("orders/o-1", owner="a", ttl=30)
        assert orders.commit(orders.intent("o-1", "a"), {"n": 1}, lease=lease).committed
        assert orders.delete("o-1")
        orders.create("o-1", {"n": 5})  # a tombstone now sits next to the record
        written: list[str] = []
        for node in nodes.values():
            written += [k.decode() for k in node.scan_iter(match=f"{prefix}:*", count=1000)]
        mine = [k for k in written if "{orders/o-1}" in k]
        lease_key = f"{prefix}:lease:{{orders/o-1}}"
        assert lease_key in mine
        assert {k.rsplit(":", 1)[1] for k in mine if k != lease_key} == {"rec", "applied", "tomb"}
        seed = nodes[CLUSTER_PORT]
        slots = {int(seed.execute_command("CLUSTER KEYSLOT", k)) for k in mine}
        assert slots == {int(seed.execute_command("CLUSTER KEYSLOT", "orders/o-1"))}
        # fencing's own slot function agrees with the server on every key it wrote
        for key in written:
            assert key_slot(key) == int(seed.execute_command("CLUSTER KEYSLOT", key)), key
        # and each key lives on the node that serves its slot
        for port, node in nodes.items():
            for key in node.scan_iter(match=f"{prefix}:*", count=1000):
                assert _owner(nodes, key_slot(key.decode())) == port
    finally:
        _close_all(nodes)
        store.close()


def test_cluster_refuses_a_fenced_commit_whose_lease_is_in_another_slot(
    curl: str, opener: Callable[..., Any]
) -> None:
    store = opener(curl)
    orders = store.collection("orders")
    orders.create("o-1", {"n": 0})
    elsewhere = store.acquire("jobs/x", owner="a", ttl=30)
    assert key_slot("jobs/x") != key_slot("orders/o-1")
    intent = orders.intent("o-1", "a")
    with pytest.raises(fencing.InvalidInput, match="name the lease 'orders/o-1'"):
        orders.commit(intent, {"n": 1}, lease=elsewhere)
    with pytest.raises(fencing.InvalidInput, match="share a hash slot"):
        orders.commit_many([(intent, {"n": 1})], lease=elsewhere)
    # nothing was written: the same intent commits under a lease named after the record
    assert orders.get("o-1").version == 1
    mine = store.acquire("orders/o-1", owner="a", ttl=30)
    out = orders.commit(intent, {"n": 1}, lease=mine)
    assert out.committed and out.record.fence == mine.token
    # an unfenced commit needs no lease at all
    assert orders.commit(orders.intent("o-1", "b"), {"n": 2}).committed


def test_cluster_fenced_table_commit_under_a_lease_named_after_the_row(
    curl: str, opener: Callable[..., Any]
) -> None:
    from .backends_redis import _create_table

    store = opener(curl)
    target = store.unwrapped if isinstance(store, Syncified) else store
    _create_table(target, "orders_t", "id", "version", TABLE_COLUMNS, [{"id": 1, "status": "a"}])
    table = store.table("orders_t")
    row_lease = f"{StoreURL.parse(curl).options['table_prefix']}orders_t:1"
    with pytest.raises(fencing.InvalidInput, match=f"name the lease {row_lease!r}"):
        table.commit(
            table.intent(1, "x"), {"status": "b"}, lease=store.acquire("t/1", owner="a", ttl=5)
        )
    lease = store.acquire(row_lease, owner="a", ttl=5)
    out = table.commit(table.intent(1, "x"), {"status": "b"}, lease=lease)
    assert out.committed and out.record.fence == lease.token
    lease.release()
    out = table.commit(table.intent(1, "y"), {"status": "c"}, lease=lease)
    assert isinstance(out, fencing.Fenced) and out.reason is fencing.FenceReason.EXPIRED
    assert table.get(1).state["status"] == "b"


def test_cluster_commit_many_prune_and_effects_span_every_node(
    curl: str, opener: Callable[..., Any]
) -> None:
    nodes = _nodes()
    try:
        keys = _keys_on_every_node(nodes, 3)
    finally:
        _close_all(nodes)
    store = opener(curl)
    orders = store.collection("orders")
    for key in keys:
        orders.create(key, {"n": 0})
    late = [orders.intent(key, "late") for key in keys]
    effects = [orders.effect(intent, "charge") for intent in late]
    batch = [(orders.intent(key, "inc"), {"n": 1}) for key in keys]
    assert all(out.committed for out in orders.commit_many(batch))
    assert all(isinstance(out, Duplicate) for out in orders.commit_many(batch))
    assert [orders.get(key).state for key in keys] == [{"n": 1}] * len(keys)
    stale = orders.commit_many([(intent, {"n": 2}) for intent in late])
    assert all(isinstance(out, fencing.Stale) for out in stale)
    # the late intents' effects, keyed by records on every node, are listed from one slot
    listed = store.effects_to_reconcile(limit=100)
    assert sorted(e.idempotency_key for e in listed) == sorted(e.idempotency_key for e in effects)
    assert {e.outcome for e in listed} == {"stale"}
    time.sleep(0.01)
    # the backend's prune of applied ids (Store.prune adds the effects' own pruning)
    backend = store.backend
    if isinstance(store, Syncified):
        backend = Syncified(store.unwrapped.backend, store._loop)
    assert backend.prune(0.001) == len(keys)  # the applied "inc" ids, on every node
    assert backend.prune(0.001) == 0
    assert len(store.effects_to_reconcile(limit=100)) == len(keys)  # prune keeps effects


def test_cluster_scripts_are_reloaded_on_every_primary(
    curl: str, opener: Callable[..., Any]
) -> None:
    """A primary that lost its scripts (a promoted replica: Redis 7 does not replicate the
    script cache) answers NOSCRIPT: the scripts are loaded on every primary, the call sent
    again. This is our own Cluster: SCRIPT FLUSH disturbs no one else."""
    nodes = _nodes()
    try:
        keys = _keys_on_every_node(nodes, 2)
        store = opener(curl)
        orders = store.collection("orders")
        for key in keys:
            orders.create(key, {"n": 0})
        for node in nodes.values():
            node.script_flush()
        assert orders.commit(orders.intent(keys[0], "one"), {"n": 1}).committed
        for node in nodes.values():
            assert node.script_exists(SCRIPTS["commit"].sha) == [True]
            node.script_flush()
        batch = [(orders.intent(key, "many"), {"n": 2}) for key in keys]
        assert all(out.committed for out in orders.commit_many(batch))
        for node in nodes.values():
            node.script_flush()
        assert store.acquire("orders/x", owner="a", ttl=30).token == 1
        for node in nodes.values():
            assert node.script_exists(SCRIPTS["acquire"].sha) == [True]
    finally:
        _close_all(nodes)


def _move_slot(nodes: dict[int, Any], slot: int, source: int, target: int) -> None:
    """Move one slot and its keys between primaries, as redis-cli --cluster reshard does."""
    src, dst = nodes[source], nodes[target]
    src_id, dst_id = src.execute_command("CLUSTER MYID"), dst.execute_command("CLUSTER MYID")
    dst.execute_command("CLUSTER SETSLOT", slot, "IMPORTING", src_id)
    src.execute_command("CLUSTER SETSLOT", slot, "MIGRATING", dst_id)
    while keys := src.execute_command("CLUSTER GETKEYSINSLOT", slot, 100):
        src.execute_command("MIGRATE", HOST, target, "", 0, 5000, "KEYS", *keys)
    for node in (dst, src, *nodes.values()):
        node.execute_command("CLUSTER SETSLOT", slot, "NODE", dst_id)


def test_cluster_follows_a_moved_slot_to_a_node_without_scripts(
    curl: str, opener: Callable[..., Any]
) -> None:
    """A store keeps its slot map; the record's slot is moved to another primary that
    never loaded the scripts: the commit follows MOVED, reloads the scripts, lands once."""
    store = opener(curl)
    orders = store.collection("orders")
    orders.create("o-1", {"n": 0})
    assert orders.commit(orders.intent("o-1", "before"), {"n": 1}).committed
    nodes = _nodes()
    slot = key_slot("orders/o-1")
    source = _owner(nodes, slot)
    target = next(port for port in nodes if port != source)
    try:
        _move_slot(nodes, slot, source, target)
        nodes[target].script_flush()
        intent = orders.intent("o-1", "after")
        assert orders.commit(intent, {"n": 2}).committed
        assert isinstance(orders.commit(intent, {"n": 2}), Duplicate)
        batch = [(orders.intent("o-1", "batch"), {"n": 3})]
        assert orders.commit_many(batch)[0].committed
        record = orders.get("o-1")
        assert (record.version, record.state) == (4, {"n": 3})
        assert _owner(nodes, slot) == target
    finally:
        _move_slot(nodes, slot, target, source)
        _close_all(nodes)
    assert orders.get("o-1").version == 4


def _myid(node: Any) -> Any:
    return node.execute_command("CLUSTER MYID")


@pytest.mark.parametrize("redirect", ["moved", "ask"])
def test_cluster_batch_item_redirected_is_sent_again_alone_and_lands_once(
    curl: str, opener: Callable[..., Any], redirect: str
) -> None:
    """A batch (one pipeline per node, ``pipeline.send_once`` on the sync driver) whose
    first item's slot moved to a primary without the scripts (MOVED): that item, refused
    without running, is sent again alone, follows the redirection, has the scripts
    reloaded (NOSCRIPT), and both items land once. Half-way through a move (ASK, then
    TRYAGAIN: the script's keys are not all on one side) the item cannot run:
    ``TransientStoreError``, and the retry after the move lands it, once."""
    nodes = _nodes()
    slot = key_slot("orders/o-1")
    source = _owner(nodes, slot)
    target = next(port for port in nodes if port != source)
    other = next(  # a record served by a third primary
        f"o-{i}"
        for i in range(2, 1000)
        if _owner(nodes, key_slot(f"orders/o-{i}")) not in (source, target)
    )
    store = opener(curl)
    orders = store.collection("orders")
    try:
        for key in ("o-1", other):
            orders.create(key, {"n": 0})
        batch = [(orders.intent(key, "batch"), {"n": 1}) for key in ("o-1", other)]
        if redirect == "moved":
            _move_slot(nodes, slot, source, target)
            nodes[target].script_flush()
            assert [out.committed for out in orders.commit_many(batch)] == [True, True]
        else:  # half-way: the record is on the target, the slot still the source's
            src, dst = nodes[source], nodes[target]
            dst.execute_command("CLUSTER SETSLOT", slot, "IMPORTING", _myid(src))
            src.execute_command("CLUSTER SETSLOT", slot, "MIGRATING", _myid(dst))
            keys = src.execute_command("CLUSTER GETKEYSINSLOT", slot, 100)
            src.execute_command("MIGRATE", HOST, target, "", 0, 5000, "KEYS", *keys)
            nodes[target].script_flush()
            with pytest.raises(TransientStoreError):
                orders.commit_many(batch)
            _move_slot(nodes, slot, source, target)  # the move ends
            outcomes = orders.commit_many(batch)
            assert [type(out) for out in outcomes] == [Committed, Duplicate]
        again = orders.commit_many(batch)
        assert [type(out) for out in again] == [Duplicate, Duplicate]
        assert [out.record.version for out in again] == [2, 2]
        assert _owner(nodes, slot) == target
    finally:
        _move_slot(nodes, slot, target, source)
        _close_all(nodes)
    assert [orders.get(key).state for key in ("o-1", other)] == [{"n": 1}] * 2


def test_cluster_lost_connection_is_transient_never_resent(
    curl: str, opener: Callable[..., Any]
) -> None:
    """redis-py's Cluster client re-sends a command after a lost connection by default;
    fencing turns that off: an acquire whose connection dies while the node is paused is
    TransientStoreError, and it never ran (a re-send would have granted the lease and
    answered the caller "held")."""
    name = f"fencing-kill-{uuid.uuid4().hex[:8]}"
    store = opener(f"{curl}&client_name={name}")
    nodes = _nodes()
    node = nodes[_owner(nodes, key_slot("orders/o-1"))]
    killed: list[int] = []

    def killer() -> None:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and not killed:
            for client in node.client_list():
                # flag b: held by the pause, with its command read but not run
                if client.get("name") == name and "b" in client.get("flags", ""):
                    killed.append(node.client_kill_filter(_id=client["id"]))
            time.sleep(0.005)
        node.execute_command("CLIENT UNPAUSE")

    node.execute_command("CLIENT PAUSE", 20000, "WRITE")
    thread = threading.Thread(target=killer)
    thread.start()
    try:
        with pytest.raises(TransientStoreError):
            store.acquire("orders/o-1", owner="a", ttl=30)
    finally:
        thread.join()
        node.execute_command("CLIENT UNPAUSE")
        _close_all(nodes)
    assert killed, "the acquire was never seen waiting"
    lease = store.try_acquire("orders/o-1", owner="b", ttl=30)
    assert lease is not None and lease.token == 1  # the lost acquire never ran


def test_cluster_batch_item_redirected_then_lost_is_transient_never_resent(
    curl: str, opener: Callable[..., Any]
) -> None:
    """A batch item refused with MOVED (its slot moved meanwhile) is sent again alone to
    the slot's new primary; that connection dies while the node is paused, before the
    commit ran: ``TransientStoreError``, and the commit never runs. (The asyncio Cluster
    pipeline followed the redirection with a client call that retries after a lost
    connection: it sent the commit again, which then ran.)"""
    name = f"fencing-kill-{uuid.uuid4().hex[:8]}"
    store = opener(f"{curl}&client_name={name}")
    orders = store.collection("orders")
    nodes = _nodes()
    slot = key_slot("orders/o-1")
    source = _owner(nodes, slot)
    other = next(  # a record on another primary
        f"o-{i}" for i in range(2, 1000) if _owner(nodes, key_slot(f"orders/o-{i}")) != source
    )
    third = _owner(nodes, key_slot(f"orders/{other}"))
    target = next(port for port in nodes if port not in (source, third))  # holds none of it
    killed: list[int] = []

    def killer() -> None:
        node = nodes[target]
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and not killed:
            for client in node.client_list():
                # flag b: held by the pause, with its command read but not run
                if client.get("name") == name and "b" in client.get("flags", ""):
                    killed.append(node.client_kill_filter(_id=client["id"]))
            time.sleep(0.005)
        node.execute_command("CLIENT UNPAUSE")

    try:
        for key in ("o-1", other):
            orders.create(key, {"n": 0})
        batch = [(orders.intent(key, "batch"), {"n": 1}) for key in ("o-1", other)]
        _move_slot(nodes, slot, source, target)
        nodes[target].execute_command("CLIENT PAUSE", 20000, "WRITE")
        thread = threading.Thread(target=killer)
        thread.start()
        try:
            with pytest.raises(TransientStoreError):
                orders.commit_many(batch)
        finally:
            thread.join()
            nodes[target].execute_command("CLIENT UNPAUSE")
        assert killed, "the redirected commit was never seen waiting"
        time.sleep(0.2)  # a commit sent again would have run by now
        assert orders.get("o-1").version == 1  # the lost commit never ran
        assert orders.get(other).version == 2
        retried = orders.commit_many(batch)
        assert [type(out) for out in retried] == [Committed, Duplicate]
    finally:
        _move_slot(nodes, slot, target, source)
        _close_all(nodes)


def test_cluster_migrate_checks_every_primary(curl: str) -> None:
    nodes = _nodes()
    last = nodes[max(nodes)]
    (policy,) = last.config_get("maxmemory-policy").values()
    try:
        last.config_set("maxmemory-policy", "allkeys-lru")
        with pytest.raises(fencing.ConfigurationError, match="allkeys-lru"):
            fencing.open(curl)
        fencing.open(f"{curl}&allow_eviction=true").close()
    finally:
        last.config_set("maxmemory-policy", policy)
        _close_all(nodes)


def _create_everywhere(url: str) -> None:
    with fencing.open(url) as store:  # the schema key may be on the node of the URL
        for i in range(20):  # some of these are on the other nodes
            store.collection("orders").create(f"o-{i}", {})


def test_cluster_wrong_mode_is_a_configuration_error() -> None:
    require_server("Redis Cluster", HOST, CLUSTER_PORT)
    require_server("Redis", HOST, PORT)
    with pytest.raises(fencing.ConfigurationError, match="not a Redis Cluster"):
        fencing.open(f"redis://{HOST}:{PORT}/0?cluster=true&prefix=fencing-test-unused")
    url = cluster_url().replace("cluster=true&", "")
    try:
        with pytest.raises(fencing.ConfigurationError, match="add cluster=true"):
            _create_everywhere(url)
    finally:
        cluster_cleanup(url.replace("?", "?cluster=true&"))
    with pytest.raises(TransientStoreError):
        fencing.open(f"redis://{HOST}:1/0?cluster=true&connect_timeout=0.5")


def test_cluster_async_store_reconnects_after_every_primary_dropped_it(curl: str) -> None:
    """redis-py's asyncio Cluster client forgets a node on each connection error; after
    connections to every primary dropped at once it had none left, and every later call
    failed with ``StoreError`` ("cannot be connected ... None") for good. Now the calls
    that lost their connection have an unknown outcome, and the store works again."""
    name = "fencing-drop-" + uuid.uuid4().hex[:8]
    url = f"{curl}&client_name={name}"
    nodes = _nodes()
    keys = _keys_on_every_node(nodes, 1)

    async def main() -> list[Any]:
        store = await fencing.open_async(url)
        try:
            orders = store.collection("orders")
            for key in keys:
                await orders.create(key, {"n": 0})
            for node in nodes.values():  # drop every connection the store has
                for client in node.client_list():
                    if client.get("name") == name:
                        node.client_kill_filter(_id=client["id"])
            lost = await asyncio.gather(*(orders.get(k) for k in keys), return_exceptions=True)
            assert all(isinstance(e, fencing.TransientStoreError) for e in lost), lost
            return [await orders.get(k) for k in keys]
        finally:
            await store.close()

    try:
        records = asyncio.run(main())
    finally:
        _close_all(nodes)
    assert [r.version for r in records] == [1] * len(keys)


@pytest.mark.parametrize("cluster", [False, True], ids=["standalone", "cluster"])
def test_async_connection_closed_while_in_use_is_transient(
    cluster: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A connection closed by another task while this one writes on it (the race of
    redis/redis-py#3546, seen under the linearizability churn on the Cluster) made
    redis-py raise ``AttributeError`` on its cleared writer, which escaped untyped; it is
    a lost connection: ``TransientStoreError``, and the store goes on working."""
    from redis.asyncio.connection import Connection

    u = _server_url(cluster)
    send = Connection._send_packed_command
    armed = [False]

    async def closed_meanwhile(self: Any, command: Any) -> None:
        # redis-py writes in a task of its own (asyncio.wait_for): another task may
        # close the connection before it runs, which is what this does
        if armed[0]:
            armed[0] = False
            self._writer.close()
            self._writer = None
        await send(self, command)

    monkeypatch.setattr(Connection, "_send_packed_command", closed_meanwhile)

    async def main() -> tuple[BaseException | None, int]:
        store = await fencing.open_async(u)
        try:
            orders = store.collection("orders")
            await orders.create("o-1", {"n": 0})
            intent = await orders.intent("o-1", "a")
            armed[0] = True
            try:
                await orders.commit(intent, {"n": 1})
            except Exception as exc:
                error: BaseException | None = exc
            else:
                error = None
            record = await orders.get("o-1")
            assert record is not None
            return error, record.version
        finally:
            await store.close()

    try:
        error, version = asyncio.run(main())
    finally:
        (cluster_cleanup if cluster else cleanup)(u)
    assert isinstance(error, TransientStoreError), repr(error)
    assert version in (1, 2)


def test_cluster_async_batch_whose_node_view_reset_meanwhile_is_transient(
    curl: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another task's connection error resets the asyncio Cluster client's nodes; a batch
    (a pipeline) running meanwhile found no default node and redis-py raised
    ``AttributeError`` after sending it (redis/redis-py#3835): ``TransientStoreError``."""
    from redis.asyncio.cluster import ClusterNode, RedisCluster
    from redis.exceptions import ConnectionError as Dropped

    default, pipeline = RedisCluster.get_default_node, ClusterNode.execute_pipeline
    armed = [False]

    async def dropped(self: Any, commands: Any) -> bool:
        if not armed[0]:
            return bool(await pipeline(self, commands))
        for command in commands:  # this node's connection dropped mid-pipeline ...
            command.result = Dropped("Connection closed by server.")
        return True

    def reset_meanwhile(self: Any) -> Any:
        if armed[0]:  # ... and another task's error reset the client's nodes meanwhile
            armed[0] = False
            return None
        return default(self)

    monkeypatch.setattr(ClusterNode, "execute_pipeline", dropped)
    monkeypatch.setattr(RedisCluster, "get_default_node", reset_meanwhile)

    async def main() -> tuple[BaseException | None, list[int]]:
        store = await fencing.open_async(curl)
        try:
            orders = store.collection("orders")
            for key in ("o-1", "o-2"):
                await orders.create(key, {"n": 0})
            items = [(await orders.intent(k, "a"), {"n": 1}) for k in ("o-1", "o-2")]
            armed[0] = True
            try:
                await orders.commit_many(items)
            except Exception as exc:
                error: BaseException | None = exc
            else:
                error = None
            again = await orders.commit_many(items)  # the retry: each landed once
            return error, [o.current.version for o in again if o.current is not None]
        finally:
            await store.close()

    error, versions = asyncio.run(main())
    assert isinstance(error, TransientStoreError), repr(error)
    assert versions == [2, 2]


@pytest.mark.parametrize("cluster", [False, True], ids=["standalone", "cluster"])
def test_sync_connection_closed_while_in_use_is_transient(
    cluster: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sync client's twin of the race (seen under the churn with 8 threads on the
    Cluster: another thread's connection error disconnects the connections in use):
    redis-py's ``AttributeError`` on the cleared socket is ``TransientStoreError``."""
    from redis.connection import Connection

    u = _server_url(cluster)
    health = Connection.check_health
    armed = [False]

    def closed_meanwhile(self: Any) -> None:
        health(self)
        if armed[0]:
            armed[0] = False
            self._sock.close()
            self._sock = None  # what another thread's disconnect leaves behind

    monkeypatch.setattr(Connection, "check_health", closed_meanwhile)
    store = fencing.open(u)
    try:
        orders = store.collection("orders")
        orders.create("o-1", {"n": 0})
        intent = orders.intent("o-1", "a")
        armed[0] = True
        with pytest.raises(TransientStoreError):
            orders.commit(intent, {"n": 1})
        armed[0] = True
        with pytest.raises(TransientStoreError):
            orders.get("o-1")
        record = orders.get("o-1")
        assert record is not None and record.version in (1, 2)
    finally:
        store.close()
        (cluster_cleanup if cluster else cleanup)(u)


def test_cluster_sync_store_survives_a_recovery_race_and_forgetting_every_node(
    curl: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seen under the churn with 8 threads on the Cluster, after connections dropped:
    redis-py's sync Cluster client, recovering from a lost connection while another
    thread recovers too, raised ``RuntimeError: dictionary changed size during
    iteration`` (untyped), and once threads had popped every startup node it could
    never connect again (``StoreError`` for good). Now: ``TransientStoreError``, and
    the store works on."""
    from redis.cluster import NodesManager
    from redis.connection import Connection
    from redis.exceptions import ConnectionError as Dropped

    read, initialize = Connection.read_response, NodesManager.initialize
    drop, race = [False], [False]

    def dropped(self: Any, *args: Any, **kwargs: Any) -> Any:
        if drop[0]:  # the connection dies after the command was sent
            drop[0] = False
            self.disconnect()
            raise Dropped("Connection closed by server.")
        return read(self, *args, **kwargs)

    def racing(self: Any) -> None:
        if race[0]:  # what another thread's recovery does meanwhile
            race[0] = False
            raise RuntimeError("dictionary changed size during iteration")
        initialize(self)

    monkeypatch.setattr(Connection, "read_response", dropped)
    monkeypatch.setattr(NodesManager, "initialize", racing)
    store = fencing.open(curl)
    try:
        orders = store.collection("orders")
        orders.create("o-1", {"n": 0})
        intent = orders.intent("o-1", "a")
        drop[0] = race[0] = True
        with pytest.raises(TransientStoreError):
            orders.commit(intent, {"n": 1})
        # threads failing together popped every startup node: none is left
        store.backend.client.nodes_manager.startup_nodes.clear()
        drop[0] = True
        with pytest.raises(TransientStoreError):
            orders.get("o-1")
        record = orders.get("o-1")
        assert record is not None and record.version in (1, 2)
    finally:
        store.close()


def _server_url(cluster: bool) -> str:
    """A fresh store URL on the Cluster or the standalone server (skip or fail if down)."""
    if cluster:
        require_server("Redis Cluster", HOST, CLUSTER_PORT)
        return cluster_url()
    require_server("Redis", HOST, PORT)
    return redis_url()


def test_async_cluster_leaves_no_node_connected_after_lost_connections(curl: str) -> None:
    """After a lost connection redis-py drops Cluster nodes still connected (a startup
    node popped, nodes swapped by a re-initialisation whose disconnect task the closing
    loop cancels); garbage, they warn "Unclosed ClusterNode" (an error in this suite).
    The store holds them until they are disconnected: every connection is killed again
    and again between calls, then the store is closed and the garbage collected."""
    import gc

    nodes = _nodes()
    keys = _keys_on_every_node(nodes, 2)

    def kill_all() -> None:
        for node in nodes.values():
            node.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")

    async def main() -> None:
        store = await fencing.open_async(curl)
        try:
            orders = store.collection("orders")
            for key in keys:
                await orders.create(key, {"n": 0})
            for round_ in range(12):
                items = []
                if round_ % 3 == 0:  # a batch across every node, too
                    with contextlib.suppress(TransientStoreError):
                        items = [(await orders.intent(k, "bump"), {"n": round_}) for k in keys]
                kill_all()
                calls = [orders.get(key) for key in keys]
                if items:
                    calls.append(orders.commit_many(items))
                for answer in await asyncio.gather(*calls, return_exceptions=True):
                    if isinstance(answer, BaseException):
                        assert isinstance(answer, TransientStoreError), answer
        finally:
            await store.close()

    try:
        asyncio.run(main())
        gc.collect()  # a node left connected warns here, in this test
    finally:
        _close_all(nodes)
