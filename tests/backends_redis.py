"""The Redis cases of the contract suite (imported by conftest): ``redis`` (standalone)
and ``redis-cluster`` (a 3-primary Redis Cluster on ports 7000-7002, started by
``scripts/redis-cluster.sh start``).

Each test gets its own key prefix (``fencing-test-<random>``) on database 0, which other
work on this machine shares: cleanup deletes only that prefix's keys (SCAN + UNLINK, on
every primary of the Cluster), never FLUSHDB. Guarded table rows live under the same
prefix (``table_prefix``).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from fencing._url import StoreURL

from ._backends import Case, register

HOST = "127.0.0.1"
PORT = 6379
CLUSTER_PORT = 7000


def redis_url(prefix: str | None = None, **options: object) -> str:
    """A URL of a fresh, private corner of the test Redis (extra options appended)."""
    prefix = prefix or f"fencing-test-{uuid.uuid4().hex[:12]}"
    query = {"prefix": prefix, "table_prefix": f"{prefix}:tables:", **options}
    return f"redis://{HOST}:{PORT}/0?" + "&".join(f"{k}={v}" for k, v in query.items())


def cluster_url(prefix: str | None = None, **options: object) -> str:
    """A URL of a fresh, private corner of the test Redis Cluster."""
    prefix = prefix or f"fencing-test-{uuid.uuid4().hex[:12]}"
    query = {"cluster": "true", "prefix": prefix, "table_prefix": f"{prefix}:tables:", **options}
    return f"redis://{HOST}:{CLUSTER_PORT}/0?" + "&".join(f"{k}={v}" for k, v in query.items())


def _make_url(tmp_path: Path) -> str:
    return redis_url()


def _make_cluster_url(tmp_path: Path) -> str:
    return cluster_url()


def _unlink_prefix(client: Any, prefix: str, **scan: Any) -> None:
    batch: list[bytes] = []
    for key in client.scan_iter(match=f"{prefix}:*", count=1000, **scan):
        batch.append(key)
        if len(batch) >= 500:
            client.unlink(*batch)  # a Cluster client splits it per slot
            batch.clear()
    if batch:
        client.unlink(*batch)


def cleanup(url: str) -> None:
    """Delete every key under the URL's prefix (only those)."""
    import redis

    prefix = StoreURL.parse(url).options["prefix"]
    assert prefix.startswith("fencing-test-"), prefix
    client = redis.Redis(host=HOST, port=PORT, db=0)
    try:
        _unlink_prefix(client, prefix)
    finally:
        client.close()


def cluster_cleanup(url: str) -> None:
    """Delete every key under the URL's prefix on every primary of the Cluster."""
    from redis.cluster import RedisCluster

    prefix = StoreURL.parse(url).options["prefix"]
    assert prefix.startswith("fencing-test-"), prefix
    client = RedisCluster(host=HOST, port=CLUSTER_PORT)
    try:
        _unlink_prefix(client, prefix, target_nodes=RedisCluster.PRIMARIES)
    finally:
        client.close()


def _create_table(
    store: Any,
    table: str,
    key: str,
    version: str | None,
    columns: Mapping[str, str],
    rows: Iterable[Mapping[str, Any]],
) -> None:
    """Declare the table and write its rows as a user would: one hash per row."""
    from fencing.backends.redis import open_backend
    from fencing.backends.redis.scripts import field_text

    backend = open_backend(StoreURL.parse(store.url))
    try:
        backend.declare_table(table, key=key, version=version, columns=list(columns))
        for row in rows:
            name = backend.layout.row(table, row[key])
            fields = {c: field_text(v) for c, v in row.items() if c != key and v is not None}
            if version:
                fields.setdefault(version, "1")
            backend.client.delete(name)
            backend.client.hset(name, mapping=fields)
    finally:
        backend.close()


register(
    Case(
        name="redis",
        make_url=_make_url,
        shared_between_processes=True,
        server=("Redis", HOST, PORT),
        create_table=_create_table,
        cleanup=cleanup,
    )
)
register(
    Case(
        name="redis-cluster",
        make_url=_make_cluster_url,
        shared_between_processes=True,
        server=("Redis Cluster", HOST, CLUSTER_PORT),
        create_table=_create_table,
        cleanup=cluster_cleanup,
    )
)
