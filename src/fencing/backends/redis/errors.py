"""Redis's errors, translated at the boundary (``translate``), and redis-py's failures
that are a lost connection in disguise (``dropped_under_us``).

A lost connection has an unknown outcome and must surface as ``TransientStoreError``;
some of redis-py's own races under concurrent use raise other exceptions for it. The
redis-py exception classes are imported lazily (``driver_errors``), as the driver is.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from ..._errors import (
    ConfigurationError,
    FencingError,
    SchemaError,
    StoreError,
    TransientStoreError,
)

__all__ = [
    "SCHEMA_ERROR",
    "DriverErrors",
    "driver_errors",
    "dropped_under_us",
    "lost_connection",
    "raise_error",
    "translate",
]

#: The error code the scripts use for a table row fencing cannot read.
SCHEMA_ERROR: Final = "FENCING_SCHEMA"


@dataclass(frozen=True, slots=True)
class DriverErrors:
    """The redis-py exception classes the flows and backends use (imported once, lazily)."""

    no_script: type[BaseException]
    response: type[BaseException]
    errors: tuple[type[BaseException], ...]
    #: error replies of a Cluster node that refused a command without running it
    #: (MOVED, ASK: a redirection; TRYAGAIN: its keys are mid-migration)
    refused: tuple[type[BaseException], ...]


@functools.cache
def driver_errors() -> DriverErrors:
    from redis import exceptions as rx

    return DriverErrors(
        rx.NoScriptError,
        rx.ResponseError,
        (rx.RedisError, rx.RedisClusterException),
        (rx.AskError, rx.TryAgainError),  # MovedError is an AskError
    )


def translate(exc: BaseException) -> FencingError:
    """A driver error as fencing's error (raise it ``from exc``)."""
    from redis import exceptions as rx

    text = f"redis: {exc}"
    if isinstance(exc, rx.AuthenticationError | rx.AuthorizationError):
        # refused credentials or ACL: retrying cannot fix it
        return ConfigurationError(f"{text} (the URL's credentials or the user's ACL)")
    if isinstance(
        exc,
        rx.ConnectionError
        | rx.TimeoutError
        | rx.TryAgainError
        | rx.ClusterError
        | rx.ReadOnlyError,
    ):
        return TransientStoreError(
            f"{text} (the outcome is unknown: retry with the same intent; a commit that"
            " landed reports Duplicate)"
        )
    if isinstance(exc, rx.RedisClusterException):
        # raised by redis-py's Cluster client itself, before or instead of a command
        if "cluster mode is not enabled" in str(exc).lower():
            return ConfigurationError(
                f"{text} (this server is not a Redis Cluster: drop cluster=true)"
            )
        cause = exc.__cause__
        # "cannot be connected": no node answered while redis-py rediscovered the
        # Cluster; after connections dropped, its threads can also break each other's
        # reconnect (a parser reset under another thread): either way, a lost connection
        if (
            isinstance(exc, rx.SlotNotCoveredError)
            or isinstance(cause, rx.ConnectionError | rx.TimeoutError)
            or "cannot be connected" in str(exc)
        ):
            return TransientStoreError(
                f"{text} (the outcome is unknown: retry with the same intent; a commit that"
                " landed reports Duplicate)"
            )
    if isinstance(exc, rx.ResponseError) and str(exc).startswith(("MOVED ", "ASK ")):
        # a redirection only reaches us from a client that does not follow them
        return ConfigurationError(
            f"{text} (this server is a Redis Cluster node: add cluster=true to the URL)"
        )
    if isinstance(exc, rx.ResponseError) and str(exc).startswith(SCHEMA_ERROR):
        return SchemaError(f"redis: {str(exc)[len(SCHEMA_ERROR) :].strip()}")
    if "shebang" in str(exc).lower():
        return ConfigurationError(f"{text} (fencing needs Redis 7.0 or newer)")
    return StoreError(text)


def raise_error(reply: object) -> None:
    """Raise an error reply (a ``Send`` step hands them back as values), translated."""
    if isinstance(reply, BaseException):
        raise translate(reply) from reply


def dropped_under_us(exc: BaseException) -> bool:
    """Whether redis-py failed because a connection was closed, or the Cluster client's
    view of its nodes was reset, by another thread or task while in use.

    redis-py then raises ``AttributeError`` or ``TypeError`` on the connection's cleared
    socket, reader or writer instead of ``ConnectionError`` (redis/redis-py#3546,
    #4287), or its Cluster client finds no node where it had one (``'NoneType' object
    has no attribute 'name'``, redis/redis-py#3835), or, recovering from a lost
    connection, its sync Cluster client trips over another thread's recovery
    (``RuntimeError: dictionary changed size during iteration``). All are a lost
    connection: the outcome of what was sent is unknown.
    """
    if not isinstance(exc, AttributeError | TypeError | RuntimeError):
        return False
    files: list[str] = []
    tb = exc.__traceback__
    while tb is not None:
        files.append(tb.tb_frame.f_code.co_filename.replace("\\", "/"))
        tb = tb.tb_next
    if _recovering(exc):
        return True  # whatever broke while the driver handled a lost connection
    if isinstance(exc, RuntimeError) or "NoneType" not in str(exc):
        return False
    if any(_driver_file(f) or "/redis/_parsers/" in f for f in files):
        return True
    return bool(files) and files[-1].endswith(("redis/cluster.py", "redis/asyncio/cluster.py"))


def _recovering(exc: BaseException) -> bool:
    """Whether ``exc`` was raised while redis-py handled a lost connection."""
    seen = exc.__context__
    while seen is not None:
        for cls in type(seen).__mro__:
            if cls.__module__.startswith("redis") and cls.__name__ in _LOST:
                return True
        seen = seen.__context__
    return False


_LOST = ("ConnectionError", "TimeoutError")
_CONNECTION_FILES = ("redis/connection.py", "redis/asyncio/connection.py")
#: This package's own files (its ``connection.py`` also ends in ``redis/connection.py``).
_HERE = str(Path(__file__).parent).replace("\\", "/") + "/"


def _driver_file(name: str) -> bool:
    """Whether ``name`` is redis-py's connection module (sync or asyncio)."""
    return name.endswith(_CONNECTION_FILES) and not name.startswith(_HERE)


def lost_connection(exc: BaseException) -> TransientStoreError:
    return TransientStoreError(
        f"redis: the connection was closed while in use ({exc}; the outcome is unknown:"
        " retry with the same intent; a commit that landed reports Duplicate)"
    )
