"""The checks of the public calls' arguments that are not values of their own (those are
in ``_validate`` and ``_values``): a table's declared columns, a lease's owner and wait,
the effect queries. Each raises a typed ``InvalidInput`` before anything is written."""

from __future__ import annotations

import math
from collections.abc import Iterable

from ._effects import Effect, EffectQuery, check_effect_key, check_limit
from ._errors import InvalidIdentifier, InvalidInput, InvalidLeaseRequest, RecordNotFound
from ._request import Target
from ._rules import check_ttl
from ._validate import check_column, check_name, is_unicode

__all__ = [
    "GUARD_PREFIX",
    "GUARD_REFUSAL",
    "MAX_OWNER_CHARS",
    "check_declared",
    "check_lease_args",
    "check_owner",
    "check_wait",
    "effect_ref",
    "found_effect",
    "guard_refusal",
    "guard_target",
    "key_query",
    "pending_query",
    "reconcile_query",
]

MAX_OWNER_CHARS = 200

#: A guard trigger's name is this prefix and the table's (``fencing_guard_orders``).
GUARD_PREFIX = "fencing_guard_"
# PostgreSQL keeps 63 bytes of a name, MySQL 64: the trigger's name must fit whole.
_MAX_GUARDED_NAME = 63 - len(GUARD_PREFIX)


#: What every guard trigger's refusal says (``errors.translate`` of each SQL backend
#: tells a ``GuardRefused`` by it).
GUARD_REFUSAL = "refused by fencing: a version never moves backwards"


def guard_refusal(target: Target) -> str:
    """The text of the database error a guard trigger raises: no quote in it (the names
    are checked identifiers), at most 123 characters (MySQL's SIGNAL keeps 128)."""
    return f"{GUARD_PREFIX}{target.name}: UPDATE {GUARD_REFUSAL}"


def guard_target(name: object, key: object, version: object) -> Target:
    """The table of ``store.guard_table()`` / ``unguard_table()``: checked identifiers,
    and a name short enough for its trigger's (``fencing_guard_<table>``) to fit."""
    target = Target(
        "table",
        check_column(name, "table"),
        check_column(key, "key column"),
        check_column(version, "version column"),
    )
    if len(target.name) > _MAX_GUARDED_NAME:
        raise InvalidIdentifier(
            f"table name {target.name!r} is too long to guard: its trigger's name"
            f" {GUARD_PREFIX + target.name!r} must fit in 63 characters"
        )
    return target


def check_declared(target: Target, columns: object) -> frozenset[str] | None:
    """The ``columns=`` of ``store.table()``: column names, none of them managed."""
    if columns is None:
        return None
    if isinstance(columns, str | bytes) or not isinstance(columns, Iterable):
        raise InvalidInput(f"columns must be a list of column names, not {type(columns).__name__}")
    names = frozenset(check_column(c) for c in columns)
    if not names:
        raise InvalidInput("columns must name at least one column")
    for col in (target.key_column, target.version_column):
        if col in names:
            raise InvalidInput(
                f"column {col!r} is managed by fencing (the key or version column):"
                " leave it out of columns"
            )
    return names


def found_effect(effect: Effect | None, key: str) -> Effect:
    if effect is None:
        raise RecordNotFound(f"no effect {key} in this store")
    return effect


def reconcile_query(limit: object) -> EffectQuery:
    return EffectQuery(limit=check_limit(limit))


def pending_query(older_than: object, limit: object) -> EffectQuery:
    if (
        isinstance(older_than, bool)
        or not isinstance(older_than, int | float)
        or not math.isfinite(older_than)
        or older_than < 0
    ):
        raise InvalidInput(
            f"older_than must be a non-negative number of seconds, not {older_than!r}"
        )
    return EffectQuery(limit=check_limit(limit), pending_for=float(older_than))


def key_query(key: object) -> EffectQuery:
    return EffectQuery(idempotency_key=check_effect_key(key), limit=1)


def effect_ref(effect: object) -> str:
    """The idempotency key of an ``Effect``, or a key given as text."""
    if isinstance(effect, Effect):
        return effect.idempotency_key
    return check_effect_key(effect)


def check_owner(owner: object) -> str:
    if not isinstance(owner, str) or not 0 < len(owner) <= MAX_OWNER_CHARS or not is_unicode(owner):
        raise InvalidLeaseRequest(f"lease owner must be a string of 1 to {MAX_OWNER_CHARS} chars")
    return owner


def check_wait(wait: object) -> float | None:
    if wait is None:
        return None
    if isinstance(wait, bool) or not isinstance(wait, int | float) or not math.isfinite(wait):
        raise InvalidLeaseRequest(f"wait must be a finite number of seconds or None, not {wait!r}")
    if wait < 0:
        raise InvalidLeaseRequest("wait must not be negative")
    return float(wait)


def check_lease_args(name: object, owner: object, ttl: object) -> tuple[str, str, float]:
    return check_name(name, "lease"), check_owner(owner), check_ttl(ttl)
