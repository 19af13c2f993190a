"""A Redis store's settings, from its URL and ``fencing.open``'s keyword options:
``redis://[user:password@]host[:port][/db][?option=value...]`` (``rediss://`` for TLS).
The options are described in ``docs/backends/redis.md``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import unquote

from ..._errors import ConfigurationError
from ..._url import StoreURL
from .layout import Layout
from .steps import Command

__all__ = ["Settings", "settings_from_url"]


@dataclass(frozen=True, slots=True)
class Settings:
    """A Redis store's connection and behaviour, parsed from its URL and options."""

    layout: Layout
    host: str = "localhost"
    port: int = 6379
    db: int = 0
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    ssl: bool = False
    wait_replicas: int = 0
    wait_timeout_ms: int = 1000
    socket_timeout: float = 10.0
    connect_timeout: float = 5.0
    client_name: str | None = None
    allow_eviction: bool = False

    @property
    def wait(self) -> Command | None:
        if self.wait_replicas <= 0:
            return None
        return ("WAIT", self.wait_replicas, self.wait_timeout_ms)


_OPTIONS: Final = frozenset(
    {
        "prefix",
        "table_prefix",
        "wait_replicas",
        "wait_timeout_ms",
        "cluster",
        "socket_timeout",
        "connect_timeout",
        "client_name",
        "allow_eviction",
    }
)


def _bool(name: str, value: object) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ConfigurationError(f"redis option {name}={value!r} must be true or false")


def _number(name: str, value: object, low: float, high: float, *, integer: bool) -> float:
    try:
        if isinstance(value, bool):
            raise ValueError
        number = int(str(value)) if integer else float(str(value))
    except ValueError:
        kind = "an integer" if integer else "a number"
        raise ConfigurationError(f"redis option {name}={value!r} must be {kind}") from None
    if not low <= number <= high:
        raise ConfigurationError(f"redis option {name}={value!r} must be from {low} to {high}")
    return number


def settings_from_url(url: StoreURL, options: dict[str, Any]) -> Settings:
    """Settings from a URL and ``fencing.open`` keyword options.

    Our own options are removed from ``options``; what is left goes to redis-py.
    """
    unknown = set(url.options) - _OPTIONS
    if unknown:
        raise ConfigurationError(
            f"unknown redis URL option(s) {sorted(unknown)}; known: {sorted(_OPTIONS)}"
        )
    raw: dict[str, object] = dict(url.options)
    raw.update({name: options.pop(name) for name in list(options) if name in _OPTIONS})
    cluster = _bool("cluster", raw.get("cluster", False))
    layout = Layout(str(raw.get("prefix", "fencing")), str(raw.get("table_prefix", "")), cluster)
    path = url.path.strip("/")
    if path and not path.isdigit():
        raise ConfigurationError(f"redis URL path {url.path!r} must be a database number")
    db = int(path or 0)
    if cluster and db != 0:
        raise ConfigurationError("Redis Cluster has only database 0")
    wait = int(_number("wait_replicas", raw.get("wait_replicas", 0), 0, 100, integer=True))
    if cluster and wait:
        raise ConfigurationError("wait_replicas is not available with cluster=true")
    name = raw.get("client_name")
    return Settings(
        layout=layout,
        host=url.host or "localhost",
        port=url.port or 6379,
        db=db,
        username=unquote(url.username) if url.username else None,
        password=unquote(url.password) if url.password else None,
        ssl=url.scheme == "rediss",
        wait_replicas=wait,
        wait_timeout_ms=int(
            _number("wait_timeout_ms", raw.get("wait_timeout_ms", 1000), 1, 3_600_000, integer=True)
        ),
        socket_timeout=_number(
            "socket_timeout", raw.get("socket_timeout", 10.0), 0.001, 3600, integer=False
        ),
        connect_timeout=_number(
            "connect_timeout", raw.get("connect_timeout", 5.0), 0.001, 3600, integer=False
        ),
        client_name=None if name is None else str(name),
        allow_eviction=_bool("allow_eviction", raw.get("allow_eviction", False)),
    )
