"""``fencing.open(url)`` / ``fencing.open_async(url)``: the URL picks the backend."""

from __future__ import annotations

import importlib
from typing import Any, Final

from ._astore import AsyncStore
from ._errors import ConfigurationError, InvalidInput, MissingDependency
from ._store import Store
from ._storebase import StoreOptions
from ._url import BACKENDS, StoreURL
from ._validate import DEFAULT_MAX_STATE_BYTES
from .backends._contract import AsyncBackend, Backend

__all__ = ["DEFAULT_RETENTION", "open", "open_async"]

#: How long applied intent ids are kept for ``Duplicate`` detection (30 days).
#: After that a replayed intent is still refused, as ``Stale``: its version moved on.
DEFAULT_RETENTION: Final = 30 * 24 * 3600.0


def _module(scheme: str) -> Any:
    module, extra = BACKENDS[scheme]
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if extra is None or exc.name is None or exc.name.startswith("fencing"):
            if exc.name and exc.name.startswith("fencing.backends"):
                raise ConfigurationError(f"the {scheme} backend is not available yet") from exc
            raise
        raise _missing(extra, exc) from exc


def _missing(extra: str, exc: ModuleNotFoundError) -> Exception:
    return MissingDependency(
        f"the {extra} backend needs {exc.name}: pip install 'fencing[{extra}]'"
    )


def store_url_text(url: object) -> object:
    """The URL text of ``url``: a string as it is; a SQLAlchemy ``Engine`` or
    ``AsyncEngine`` (anything whose ``.url`` has ``render_as_string``) or a SQLAlchemy
    ``URL`` gives its URL, password included, which fencing then opens on its own
    connections. Duck-typed: the core never imports SQLAlchemy."""
    if isinstance(url, str):
        return url
    engine_url = getattr(url, "url", None)
    for candidate in (engine_url, url):
        render = getattr(candidate, "render_as_string", None)
        drivername = getattr(candidate, "drivername", None)
        if callable(render) and isinstance(drivername, str) and drivername.startswith("sqlite"):
            return _sqlite_text(candidate, drivername)
        if callable(render):
            text = render(hide_password=False)
            if isinstance(text, str):
                return text
    return url


def _sqlite_text(url: Any, drivername: str) -> str:
    """A SQLAlchemy SQLite URL's text, its path as is: ``render_as_string`` would
    percent-encode it (``%3Amemory%3A``), and an empty one (``sqlite://``) is memory."""
    database = url.database or ":memory:"
    query = "&".join(f"{k}={v}" for k, v in dict(url.query).items())
    return f"{drivername}:///{database}" + (f"?{query}" if query else "")


def _store_options(max_state_bytes: int, retention: float) -> StoreOptions:
    if isinstance(max_state_bytes, bool) or not isinstance(max_state_bytes, int):
        raise InvalidInput("max_state_bytes must be an integer")
    if not 2 <= max_state_bytes <= 64 << 20:
        raise InvalidInput("max_state_bytes must be from 2 bytes to 64 MiB")
    if not isinstance(retention, int | float) or not 60 <= retention <= 10 * 365 * 86400:
        raise InvalidInput("retention must be from 60 seconds to 10 years")
    return StoreOptions(max_state_bytes, float(retention))


def open(
    url: str | object,
    *,
    migrate: bool = True,
    max_state_bytes: int = DEFAULT_MAX_STATE_BYTES,
    retention: float = DEFAULT_RETENTION,
    **backend_options: Any,
) -> Store:
    """Open a store. ``migrate=False`` skips creating fencing's own tables on open.

    URLs: ``sqlite:///app.db`` (``?synchronous=normal`` trades durability of the last
    commits on power loss for speed), ``sqlite://:memory:``, ``memory://``,
    ``postgresql://...``, ``mysql://...``, ``redis://...``; SQLAlchemy's forms of the
    drivers fencing uses (``postgresql+psycopg://``, ``mysql+pymysql://``,
    ``sqlite+pysqlite:///app.db``). ``url`` may also be a SQLAlchemy ``Engine`` (or
    ``URL``): fencing opens its own connections to the engine's database.
    """
    parsed = StoreURL.parse(store_url_text(url))
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
    url: str | object,
    *,
    migrate: bool = True,
    max_state_bytes: int = DEFAULT_MAX_STATE_BYTES,
    retention: float = DEFAULT_RETENTION,
    **backend_options: Any,
) -> AsyncStore:
    """Open a store for asyncio; the same API with every store call awaitable.

    ``url`` may also be a SQLAlchemy ``AsyncEngine`` (``mysql+aiomysql://``,
    ``postgresql+psycopg://``, ``sqlite+aiosqlite://``) or ``Engine``.
    """
    parsed = StoreURL.parse(store_url_text(url))
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
