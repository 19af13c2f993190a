"""The MySQL / MariaDB backend: ``mysql://user:password@host:3306/db`` (also ``mariadb://``).

PyMySQL for the sync store, aiomysql for the async one (``pip install 'fencing[mysql]'``).
A commit, or a whole ``commit_many`` batch, is one round trip: the statements of one
transaction sent together as a multi-statement query, the conditional UPDATE deciding,
and the record read back in the same transaction. How and why: ``docs/backends/mysql.md``.

Files: ``settings`` (the URL's options), ``schema.sql`` / ``schema`` (fencing's tables and
their upgrades), ``steps`` (``Batch``, the step the flows yield, its ``Result``, and its framing),
``statements`` (fixed SQL), ``templates`` (SQL built per shape of request), ``values``
(what a column value beyond JSON is bound as), ``answers``
(what result rows mean), ``flows`` and ``effects`` (the operations as flows),
``restart`` (a transaction started again after a deadlock), ``errors`` (``translate``),
``connection`` (a batch on a connection, the rules after an exception), ``driver`` (the
sync and async backends, one connection per flow, each flow's transaction framed),
``bound`` (the same flows on the caller's connection: ``store.using``), ``guard`` (the
guard trigger on a user's table).
"""

from __future__ import annotations

from typing import Any

from ..._url import StoreURL
from .driver import AsyncMySQLBackend, MySQLBackend
from .errors import driver_module
from .schema import SCHEMA_VERSION
from .settings import settings_from_url

__all__ = [
    "SCHEMA_VERSION",
    "AsyncMySQLBackend",
    "MySQLBackend",
    "open_async_backend",
    "open_backend",
]


def open_backend(url: StoreURL, **options: Any) -> MySQLBackend:
    """``mysql://user:password@host:3306/db?pool_size=5`` (also ``mariadb://``)."""
    driver_module("pymysql")
    return MySQLBackend(settings_from_url(url, options))


async def open_async_backend(url: StoreURL, **options: Any) -> AsyncMySQLBackend:
    """The same URL, for asyncio (aiomysql)."""
    return await AsyncMySQLBackend.open(settings_from_url(url, options))
