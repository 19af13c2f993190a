"""The caller's connection, for ``store.using(conn_or_session)``.

``borrow_sync(obj)`` / ``borrow_async(obj)`` recognise what the caller gave by its
type's module and name (duck-typed: the core imports no driver and no SQLAlchemy) and
answer a ``Borrowed``: the driver family (``kind``) and, for one operation, the DB-API
connection to run on, inside the caller's transaction:

* a driver connection (psycopg 3, psycopg2, PyMySQL, mysqlclient's ``MySQLdb``,
  ``sqlite3``; psycopg's ``AsyncConnection``, aiomysql, aiosqlite) is itself;
* a SQLAlchemy ``Session`` (or ``scoped_session``) is flushed first when its
  ``autoflush`` is on, as a query would be, so fencing reads the application's own
  pending changes; then ``session.connection()`` (which begins the session's
  transaction) gives the driver connection. A ``Connection`` is begun if it is not in
  a transaction yet, so its ``commit()`` commits what fencing wrote. ``AsyncSession``
  and ``AsyncConnection`` the same, awaited.

The DB-API connection is asked for again at every operation: a session's connection
changes after it commits.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import Any

from ._errors import InvalidInput

__all__ = ["Borrowed", "borrow_async", "borrow_sync"]

#: A driver connection's class, by (top-level package, class name), and its kind.
_SYNC_DRIVERS = {
    ("psycopg", "Connection"): "psycopg",
    ("psycopg2", "connection"): "psycopg2",
    ("pymysql", "Connection"): "pymysql",
    ("MySQLdb", "Connection"): "mysqldb",
}
_ASYNC_DRIVERS = {
    ("psycopg", "AsyncConnection"): "psycopg",
    ("aiomysql", "Connection"): "aiomysql",
    ("aiosqlite", "Connection"): "aiosqlite",
}
#: SQLAlchemy's dialect driver names, as the kind of connection they hand out.
_SA_DRIVERS = {
    "psycopg": "psycopg",
    "psycopg_async": "psycopg",
    "psycopg2": "psycopg2",
    "pymysql": "pymysql",
    "mysqldb": "mysqldb",
    "aiomysql": "aiomysql",
    "pysqlite": "sqlite3",
    "aiosqlite": "aiosqlite",
}
_SA = {
    ("sqlalchemy", "Session"): "session",
    ("sqlalchemy", "scoped_session"): "scoped",
    ("sqlalchemy", "Connection"): "connection",
    ("sqlalchemy", "AsyncSession"): "async_session",
    ("sqlalchemy", "AsyncConnection"): "async_connection",
}
_ASYNC_SA = {"async_session", "async_connection"}
#: Django's database wrappers, by the module of their driver (``DatabaseWrapper.Database``).
_DJANGO_DRIVERS = {
    "psycopg": "psycopg",
    "psycopg2": "psycopg2",
    "sqlite3": "sqlite3",
    "pymysql": "pymysql",
    "MySQLdb": "mysqldb",
}
_SUPPORTED = (
    "a psycopg 3, psycopg2, PyMySQL, mysqlclient (MySQLdb) or sqlite3 connection, a"
    " SQLAlchemy Session or Connection, or a Django connection"
    " (an async store: psycopg's AsyncConnection, aiomysql, aiosqlite, or a SQLAlchemy"
    " AsyncSession or AsyncConnection)"
)


class Borrowed:
    """What ``store.using`` was given, and how to reach its DB-API connection now."""

    __slots__ = ("_aget", "_get", "asynchronous", "kind", "source")

    def __init__(
        self,
        kind: str,
        source: object,
        *,
        get: Callable[[], Any] | None = None,
        aget: Callable[[], Any] | None = None,
    ) -> None:
        # psycopg | psycopg2 | pymysql | mysqldb | sqlite3 | aiomysql | aiosqlite
        self.kind = kind
        self.source = source
        self.asynchronous = aget is not None
        self._get = get
        self._aget = aget

    def __repr__(self) -> str:
        return f"<Borrowed {self.kind} from {type(self.source).__name__}>"

    def connection(self) -> Any:
        """The DB-API connection for this operation (a session flushed and begun)."""
        assert self._get is not None
        return self._get()

    async def aconnection(self) -> Any:
        """The asyncio driver connection for this operation (a session flushed and begun)."""
        assert self._aget is not None
        return await self._aget()


def _family(obj: object, table: dict[tuple[str, str], str]) -> str | None:
    for cls in type(obj).__mro__:
        found = table.get((cls.__module__.split(".", 1)[0], cls.__name__))
        if found is not None:
            return found
    return None


def _what(obj: object) -> str:
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


def borrow_sync(obj: object) -> Borrowed:
    """``obj`` for a sync store: a driver connection, or a SQLAlchemy session/connection."""
    return _borrow(obj, asynchronous=False)


def borrow_async(obj: object) -> Borrowed:
    """``obj`` for an async store: an asyncio driver connection, or a SQLAlchemy
    ``AsyncSession`` / ``AsyncConnection``."""
    return _borrow(obj, asynchronous=True)


def _borrow(obj: object, *, asynchronous: bool) -> Borrowed:
    if isinstance(obj, sqlite3.Connection):
        return _checked(Borrowed("sqlite3", obj, get=lambda: obj), obj, asynchronous)
    kind = _family(obj, _SYNC_DRIVERS)
    if kind is not None:
        return _checked(Borrowed(kind, obj, get=lambda: obj), obj, asynchronous)
    kind = _family(obj, _ASYNC_DRIVERS)
    if kind is not None:
        return _checked(Borrowed(kind, obj, aget=lambda: _ready(obj)), obj, asynchronous)
    wrapper = _django_wrapper(obj)
    if wrapper is not None:
        return _checked(_django(wrapper, obj), obj, asynchronous)
    shape = _family(obj, _SA)
    if shape is None:
        raise InvalidInput(f"store.using() takes {_SUPPORTED}, not {_what(obj)}")
    return _checked(_sqlalchemy(obj, shape), obj, asynchronous)


async def _ready(obj: object) -> object:
    return obj


def _checked(borrowed: Borrowed, obj: object, asynchronous: bool) -> Borrowed:
    if borrowed.asynchronous and not asynchronous:
        raise InvalidInput(
            f"{_what(obj)} is an asyncio connection: use it with a store opened by"
            " fencing.open_async(), or give this store a synchronous connection"
        )
    if asynchronous and not borrowed.asynchronous:
        raise InvalidInput(
            f"{_what(obj)} is a synchronous connection: use it with a store opened by"
            " fencing.open(), or give this async store an asyncio connection"
        )
    return borrowed


def _sqlalchemy(obj: Any, shape: str) -> Borrowed:
    if shape == "scoped":
        return _sa_kind(obj(), _session_get(obj), obj)
    if shape == "session":
        return _sa_kind(obj, _session_get(lambda: obj), obj)
    if shape == "connection":
        return _sa_kind(obj, _connection_get(obj), obj)
    if shape == "async_session":
        return _sa_kind(obj.sync_session, None, obj, aget=_async_session_get(obj))
    return _sa_kind(obj, None, obj, aget=_async_connection_get(obj))


def _sa_kind(
    holder: Any,
    get: Callable[[], Any] | None,
    source: object,
    *,
    aget: Callable[[], Any] | None = None,
) -> Borrowed:
    """The kind of connection a SQLAlchemy session or connection hands out, from its
    engine's dialect (refused if fencing has no backend for that driver)."""
    try:
        bind = holder.get_bind() if hasattr(holder, "get_bind") else holder.engine
    except Exception as exc:  # an unbound session: SQLAlchemy's own error says why
        raise InvalidInput(f"store.using(): {_what(source)} has no engine: {exc}") from None
    dialect = bind.dialect
    kind = _SA_DRIVERS.get(str(dialect.driver))
    if kind is None:
        raise InvalidInput(
            f"store.using(): {_what(source)} runs on {dialect.name}+{dialect.driver}; fencing"
            " joins transactions of psycopg (3), psycopg2, pymysql, mysqldb (mysqlclient),"
            " aiomysql, pysqlite and aiosqlite"
        )
    return Borrowed(kind, source, get=get, aget=aget)


