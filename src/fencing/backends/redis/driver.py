"""Redis's drivers: ``RedisBackend`` (on ``FlowBackend``) and ``AsyncRedisBackend`` (on
``AsyncFlowBackend``). Each carries out the steps of the flows (``_run``) on its
redis-py client; what they share (their state, the error boundary, the Cluster's node
targets, the hot path's decisions) is ``_RedisDriver``.

redis-py's retries are off (``connection``): a step is sent once (on a Cluster, the sync
driver pipelines itself, ``pipeline.send_once``, and the asyncio one follows its pipeline's
redirections itself, ``_send_cluster``: redis-py's would send a command again).
A redis-py error is translated (``errors.translate``) before it leaves ``_run``, and is
thrown back into the flow at that step, like any ``FencingError``; no Redis flow catches
one: fencing never re-sends a command that may have run. Only a script the server
reports it does not know (NOSCRIPT: nothing ran) is loaded and sent again, by the flow
(``scripts.run_calls``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Final

from ..._errors import FencingError
from ..._request import CommitRequest, CommitResult, Target
from .._abase import AsyncFlowBackend
from .._base import FlowBackend
from .._contract import Flows
from .connection import revive
from .errors import driver_errors, dropped_under_us, lost_connection, translate
from .flows import RedisFlows
from .pipeline import first_key, send_once
from .replies import commit_result, scan_reply
from .scripts import SCRIPTS, Call, judge_call, run_call
from .settings import Settings
from .steps import Command, Each, Load, Scan, Send, Step

if TYPE_CHECKING:
    from .connection import AsyncClient, SyncClient

__all__ = ["AsyncRedisBackend", "RedisBackend"]

_SCAN_COUNT: Final = 1000
_HELD: Final = 256  # asyncio Cluster nodes held before the disconnected are let go


class _RedisDriver:
    """What the two drivers share: everything but the I/O.

    The hot path: ``commit`` and ``probe`` (measured with ``fencing bench``) send their
    one script call straight, without a flow; the flow takes over when it needs more
    (``WAIT`` after a write, or a script the server does not know: ``_straight``).
    """

    scheme = "redis"
    flows: Flows
    _cluster_module: str  # redis-py's Cluster module of the driver's client

    def __init__(self, settings: Settings, client: Any) -> None:
        self.settings = settings
        self.layout = settings.layout
        self.client = client
        self.flows = flows = RedisFlows(settings)
        self._declare = flows.declare
        errors = driver_errors()
        self._errors = errors.errors
        self._response_error = errors.response
        self._no_script = errors.no_script
        self._refused = errors.refused
        # what _run catches: redis-py's errors, and what may be a lost connection in
        # disguise (see errors.dropped_under_us)
        self._caught: tuple[type[BaseException], ...] = (
            *errors.errors,
            AttributeError,
            TypeError,
            RuntimeError,
        )
        self._direct = settings.wait is None
        self._known: dict[str, Any] = {}  # Cluster node addresses seen (see revive)
        self._nodes: dict[int, Any] = {}  # asyncio Cluster nodes seen, held (see _reap)

    def _failure(self, exc: BaseException) -> FencingError:
        """The fencing error for what ``_caught`` caught (raise it ``from exc``); an
        exception that is neither redis-py's nor a lost connection goes on as it is."""
        if isinstance(exc, self._errors):
            return translate(exc)
        if dropped_under_us(exc):
            return lost_connection(exc)
        raise exc

    def _straight(self, request: CommitRequest, name: str) -> tuple[Call, bool, bool]:
        """The hot path's call for ``commit`` or ``probe``, whether it writes, and whether
        it may be sent straight (no ``WAIT`` to follow it)."""
        write = name == "commit"
        return judge_call(self.layout, request, name), write, self._direct or not write

    def record_lease_name(self, target: Target, key: str | int) -> str:
        """The lease that fences a record shares its hash slot (``Layout.tag``):
        ``<collection>/<key>``, or a table row's own key."""
        return self.layout.tag(target, key)

    def _revive(self) -> None:
        """Give the Cluster client its nodes back if it forgot them all (``revive``)."""
        address = (self.settings.host, self.settings.port)
        revive(self.client, address, self._cluster_module, self._known)

    def _targets(self) -> list[dict[str, Any]]:
        """The keyword arguments that send a command to each primary of a Cluster (one
        empty set when standalone)."""
        if not self.layout.cluster:
            return [{}]
        return [{"target_nodes": node} for node in self.client.get_primaries()]

    def _scan_options(self, step: Scan, targets: list[dict[str, Any]]) -> dict[str, Any]:
        options = {"match": step.match, "count": _SCAN_COUNT, "_type": step.kind}
        return options | targets[step.state[0]]


