"""The few primitives in which sync and async genuinely differ.

``_astore.py`` is written against the async names; ``scripts/unasync.py`` rewrites
it into ``_store.py`` with the sync names, so the two fronts cannot drift.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

__all__ = [
    "AsyncRunner",
    "ThreadRunner",
    "current_loop",
    "maybe_await",
    "no_loop",
    "passthrough",
    "sleep_async",
    "sleep_sync",
]

T = TypeVar("T")


async def maybe_await(value: Any) -> Any:
    """Await ``value`` if it is awaitable (an async decide or handler)."""
    if inspect.isawaitable(value):
        return await value
    return value


def passthrough(value: T) -> T:
    """The sync twin of ``maybe_await``."""
    return value


def current_loop() -> asyncio.AbstractEventLoop | None:
    """The running event loop (None outside one): an async store belongs to it."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def no_loop() -> asyncio.AbstractEventLoop | None:
    """The sync twin of ``current_loop``: a sync store belongs to no event loop."""
    return None


def sleep_sync(seconds: float) -> None:
    if seconds > 0:
        time.sleep(seconds)


async def sleep_async(seconds: float) -> None:
    if seconds > 0:
        await asyncio.sleep(seconds)


class Stopped(Exception):
    """Raised inside a background loop when its runner is stopped."""


class AsyncRunner:
    """A background loop as an asyncio task, stoppable; sleeps end early on stop."""

    def __init__(self) -> None:
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @property
    def running(self) -> bool:
        return self._task is not None

    def start(self, name: str, body: Callable[[], Coroutine[Any, Any, None]]) -> None:
        self._task = asyncio.get_running_loop().create_task(body(), name=name)

    async def sleep(self, seconds: float) -> None:
        try:
            await asyncio.wait_for(self._stop.wait(), seconds)
        except TimeoutError:
            return
        raise Stopped

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is None:
            return
        self._stop.set()
        if task is not asyncio.current_task():
            await task


class ThreadRunner:
    """A background loop in a daemon thread, stoppable; sleeps end early on stop."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        return self._thread is not None

    def start(self, name: str, body: Callable[[], None]) -> None:
        self._thread = threading.Thread(target=body, name=name, daemon=True)
        self._thread.start()

    def sleep(self, seconds: float) -> None:
        if self._stop.wait(seconds):
            raise Stopped

    def stop(self) -> None:
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._stop.set()
        if thread is not threading.current_thread():
            thread.join()
