"""MySQL's options: ``mysql://user:password@host:3306/db?pool_size=5`` (also ``mariadb://``).

URL query or keyword: ``pool_size`` (5), ``pool_timeout`` seconds to wait for a free
connection (30), ``connect_timeout`` (10), ``lock_wait_timeout`` seconds a statement waits
for a row lock, ``innodb_lock_wait_timeout`` of the session (10), ``pool_recycle`` seconds
an idle connection is kept (3600), ``unix_socket``; keyword only: ``ssl`` (a dict or
``ssl.SSLContext`` handed to the driver).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import unquote

from ..._errors import ConfigurationError
from ..._url import StoreURL
from .errors import driver_module
from .steps import Batch

__all__ = ["Settings", "settings_from_url"]

_OPTIONS: Final = {
    "pool_size": int,
    "pool_timeout": float,
    "connect_timeout": float,
    "lock_wait_timeout": int,
    "pool_recycle": float,
    "unix_socket": str,
}


@dataclass(frozen=True)
class Settings:
    host: str
    port: int
    user: str | None
    password: str = field(repr=False)
    database: str
    unix_socket: str | None = None
    pool_size: int = 5
    pool_timeout: float = 30.0
    connect_timeout: float = 10.0
    lock_wait_timeout: int = 10
    pool_recycle: float = 3600.0
    ssl: Any = None

    @property
    def server(self) -> tuple[str, int, str | None]:
        """Which server: its row locks are the same for every database on it."""
        return (self.host, self.port, self.unix_socket)

    def driver_kwargs(self, database_arg: str = "database") -> dict[str, Any]:
        """What PyMySQL's ``connect`` takes (aiomysql's: ``database_arg="db"``)."""
        client = driver_module("pymysql.constants.CLIENT")
        kwargs: dict[str, Any] = {
            "host": self.host,
            "port": self.port,
            "user": self.user,
            "password": self.password,
            database_arg: self.database,
            "charset": "utf8mb4",
            "autocommit": True,
            "client_flag": client.FOUND_ROWS | client.MULTI_STATEMENTS,
            "connect_timeout": self.connect_timeout,
        }
        if self.unix_socket:
            kwargs["unix_socket"] = self.unix_socket
        if self.ssl is not None:
            kwargs["ssl"] = self.ssl
        return kwargs

    def session_setup(self) -> Batch:
        """Run once on every new connection."""
        return Batch(
            f"SET time_zone = '+00:00', innodb_lock_wait_timeout = {int(self.lock_wait_timeout)};\n"
            "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED",
            None,
        )


def settings_from_url(url: StoreURL, options: dict[str, Any]) -> Settings:
    """Settings from a parsed ``StoreURL`` and keyword options (keywords win)."""
    unknown = (set(url.options) - set(_OPTIONS)) | (set(options) - set(_OPTIONS) - {"ssl"})
    if unknown:
        raise ConfigurationError(
            f"unknown mysql option(s) {sorted(unknown)}; known: {sorted([*_OPTIONS, 'ssl'])}"
        )
    values: dict[str, Any] = {}
    for name, kind in _OPTIONS.items():
        raw = options.get(name, url.options.get(name))
        if raw is None:
            continue
        try:
            value = kind(raw)
        except (TypeError, ValueError):
            raise ConfigurationError(
                f"mysql option {name}={raw!r} must be {kind.__name__}"
            ) from None
        if kind is not str and not value > 0:
            raise ConfigurationError(f"mysql option {name}={raw!r} must be positive")
        values[name] = value
    database = unquote(url.path or "")
    if not database or "/" in database:
        raise ConfigurationError(
            "a mysql URL names its database: mysql://user:password@host:3306/dbname"
        )
    return Settings(
        host=url.host or "localhost",
        port=url.port or 3306,
        user=unquote(url.username) if url.username else None,
        password=unquote(url.password) if url.password else "",
        database=database,
        ssl=options.get("ssl"),
        **values,
    )
