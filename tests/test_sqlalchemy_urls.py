"""SQLAlchemy's URLs (``dialect+driver://``) and engines open fencing stores.

Every SQL backend, through the sync and the async API: the URL as SQLAlchemy writes it
opens and commits; ``fencing.open(engine)`` / ``open_async(async_engine)`` open fencing's
own store on the engine's database. Drivers fencing does not use are refused clearly.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

import fencing
from fencing import Committed, ConfigurationError
from fencing._open import store_url_text
from fencing._url import StoreURL, redact_url

from ._backends import CASES, TABLE_COLUMNS
from ._syncify import Loop, Syncified

sqlalchemy = pytest.importorskip("sqlalchemy")

_SQL = ("sqlite-memory", "sqlite-file", "postgresql", "mysql")
_DRIVER = {
    ("sqlite", "sync"): "sqlite+pysqlite",
    ("sqlite", "async"): "sqlite+aiosqlite",
    ("postgresql", "sync"): "postgresql+psycopg",
    ("postgresql", "async"): "postgresql+psycopg",
    ("mysql", "sync"): "mysql+pymysql",
    ("mysql", "async"): "mysql+aiomysql",
}


def sqlalchemy_url(url: str, api: str) -> str:
    """``url`` as SQLAlchemy writes it, with the driver of the API."""
    if url == "sqlite://:memory:":
        url = "sqlite:///:memory:"
    scheme, rest = url.split("://", 1)
    return f"{_DRIVER[scheme, api]}://{rest}"


def _open(url_or_engine: Any, api: str, loop: Loop) -> Any:
    if api == "sync":
        return fencing.open(url_or_engine)
    return Syncified(loop.run(fencing.open_async(url_or_engine)), loop)


def _commit_once(store: Any, backend_name: str) -> None:
    target = store.unwrapped if isinstance(store, Syncified) else store
    create = CASES[backend_name].create_table
    assert create is not None
    create(target, "orders_t", "id", "version", TABLE_COLUMNS, [{"id": 1}])
    orders = store.table("orders_t")
    out = orders.commit(orders.intent(1, "sa-1"), {"status": "paid"})
    assert isinstance(out, Committed), out
    assert orders.get(1).version == 2


@pytest.mark.backends(only=lambda name: name in _SQL)
def test_sqlalchemy_url_opens_and_commits(
    store_url: str, backend_name: str, api: str, loop: Loop
) -> None:
    url = sqlalchemy_url(store_url, "sync")  # the sync driver's name, on either API
    store = _open(url, api, loop)
    try:
        _commit_once(store, backend_name)
        assert store.url == redact_url(url)
    finally:
        store.close()


@pytest.mark.backends(only=lambda name: name in _SQL)
def test_async_driver_url_opens_and_commits(
    store_url: str, backend_name: str, api: str, loop: Loop
) -> None:
    url = sqlalchemy_url(store_url, "async")  # aiosqlite's name needs no aiosqlite here
    store = _open(url, api, loop)
    try:
        _commit_once(store, backend_name)
    finally:
        store.close()


@pytest.mark.backends(only=lambda name: name in _SQL)
def test_open_engine(store_url: str, backend_name: str, api: str, loop: Loop) -> None:
    url = sqlalchemy_url(store_url, api)
    if api == "sync":
        engine = sqlalchemy.create_engine(url)
    else:
        from sqlalchemy.ext.asyncio import create_async_engine

        engine = create_async_engine(url)
    try:
        store = _open(engine, api, loop)
        try:
            _commit_once(store, backend_name)
        finally:
            store.close()
    finally:
        if api == "sync":
            engine.dispose()
        else:
            loop.run(engine.dispose())


@pytest.mark.parametrize(
    "url",
    [
        "sqlite+pysqlite:///app.db",
        "sqlite+pysqlite:///:memory:",
        "sqlite+aiosqlite:///app.db",
        "postgresql+psycopg://u:pw@db.example/app",
        "postgres+psycopg://u:pw@db.example/app",
        "postgresql+psycopg_async://u:pw@db.example/app",
        "mysql+pymysql://u:pw@db.example:3306/app",
        "mysql+aiomysql://u:pw@db.example/app",
        "mariadb+pymysql://u:pw@db.example/app",
        "MySQL+PyMySQL://u:pw@db.example/app",
    ],
)
def test_driver_urls_parse(url: str) -> None:
    parsed = StoreURL.parse(url)
    assert parsed.scheme == url.split("+")[0].lower()
    assert "pw" not in parsed.redacted() and "pw" not in repr(parsed)


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("postgresql+psycopg2://u:pw@h/db", "psycopg 3"),
        ("postgresql+asyncpg://u:pw@h/db", "psycopg 3"),
        ("postgresql+pg8000://u:pw@h/db", "postgresql+psycopg://"),
        ("mysql+mysqldb://u:pw@h/db", "PyMySQL"),
        ("mysql+mysqlconnector://u:pw@h/db", "mysql+pymysql://"),
        ("mariadb+mariadbconnector://u:pw@h/db", "PyMySQL"),
        ("mysql+asyncmy://u:pw@h/db", "aiomysql"),
        ("sqlite+pysqlcipher:///app.db", "sqlite3"),
        ("redis+x://h", "takes no +driver"),
        ("memory+x://", "takes no +driver"),
        ("postgresql+://u:pw@h/db", "not a driver name"),
    ],
)
def test_other_drivers_refused(url: str, says: str) -> None:
    with pytest.raises(ConfigurationError, match=re.escape(says)) as err:
        StoreURL.parse(url)
    assert "pw" not in str(err.value)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql+psycopg://u:s3cret@h/db", "postgresql+psycopg://u:***@h/db"),
        ("mysql+pymysql://u:s3c@ret@h/db?ssl=1", "mysql+pymysql://u:***@h/db?ssl=1"),
        ("sqlite+pysqlite:///a.db?password=s3cret", "sqlite+pysqlite:///a.db?password=***"),
        ("postgresql+psycopg://h/db?password=s3cret", "postgresql+psycopg://h/db?password=***"),
    ],
)
def test_redaction_of_driver_urls(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_engine_password_reaches_fencing_not_its_repr() -> None:
    engine = sqlalchemy.create_engine("postgresql+psycopg://u:s3cr%40t@db.example:5433/app")
    try:
        text = store_url_text(engine)
        assert isinstance(text, str)
        parsed = StoreURL.parse(text)
        assert parsed.password == "s3cr@t" or parsed.password == "s3cr%40t"
        assert "s3cr" not in repr(parsed) and "s3cr" not in parsed.redacted()
        assert (parsed.host, parsed.port, parsed.path) == ("db.example", 5433, "app")
        # a SQLAlchemy URL object works too
        assert store_url_text(engine.url) == text
    finally:
        engine.dispose()


def test_engine_of_a_driver_fencing_does_not_use_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="a store URL is a string"):
        fencing.open(object())
    url = sqlalchemy.engine.make_url("postgresql+psycopg2://u:pw@db.example/app")
    with pytest.raises(ConfigurationError, match="psycopg 3") as err:
        fencing.open(url)
    assert "pw" not in str(err.value)


@pytest.mark.parametrize(
    ("url", "path"),
    [
        ("sqlite:///:memory:", ":memory:"),
        ("sqlite+pysqlite://", ":memory:"),
        ("sqlite:///rel.db", "rel.db"),
        ("sqlite:////abs/a b@c.db?timeout=3", "/abs/a b@c.db"),
    ],
)
def test_sqlite_engine_paths_are_not_percent_encoded(
    url: str, path: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    engine = sqlalchemy.create_engine(url)
    try:
        text = store_url_text(engine)
        assert isinstance(text, str)
        assert StoreURL.parse(text).path == path
        if path == ":memory:":
            fencing.open(engine).close()
            assert list(tmp_path.iterdir()) == []  # no file named after :memory:
    finally:
        engine.dispose()
