"""The running fenced task's context: its intent and target, and the effects it records.

:meth:`FencedTask.run <fencing.contrib._common.FencedTask.run>` sets both
(:func:`running_task`) for the time of the store's ``apply``; ``decide`` reads them
through :func:`current_intent` and :func:`current_target`, and records an external
effect with :func:`effect` (or :func:`aeffect` on an async store) before making it.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Any

from .._effects import Effect
from .._values import Intent

_current: contextvars.ContextVar[Intent | None] = contextvars.ContextVar(
    "fencing_current_intent", default=None
)
_target: contextvars.ContextVar[Any] = contextvars.ContextVar(
    "fencing_current_target", default=None
)
_lease: contextvars.ContextVar[Any] = contextvars.ContextVar("fencing_current_lease", default=None)


def current_intent() -> Intent | None:
    """The intent the running fenced task is applying (None outside one).

    ``decide`` receives only the record; it can read the transition, or derive an
    idempotency key for an external call from ``current_intent().root_id``.
    """
    return _current.get()


def current_target() -> Any:
    """The collection or table the running fenced task commits to (None outside one)."""
    return _target.get()


def current_lease() -> Any:
    """The lease the running fenced task holds (a ``Lease``, or an ``AsyncLease`` on an
    async store; None without ``lease=`` or outside a task).

    Before an external call that must not be made twice, ``decide`` can ask the store
    whether the lease is still its own: ``current_lease().renew()`` (``await`` it on an
    async store) raises ``fencing.LeaseLost`` when a newer owner took it or it ran out,
    and the queue retries the task with the same intent (the store then judges it:
    ``Duplicate`` if the newer owner committed it, ``Stale`` if the record moved on).
    ``current_lease().lost`` says what the heartbeat already knows, without a round trip.
    """
    return _lease.get()


@contextlib.contextmanager
def holding(lease: Any) -> Iterator[None]:
    """The context of a run under ``lease`` (reset on the way out)."""
    token = _lease.set(lease)
    try:
        yield
    finally:
        _lease.reset(token)


@contextlib.contextmanager
def running_task(intent: Intent, target: Any) -> Iterator[None]:
    """The context of one run: ``intent`` applied to ``target`` (reset on the way out)."""
    token, where = _current.set(intent), _target.set(target)
    try:
        yield
    finally:
        _target.reset(where)
        _current.reset(token)


def _running() -> tuple[Intent, Any]:
    intent, target = _current.get(), _target.get()
    if intent is None or target is None:
        raise RuntimeError("effect() is called inside a fenced task's decide")
    return intent, target


def effect(name: str, *, detail: Any = None) -> Effect:
    """Record external effect ``name`` of the running task's intent, before making it.

    For a sync store, inside ``decide``: ``fx = effect("charge", detail={...})``, then
    call the provider with ``fx.idempotency_key`` unless ``fx.status == "done"`` (a
    retry), then ``current_target().effect_done(fx)``. An outcome that ends the intent
    uncommitted (stale, fenced, contended, missing) settles the effect, and so does a
    task that fails for good: ``fencing reconcile`` lists it, and on ``Stale`` a
    ``Reconcile`` policy's handler receives it.
    """
    intent, target = _running()
    recorded: Effect = target.effect(intent, name, detail=detail)
    return recorded


async def aeffect(name: str, *, detail: Any = None) -> Effect:
    """:func:`effect` for a task on an async store (arq, or an async ``target``)."""
    intent, target = _running()
    recorded: Effect = await target.effect(intent, name, detail=detail)
    return recorded
