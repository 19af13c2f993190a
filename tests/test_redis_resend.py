"""A Redis write whose reply is lost is sent once: ``TransientStoreError``, never a re-send.

A TCP proxy per Redis server (``tests/_cut_proxy.py``) lets the server run a script,
then closes the client's connection instead of handing the reply over: the write
landed and the caller cannot know. fencing must raise ``TransientStoreError`` (the
outcome is unknown) having sent the script exactly once, and the caller's retry with
the same intent answers ``Duplicate``.

Found by the churn of ``test_linearizability`` on the Cluster: a commit answered
``Duplicate`` at the very version it wrote. redis-py's sync Cluster pipeline (5.3.1,
``ClusterPipeline._send_cluster_commands``) sends every command of a node whose
connection failed again, one by one, even those already answered; a ``commit_many``
item that had landed came back ``Duplicate`` of itself, and nothing was raised.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

import fencing
from fencing import Duplicate, TransientStoreError
from fencing.backends.redis.layout import key_slot
from fencing.backends.redis.scripts import SCRIPTS

from ._backends import require_server
from ._cut_proxy import CutProxy
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

MARKERS = {name: SCRIPTS[name].sha.encode() for name in ("commit", "create", "delete", "acquire")}


@dataclass
class Served:
    """A fresh store URL whose every server is behind a ``CutProxy``."""

    url: str
    cluster: bool
    proxies: dict[int, CutProxy]  # by the server's port
    options: dict[str, Any] = field(default_factory=dict)

    def proxy_of(self, tag: str) -> CutProxy:
        """The proxy of the primary that serves the hash slot of ``tag``."""
        if not self.cluster:
            return self.proxies[PORT]
        return self.proxies[_owner(key_slot(tag))]

    def sent(self, script: str) -> int:
        return sum(p.sent[MARKERS[script]] for p in self.proxies.values())


def _slots() -> list[Any]:
    import redis

    seed = redis.Redis(host=HOST, port=CLUSTER_PORT)
    try:
        return list(seed.execute_command("CLUSTER SLOTS"))
    finally:
        seed.close()


def _owner(slot: int) -> int:
    for shard in _slots():
        if shard[0] <= slot <= shard[1]:
            return int(shard[2][1])
    raise AssertionError(f"slot {slot} is not served")


@pytest.fixture(params=["standalone", "cluster"])
def served(request: pytest.FixtureRequest) -> Iterator[Served]:
    watch = tuple(MARKERS.values())
    if request.param == "standalone":
        require_server("Redis", HOST, PORT)
        proxy = CutProxy(HOST, PORT, watch)
        url = redis_url().replace(f"{HOST}:{PORT}/", f"{proxy.host}:{proxy.port}/")
        try:
            yield Served(url, False, {PORT: proxy})
        finally:
            proxy.close()
            cleanup(url)
        return
    require_server("Redis Cluster", HOST, CLUSTER_PORT)
    ports = sorted({int(shard[2][1]) for shard in _slots()})
    proxies = {port: CutProxy(HOST, port, watch) for port in ports}

    def remap(address: tuple[str, int]) -> tuple[str, int]:
        proxy = proxies.get(address[1])
        return address if proxy is None else (proxy.host, proxy.port)

    url = cluster_url()
    try:
        yield Served(url, True, proxies, {"address_remap": remap})
    finally:
        for proxy in proxies.values():
            proxy.close()
        cluster_cleanup(url)


@pytest.fixture
def opener(api: str, request: pytest.FixtureRequest) -> Iterator[Callable[[Served], Any]]:
    """open_(served) -> a store through the proxies, by the sync or the async API."""
    opened: list[Any] = []
    loop: Loop | None = request.getfixturevalue("loop") if api == "async" else None

    def open_(served: Served) -> Any:
        if loop is None:
            store: Any = fencing.open(served.url, **served.options)
        else:
            store = Syncified(loop.run(fencing.open_async(served.url, **served.options)), loop)
        opened.append(store)
        return store

    yield open_
    for store in opened:
        store.close()


def _keys(served: Served, shape: str) -> list[str]:
    """Record keys of collection ``orders``: one; two on one node; two on two nodes."""
    if shape == "one":
        return ["o-0"]
    if not served.cluster:
        return ["o-0", "o-1"]
    first = _owner(key_slot("orders/o-0"))
    for i in range(1, 1000):
        same = _owner(key_slot(f"orders/o-{i}")) == first
        if same == (shape == "one node"):
            return ["o-0", f"o-{i}"]
    raise AssertionError("no such key")


@pytest.mark.parametrize(
    ("served", "shape"),
    [
        *(("standalone", shape) for shape in ("one", "one node")),  # one server: one node
        *(("cluster", shape) for shape in ("one", "one node", "two nodes")),
    ],
    indirect=["served"],
)
def test_a_commit_whose_reply_is_lost_is_sent_once(
    served: Served, opener: Callable[[Served], Any], shape: str
) -> None:
    """The server ran the commit (a batch: every item on the node of the first key) and
    the reply was lost: ``TransientStoreError``, each script sent once, each record
    written once; the retry with the same intents answers ``Duplicate``."""
    store = opener(served)
    orders = store.collection("orders")
    keys = _keys(served, shape)
    for key in keys:
        orders.create(key, {"n": 0})
    work = [(orders.intent(key, "ship"), {"n": 1}) for key in keys]
    proxy = served.proxy_of(f"orders/{keys[0]}")
    before = served.sent("commit")
    proxy.cut(MARKERS["commit"])

    def commit() -> list[fencing.Outcome]:
        return [orders.commit(*work[0])] if shape == "one" else list(orders.commit_many(work))

    with pytest.raises(TransientStoreError):
        commit()
    assert proxy.cuts == 1
    assert served.sent("commit") - before == len(keys), "a commit was sent again"
    assert [orders.get(key).version for key in keys] == [2] * len(keys)  # each landed once
    retried = commit()
    assert [type(outcome) for outcome in retried] == [Duplicate] * len(keys)
    assert [outcome.record.version for outcome in retried] == [2] * len(keys)


@pytest.mark.parametrize("script", ["create", "delete", "acquire"])
def test_a_write_whose_reply_is_lost_is_sent_once(
    served: Served, opener: Callable[[Served], Any], script: str
) -> None:
    store = opener(served)
    orders = store.collection("orders")
    if script == "delete":
        orders.create("o-0", {"n": 0})
    proxy = served.proxy_of("orders/o-0")
    proxy.cut(MARKERS[script])
    write = {
        "create": lambda: orders.create("o-0", {"n": 0}),
        "delete": lambda: orders.delete("o-0"),
        "acquire": lambda: store.acquire("orders/o-0", owner="a", ttl=60),
    }[script]
    with pytest.raises(TransientStoreError):
        write()
    assert proxy.cuts == 1
    assert served.sent(script) == 1, f"the {script} was sent again"
    found = orders.get("o-0")
    if script == "create":
        assert found is not None and found.version == 1
    elif script == "delete":
        assert found is None
    else:  # the lost acquire was granted, once: the lease is held
        assert store.try_acquire("orders/o-0", owner="b", ttl=60) is None
