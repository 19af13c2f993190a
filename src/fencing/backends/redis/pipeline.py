"""Several commands in one round trip on a (synchronous) Redis Cluster, each sent once.

redis-py's sync ``ClusterPipeline`` sends a command again, alone, when its node's
connection failed ("RETRY MAGIC" in ``_send_cluster_commands``, redis-py 5.3), and it
marks every command of that node failed, those already answered too: a commit that
ran was sent a second time and answered ``Duplicate`` of its own write, and nothing
told the caller the first send had happened (found by the linearizability churn on
the Cluster). fencing never re-sends a command that may have run, so it pipelines on a
Cluster itself (``send_once``): the commands are grouped by the primary that serves
their first key's slot, written to every node, then the replies read. A node whose
connection fails gives that error as the reply of each of its commands not yet
answered (``TransientStoreError`` for the caller: the outcome is unknown); the replies
already read stay. Only a command the server refused without running it (MOVED, ASK,
TRYAGAIN) is sent again, alone, through the client, which follows the redirection.

The asyncio Cluster pipeline makes one attempt (``connection.connect``) and keeps the
replies already read; it is kept, told not to follow redirections (it follows them with a
client call that re-sends after a lost connection): ``AsyncRedisBackend._send_cluster``.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

from .errors import driver_errors
from .steps import Command

__all__ = ["first_key", "send_once"]


def first_key(command: Command) -> str:
    """The first key of a command fencing sends (a script call, HMGET or SMEMBERS)."""
    if str(command[0]).upper() == "EVALSHA":
        return str(command[3])
    return str(command[1])


def send_once(client: Any, commands: Sequence[Command]) -> list[object]:
    """Send ``commands`` on a sync ``RedisCluster`` in one round trip per node, all
    nodes at once; the replies in order, error replies and lost connections as values."""
    from redis.exceptions import ConnectionError as Lost
    from redis.exceptions import ResponseError
    from redis.exceptions import TimeoutError as TimedOut

    refused = driver_errors().refused

    by_node: dict[str, tuple[Any, list[int]]] = {}
    for i, command in enumerate(commands):
        node = client.get_node_from_key(first_key(command))
        by_node.setdefault(node.name, (node, []))[1].append(i)
    replies: list[object] = [None] * len(commands)
    held: list[tuple[Any, Any, list[int]]] = []  # (the node's client, connection, commands)
    try:
        for node, indexes in by_node.values():
            redis_node = client.get_redis_connection(node)
            try:
                connection = _checkout(redis_node.connection_pool)
            except (Lost, TimedOut):
                client.nodes_manager.initialize()  # nothing was sent: find the nodes again
                raise
            held.append((redis_node, connection, indexes))
        pending: list[tuple[Any, Any, list[int]]] = []
        for redis_node, connection, indexes in held:
            try:
                packed = connection.pack_commands([commands[i] for i in indexes])
                connection.send_packed_command(packed)
            except (Lost, TimedOut) as exc:
                connection.disconnect()
                for i in indexes:
                    replies[i] = exc
            else:
                pending.append((redis_node, connection, indexes))
        for redis_node, connection, indexes in pending:
            for n, i in enumerate(indexes):
                try:
                    replies[i] = redis_node.parse_response(connection, commands[i][0])
                except ResponseError as exc:  # an error reply, read whole
                    replies[i] = exc
                except (Lost, TimedOut) as exc:
                    connection.disconnect()
                    for j in indexes[n:]:
                        replies[j] = exc  # sent, maybe run: unknown, never sent again
                    break
    finally:
        for redis_node, connection, _ in held:
            redis_node.connection_pool.release(connection)
    for i, reply in enumerate(replies):
        if isinstance(reply, refused):  # it did not run: follow the redirection, once
            try:
                replies[i] = client.execute_command(*commands[i])
            except ResponseError as exc:
                replies[i] = exc
    return replies


def _checkout(pool: Any) -> Any:
    """A connection from a node's pool (redis-py before 5.3 wants a command name; 6
    warns when given one)."""
    named = _NAMED.get(type(pool))
    if named is None:
        parameter = inspect.signature(pool.get_connection).parameters.get("command_name")
        named = _NAMED[type(pool)] = bool(
            parameter is not None and parameter.default is inspect.Parameter.empty
        )
    return pool.get_connection("EVALSHA") if named else pool.get_connection()


#: per pool class: whether its ``get_connection`` needs a command name
_NAMED: dict[type, bool] = {}
