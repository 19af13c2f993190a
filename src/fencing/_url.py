"""Store URLs: ``StoreURL`` (a parsed URL whose repr hides secrets), the scheme table,
and ``redact_url``. Below the backends, which each take a ``StoreURL``."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Final
from urllib.parse import parse_qsl, urlsplit

from ._errors import ConfigurationError

__all__ = ["BACKENDS", "DRIVERS", "URL_HELP", "StoreURL", "redact_url", "resolve_url"]

# scheme -> (module, extra to install)
BACKENDS: Final = {
    "memory": ("fencing.backends.memory", None),
    "sqlite": ("fencing.backends.sqlite", None),
    "postgresql": ("fencing.backends.postgres", "postgres"),
    "postgres": ("fencing.backends.postgres", "postgres"),
    "mysql": ("fencing.backends.mysql", "mysql"),
    "mariadb": ("fencing.backends.mysql", "mysql"),
    "redis": ("fencing.backends.redis", "redis"),
    "rediss": ("fencing.backends.redis", "redis"),
}

# SQLAlchemy's ``dialect+driver://`` URLs: the drivers fencing's backends use, per scheme.
# ``mysql+aiomysql`` (an ``AsyncEngine``'s URL) and ``mysql+pymysql`` both open the MySQL
# backend, which takes PyMySQL for the sync store and aiomysql for the async one; so do
# ``sqlite+pysqlite`` and ``sqlite+aiosqlite`` the SQLite backend (the stdlib's sqlite3).
DRIVERS: Final = {
    "sqlite": ("pysqlite", "aiosqlite"),
    "postgresql": ("psycopg", "psycopg_async"),
    "postgres": ("psycopg", "psycopg_async"),
    "mysql": ("pymysql", "aiomysql"),
    "mariadb": ("pymysql", "aiomysql"),
}

# query parameters whose values are secrets (libpq takes ``?password=`` and ``sslpassword``)
_SECRET_PARAM = re.compile(
    r"([?&;](?:[a-z_]*pass(?:word|wd)?|secret|token|sslkey)=)[^&;#]*", re.IGNORECASE
)
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]{0,31}")


def redact_url(url: str) -> str:
    """``url`` with any password (in its user info or its query) replaced by ``***``.

    Works on malformed URLs too: everything between the user name and the *last* ``@``
    is taken as the password, so a password holding ``@``, ``/`` or ``:`` is hidden whole.
    """
    scheme, sep, rest = url.partition("://")
    if not sep:
        return "<a store URL without scheme://>"
    if scheme.lower().partition("+")[0] in ("sqlite", "memory"):
        return _SECRET_PARAM.sub(r"\1***", url)
    at = rest.rfind("@")
    if at >= 0:
        user, colon, _ = rest[:at].partition(":")
        rest = f"{user}{':***' if colon else ''}@{rest[at + 1 :]}"
    return _SECRET_PARAM.sub(r"\1***", f"{scheme}://{rest}")


@dataclass(frozen=True)
class StoreURL:
    """A parsed store URL; ``options`` are its query parameters. Its repr hides secrets."""

    raw: str = field(repr=False)
    scheme: str
    host: str | None
    port: int | None
    username: str | None
    password: str | None = field(repr=False)
    path: str
    options: dict[str, str] = field(default_factory=dict, repr=False)

    @classmethod
    def parse(cls, url: object) -> StoreURL:
        # Never echo the URL as given: it may hold a password. ``redact_url`` only.
        if not isinstance(url, str):
            raise ConfigurationError(f"a store URL is a string, not {type(url).__name__}")
        if "://" not in url:
            raise ConfigurationError("a store URL must look like scheme://...")
        scheme, rest = url.split("://", 1)
        scheme, plus, driver = scheme.lower().partition("+")
        if scheme not in BACKENDS:
            known = ", ".join(sorted(BACKENDS))
            shown = repr(scheme) if _SCHEME.fullmatch(scheme) else "(not a scheme)"
            raise ConfigurationError(f"unknown store URL scheme {shown}; known: {known}")
        if plus:
            _check_driver(scheme, driver)
        if scheme == "sqlite":
            path, _, query = rest.partition("?")
            if path.startswith("/"):
                path = path[1:]
            if not path:
                raise ConfigurationError(
                    "sqlite URL needs a path: sqlite:///app.db or sqlite://:memory:"
                )
            return cls(url, scheme, None, None, None, None, path, _options(query))
        try:
            parts = urlsplit(f"{scheme}://{rest}")  # ``psycopg_async`` is no URL scheme
            port = parts.port
        except ValueError:
            port = -1
        if port == -1:  # raised outside the handler: the parser's message (which may
            # quote part of the password) is neither the cause nor the context
            raise ConfigurationError(f"store URL {redact_url(url)!r} is malformed")
        return cls(
            url,
            scheme,
            parts.hostname,
            port,
            parts.username,
            parts.password,
            parts.path.lstrip("/"),
            _options(parts.query),
        )

    def option(self, name: str, default: str) -> str:
        return self.options.get(name, default)

    def redacted(self) -> str:
        """The URL with its password (user info or query) shown as ``***``."""
        return redact_url(self.raw)


def _check_driver(scheme: str, driver: str) -> None:
    drivers = DRIVERS.get(scheme, ())
    if driver in drivers:
        return
    shown = repr(driver) if driver and _SCHEME.fullmatch(driver) else "(not a driver name)"
    if not drivers:
        raise ConfigurationError(
            f"a {scheme} store URL takes no +driver (got {shown}): write {scheme}://..."
        )
    uses = " or ".join(f"{scheme}+{d}://" for d in drivers)
    raise ConfigurationError(
        f"fencing's {scheme} backend does not use the driver {shown}: write {scheme}://"
        f" or {uses} (fencing opens its own connections with "
        f"{_DRIVER_NAMES[scheme]})"
    )


_DRIVER_NAMES: Final = {
    "sqlite": "the standard library's sqlite3",
    "postgresql": "psycopg 3",
    "postgres": "psycopg 3",
    "mysql": "PyMySQL, and aiomysql for open_async",
    "mariadb": "PyMySQL, and aiomysql for open_async",
}


def _options(query: str) -> dict[str, str]:
    try:
        return dict(parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query)))
    except ValueError:
        pass
    # outside the handler: the parser's message would quote the query (secrets too)
    shown = _SECRET_PARAM.sub(r"\1***", "?" + query)
    raise ConfigurationError(f"store URL query {shown!r} is malformed")


#: What every ``URL`` argument's help ends with.
URL_HELP = (
    "; env:NAME or file:PATH reads it from an environment variable or a file, so a"
    " password stays out of the process list"
)


def resolve_url(given: str) -> str:
    """A store URL argument as given, or read from ``env:NAME`` / ``file:PATH``."""
    scheme, sep, rest = given.partition(":")
    if not sep or scheme not in ("env", "file"):
        return given
    if not rest:
        raise ConfigurationError(f"{scheme}: needs a name after it, e.g. {scheme}:FENCING_URL")
    if scheme == "env":
        found = os.environ.get(rest)
        if not found or not found.strip():
            raise ConfigurationError(f"the environment variable {rest} (env:{rest}) is not set")
        return found.strip()
    try:
        with open(rest, encoding="utf-8") as fh:
            text = fh.read().strip()
    except OSError as exc:
        raise ConfigurationError(f"cannot read the store URL from {rest}: {exc.strerror}") from None
    if not text or "\n" in text:
        raise ConfigurationError(f"{rest} must hold one store URL on one line")
    return text
