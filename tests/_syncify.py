"""Drive an ``AsyncStore`` through the sync API, so one suite tests both fronts.

An event loop runs in a background thread; every coroutine the async API returns
is run there and waited for, every async object is wrapped again. Async context
managers become sync ones. This is test scaffolding, not part of fencing.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Coroutine
from typing import Any

import fencing


class Loop:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()


_WRAP = (
    fencing.AsyncStore,
    fencing.AsyncCollection,
    fencing.AsyncTable,
    fencing.AsyncLease,
    fencing.AsyncOutbox,
)


def _arg(value: Any) -> Any:
    """Unwrap proxies; run sync callbacks (decide, handlers) in a worker thread, so
    that a callback may itself use the syncified store without blocking the loop."""
    if isinstance(value, Syncified):
        return value.unwrapped
    if isinstance(value, fencing.Reconcile):
        return fencing.Reconcile(_arg(value.handler))
    if callable(value) and not isinstance(value, type) and not inspect.iscoroutinefunction(value):
        fn = value

        async def in_thread(*args: Any) -> Any:
            args = tuple(Syncified(a, _CURRENT[0]) if isinstance(a, _WRAP) else a for a in args)
            return await asyncio.to_thread(fn, *args)

        return in_thread
    return value


_CURRENT: list[Any] = [None]


class Syncified:
    """A sync-looking proxy over an async fencing object."""

    def __init__(self, target: Any, loop: Loop) -> None:
        _CURRENT[0] = loop
        object.__setattr__(self, "_target", target)
        object.__setattr__(self, "_loop", loop)

    @property
    def unwrapped(self) -> Any:
        return self._target

    def _wrap(self, value: Any) -> Any:
        if inspect.iscoroutine(value):
            value = self._loop.run(value)
        if isinstance(value, _WRAP) or hasattr(value, "__aenter__"):
            return Syncified(value, self._loop)
        return value

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._target, name)
        if callable(value) and not isinstance(value, type):

            def call(*args: Any, **kwargs: Any) -> Any:
                args = tuple(_arg(a) for a in args)
                kwargs = {k: _arg(v) for k, v in kwargs.items()}
                return self._wrap(value(*args, **kwargs))

            return call
        return self._wrap(value) if isinstance(value, _WRAP) else value

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._target, name, value)

    def __enter__(self) -> Any:
        return self._wrap(self._target.__aenter__())

    def __exit__(self, *exc: Any) -> Any:
        return self._loop.run(self._target.__aexit__(*exc))

    def __repr__(self) -> str:
        return f"Syncified({self._target!r})"
