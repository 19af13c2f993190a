"""``fencing.open(url)`` / ``fencing.open_async(url)``: the URL picks the backend."""

from __future__ import annotations

import importlib
from typing import Any, Final, Literal

from ._astore import AsyncStore
from ._errors import ConfigurationError, InvalidInput, MissingDependency, StoreNotMigrated
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


#: ``migrate=``: True makes or upgrades fencing's tables; False touches nothing and checks
#: nothing; "check" touches nothing and requires a store there at this fencing's schema.
Migrate = bool | Literal["check"]


def _check_migrate(migrate: object) -> None:
    if migrate is not True and migrate is not False and migrate != "check":
        raise InvalidInput(f'migrate must be True, False or "check", not {migrate!r}')


def _backend_options(module: Any, migrate: Migrate, options: dict[str, Any]) -> dict[str, Any]:
    """A backend whose open makes the store (an SQLite file) is told not to, to check."""
    if migrate == "check" and getattr(module, "CREATES_ON_OPEN", False):
        return {**options, "create": False}
    return options


def _not_migrated(url: StoreURL, exc: StoreNotMigrated) -> StoreNotMigrated:
    """The opener's message: the store's URL (redacted) and what to run."""
    shown = url.redacted()
    if exc.found is None:
        text = f"no fencing store at {shown} ({exc}): run `fencing migrate URL` first"
    else:
        text = (
            f"the fencing store at {shown} is at schema version {exc.found}, older than"
            f" this fencing's ({exc.expected}): run `fencing migrate URL` to upgrade it"
        )
    return StoreNotMigrated(f"{text}; nothing was created or changed", exc.found, exc.expected)


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
    migrate: Migrate = True,
    max_state_bytes: int = DEFAULT_MAX_STATE_BYTES,
    retention: float = DEFAULT_RETENTION,
    **backend_options: Any,
) -> Store:
    """Open a store. ``migrate=False`` skips creating fencing's own tables on open;
    ``migrate="check"`` creates and changes nothing (not even an SQLite file) and raises
    ``StoreNotMigrated`` unless a store is there at this fencing's schema (what a
    monitor or a relay wants: a mistyped URL is an error, not a new empty store).

    URLs: ``sqlite:///app.db`` (``?synchronous=normal`` trades durability of the last
    commits on power loss for speed), ``sqlite://:memory:``, ``memory://``,
    ``postgresql://...``, ``mysql://...``, ``redis://...``; SQLAlchemy's forms of the
    drivers fencing uses (``postgresql+psycopg://``, ``mysql+pymysql://``,
    ``sqlite+pysqlite:///app.db``). ``url`` may also be a SQLAlchemy ``Engine`` (or
    ``URL``): fencing opens its own connections to the engine's database.
    """
    _check_migrate(migrate)
    parsed = StoreURL.parse(store_url_text(url))
    options = _store_options(max_state_bytes, retention)
    module = _module(parsed.scheme)
    try:
        backend: Backend = module.open_backend(
            parsed, **_backend_options(module, migrate, backend_options)
        )
    except StoreNotMigrated as exc:
        raise _not_migrated(parsed, exc) from None
    try:
        if migrate == "check":
            backend.check_schema()
        elif migrate:
            backend.migrate()
    except StoreNotMigrated as exc:
        backend.close()
        raise _not_migrated(parsed, exc) from None
    except BaseException:
        backend.close()
        raise
    return Store(backend, parsed.redacted(), options)


async def open_async(
    url: str | object,
    *,
    migrate: Migrate = True,
    max_state_bytes: int = DEFAULT_MAX_STATE_BYTES,
    retention: float = DEFAULT_RETENTION,
    **backend_options: Any,
) -> AsyncStore:
    """Open a store for asyncio; the same API with every store call awaitable.

    ``url`` may also be a SQLAlchemy ``AsyncEngine`` (``mysql+aiomysql://``,
    ``postgresql+psycopg://``, ``sqlite+aiosqlite://``) or ``Engine``.
    """
    _check_migrate(migrate)
    parsed = StoreURL.parse(store_url_text(url))
    options = _store_options(max_state_bytes, retention)
    module = _module(parsed.scheme)
    try:
        backend: AsyncBackend = await module.open_async_backend(
            parsed, **_backend_options(module, migrate, backend_options)
        )
    except StoreNotMigrated as exc:
        raise _not_migrated(parsed, exc) from None
    try:
        if migrate == "check":
            await backend.check_schema()
        elif migrate:
            await backend.migrate()
    except StoreNotMigrated as exc:
        await backend.close()
        raise _not_migrated(parsed, exc) from None
    except BaseException:
        await backend.close()
        raise
    return AsyncStore(backend, parsed.redacted(), options)
