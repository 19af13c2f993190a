"""How ``tests/test_using.py`` borrows a connection to a store's own database.

A ``Lender`` per backend case and driver: a driver connection in the driver's default
(transactional) mode, an asyncio one, and SQLAlchemy URLs, all reaching the database
(and, on PostgreSQL, the schema first on the search path) that a store opened on the
case's URL uses, so a table name resolves on them as on the store's own connections.
Server backends register theirs in ``tests/backends_*.py``: PostgreSQL's through psycopg 3
and psycopg2, MySQL's through PyMySQL and mysqlclient.

``LENDERS``: each case's first lender (its store's own driver). ``DRIVERS``: every lender
of a case, by driver; a test taking the ``lender_name`` fixture runs once per case and
driver (``conftest.pytest_generate_tests``; ``@pytest.mark.lenders(only=...)`` keeps
the lenders a predicate accepts), and calls ``require_driver`` first.
"""

from __future__ import annotations

import importlib
import sqlite3
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import pytest

from ._backends import CI


@dataclass(frozen=True)
class Lender:
    #: a sync driver connection to the store's database, not in autocommit mode
    connect: Callable[[str], Any]
    #: the same, in autocommit mode (the caller has no transaction to join)
    connect_autocommit: Callable[[str], Any]
    #: an asyncio driver connection (None: the backend has no async lender yet)
    aconnect: Callable[[str], Awaitable[Any]] | None
    #: a SQLAlchemy URL (sync driver) and an async one for the store's database
    sa_url: Callable[[str], str]
    sa_async_url: Callable[[str], str] | None
    #: keyword arguments for create_engine (PostgreSQL: the schema on the search path)
    sa_options: Callable[[str], dict[str, Any]] = lambda url: {}
    #: the driver's name in test ids (``postgresql-psycopg2``)
    driver: str = "default"
    #: the module its connections need (an extra that may be missing: ``require_driver``)
    requires: str | None = None


LENDERS: dict[str, Lender] = {}
DRIVERS: dict[str, dict[str, Lender]] = {}


def register_lender(case: str, lender: Lender) -> None:
    LENDERS.setdefault(case, lender)
    DRIVERS.setdefault(case, {})[lender.driver] = lender


def require_driver(lender: Lender) -> None:
    """Skip (laptop) or fail (CI) when the driver a lender needs is not installed."""
    if lender.requires is not None:
        require_module(lender.requires)


def require_module(module: str) -> None:
    """Skip (laptop) or fail (CI) when the driver ``module`` is not installed."""
    try:
        importlib.import_module(module)
    except ImportError as exc:
        message = f"{module} is not installed ({exc})"
        if CI:
            pytest.fail(f"{message}, and CI is set: every driver's tests must run in CI")
        pytest.skip(f"{message}: `make test` installs it, with the MariaDB client headers")


def _sqlite_path(url: str) -> str:
    return urlsplit(url).path[1:] if url.startswith("sqlite:///") else url


def _sqlite_connect(url: str) -> sqlite3.Connection:
    conn = sqlite3.connect(_sqlite_path(url), timeout=30)
    conn.execute("PRAGMA busy_timeout=30000")
    return conn


def _sqlite_autocommit(url: str) -> sqlite3.Connection:
    return sqlite3.connect(_sqlite_path(url), timeout=30, isolation_level=None)


async def _sqlite_aconnect(url: str) -> Any:
    import aiosqlite

    return await aiosqlite.connect(_sqlite_path(url), timeout=30)


register_lender(
    "sqlite-file",
    Lender(
        connect=_sqlite_connect,
        connect_autocommit=_sqlite_autocommit,
        aconnect=_sqlite_aconnect,
        sa_url=lambda url: f"sqlite:///{_sqlite_path(url)}",
        sa_async_url=lambda url: f"sqlite+aiosqlite:///{_sqlite_path(url)}",
        driver="sqlite3",
    ),
)
