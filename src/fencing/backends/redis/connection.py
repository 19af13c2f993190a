"""fencing's redis-py clients: made with redis-py's retries off (``connect``), with
connections that an exception landing anywhere cannot leave half-ready, and a Cluster
client that gets its nodes back when it forgot them all (``revive``).

fencing never re-sends a command that may have run: a dropped connection or a timeout
raises ``TransientStoreError``, the outcome is unknown (see ``docs/backends/redis.md``).

Half-ready connections
----------------------

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

import importlib
import weakref
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, TypeVar

from ..._errors import ConfigurationError, MissingDependency
from .errors import driver_errors, translate
from .settings import Settings

if TYPE_CHECKING:
    import redis as redis_sync
    import redis.asyncio as redis_async
    import redis.asyncio.cluster as redis_async_cluster
    import redis.cluster as redis_sync_cluster

    SyncClient = redis_sync.Redis | redis_sync_cluster.RedisCluster
    AsyncClient = redis_async.Redis | redis_async_cluster.RedisCluster

__all__ = [
    "connect",
    "guard_cluster",
    "guard_pool",
    "guarded",
    "guarded_async",
    "revive",
]

T = TypeVar("T")


_MADE: dict[tuple[type[Any], bool | None], type[Any]] = {}


def connect(settings: Settings, options: dict[str, Any], *, asyncio: bool = False) -> Any:
    """A client (``redis.Redis`` or ``RedisCluster``; from ``redis.asyncio`` with
    ``asyncio``): ``options`` (those fencing does not know) go to it as they are."""
    try:
        import redis  # the driver itself, whether or not its modules were imported

        driver = importlib.import_module("redis.asyncio") if asyncio else redis
        cluster = importlib.import_module(f"{driver.__name__}.cluster")
    except ModuleNotFoundError as exc:
        raise MissingDependency(
            f"the redis backend needs {exc.name}: pip install 'fencing[redis]'"
        ) from exc
    kwargs = _client_options(settings, options)
    if settings.layout.cluster:
        client = _checked(
            lambda: cluster.RedisCluster(
                host=settings.host,
                port=settings.port,
                # sync: follow MOVED/ASK, never re-send. asyncio: one attempt of a
                # pipeline (0 would run none); single commands name their node, which
                # turns the retries off (AsyncRedisBackend._command)
                cluster_error_retry_attempts=1 if asyncio else 0,
                **kwargs,
            )
        )
        if not asyncio:
            guard_cluster(client)
        return client
    client = _checked(
        lambda: driver.Redis(
            host=settings.host, port=settings.port, db=settings.db, **_no_retry(), **kwargs
        )
    )
    pool = client.connection_pool
    if asyncio:
        pool.connection_class = guarded_async(pool.connection_class)
    else:
        guard_pool(pool)  # (no connection is made before the first command)
    return client


def _no_retry() -> dict[str, Any]:
    """fencing never re-sends a command by itself: a lost reply is TransientStoreError."""
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    return {"retry": Retry(NoBackoff(), 0)}


def _checked(make: Callable[[], T]) -> T:
    try:
        return make()
    except TypeError as exc:
        raise ConfigurationError(f"redis: bad client option ({exc})") from exc
    except driver_errors().errors as exc:  # a Cluster client connects as it is made
        raise translate(exc) from exc


def _client_options(settings: Settings, extra: dict[str, Any]) -> dict[str, Any]:
    options: dict[str, Any] = {
        "username": settings.username,
        "password": settings.password,
        "socket_timeout": settings.socket_timeout,
        "socket_connect_timeout": settings.connect_timeout,
        "client_name": settings.client_name,
        "decode_responses": False,
    }
    if settings.ssl:
        options["ssl"] = True
    options.update(extra)
    return options


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

        made = _MADE[(base, None)] = _named(WeakInUse, base)
    pool.__class__ = made
    pool._in_use_connections = weakref.WeakSet(pool._in_use_connections)
    pool.connection_class = guarded(pool.connection_class)


def guarded(base: type[Any]) -> type[Any]:
    """``base`` (a ``redis.connection.Connection`` class), made safe to interrupt."""
    made = _MADE.get((base, False))
    if made is None:
        made = _MADE[(base, False)] = _named(_guarded(base), base)
    return made


def guarded_async(base: type[Any]) -> type[Any]:
    """``base`` (a ``redis.asyncio.connection.Connection`` class), made safe to cancel."""
    made = _MADE.get((base, True))
    if made is None:
        made = _MADE[(base, True)] = _named(_guarded_async(base), base)
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


def _named(made: type[Any], base: type[Any]) -> type[Any]:
    made.__name__ = made.__qualname__ = f"Fencing{base.__name__}"
    return made


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

    return Guarded


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
