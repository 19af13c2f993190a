"""PostgreSQL's errors, translated at the boundary (``docs/backends/postgres.md``)::

    psycopg.Error
    ├── connection lost, admin shutdown, pool timeout,
    │   serialization failure, deadlock, statement timeout          -> TransientStoreError
    ├── lock timeout (lock_timeout, 55P03)                         -> LockTimeout
    ├── ... cancelled by the watchdog: your own transaction's lock  -> SelfDeadlock
    ├── undefined table / column / schema                          -> SchemaError
    ├── a value the column or jsonb cannot hold                    -> InvalidInput / InvalidState
    ├── a guard trigger's refusal (check_violation, ``guard``)      -> GuardRefused
    └── anything else                                              -> StoreError

Three of the transient ones are told apart, for the flows that re-run a statement:
``Retry``, ``Disconnected`` and ``Deadlock``.
"""

from __future__ import annotations

import re
from typing import Final

import psycopg
from psycopg_pool import PoolClosed, PoolTimeout

from ..._checks import is_guard_refusal
from ..._errors import (
    ConfigurationError,
    FencingError,
    GuardRefused,
    InvalidInput,
    InvalidState,
    LockTimeout,
    SchemaError,
    SelfDeadlock,
    StoreClosed,
    StoreError,
    TransientStoreError,
)

__all__ = [
    "CONFIG_STATES",
    "CONFIG_TEXT",
    "Deadlock",
    "Disconnected",
    "Retry",
    "self_deadlock",
    "sqlstate",
    "translate",
]


class Retry(TransientStoreError):
    """The statement rolled back because a concurrent commit claimed the same intent,
    or a newer fence got there first; nothing was written, run it again."""


class Disconnected(TransientStoreError):
    """The connection was lost; the outcome of a write is unknown."""


class Deadlock(TransientStoreError):
    """The server chose this statement as a deadlock's victim and rolled it back
    whole: nothing was written, so a batch may simply run again."""


_TRANSIENT: Final = frozenset({"40001", "40P01", "57014", "53300", "53400"})
_RELATION: Final = re.compile(r'in relation "([^"]+)"')
_OWN_TRANSACTION: Final = (
    "if your own open transaction holds it (it updated or locked that row:"
    " select_for_update(), an UPDATE, a fenced commit through store.using), this call"
    " would wait for it forever: end that transaction first, or make a commit inside it"
    " through store.using(conn)"
)
_DISCONNECTED: Final = frozenset({"57P01", "57P02", "57P03"})
_UNDEFINED: Final = frozenset({"42P01", "42703", "3F000"})
_UNSTORABLE: Final = frozenset({"22P05", "22021"})  # jsonb: \u0000, bad encoding

# A connection refused by the server for what the URL says (no such database, role or
# password; no pg_hba.conf entry) is a configuration error: retrying cannot fix it.
# libpq reports these on connect without a SQLSTATE, so its FATAL text is matched too.
CONFIG_STATES: Final = frozenset({"3D000", "28P01", "28000"})
CONFIG_TEXT: Final = re.compile(
    r"FATAL:\s+(database \S.* does not exist|role \S.* does not exist"
    r"|password authentication failed|no pg_hba\.conf entry|.*authentication failed)"
)


def _locked(diag: object) -> str:
    """What the statement waited for, from the error's context: ``a row of "orders"``."""
    found = _RELATION.search(str(getattr(diag, "context", None) or ""))
    return f'a row of "{found.group(1)}"' if found else "a lock"


def self_deadlock(exc: Exception, pid: int) -> SelfDeadlock:
    """The error for a statement of the store's own that the watchdog (``watch.py``)
    cancelled: it waited for a lock of connection ``pid``, the same thread's."""
    what = _locked(getattr(exc, "diag", None))
    return SelfDeadlock(
        f"postgresql: a statement on the store's own connection waited for {what} locked"
        f" by your own open transaction, on connection pid {pid} (given to store.using in"
        " this thread): it could never be granted while your code waits here, so it was"
        " cancelled, and nothing of it was written. End (commit or roll back) that"
        " transaction first, or make a commit inside it through store.using(conn)",
        (pid,),
    )


def sqlstate(exc: BaseException) -> str:
    """The error's SQLSTATE: psycopg 3's ``sqlstate``, psycopg2's ``pgcode`` ("": none)."""
    return getattr(exc, "sqlstate", None) or getattr(exc, "pgcode", None) or ""


def _driver_class(exc: BaseException, name: str) -> bool:
    """Whether ``exc`` is psycopg's or psycopg2's DB-API exception class ``name``."""
    return any(
        cls.__name__ == name and cls.__module__.split(".", 1)[0] in ("psycopg", "psycopg2")
        for cls in type(exc).__mro__
    )


def translate(exc: Exception) -> FencingError:
    """The fencing error for a driver error, psycopg 3's or psycopg2's (a connection given
    to ``store.using``): ``raise translate(exc) from exc``."""
    state = sqlstate(exc)
    diag = getattr(exc, "diag", None)
    text = f"postgresql: {str(exc).strip() or type(exc).__name__}"
    if state == "55P03":  # lock_timeout (or NOWAIT): the statement was cancelled whole
        return LockTimeout(
            f"{text}: another transaction holds {_locked(diag)} for longer than the store's"
            f" lock_timeout; nothing of the statement was written. {_OWN_TRANSACTION}"
        )
    if state == "23505" and getattr(diag, "constraint_name", None) == "fencing_applied_pkey":
        return Retry(text)
    if state == "23502" and getattr(diag, "table_name", None) == "fencing_applied":
        return Retry(text)
    if state == "23514" and is_guard_refusal(text):
        return GuardRefused(text)
    if isinstance(exc, UnicodeError):
        return InvalidInput(f"postgresql: text that cannot be encoded ({exc})")
    if isinstance(exc, PoolClosed):
        return StoreClosed("postgresql: the store is closed")
    if state == "40P01":
        return Deadlock(text)
    if state in CONFIG_STATES:
        return ConfigurationError(f"{text} (the URL's database or credentials)")
    if isinstance(exc, PoolTimeout) or state in _TRANSIENT:
        return TransientStoreError(text)
    if isinstance(exc, psycopg.OperationalError) or _driver_class(exc, "OperationalError"):
        if not state or state.startswith("08") or state in _DISCONNECTED:
            return Disconnected(text)
        return TransientStoreError(text)
    if state in _UNDEFINED:
        return SchemaError(f"{text} (run store.migrate() / fencing migrate URL?)")
    if state in _UNSTORABLE:
        return InvalidState(f"{text} (PostgreSQL cannot store this text)")
    if _driver_class(exc, "DataError") or state in ("42804", "42883"):
        return InvalidInput(f"{text} (a value the column cannot hold or compare)")
    return StoreError(text)
