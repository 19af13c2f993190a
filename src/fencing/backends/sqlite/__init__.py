"""The SQLite backend: the embedded default (``sqlite:///path.db``, ``sqlite://:memory:``).

Every write runs in ``BEGIN IMMEDIATE``, so a commit's check and write happen under
SQLite's write lock: atomic across threads and processes. The store's clock is the host's
wall clock, read by the backend inside the write transaction; every process sharing the
file shares that clock. See ``docs/backends/sqlite.md``.

Files: ``settings`` (the URL's options), ``schema.sql`` / ``schema`` (fencing's tables and
their upgrades), ``statements`` (SQL), ``operations`` (each operation as a function of a
connection in its transaction), ``flows`` (the operations as ``Txn`` steps), ``errors``
(``translate``), ``driver`` (the connection, its lock and transactions), ``guard`` (the
guard trigger on a user's table), ``bound`` / ``abound`` (``store.using``: the
caller's ``sqlite3`` / aiosqlite connection; ``abound`` also has the async store).
"""

from __future__ import annotations

from typing import Any

from ..._url import StoreURL
from .abound import AsyncSQLiteBackend
from .driver import SQLiteBackend
from .schema import SCHEMA_VERSION
from .settings import settings_from_url

__all__ = [
    "CREATES_ON_OPEN",
    "SCHEMA_VERSION",
    "SQLiteBackend",
    "open_async_backend",
    "open_backend",
]

#: opening a file makes it: ``fencing.open(url, migrate="check")`` passes ``create=False``
CREATES_ON_OPEN = True


def open_backend(url: StoreURL, **options: Any) -> SQLiteBackend:
    """``sqlite:///path.db`` (WAL, synchronous=FULL), ``sqlite://:memory:``."""
    return SQLiteBackend(settings_from_url(url, options))


async def open_async_backend(url: StoreURL, **options: Any) -> AsyncSQLiteBackend:
    """The same backend for asyncio: each call runs in a worker thread; its views
    (``store.using``) run on the caller's aiosqlite connection."""
    return AsyncSQLiteBackend(open_backend(url, **options))