class RedisBackend(_RedisDriver, FlowBackend):
    """The synchronous Redis backend (``fencing.open("redis://...")``)."""

    client: SyncClient
    _cluster_module = "redis.cluster"

    def _run(self, step: Step) -> object:
        try:
            return self._carry_out(step)
        except self._caught as exc:
            raise self._failure(exc) from exc

    def _command(self, command: Command) -> object:
        # redis-py types its commands as "a value or an awaitable" for both clients;
        # the replies are checked where they are read. A Cluster client is made with
        # cluster_error_retry_attempts=0: it follows MOVED and ASK, never re-sends.
        client: Any = self.client
        if self.layout.cluster:
            self._revive()
        return client.execute_command(*command)

    def _carry_out(self, step: Step) -> object:
        client: Any = self.client  # see _command
        if isinstance(step, Send):
            if len(step.commands) == 1:
                try:
                    return [self._command(step.commands[0])]
                except self._response_error as exc:
                    return [exc]
            if self.layout.cluster:
                self._revive()
                return send_once(client, step.commands)  # never redis-py's re-sending pipeline
            with client.pipeline(transaction=False) as pipe:
                for command in step.commands:
                    pipe.execute_command(*command)
                return pipe.execute(raise_on_error=False)
        if isinstance(step, Load):
            for script in SCRIPTS.values():
                client.script_load(script.text)  # a Cluster client loads on every primary
            return None
        targets = self._targets()
        if isinstance(step, Each):
            return [[client.execute_command(*c, **t) for c in step.commands] for t in targets]
        cursor, keys = client.scan(step.state[1], **self._scan_options(step, targets))
        return scan_reply(step.state, len(targets), cursor, keys)

    # the hot path (see _RedisDriver): one script call, sent straight
    def commit(self, request: CommitRequest) -> CommitResult:
        return self._send_straight(request, "commit")

    def probe(self, request: CommitRequest) -> CommitResult:
        return self._send_straight(request, "probe")

    def _send_straight(self, request: CommitRequest, name: str) -> CommitResult:
        call, write, straight = self._straight(request, name)
        if straight:
            try:
                return commit_result(request, self._command(call.command()))
            except self._no_script:
                pass  # it did not run: the flow loads the scripts and sends it again
            except self._caught as exc:
                raise self._failure(exc) from exc
        return commit_result(request, self._drive(run_call(self.settings, call, write=write)))

    def declare_table(
        self, name: str, *, key: str = "id", version: str | None = "version", columns: Iterable[str]
    ) -> None:
        """Declare a guarded table and its columns, replacing an earlier declaration.

        ``store.table(name, columns=[...])`` declares too, adding to what is declared.
        """
        self._drive(self._declare(name, key, version, columns))

    def close(self) -> None:
        self.client.close()


