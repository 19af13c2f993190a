"""The outbox demo's relay processes: ``python -m fencing._demo.queues.relay QUEUE``.

One process is a ``fencing.contrib.relay`` relay over the demo's store (claims of
``TTL`` seconds, ``POLL`` seconds between idle claims), publishing with the queue's
own client, built from the demo's settings in the environment like the workers' (the
Celery app, a Redis connection for RQ, the Dramatiq broker, arq ``RedisSettings``).
Every publish the broker took is appended to ``relay-published.jsonl`` in the control
directory (row id, its intent's root id, the relay's pid).

With ``FENCING_DEMO_RELAY_HANG=N`` a relay stops right after its N-th publish, before
marking that row sent, and announces ``relay-hung-<pid>``: the demo SIGKILLs it there
(:class:`Relays`) and starts the next, which publishes the killed relay's claimed rows
again once its claim lapsed: at least once, so some rows twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Final

from ..._errors import ConfigurationError

HANG_ENV: Final = "FENCING_DEMO_RELAY_HANG"
PUBLISHED: Final = "relay-published.jsonl"
TTL: Final = 1.0  # a killed relay's rows go out again this long after its claim
POLL: Final = 0.05
BATCH: Final = 20
HANG_LIMIT: Final = 120.0  # a hung relay nobody kills gives up after this


# -- the relay process ---------------------------------------------------------------------
class _Logged:
    """The queue's publisher, noting each publish; hangs after the ``hang``-th one."""

    def __init__(self, inner: Any, hang: int) -> None:
        self.inner = inner
        self.kind: str = inner.kind
        self.hang = hang
        self.count = 0

    def _after(self, row: Any) -> None:
        from ..._values import Intent
        from ...contrib._common import publish_id
        from . import _tasks

        self.count += 1
        root = Intent.from_json(row.payload).root_id
        event = {"row": row.id, "id": publish_id(row), "root": root, "pid": os.getpid()}
        _tasks._writer(PUBLISHED).write(event)
        if self.count == self.hang:  # published, not marked: the demo kills us here
            (Path(_tasks.settings().control) / f"relay-hung-{os.getpid()}").touch()
            time.sleep(HANG_LIMIT)
            raise SystemExit("the hung relay was not killed")

    def publish(self, row: Any) -> None:
        self.inner.publish(row)
        self._after(row)

    def close(self) -> None:
        self.inner.close()


class _AsyncLogged(_Logged):
    async def publish(self, row: Any) -> None:  # type: ignore[override]
        await self.inner.publish(row)
        await asyncio.to_thread(self._after, row)

    async def close(self) -> None:  # type: ignore[override]
        await self.inner.close()


def _publisher(queue: str, settings: Any) -> Any:
    from .modules import queue_module

    module = queue_module(queue)  # in a demo process: builds the app, the broker
    if queue == "celery":
        from ...contrib.celery import publisher as celery_publisher

        return celery_publisher(module.app)
    if queue == "rq":
        import redis

        from ...contrib.rq import publisher as rq_publisher

        return rq_publisher(redis.Redis.from_url(settings.broker), settings.queue)
    if queue == "dramatiq":
        from ...contrib.dramatiq import publisher as dramatiq_publisher

        return dramatiq_publisher(module.broker)
    from ...contrib.arq import publisher as arq_publisher

    return arq_publisher(module._redis_settings(settings.broker))


def main(queue: str) -> None:
    import fencing
    from fencing.contrib.relay import AsyncRelay, Relay

    from . import _tasks

    settings = _tasks.settings()
    hang = int(os.environ.get(HANG_ENV, "0"))
    options: dict[str, Any] = {"ttl": TTL, "poll": POLL, "batch": BATCH}
    options["name"] = f"demo-relay-{os.getpid()}"
    if queue == "arq":

        async def run() -> None:
            store = await fencing.open_async(settings.store, migrate=False)
            relay = AsyncRelay(store, _AsyncLogged(_publisher(queue, settings), hang), **options)
            loop = asyncio.get_running_loop()
            loop.add_signal_handler(signal.SIGTERM, relay.stop)
            try:
                await relay.run()
            finally:
                await relay.close()
                await store.close()

        asyncio.run(run())
        return
    with fencing.open(settings.store, migrate=False) as store:
        relay = Relay(store, _Logged(_publisher(queue, settings), hang), **options)
        signal.signal(signal.SIGTERM, lambda *_: relay.stop())
        try:
            relay.run()
        finally:
            relay.close()


# -- the demo's side -------------------------------------------------------------------------
class Relays:
    """The relay processes of one run: one at a time; each hung one is SIGKILLed and replaced.

    ``hangs`` are the publish counts after which the successive relays hang (the last
    relay started never hangs)."""

    def __init__(self, queue: str, env: dict[str, str], control: Path, hangs: list[int]):
        self.queue = queue
        self.env = env
        self.control = control
        self.hangs = list(hangs)
        self.kills = 0
        self.started = 0
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        hang = self.hangs[self.started] if self.started < len(self.hangs) else 0
        self.started += 1
        with open(self.control / f"relay-{self.started}.log", "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", __name__, self.queue],
                env={**self.env, HANG_ENV: str(hang)},
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def check(self) -> None:
        """Kill a relay that hung after a publish and start the next; a relay that
        exited by itself ends the demo with its log."""
        proc = self.proc
        if proc is None:
            return
        if (self.control / f"relay-hung-{proc.pid}").exists():
            self._kill(proc)
            self.kills += 1
            self.start()
            return
        if proc.poll() is not None:
            raise ConfigurationError(
                f"the relay process exited (status {proc.returncode}):\n{self.tail()}"
            )

    def tail(self, lines: int = 15) -> str:
        path = self.control / f"relay-{self.started}.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return "\n".join(text.splitlines()[-lines:]) or "(no output)"

    @staticmethod
    def _kill(proc: subprocess.Popen[bytes]) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)

    def stop(self) -> None:
        """SIGTERM the running relay (it stops after the row it publishes), then kill."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
        self._kill(proc)

    def published(self) -> dict[str, int]:
        """How many times the row of each intent (by root id) was published."""
        path = self.control / PUBLISHED
        counts: dict[str, int] = {}
        if path.exists():
            for line in path.read_bytes().splitlines():
                if line.strip():
                    root = str(json.loads(line)["root"])
                    counts[root] = counts.get(root, 0) + 1
        return counts


if __name__ == "__main__":
    main(sys.argv[1])
