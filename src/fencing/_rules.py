"""The rules every backend must agree on, as pure functions over plain values.

The memory backend runs these directly; SQL backends encode the success path in
one conditional statement and run :func:`judge` on the refused path to say *why*
nothing was written; Redis scripts encode the same rules in Lua. The contract
test suite holds them all to the same answers.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from ._errors import InvalidLeaseRequest
from ._types import loosely_equal
from ._values import Intent, Record

__all__ = [
    "MAX_TTL",
    "LeaseRef",
    "LeaseRow",
    "Status",
    "check_ttl",
    "guard_holds",
    "judge",
    "lease_grant",
    "lease_renewal",
]

#: The longest lease fencing accepts, in seconds (one week). Longer is a mistake.
MAX_TTL: Final = 7 * 24 * 3600.0
MIN_TTL: Final = 0.001


class Status(enum.Enum):
    """What a backend reports for a commit or a probe."""

    OK = "ok"  # probe only: a commit now would apply
    APPLIED = "applied"
    STALE = "stale"
    DUPLICATE = "duplicate"
    MISSING = "missing"
    FENCED_NEWER = "fenced_newer"
    FENCED_EXPIRED = "fenced_expired"


@dataclass(frozen=True, slots=True)
class LeaseRef:
    """The lease a commit is made under: its name and the token it was granted."""

    name: str
    token: int


@dataclass(frozen=True, slots=True)
class LeaseRow:
    """A lease as the store holds it. ``owner`` is None once released; the token stays."""

    name: str
    owner: str | None
    token: int
    expires_at: float  # by the store's clock

    def held_at(self, now: float) -> bool:
        return self.owner is not None and self.expires_at > now


def check_ttl(ttl: object, what: str = "ttl") -> float:
    if isinstance(ttl, bool) or not isinstance(ttl, int | float) or not math.isfinite(ttl):
        raise InvalidLeaseRequest(f"{what} must be a finite number of seconds, not {ttl!r}")
    if not MIN_TTL <= ttl <= MAX_TTL:
        raise InvalidLeaseRequest(
            f"{what} {ttl!r}s is outside {MIN_TTL}s to {MAX_TTL:.0f}s (one week)"
        )
    return float(ttl)


def _same(a: Any, b: Any) -> bool:
    # JSON equality: true is not 1, 1 equals 1.0.
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if a == b:
        return True
    # a column value beyond JSON against another type (a UUID column read as text...)
    return type(a) is not type(b) and loosely_equal(a, b)


def guard_holds(guard: Mapping[str, Any] | None, state: Mapping[str, Any]) -> bool:
    if guard is None:
        return True
    missing = object()
    for field, value in guard.items():
        have = state.get(field, missing)
        if have is missing or not _same(have, value):
            return False
    return True


def judge(
    record: Record | None,
    applied: bool,
    intent: Intent,
    lease: LeaseRef | None,
    lease_row: LeaseRow | None,
    now: float,
    guard_held: bool | None = None,
) -> Status:
    """Whether a commit of ``intent`` may apply to ``record``, and if not, why.

    Order matters and is part of the contract: missing, duplicate, fenced, stale.
    ``guard_held``, when given, is the store's own comparison of the intent's guard with
    the record (SQLite compares a bound ``Decimal`` or ``datetime`` with the column's
    affinity, which Python cannot repeat); else the guard is compared here.
    """
    if record is None:
        return Status.MISSING
    if applied:
        return Status.DUPLICATE
    if lease is not None:
        if record.fence > lease.token:
            return Status.FENCED_NEWER
        if lease_row is None or lease_row.token != lease.token:
            return Status.FENCED_NEWER
        if not lease_row.held_at(now):
            return Status.FENCED_EXPIRED
    expected = intent.expected_version
    if expected is not None and record.version != expected:
        return Status.STALE
    if not (guard_holds(intent.guard, record.state) if guard_held is None else guard_held):
        return Status.STALE
    return Status.OK


def lease_grant(
    name: str, row: LeaseRow | None, owner: str, ttl: float, now: float
) -> LeaseRow | None:
    """The row after acquiring, or None if the lease is held by someone.

    The token is one more than the last one ever granted for the name, whether
    that lease was released, expired or taken over: tokens never go back.
    """
    if row is None:
        return LeaseRow(name, owner, 1, now + ttl)
    if row.held_at(now):
        return None
    return LeaseRow(name, owner, row.token + 1, now + ttl)


def lease_renewal(row: LeaseRow | None, token: int, ttl: float, now: float) -> LeaseRow | None:
    """The row after renewing, or None when ``token`` no longer holds the lease."""
    if row is None or row.token != token or not row.held_at(now):
        return None
    return LeaseRow(row.name, row.owner, token, now + ttl)
