"""PostgreSQL's options: ``postgresql://user:password@host:5432/db?schema=fencing&max_size=10``
(see ``docs/backends/postgres.md``); everything fencing does not know goes to libpq."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import unquote

import psycopg
from psycopg.conninfo import make_conninfo

from ..._errors import ConfigurationError, InvalidIdentifier
from ..._url import StoreURL
from ..._validate import check_column
from .statements import SESSION, SESSION_IN_SCHEMA

__all__ = ["Settings", "settings_from_url"]

T = TypeVar("T")


@dataclass(frozen=True)
class Settings:
    """What ``open_backend`` understood of a URL and its options (its repr hides the
    conninfo, which holds the password)."""

    conninfo: str = field(repr=False)
    where: str
    schema: str | None = None
    min_size: int = 1
    max_size: int = 10
    pool_timeout: float = 30.0
    connect_kwargs: Mapping[str, Any] = field(default_factory=dict)
    #: seconds a statement on the store's own connections waits for a lock (0: no limit)
    lock_timeout: float = 5.0

    def session(self) -> tuple[str, dict[str, Any]]:
        """The statement (and its parameters) that sets up each of the store's own
        connections: its lock timeout, and its schema first on the search path."""
        params: dict[str, Any] = {"lock_timeout": f"{round(self.lock_timeout * 1000)}ms"}
        if self.schema is None:
            return SESSION, params
        return SESSION_IN_SCHEMA, {**params, "schema": self.schema}

    def pool_kwargs(self) -> dict[str, Any]:
        return {
            "conninfo": self.conninfo,
            "kwargs": {"autocommit": True, **self.connect_kwargs},
            "min_size": self.min_size,
            "max_size": self.max_size,
            "timeout": self.pool_timeout,
            "name": "fencing",
            "open": False,
        }


def _number(name: str, raw: object, low: float, kind: Callable[[Any], T]) -> T:
    try:
        if isinstance(raw, bool):
            raise ValueError(raw)
        value = kind(raw)
    except (TypeError, ValueError):
        raise ConfigurationError(f"postgresql option {name}={raw!r} must be a number") from None
    if value < low:  # type: ignore[operator]
        raise ConfigurationError(f"postgresql option {name}={raw!r} must be at least {low}")
    return value


def settings_from_url(url: StoreURL, options: Mapping[str, Any]) -> Settings:
    """Our options out of the URL's query and ``options``; the rest go to libpq."""
    merged: dict[str, Any] = {**url.options, **options}
    schema = merged.pop("schema", None)
    if schema is not None:
        try:
            schema = check_column(schema, "schema")
        except InvalidIdentifier as exc:
            raise ConfigurationError(f"postgresql option schema: {exc}") from exc
    min_size = _number("min_size", merged.pop("min_size", 1), 0, int)
    max_size = _number("max_size", merged.pop("max_size", max(10, min_size)), 1, int)
    if max_size < min_size:
        raise ConfigurationError(f"postgresql max_size={max_size} is below min_size={min_size}")
    pool_timeout = _number("pool_timeout", merged.pop("pool_timeout", 30.0), 0.001, float)
    lock_timeout = _number("lock_timeout", merged.pop("lock_timeout", 5.0), 0, float)
    if 0 < lock_timeout < 0.001:
        raise ConfigurationError(
            f"postgresql option lock_timeout={lock_timeout!r} must be 0 (no limit) or at"
            " least 0.001 (seconds)"
        )
    connect_kwargs: dict[str, Any] = {}
    if "prepare_threshold" in merged:
        raw = merged.pop("prepare_threshold")
        none = raw is None or str(raw).lower() == "none"
        connect_kwargs["prepare_threshold"] = (
            None if none else _number("prepare_threshold", raw, 0, int)
        )
    params: dict[str, Any] = {
        "host": url.host,
        "port": url.port,
        "user": unquote(url.username) if url.username else None,
        "password": unquote(url.password) if url.password else None,
        "dbname": unquote(url.path) or None,
        "application_name": "fencing",
        "connect_timeout": 10,
    }
    params.update(merged)  # everything else is a libpq parameter (sslmode, ...)
    try:
        conninfo = make_conninfo("", **{k: v for k, v in params.items() if v is not None})
    except psycopg.ProgrammingError as exc:
        raise ConfigurationError(f"postgresql URL: {exc}") from exc
    where = f"{params['host'] or 'localhost'}:{params['port'] or 5432}/{params['dbname'] or ''}"
    return Settings(
        conninfo, where, schema, min_size, max_size, pool_timeout, connect_kwargs, lock_timeout
    )
