"""The demo's broker chores: its URL, is it there, and deleting only the run's own keys."""

from __future__ import annotations

import socket
from urllib.parse import urlsplit, urlunsplit

from ..._errors import ConfigurationError
from ..config import DemoConfig

DEFAULT_BROKER = "redis://127.0.0.1:6379/10"  # a database the test suite does not use
AMQP_SCHEMES = ("amqp", "pyamqp")


def broker_url(config: DemoConfig) -> str:
    return config.broker or DEFAULT_BROKER


def shown_broker(config: DemoConfig) -> str:
    """The broker URL to print: without its password."""
    url = broker_url(config)
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = f"{parts.username or ''}:***@{parts.hostname or ''}"
    if parts.port is not None:
        netloc += f":{parts.port}"
    return urlunsplit(parts._replace(netloc=netloc))


def check(queue: str, url: str, schemes: tuple[str, ...]) -> None:
    """Raise ``ConfigurationError`` (exit 2) unless ``url`` suits the queue and answers."""
    parts = urlsplit(url)
    if parts.scheme not in schemes:
        raise ConfigurationError(
            f"--broker for {queue} must be a {' or '.join(sorted(set(schemes)))} URL,"
            f" not {_safe(url)!r}"
        )
    if parts.scheme.startswith("redis"):
        import redis

        client = redis.Redis.from_url(url, socket_connect_timeout=2.0, socket_timeout=2.0)
        try:
            client.ping()
        except redis.RedisError as exc:
            raise ConfigurationError(
                f"cannot reach the {queue} broker at {_safe(url)}: {exc}"
            ) from None
        finally:
            client.close()
        return
    host = parts.hostname or "127.0.0.1"
    port = parts.port or 5672
    try:
        socket.create_connection((host, port), timeout=2.0).close()
    except OSError as exc:
        raise ConfigurationError(
            f"cannot reach the {queue} broker at {_safe(url)}: {exc}"
        ) from None


def _safe(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    return url.replace(f":{parts.password}@", ":***@", 1)


def redis_delete(url: str, patterns: list[str], sets: dict[str, list[str]] | None = None) -> None:
    """Delete the keys matching ``patterns`` (the run's own), and members of shared sets."""
    import redis

    client = redis.Redis.from_url(url, socket_connect_timeout=2.0)
    try:
        for pattern in patterns:
            keys = list(client.scan_iter(match=pattern, count=500))
            for start in range(0, len(keys), 500):
                client.delete(*keys[start : start + 500])
        for name, members in (sets or {}).items():
            if members:
                client.srem(name, *members)
    finally:
        client.close()
