"""The MySQL / MariaDB case: a fresh database per test on the server of this machine (or CI).

``FENCING_MYSQL_URL`` points the tests at another server (its database part is replaced
by a fresh ``fencing_t_<hex>`` database per test, dropped afterwards).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from ._backends import Case, register
from ._lenders import Lender, register_lender

BASE_URL = os.environ.get("FENCING_MYSQL_URL", "mysql://root@127.0.0.1:3306/test")
_parts = urlsplit(BASE_URL)
HOST = _parts.hostname or "127.0.0.1"
PORT = _parts.port or 3306


def _admin() -> Any:
    """A short-lived connection to the server (no database selected)."""
    import pymysql

    return pymysql.connect(
        host=HOST,
        port=PORT,
        user=_parts.username or "root",
        password=_parts.password or "",
        charset="utf8mb4",
        autocommit=True,
    )


def url_for(database: str) -> str:
    return urlunsplit(_parts._replace(path="/" + database))


def make_url(tmp_path: Path) -> str:
    """Create a fresh, empty database and return its URL."""
    database = "fencing_t_" + uuid.uuid4().hex[:16]
    conn = _admin()
    try:
        with conn.cursor() as cur:
            cur.execute(f"CREATE DATABASE `{database}` CHARACTER SET utf8mb4")
    finally:
        conn.close()
    return url_for(database)


def cleanup(url: str) -> None:
    database = urlsplit(url).path.lstrip("/")
    assert database.startswith("fencing_t_"), database
    conn = _admin()
    try:
        with conn.cursor() as cur:
            # a connection a failed test left in a transaction on the database holds a
            # metadata lock: fail (1205) after a minute instead of waiting the server's
            # lock_wait_timeout (a day), which looked like a hung test suite
            cur.execute("SET SESSION lock_wait_timeout = 60")
            cur.execute(f"DROP DATABASE IF EXISTS `{database}`")
    finally:
        conn.close()


def connect(store: Any) -> Any:
    """A short-lived PyMySQL connection to a store's database (sync or async store)."""
    import pymysql

    backend = store.backend
    backend = getattr(backend, "sync", backend)
    return pymysql.connect(**backend.settings.driver_kwargs())


def create_table(
    store: Any,
    table: str,
    key: str,
    version: str | None,
    columns: Mapping[str, str],
    rows: Iterable[Mapping[str, Any]],
) -> None:
    cols = [f"`{key}` INTEGER PRIMARY KEY"]
    if version:
        cols.append(f"`{version}` INTEGER NOT NULL DEFAULT 1")
    cols += [f"`{c}` {t}" for c, t in columns.items()]
    conn = connect(store)
    try:
        with conn.cursor() as cur:
            cur.execute(f"DROP TABLE IF EXISTS `{table}`")
            cur.execute(f"CREATE TABLE `{table}` ({', '.join(cols)}) ENGINE=InnoDB")
            for row in rows:
                names = ", ".join(f"`{c}`" for c in row)
                marks = ", ".join("%s" for _ in row)
                cur.execute(f"INSERT INTO `{table}` ({names}) VALUES ({marks})", list(row.values()))
    finally:
        conn.close()


register(
    Case(
        name="mysql",
        make_url=make_url,
        shared_between_processes=True,
        server=("MariaDB", HOST, PORT),
        create_table=create_table,
        cleanup=cleanup,
    )
)


# -- store.using(conn): connections to a case's database (tests/test_using.py) ----------
def _connect_kwargs(url: str) -> dict[str, Any]:
    parts = urlsplit(url)
    return {
        "host": parts.hostname or HOST,
        "port": parts.port or PORT,
        "user": parts.username or "root",
        "password": parts.password or "",
        "database": parts.path.lstrip("/"),
        "charset": "utf8mb4",
    }


def lend(url: str) -> Any:
    """A PyMySQL connection as an application opens one: autocommit off (PyMySQL's
    default), no multi-statement option."""
    import pymysql

    return pymysql.connect(**_connect_kwargs(url))


def lend_autocommit(url: str) -> Any:
    import pymysql

    return pymysql.connect(**_connect_kwargs(url), autocommit=True)


async def alend(url: str) -> Any:
    import aiomysql

    kwargs = _connect_kwargs(url)
    kwargs["db"] = kwargs.pop("database")
    return await aiomysql.connect(**kwargs)


def _sa_url(url: str, driver: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(scheme=f"mysql+{driver}", query="charset=utf8mb4"))


def lend_mysqlclient(url: str, *, autocommit: bool = False) -> Any:
    """A mysqlclient (``MySQLdb``) connection, Django's MySQL driver: autocommit off (its
    default)."""
    import MySQLdb

    conn = MySQLdb.connect(**_connect_kwargs(url))
    conn.autocommit(autocommit)
    return conn


register_lender(
    "mysql",
    Lender(
        connect=lend,
        connect_autocommit=lend_autocommit,
        aconnect=alend,
        sa_url=lambda url: _sa_url(url, "pymysql"),
        sa_async_url=lambda url: _sa_url(url, "aiomysql"),
        driver="pymysql",
    ),
)
register_lender(
    "mysql",
    Lender(
        connect=lend_mysqlclient,
        connect_autocommit=lambda url: lend_mysqlclient(url, autocommit=True),
        aconnect=None,
        sa_url=lambda url: _sa_url(url, "mysqldb"),
        sa_async_url=None,
        driver="mysqlclient",
        requires="MySQLdb",
    ),
)
