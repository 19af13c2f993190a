"""The relay side of the outbox end-to-end tests.

``fencing relay URL --queue K --app tests.contrib.apps.relay_app:K`` publishes with the
e2e app of queue K, configured from the same environment as the workers
(``FENCING_E2E_BROKER``, ``FENCING_E2E_QUEUE``, ``FENCING_E2E_PREFIX``): the Celery
app, a Redis connection (RQ), the Dramatiq broker, arq ``RedisSettings``.

``python -m tests.contrib.apps.relay_app K`` runs a relay (claim ttl 1 s) that hangs
right after its first publish, before marking it, once it finds the control file
``relay-hang``: it announces ``relay-published-<row id>`` with its pid and waits for
the test to SIGKILL it.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from typing import Any

from . import _shared


def __getattr__(name: str) -> Any:
    if name == "celery":
        from .celery_app import app

        return app
    if name == "rq":
        import redis

        return redis.Redis.from_url(os.environ["FENCING_E2E_BROKER"])
    if name == "dramatiq":
        from .dramatiq_app import broker

        return broker
    if name == "arq":
        from .arq_app import redis_settings

        return redis_settings(os.environ["FENCING_E2E_BROKER"])
    raise AttributeError(name)


def _hang_after(row: Any) -> None:
    if (_shared.control_dir() / "relay-hang").exists():
        _shared._announce(f"relay-published-{row.id}")
        time.sleep(_shared.WAIT_LIMIT)


class HangingPublisher:
    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.kind = inner.kind

    def publish(self, row: Any) -> None:
        self.inner.publish(row)
        _hang_after(row)

    def close(self) -> None:
        self.inner.close()


class AsyncHangingPublisher(HangingPublisher):
    async def publish(self, row: Any) -> None:  # type: ignore[override]
        await self.inner.publish(row)
        await asyncio.to_thread(_hang_after, row)

    async def close(self) -> None:  # type: ignore[override]
        await self.inner.close()


def main(kind: str) -> None:
    import fencing
    from fencing.contrib._cli_relay import _publisher
    from fencing.contrib.relay import AsyncRelay, Relay

    app = __getattr__(kind)
    if kind == "arq":
        from fencing.contrib.arq import publisher

        async def go() -> None:
            store = await fencing.open_async(_shared.store_url())
            relay = AsyncRelay(store, AsyncHangingPublisher(publisher(app)), ttl=1.0)
            await relay.run_once()

        asyncio.run(go())
        return
    store = fencing.open(_shared.store_url())
    Relay(store, HangingPublisher(_publisher(kind, app)), ttl=1.0).run_once()


if __name__ == "__main__":
    main(sys.argv[1])
