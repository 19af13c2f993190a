"""The PostgreSQL backend (``postgresql://`` and ``postgres://``): psycopg 3 and
psycopg_pool, sync and async. A commit is one statement, one round trip, atomic under
READ COMMITTED; see ``docs/backends/postgres.md`` for the options and the design.

Files: ``settings`` (the URL's options), ``schema.sql`` / ``effects.sql`` / ``schema``
(fencing's tables and their upgrades), ``statements`` (SQL), ``steps`` (what a flow asks
its driver to run), ``flows`` and ``effects`` (the operations, I/O-free), ``errors``
(``translate``), ``driver`` (the pools, sync and async), ``guard`` (the guard trigger on a
user's table).
"""

from __future__ import annotations

from typing import Any

from ..._errors import MissingDependency

try:
    import psycopg  # noqa: F401
    import psycopg_pool  # noqa: F401
except ModuleNotFoundError as exc:  # pragma: no cover - exercised with the driver hidden
    raise MissingDependency(
        f"the postgres backend needs {exc.name}: pip install 'fencing[postgres]'"
    ) from exc

from ..._url import StoreURL
from .driver import AsyncPostgresBackend, PostgresBackend
from .schema import SCHEMA_VERSION
from .settings import settings_from_url

__all__ = [
    "SCHEMA_VERSION",
    "AsyncPostgresBackend",
    "PostgresBackend",
    "open_async_backend",
    "open_backend",
]


def open_backend(url: StoreURL, **options: Any) -> PostgresBackend:
    """``postgresql://user:password@host:port/db?schema=...`` (its options:
    ``docs/backends/postgres.md``)."""
    backend = PostgresBackend(settings_from_url(url, options))
    backend.connect()
    return backend


async def open_async_backend(url: StoreURL, **options: Any) -> AsyncPostgresBackend:
    """The asyncio twin of :func:`open_backend`."""
    backend = AsyncPostgresBackend(settings_from_url(url, options))
    await backend.connect()
    return backend
