"""A fenced task's retry and lease options: :class:`Backoff` and :class:`LeaseSpec`."""

from __future__ import annotations

import math
import os
import random
import socket
from collections.abc import Callable
from dataclasses import dataclass

from .._checks import MAX_OWNER_CHARS
from .._errors import InvalidInput
from .._rules import check_ttl
from .._values import Intent


@dataclass(frozen=True, slots=True)
class Backoff:
    """Exponential backoff between retries: ``base * 2**(n-1)`` capped at ``cap``, jittered.

    The jitter keeps the delay within its upper half, so retries of many tasks
    spread out without ever coming back faster than half the nominal delay.
    """

    base: float = 1.0
    cap: float = 60.0

    def __post_init__(self) -> None:
        for name in ("base", "cap"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise InvalidInput(f"Backoff {name} must be a number of seconds")
            if not math.isfinite(value) or value <= 0:
                raise InvalidInput(f"Backoff {name} must be positive and finite, not {value}")
        if self.cap < self.base:
            raise InvalidInput("Backoff cap must not be below its base")

    def delay(self, retry: int, rng: random.Random | None = None) -> float:
        """Seconds to wait before retry number ``retry`` (1-based)."""
        ceiling = min(self.cap, self.base * 2 ** min(max(retry, 1) - 1, 32))
        return (rng or random).uniform(ceiling / 2, ceiling)


def record_lease_name(intent: Intent) -> str:
    """The default lease name: ``<collection>/<key>``, one lease per record. A task
    with this default takes the name from its target (``target.lease_name(key)``),
    which on Redis is a table row's own key, so the lease shares its Cluster slot."""
    return f"{intent.collection}/{intent.key}"


def _default_owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"[:MAX_OWNER_CHARS]


@dataclass(frozen=True, slots=True)
class LeaseSpec:
    """Run each task under a lease on its record, so a paused worker is fenced.

    ``name(intent)`` names the lease (default: the record's, ``<collection>/<key>``,
    on Redis a table row's own key ``<table_prefix><table>:<key>``); ``owner`` is
    informational (default ``<host>:<pid>``); the task waits up to ``wait`` seconds
    for a held lease, then reports ``LeaseHeld``, which the queue retries. With
    ``heartbeat`` the lease is renewed every ``ttl/3`` while ``decide`` runs; a
    worker paused past its TTL still loses it, and its commit comes back ``Fenced``.
    """

    ttl: float
    name: Callable[[Intent], str] = record_lease_name
    owner: str | None = None
    wait: float = 0.0
    heartbeat: bool = True

    def __post_init__(self) -> None:
        check_ttl(self.ttl)
        if not callable(self.name):
            raise InvalidInput("LeaseSpec name must be a function of the intent")
        if self.owner is not None and (
            not isinstance(self.owner, str) or not 0 < len(self.owner) <= MAX_OWNER_CHARS
        ):
            raise InvalidInput(f"LeaseSpec owner must be a string of 1 to {MAX_OWNER_CHARS}")
        wait = self.wait
        if isinstance(wait, bool) or not isinstance(wait, int | float):
            raise InvalidInput("LeaseSpec wait must be a number of seconds")
        if not math.isfinite(wait) or wait < 0:
            raise InvalidInput("LeaseSpec wait must be finite and not negative")

    def owner_name(self) -> str:
        return self.owner if self.owner is not None else _default_owner()
