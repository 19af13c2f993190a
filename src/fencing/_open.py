"""``fencing.open(url)`` / ``fencing.open_async(url)``: the URL picks the backend."""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import parse_qsl, urlsplit

from ._astore import AsyncStore
from ._errors import ConfigurationError, InvalidInput
from ._front import StoreOptions
from ._store import Store
from ._validate import DEFAULT_MAX_STATE_BYTES
from .backends._contract import AsyncBackend, Backend

__all__ = ["DEFAULT_RETENTION", "StoreURL", "open", "open_async"]

#: How long applied intent ids are kept for ``Duplicate`` detection (30 days).
#: After that a replayed intent is still refused, as ``Stale``: its version moved on.
DEFAULT_RETENTION: Final = 30 * 24 * 3600.0

# scheme -> (module, extra to install)
_BACKENDS: Final = {
    "memory": ("fencing.backends.memory", None),
    "sqlite": ("fencing.backends.sqlite", None),
    "postgresql": ("fencing.backends.postgres", "postgres"),
    "postgres": ("fencing.backends.postgres", "postgres"),
    "mysql": ("fencing.backends.mysql", "mysql"),
    "mariadb": ("fencing.backends.mysql", "mysql"),
    "redis": ("fencing.backends.redis", "redis"),
    "rediss": ("fencing.backends.redis", "redis"),
}


@dataclass(frozen=True)
class StoreURL:
    """A parsed store URL; ``options`` are its query parameters."""

    raw: str
    scheme: str
    host: str | None
    port: int | None
    username: str | None
    password: str | None
    path: str
    options: dict[str, str] = field(default_factory=dict)

    @classmethod
    def parse(cls, url: object) -> StoreURL:
        if not isinstance(url, str) or "://" not in url:
            raise ConfigurationError(f"store URL {url!r} must look like scheme://...")
        scheme, rest = url.split("://", 1)
        scheme = scheme.lower()
        if scheme not in _BACKENDS:
            known = ", ".join(sorted(_BACKENDS))
            raise ConfigurationError(f"unknown store URL scheme {scheme!r}; known: {known}")
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
            parts = urlsplit(url)
            port = parts.port
        except ValueError as exc:
            raise ConfigurationError(f"store URL {url!r} is malformed: {exc}") from exc
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
        if self.password:
            return self.raw.replace(f":{self.password}@", ":***@")
        return self.raw


def _options(query: str) -> dict[str, str]:
    try:
        return dict(parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query)))
    except ValueError as exc:
        raise ConfigurationError(f"store URL query {query!r} is malformed") from exc


def _module(scheme: str) -> Any:
    module, extra = _BACKENDS[scheme]
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if extra is None or exc.name is None or exc.name.startswith("fencing"):
            if exc.name and exc.name.startswith("fencing.backends"):
                raise ConfigurationError(f"the {scheme} backend is not available yet") from exc
            raise
        raise _missing(extra, exc) from exc


def _missing(extra: str, exc: ModuleNotFoundError) -> Exception:
    from ._errors import MissingDependency

    return MissingDependency(
        f"the {extra} backend needs {exc.name}: pip install 'fencing[{extra}]'"
    )


def _store_options(max_state_bytes: int, retention: float) -> StoreOptions:
    if isinstance(max_state_bytes, bool) or not isinstance(max_state_bytes, int):
        raise InvalidInput("max_state_bytes must be an integer")
    if not 2 <= max_state_bytes <= 64 << 20:
        raise InvalidInput("max_state_bytes must be from 2 bytes to 64 MiB")
    if not isinstance(retention, int | float) or not 60 <= retention <= 10 * 365 * 86400:
        raise InvalidInput("retention must be from 60 seconds to 10 years")
    return StoreOptions(max_state_bytes, float(retention))


def open(
    url: str,
    *,
    migrate: bool = True,
    max_state_bytes: int = DEFAULT_MAX_STATE_BYTES,
    retention: float = DEFAULT_RETENTION,
    **backend_options: Any,
) -> Store:
    """Open a store. ``migrate=False`` skips creating fencing's own tables on open.

    URLs: ``sqlite:///app.db`` (``?synchronous=normal`` trades durability of the last
    commits on power loss for speed), ``sqlite://:memory:``, ``memory://``,
    ``postgresql://...``, ``mysql://...``, ``redis://...``.
    """
    parsed = StoreURL.parse(url)
    options = _store_options(max_state_bytes, retention)
    backend: Backend = _module(parsed.scheme).open_backend(parsed, **backend_options)
    try:
        if migrate:
            backend.migrate()
    except BaseException:
        backend.close()
        raise
    return Store(backend, parsed.redacted(), options)


async def open_async(
    url: str,
    *,
    migrate: bool = True,
    max_state_bytes: int = DEFAULT_MAX_STATE_BYTES,
    retention: float = DEFAULT_RETENTION,
    **backend_options: Any,
) -> AsyncStore:
    """Open a store for asyncio; the same API with every store call awaitable."""
    parsed = StoreURL.parse(url)
    options = _store_options(max_state_bytes, retention)
    backend: AsyncBackend = await _module(parsed.scheme).open_async_backend(
        parsed, **backend_options
    )
    try:
        if migrate:
            await backend.migrate()
    except BaseException:
        await backend.close()
        raise
    return AsyncStore(backend, parsed.redacted(), options)
