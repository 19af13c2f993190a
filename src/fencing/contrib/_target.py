"""Where a fenced task commits: a collection or table, or a factory of one per process."""

from __future__ import annotations

import asyncio
import inspect
import os
import threading
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

from .._astore import AsyncCollection, AsyncTable
from .._errors import ConfigurationError, InvalidIntent
from .._store import Collection, Table
from .._values import Intent

SyncTarget = Collection | Table
AsyncTarget = AsyncCollection | AsyncTable
#: A target, or a zero-argument factory called once per process (per event loop for
#: async targets; it may return an awaitable), so a worker opens its own store
#: after fork instead of inheriting the enqueuing process's connection.
TargetSource = SyncTarget | AsyncTarget | Callable[[], Any]
#: A source with this attribute (a Django ``FencedModel`` class: ``target=Order``)
#: gives its target through it, asked at every run: the model's store follows its
#: database (Django's test database, a forked worker's own connections) by itself.
MODEL_TARGET = "__fencing_target__"


#: Set by a test helper (``fencing.contrib.django.testing``): the view of each resolved
#: sync target that a run in this context commits through (the same table on the
#: test's own connection), or None.
sync_view: ContextVar[Callable[[SyncTarget], SyncTarget] | None] = ContextVar(
    "fencing_sync_view", default=None
)


def check_match(target: SyncTarget | AsyncTarget, intent: Intent) -> None:
    if intent.collection != target.name or intent.kind != target.kind:
        raise InvalidIntent(
            f"intent for {intent.kind} {intent.collection!r} reached a task that commits to"
            f" {target.kind} {target.name!r}"
        )


class TargetSlot:
    """Resolves a target source once per process (and per event loop when async)."""

    __slots__ = ("_alock", "_fresh", "_lock", "_loop", "_pid", "_source", "_value")

    def __init__(self, source: TargetSource) -> None:
        model = getattr(source, MODEL_TARGET, None)
        self._fresh = callable(model)
        if callable(model):
            source = model  # asked at every run, never kept
        if not callable(source) and not isinstance(
            source, Collection | Table | AsyncCollection | AsyncTable
        ):
            raise ConfigurationError(
                "target must be a Collection or Table (an AsyncCollection or AsyncTable for"
                f" async queues), or a function returning one, not {type(source).__name__}"
            )
        self._source = source
        self._lock = threading.Lock()
        self._alock: asyncio.Lock | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pid: int | None = None
        self._value: SyncTarget | AsyncTarget | None = None

    @property
    def resolved(self) -> SyncTarget | AsyncTarget | None:
        """The target if known without calling a factory (for checks at enqueue)."""
        if isinstance(self._source, Collection | Table | AsyncCollection | AsyncTable):
            return self._source
        return self._value if self._pid == os.getpid() else None

    def sync(self) -> SyncTarget:
        value = self._resolve()
        view = sync_view.get()
        return value if view is None else view(value)

    def _resolve(self) -> SyncTarget:
        source = self._source
        if isinstance(source, Collection | Table):
            return source
        if isinstance(source, AsyncCollection | AsyncTable):
            raise ConfigurationError("this task's target is async: run it with arun()")
        if self._fresh:
            fresh = source()
            if not isinstance(fresh, Collection | Table):
                raise ConfigurationError(
                    f"the model's target is {type(fresh).__name__}, not a Collection or Table"
                )
            return fresh
        with self._lock:
            value = self._value
            if value is None or self._pid != os.getpid():
                value = source()
                if not isinstance(value, Collection | Table):
                    raise ConfigurationError(
                        f"the target factory returned {type(value).__name__}, not a Collection"
                        " or Table of a sync store"
                    )
                self._value, self._pid = value, os.getpid()
            assert isinstance(value, Collection | Table)
            return value

    async def aget(self) -> AsyncTarget:
        source = self._source
        if isinstance(source, AsyncCollection | AsyncTable):
            return source
        if isinstance(source, Collection | Table) or self._fresh:
            raise ConfigurationError("this task's target is sync: run it with run()")
        loop = asyncio.get_running_loop()
        if self._alock is None or self._loop is not loop:
            self._alock, self._loop, self._value = asyncio.Lock(), loop, None
        async with self._alock:
            value = self._value
            if value is None or self._pid != os.getpid():
                value = source()
                if inspect.isawaitable(value):
                    value = await value
                if not isinstance(value, AsyncCollection | AsyncTable):
                    raise ConfigurationError(
                        f"the target factory returned {type(value).__name__}, not an"
                        " AsyncCollection or AsyncTable"
                    )
                self._value, self._pid = value, os.getpid()
            assert isinstance(value, AsyncCollection | AsyncTable)
            return value
