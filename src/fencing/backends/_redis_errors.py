"""redis-py's failures that are a lost connection in disguise, and a Cluster client that
forgot every node: what the Redis backends need to keep their error contract.

A lost connection has an unknown outcome and must surface as ``TransientStoreError``;
some of redis-py's own races under concurrent use raise other exceptions for it.
"""

from __future__ import annotations

import importlib
from typing import Any

from .._errors import TransientStoreError

__all__ = ["dropped_under_us", "lost_connection", "revive"]


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
    if any(f.endswith(_CONNECTION_FILES) or "/redis/_parsers/" in f for f in files):
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


def revive(client: Any, configured: tuple[str, int], module: str, known: dict[str, Any]) -> None:
    """Give a Cluster client its nodes back once it has forgotten them all.

    redis-py drops a node from its startup nodes on every connection error it sees
    there (redis/redis-py#3693; the sync client's startup nodes are its node cache
    too); when connections to every primary fail at once (a network blip, a proxy
    restart), or several threads or tasks fail together, none is left and the client
    could never connect again. ``known`` (the caller's, kept between calls) holds the
    addresses seen so far; the nodes are rediscovered from them and the ``configured``
    (host, port) of the store's URL.
    """
    manager: Any = getattr(client, "nodes_manager", None)
    if manager is None:
        return
    nodes = manager.startup_nodes
    if nodes:
        if len(nodes) > len(known):
            known.update({name: (n.host, n.port) for name, n in list(nodes.items())})
        return
    node_class = importlib.import_module(module).ClusterNode
    extra = {} if module == "redis.cluster" else manager.connection_kwargs
    addresses = {**known, "": configured}
    for host, port in addresses.values():
        if f"{host}:{port}" not in nodes:  # redis-py's node names
            nodes[f"{host}:{port}"] = node_class(host, port, **extra)


def lost_connection(exc: BaseException) -> TransientStoreError:
    return TransientStoreError(
        f"redis: the connection was closed while in use ({exc}; the outcome is unknown:"
        " retry with the same intent; a commit that landed reports Duplicate)"
    )
