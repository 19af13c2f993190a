"""A fencing store per Django database alias, built from ``DATABASES``.

``store(alias)`` opens fencing on the database Django's ``connections[alias]`` points at
*now*: the URL is derived from the connection's ``settings_dict`` at every call, so once
Django's test runner has switched ``NAME`` to the test database, the next call opens a
store there (and closes the one on the old name). The stores are opened lazily, on
first use, and fencing's own tables are created then (``migrate=True``, as
``fencing.open`` does; ``FENCING["MIGRATE"]`` says otherwise). The app closes them
before Django's test runner destroys a test database, so the database can be dropped.

Settings (all optional)::

    FENCING = {
        "OPTIONS": {"default": {"schema": "fencing", "max_size": 4}},  # fencing.open() options
        "MIGRATE": True,                            # or "check", or False
        "SIGNING_KEYS": {"k2": "secret", "k1": "older secret"},
        "SIGNING_KEY": "k2",                        # the current one; default: the first
    }
"""

from __future__ import annotations

import os
import threading
import urllib.parse
from collections.abc import Mapping
from typing import Any

import fencing
from fencing import ConfigurationError, Signer, Store

__all__ = ["alias_of", "close_stores", "database_url", "signer", "store"]

_lock = threading.RLock()
#: alias -> (the URL it was opened on, the store)
_stores: dict[str, tuple[str, Store]] = {}


def _forget_after_fork() -> None:
    """A forked child (a Celery prefork worker, a forking server) opens stores of its
    own: the parent's connections are the parent's (closing them here would end the
    parent's sessions too; they are left to the parent), and their pools' threads did
    not come along."""
    global _lock
    _lock = threading.RLock()
    _orphans.extend(held for _, held in _stores.values())  # kept: never finalized here
    _stores.clear()


_orphans: list[Store] = []


os.register_at_fork(after_in_child=_forget_after_fork)
#: PostgreSQL connection options Django passes to libpq that fencing's connections need too
_LIBPQ = (
    "sslmode",
    "sslrootcert",
    "sslcert",
    "sslkey",
    "sslcrl",
    "passfile",
    "service",
    "connect_timeout",
    "target_session_attrs",
)


def _settings() -> Mapping[str, Any]:
    from django.conf import settings

    found = getattr(settings, "FENCING", None) or {}
    if not isinstance(found, Mapping):
        raise ConfigurationError("settings.FENCING must be a dict")
    return found


def _q(value: object) -> str:
    return urllib.parse.quote(str(value), safe="")


def database_url(alias: str = "default") -> str:
    """The fencing URL of the database ``connections[alias]`` is configured for now."""
    from django.db import connections

    wrapper = connections[alias]
    conf = wrapper.settings_dict
    vendor = wrapper.vendor
    name = conf.get("NAME")
    if vendor == "sqlite":
        if not name or wrapper.is_in_memory_db() or str(name).startswith("file:"):
            raise ConfigurationError(_in_memory(alias))
        return "sqlite:///" + os.path.abspath(str(name))
    if vendor not in ("postgresql", "mysql"):
        raise ConfigurationError(
            f"fencing has no backend for Django's {vendor} database {alias!r}"
            " (PostgreSQL, MySQL/MariaDB and SQLite are supported)"
        )
    auth = ""
    if conf.get("USER"):
        auth = _q(conf["USER"]) + (f":{_q(conf['PASSWORD'])}" if conf.get("PASSWORD") else "")
        auth += "@"
    host = str(conf.get("HOST") or ("" if vendor == "postgresql" else "localhost"))
    if ":" in host and not host.startswith("/"):
        host = f"[{host}]"  # an IPv6 address
    elif host.startswith("/"):
        host = ""  # a unix socket directory: given as libpq's host option below
    port = f":{conf['PORT']}" if conf.get("PORT") else ""
    scheme = "postgresql" if vendor == "postgresql" else "mysql"
    query: dict[str, str] = {}
    options = conf.get("OPTIONS") or {}
    if vendor == "postgresql":
        query.update({k: str(options[k]) for k in _LIBPQ if k in options})
        if str(conf.get("HOST") or "").startswith("/"):
            query["host"] = str(conf["HOST"])
    tail = f"?{urllib.parse.urlencode(query)}" if query else ""
    return f"{scheme}://{auth}{host}{port}/{_q(name or '')}{tail}"


def _in_memory(alias: str) -> str:
    return (
        f"Django's database {alias!r} is an in-memory SQLite database, which fencing's own"
        " connections cannot reach: use a file (for tests, set"
        f" DATABASES[{alias!r}]['TEST']['NAME'] to a file name)"
    )


def store(alias: str = "default") -> Store:
    """The fencing store on Django's database ``alias`` (opened on first use; reopened
    when the alias's database changes, as when Django's test runner switches to the
    test database). Thread-safe; the store is shared like Django's settings are.

    Ask for it where you use it (``store().table(Order)``): a store kept from import
    time would stay on the database of that time."""
    url = database_url(alias)
    with _lock:
        held = _stores.get(alias)
        if held is not None and held[0] == url and not held[1].closed:
            return held[1]
        if held is not None:
            del _stores[alias]
            held[1].close()
        conf = _settings()
        options = dict((conf.get("OPTIONS") or {}).get(alias) or {})
        migrate = conf.get("MIGRATE", True)
        opened = fencing.open(url, migrate=migrate, **options)
        _stores[alias] = (url, opened)
        return opened


def alias_of(candidate: object) -> str | None:
    """The alias whose store ``candidate`` is (None if it is none of them)."""
    with _lock:
        for alias, (_, held) in _stores.items():
            if held is candidate:
                return alias
    return None


def close_stores(alias: str | None = None) -> None:
    """Close the stores opened by :func:`store` (all, or ``alias``'s); the next
    ``store()`` opens a new one."""
    with _lock:
        names = list(_stores) if alias is None else [alias] if alias in _stores else []
        closing = [_stores.pop(name)[1] for name in names]
    for held in closing:
        held.close()


def signer() -> Signer:
    """A :class:`fencing.Signer` from ``FENCING["SIGNING_KEYS"]`` (key id -> secret, str
    or bytes) and ``FENCING["SIGNING_KEY"]`` (the current key id; default: the first)."""
    conf = _settings()
    keys = conf.get("SIGNING_KEYS")
    if not keys or not isinstance(keys, Mapping):
        raise ConfigurationError(
            'settings.FENCING["SIGNING_KEYS"] must map key ids to secrets to sign intents'
        )
    secrets = {kid: s.encode() if isinstance(s, str) else bytes(s) for kid, s in keys.items()}
    current = conf.get("SIGNING_KEY") or next(iter(secrets))
    return Signer(keys=secrets, current=current)
