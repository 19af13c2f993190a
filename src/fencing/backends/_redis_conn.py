"""redis-py connections that an exception landing anywhere cannot leave half-ready.

redis-py's ``Connection.connect()`` stores the socket before it sends the handshake
(``AUTH``, ``CLIENT SETNAME``, ``SELECT db``) and cleans up only after a ``RedisError``:
any other exception in between (a signal handler's, a cancelled task's) leaves an open
socket that never selected its database, and the pool hands it out again as it is, so
the next commands silently go to database 0. Likewise a call interrupted between
sending a command and reading its reply goes back to the pool with the reply still
due: the next command on that connection reads it as its own, unless it happened to
arrive before the pool's ``can_read()`` check.

These subclasses keep two facts: whether the handshake finished, and how many replies
are still owed. The pool calls ``connect()`` on every checkout; a connection that is
not known to be ready and clean is disconnected there and connected afresh. Both facts
are set conservatively (a fact updated one step late only costs a reconnect).

The synchronous connections also pack commands with redis-py's Python serializer, not
hiredis's ``pack_command``: converting an ``int`` argument to text checks for signals,
and when a handler raises there, hiredis 3 reads the NULL it got back and crashes the
process (a segmentation fault, seen under a timer-signal storm).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from typing import Any

__all__ = ["guard_cluster", "guard_pool", "guarded", "guarded_async"]


_MADE: dict[tuple[type[Any], bool | None], type[Any]] = {}


def guard_pool(pool: Any) -> None:
    """Make a (synchronous) ``redis.ConnectionPool`` hand out guarded connections, and
    hold the connections it lent weakly.

    Its ``get_connection()`` records a connection as in use before the ``try`` that
    gives it back on failure: an exception landing in between lost the connection for
    good, its socket open, one more at each landing. Held weakly, a connection no caller
    holds any more is collected, and collecting it closes its socket.
    """
    base = type(pool)
    made = _MADE.get((base, None))
    if made is None:

        class WeakInUse(base):  # type: ignore[misc,valid-type]
            def reset(self) -> None:
                super().reset()
                self._in_use_connections: weakref.WeakSet[Any] = weakref.WeakSet()

        WeakInUse.__name__ = WeakInUse.__qualname__ = f"Fencing{base.__name__}"
        made = _MADE[(base, None)] = WeakInUse
    pool.__class__ = made
    pool._in_use_connections = weakref.WeakSet(pool._in_use_connections)
    pool.connection_class = guarded(pool.connection_class)


def guarded(base: type[Any]) -> type[Any]:
    """``base`` (a ``redis.connection.Connection`` class), made safe to interrupt."""
    made = _MADE.get((base, False))
    if made is None:
        made = _MADE[(base, False)] = _guarded(base)
    return made


def guarded_async(base: type[Any]) -> type[Any]:
    """``base`` (a ``redis.asyncio.connection.Connection`` class), made safe to cancel."""
    made = _MADE.get((base, True))
    if made is None:
        made = _MADE[(base, True)] = _guarded_async(base)
    return made


def guard_cluster(client: Any) -> None:
    """``guard_pool`` for every node of a (synchronous) ``RedisCluster``, present and
    future. The connections its start-up made are dropped: guarded ones replace them."""
    nodes = client.nodes_manager
    make = nodes.create_redis_node

    def create_redis_node(host: str, port: int, **kwargs: Any) -> Any:
        node = make(host, port, **kwargs)
        guard_pool(node.connection_pool)
        return node

    nodes.create_redis_node = create_redis_node
    for node in list(nodes.nodes_cache.values()):
        if node.redis_connection is not None:
            pool = node.redis_connection.connection_pool
            pool.disconnect()
            pool.reset()
            guard_pool(pool)


def _guarded(base: type[Any]) -> type[Any]:
    from redis.connection import PythonRespSerializer
    from redis.exceptions import ResponseError

    class Guarded(base):  # type: ignore[misc]
        _fencing_ready = False  # the handshake of the current socket finished
        _fencing_owed = 0  # replies sent for and not yet read
        _fencing_packed = 0  # commands packed by pack_commands(), about to be sent

        def _construct_command_packer(self, packer: Any) -> Any:
            if packer is not None:
                return packer
            return PythonRespSerializer(self._buffer_cutoff, self.encoder.encode)

        def connect(self) -> None:
            if self._sock is not None and (not self._fencing_ready or self._fencing_owed):
                self.disconnect()
            if self._sock is None:
                self._fencing_ready = False
                self._fencing_owed = 0
                super().connect()
                self._fencing_ready = True

        def disconnect(self, *args: Any) -> None:
            self._fencing_ready = False
            super().disconnect(*args)
            self._fencing_owed = 0

        def pack_commands(self, commands: Iterable[Any]) -> Any:
            commands = list(commands)
            self._fencing_packed = len(commands)
            return super().pack_commands(commands)

        def send_command(self, *args: Any, **kwargs: Any) -> None:
            self._fencing_owed += 1
            super().send_command(*args, **kwargs)

        def send_packed_command(self, command: Any, check_health: bool = True) -> None:
            packed, self._fencing_packed = self._fencing_packed, 0
            self._fencing_owed += packed
            super().send_packed_command(command, check_health)

        def read_response(self, *args: Any, **kwargs: Any) -> Any:
            try:
                reply = super().read_response(*args, **kwargs)
            except ResponseError:  # an error reply: read whole
                self._fencing_owed -= 1
                raise
            self._fencing_owed -= 1
            return reply

    Guarded.__name__ = Guarded.__qualname__ = f"Fencing{base.__name__}"
    return Guarded


def _guarded_async(base: type[Any]) -> type[Any]:
    from redis.exceptions import ResponseError

    class Guarded(base):  # type: ignore[misc]
        _fencing_ready = False
        _fencing_owed = 0
        _fencing_packed = 0

        async def connect(self) -> None:
            if self.is_connected and (not self._fencing_ready or self._fencing_owed):
                await self.disconnect()
            if not self.is_connected:
                self._fencing_ready = False
                self._fencing_owed = 0
                await super().connect()
                self._fencing_ready = True

        async def disconnect(self, nowait: bool = False) -> None:
            self._fencing_ready = False
            await super().disconnect(nowait)
            self._fencing_owed = 0

        def pack_commands(self, commands: Iterable[Any]) -> Any:
            commands = list(commands)
            packed = super().pack_commands(commands)
            self._fencing_packed = len(commands)
            return packed

        async def send_command(self, *args: Any, **kwargs: Any) -> None:
            self._fencing_owed += 1
            await super().send_command(*args, **kwargs)

        async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
            packed, self._fencing_packed = self._fencing_packed, 0
            self._fencing_owed += packed
            await super().send_packed_command(command, check_health)

        async def read_response(self, *args: Any, **kwargs: Any) -> Any:
            try:
                reply = await super().read_response(*args, **kwargs)
            except ResponseError:
                self._fencing_owed -= 1
                raise
            self._fencing_owed -= 1
            return reply

    Guarded.__name__ = Guarded.__qualname__ = f"Fencing{base.__name__}"
    return Guarded