class AsyncRedisBackend(_RedisDriver, AsyncFlowBackend):
    """The asyncio Redis backend (``fencing.open_async("redis://...")``)."""

    client: AsyncClient
    _cluster_module = "redis.asyncio.cluster"

    async def _run(self, step: Step) -> object:
        try:
            return await self._carry_out(step)
        except self._caught as exc:
            await self._reap()
            raise self._failure(exc) from exc

    def _revive(self) -> None:
        super()._revive()
        manager: Any = getattr(self.client, "nodes_manager", None)
        if manager is not None:
            for node in (*manager.startup_nodes.values(), *manager.nodes_cache.values()):
                self._nodes.setdefault(id(node), node)

    async def _reap(self) -> None:
        """Disconnect the nodes the Cluster client let go of. After a lost connection
        redis-py pops the node from its startup nodes still connected (it ran
        ``CLUSTER SLOTS`` there) and drops it, or swaps nodes and leaves their
        disconnection to a task the closing loop may cancel: garbage, a connected node
        warns "Unclosed ClusterNode". ``_revive`` holds every node it sees, and a call
        still in flight may connect a dropped node again, so they are held until
        ``close`` (past ``_HELD`` nodes, the disconnected ones are let go)."""
        manager: Any = getattr(self.client, "nodes_manager", None)
        if manager is None:
            return
        live = {id(n) for n in (*manager.startup_nodes.values(), *manager.nodes_cache.values())}
        for key, node in list(self._nodes.items()):
            if key not in live and _connected(node):
                with contextlib.suppress(Exception):
                    await node.disconnect()
        if len(self._nodes) > _HELD:
            for key, node in list(self._nodes.items()):
                if key not in live and not _connected(node):
                    self._nodes.pop(key, None)

    async def _command(self, command: Command) -> object:
        client: Any = self.client  # see RedisBackend._command
        if not self.layout.cluster:
            return await client.execute_command(*command)
        # The asyncio Cluster client re-sends a command after a lost connection unless
        # it is told the node (its pipelines need cluster_error_retry_attempts=1 to run
        # at all): name the node of the command's first key; MOVED and ASK are followed.
        self._revive()
        await client.initialize()
        node = client.get_node_from_key(first_key(command))
        return await client.execute_command(*command, target_nodes=node)

    async def _carry_out(self, step: Step) -> object:
        client: Any = self.client  # see RedisBackend._command
        if self.layout.cluster:
            self._revive()
        if isinstance(step, Send):
            if len(step.commands) == 1:
                try:
                    return [await self._command(step.commands[0])]
                except self._response_error as exc:
                    return [exc]
            if self.layout.cluster:
                return await self._send_cluster(step.commands)
            async with client.pipeline(transaction=False) as pipe:
                for command in step.commands:
                    pipe.execute_command(*command)
                return await pipe.execute(raise_on_error=False)
        if isinstance(step, Load):
            for script in SCRIPTS.values():
                await client.script_load(script.text)  # on every primary of a Cluster
            return None
        if self.layout.cluster:
            await client.initialize()  # its node list is empty until then
        targets = self._targets()
        if isinstance(step, Each):
            return [[await client.execute_command(*c, **t) for c in step.commands] for t in targets]
        cursor, keys = await client.scan(step.state[1], **self._scan_options(step, targets))
        return scan_reply(step.state, len(targets), cursor, keys)

    async def _send_cluster(self, commands: tuple[Command, ...]) -> list[object]:
        """redis-py's asyncio Cluster pipeline, one attempt (``connection.connect``), told
        not to follow redirections: it would follow them with a client call that sends a
        command again after a lost connection. A command a node refused without running
        it (``refused``) is sent again here, alone, by ``_command`` (its node named: sent
        once), which follows the redirection."""
        client: Any = self.client  # see RedisBackend._command
        async with client.pipeline(transaction=False) as pipe:
            for command in commands:
                pipe.execute_command(*command)
            replies = list(await pipe.execute(raise_on_error=False, allow_redirections=False))
        for i, reply in enumerate(replies):
            if isinstance(reply, self._refused):
                try:
                    replies[i] = await self._command(commands[i])
                except self._response_error as exc:
                    replies[i] = exc
        return replies

    # the hot path (see _RedisDriver): one script call, sent straight
    async def commit(self, request: CommitRequest) -> CommitResult:
        return await self._send_straight(request, "commit")

    async def probe(self, request: CommitRequest) -> CommitResult:
        return await self._send_straight(request, "probe")

    async def _send_straight(self, request: CommitRequest, name: str) -> CommitResult:
        call, write, straight = self._straight(request, name)
        if straight:
            try:
                return commit_result(request, await self._command(call.command()))
            except self._no_script:
                pass  # it did not run: the flow loads the scripts and sends it again
            except self._caught as exc:
                await self._reap()
                raise self._failure(exc) from exc
        flow = run_call(self.settings, call, write=write)
        return commit_result(request, await self._drive(flow))

    async def declare_table(
        self, name: str, *, key: str = "id", version: str | None = "version", columns: Iterable[str]
    ) -> None:
        """Declare a guarded table and its columns, replacing an earlier declaration.

        ``store.table(name, columns=[...])`` declares too, adding to what is declared.
        """
        await self._drive(self._declare(name, key, version, columns))

    async def close(self) -> None:
        try:
            await self.client.aclose()  # redis-py >= 5.0.1
        finally:  # and every node redis-py let go of still connected (see _reap)
            nodes, self._nodes = list(self._nodes.values()), {}
            for node in nodes:
                with contextlib.suppress(Exception):
                    await node.disconnect()  # (a no-op for one never connected)


def _connected(node: Any) -> bool:
    """Whether an asyncio ``ClusterNode`` holds an open connection (what its
    ``__del__`` warns about)."""
    return any(c.is_connected for c in getattr(node, "_connections", ()))