def _session_get(session_of: Callable[[], Any]) -> Callable[[], Any]:
    def get() -> Any:
        session = session_of()
        if session.autoflush:
            session.flush()
        return session.connection().connection.driver_connection

    return get


def _connection_get(conn: Any) -> Callable[[], Any]:
    def get() -> Any:
        if not conn.in_transaction():
            conn.begin()
        return conn.connection.driver_connection

    return get


def _async_session_get(session: Any) -> Callable[[], Any]:
    async def aget() -> Any:
        if session.sync_session.autoflush:
            await session.flush()
        conn = await session.connection()
        return (await conn.get_raw_connection()).driver_connection

    return aget


def _async_connection_get(conn: Any) -> Callable[[], Any]:
    async def aget() -> Any:
        if not conn.in_transaction():
            await conn.begin()
        return (await conn.get_raw_connection()).driver_connection

    return aget


def _django_wrapper(obj: Any) -> Any:
    """The ``DatabaseWrapper`` behind Django's ``connection`` proxy or ``connections[alias]``
    (None if ``obj`` is neither)."""
    cls = type(obj)
    if cls.__module__ == "django.utils.connection" and cls.__name__ == "ConnectionProxy":
        return obj._connections[obj._alias]
    for base in cls.__mro__:
        if base.__module__.startswith("django.db.backends.") and base.__name__ in (
            "BaseDatabaseWrapper",
            "DatabaseWrapper",
        ):
            return obj
    return None


def _django(wrapper: Any, source: object) -> Borrowed:
    driver = getattr(getattr(wrapper, "Database", None), "__name__", "?")
    kind = _DJANGO_DRIVERS.get(driver.split(".", 1)[0])
    if kind is None:
        raise InvalidInput(
            f"store.using(): Django's database {wrapper.alias!r} runs on {wrapper.vendor}"
            f" through {driver}; fencing joins Django's transactions on psycopg (3),"
            " psycopg2, sqlite3, mysqlclient (MySQLdb) and PyMySQL (installed as MySQLdb)"
        )

    def get() -> Any:
        wrapper.ensure_connection()
        return wrapper.connection

    return Borrowed(kind, source, get=get)
