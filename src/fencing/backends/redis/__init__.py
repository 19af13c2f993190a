"""The Redis backend: ``redis://`` and ``rediss://`` URLs, standalone or Cluster, sync and
asyncio. Every primitive that reads or writes more than one value is one Lua script, so
a commit is one atomic step and one round trip; the store's clock is the Redis server's.
Requires Redis 7.0 or newer. See ``docs/backends/redis.md`` (options, key layout,
Cluster, durability).

Files: ``settings`` (the URL's options), ``layout`` (keys and Cluster slots), ``lua/``
and ``scripts`` (the scripts, the calls to them and the flows that send them),
``replies`` (replies read as fencing's values), ``steps`` (what a flow asks its driver
for), ``flows`` and ``effects`` (the logic), ``errors`` (``translate``), ``connection``
(redis-py clients and their guarded connections), ``driver`` (the two backends).
"""

from __future__ import annotations

from typing import Any

from ..._url import StoreURL
from .connection import connect
from .driver import AsyncRedisBackend, RedisBackend
from .flows import SCHEMA_VERSION
from .settings import settings_from_url

__all__ = [
    "SCHEMA_VERSION",
    "AsyncRedisBackend",
    "RedisBackend",
    "open_async_backend",
    "open_backend",
]


def open_backend(url: StoreURL, **options: Any) -> RedisBackend:
    """``redis://host:port/db?prefix=...`` (the options: ``docs/backends/redis.md``)."""
    settings = settings_from_url(url, options)
    return RedisBackend(settings, connect(settings, options))


async def open_async_backend(url: StoreURL, **options: Any) -> AsyncRedisBackend:
    """The asyncio twin of :func:`open_backend`, over ``redis.asyncio``."""
    settings = settings_from_url(url, options)
    return AsyncRedisBackend(settings, connect(settings, options, asyncio=True))
