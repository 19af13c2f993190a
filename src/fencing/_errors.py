"""The errors fencing raises.

Stale, duplicate and fenced commits are *outcomes*, never errors. Errors are for
bad input (refused before anything is written), for configuration, and for a
store that could not be reached::

    FencingError
    ├── InvalidInput (also ValueError)       bad input, refused before any write
    │   ├── InvalidIntent                    malformed, truncated, tampered, mismatched intent
    │   ├── InvalidState                     state not a JSON object, not JSON, oversize
    │   ├── InvalidIdentifier                unsafe collection, lease, table or column name
    │   ├── InvalidLeaseRequest              non-positive or absurd TTL, bad owner
    │   └── OutboxRowError                   outbox.retry/drop named rows they cannot take:
    │       ├── UnknownOutboxRow (LookupError)   an id with no row
    │       └── OutboxRowNotDead                 a row that is not dead (pending or sent)
    ├── ConfigurationError                   unknown URL scheme, bad URL option, a database
    │   │                                    or credentials the server refuses (not retried)
    │   └── MissingDependency (ImportError)  a backend's driver is not installed
    ├── SchemaError                          guarded table or column missing, schema too new
    │   └── StoreNotMigrated                 open(url, migrate="check"): no store there, or
    │                                        an older one (``fencing migrate URL``)
    ├── AlreadyExists                        create() on a key that is present
    ├── RecordNotFound (LookupError)         intent() for a key that does not exist
    ├── LeaseError
    │   ├── LeaseHeld                        another owner holds the lease
    │   └── LeaseLost                        renew/release by a holder that no longer holds it
    │       └── LeaseExpired                 a fenced task's lease kept running out, nobody
    │                                        took over: the same intent is retried
    └── StoreError                           the store failed
        ├── StoreClosed                      the store was closed: every call refused
        ├── WrongEventLoop                   an async store used outside the loop that opened it
        ├── GuardRefused                     a table's guard trigger refused an UPDATE that
        │                                    set its version lower, or (strict) left it
        │                                    unchanged (``store.guard_table``)
        └── TransientStoreError              connection dropped, busy, timeout: the outcome
            │                                is unknown; retry with the *same* intent and
            │                                expect Duplicate if the first try landed
            ├── SerializationFailure         store.using(): your transaction's snapshot is
            │                                older than the row's latest commit: roll it
            │                                back and run the whole transaction again
            └── LockTimeout                  fencing's own connection waited its lock_timeout
                │                            for a lock another transaction holds
                └── SelfDeadlock             ... held by your own open transaction, in this
                                             thread (or task): it could never be granted
"""

from __future__ import annotations

__all__ = [
    "AlreadyExists",
    "ConfigurationError",
    "FencingError",
    "GuardRefused",
    "InvalidIdentifier",
    "InvalidInput",
    "InvalidIntent",
    "InvalidLeaseRequest",
    "InvalidState",
    "LeaseError",
    "LeaseExpired",
    "LeaseHeld",
    "LeaseLost",
    "LockTimeout",
    "MissingDependency",
    "OutboxRowError",
    "OutboxRowNotDead",
    "RecordNotFound",
    "SchemaError",
    "SelfDeadlock",
    "SerializationFailure",
    "StoreClosed",
    "StoreError",
    "StoreNotMigrated",
    "TransientStoreError",
    "UnknownOutboxRow",
    "WrongEventLoop",
]


class FencingError(Exception):
    """Base of every error fencing raises."""


class InvalidInput(FencingError, ValueError):
    """Input refused before anything was written."""


class InvalidIntent(InvalidInput):
    """An intent that is malformed, truncated, wrong-typed, oversize, tampered or mismatched."""


class InvalidState(InvalidInput):
    """A state that is not a JSON object of JSON values, or is larger than allowed."""


class InvalidIdentifier(InvalidInput):
    """A collection, lease, table or column name outside the safe identifier rules."""


class InvalidLeaseRequest(InvalidInput):
    """A lease request with a bad TTL, owner or wait time."""


class OutboxRowError(InvalidInput):
    """``outbox.retry(ids)`` / ``outbox.drop(ids)`` named rows it cannot take; nothing was
    changed, not even for the other ids. ``unknown``: ids with no row; ``not_dead``: ids
    of rows that are not dead (still pending, or sent)."""

    def __init__(self, message: str, unknown: tuple[int, ...], not_dead: tuple[int, ...]) -> None:
        super().__init__(message)
        self.unknown = unknown
        self.not_dead = not_dead


class UnknownOutboxRow(OutboxRowError, LookupError):
    """An id named to ``outbox.retry`` / ``outbox.drop`` has no row (never, or pruned)."""


class OutboxRowNotDead(OutboxRowError):
    """A row named to ``outbox.retry`` / ``outbox.drop`` is not dead: only dead rows are
    put back or dropped (a pending row is the relay's, a sent one is history)."""


class ConfigurationError(FencingError):
    """A store URL or option that fencing cannot use."""


class MissingDependency(ConfigurationError, ImportError):
    """The driver a backend needs is not installed; the message names the extra."""


class SchemaError(FencingError):
    """A guarded table or column does not exist, or the store's schema is unknown."""


class StoreNotMigrated(SchemaError):
    """``fencing.open(url, migrate="check")`` found no fencing store at ``url`` (no file,
    schema, database tables or keys of fencing's), or one at an older schema version:
    nothing was created or changed; ``fencing migrate URL`` makes or upgrades it.
    ``found`` is the store's schema version (None: there is no store), ``expected``
    this fencing's."""

    def __init__(self, message: str, found: int | None = None, expected: int | None = None):
        super().__init__(message)
        self.found = found
        self.expected = expected


class AlreadyExists(FencingError):
    """create() found the key already present; nothing was written."""


class RecordNotFound(FencingError, LookupError):
    """An intent was asked for a record that does not exist."""


class LeaseError(FencingError):
    """A lease operation that could not be done."""


class LeaseHeld(LeaseError):
    """The lease is held by another owner (or by another acquisition)."""

    def __init__(self, name: str, holder: str | None = None, expires_in: float | None = None):
        self.name = name
        self.holder = holder
        self.expires_in = expires_in
        detail = f" by {holder!r}" if holder else ""
        if expires_in is not None:
            detail += f" for another {expires_in:.3f}s"
        super().__init__(f"lease {name!r} is held{detail}")


class LeaseLost(LeaseError):
    """The caller no longer holds this lease token (it expired or a newer owner took it)."""


class LeaseExpired(LeaseLost):
    """A fenced task's commit came back ``Fenced(EXPIRED)`` every time it took its lease
    again: the worker kept outliving its TTL and nobody took over. The work is not done
    and not obsolete: the queue retries the same intent (``outcome`` is the answer)."""

    def __init__(self, outcome: object) -> None:
        self.outcome = outcome
        intent = getattr(outcome, "intent", None)
        what = "" if intent is None else f" {intent.collection}/{intent.key} intent {intent.id}"
        super().__init__(
            f"the lease ran out before the commit of{what} and nobody took over;"
            " the same intent is retried"
        )


class StoreError(FencingError):
    """The store failed to carry out an operation."""


class StoreClosed(StoreError):
    """The store was closed; every call on it (and its collections, tables, leases) is
    refused. Open a new store."""


class WrongEventLoop(StoreError):
    """An async store was used from an event loop other than the one that opened it.

    An async store (its pool and connections) belongs to the loop it was opened in:
    open one store per event loop."""


class GuardRefused(StoreError):
    """A table's guard trigger (``store.guard_table()``, ``fencing migrate URL
    --guard-table``) refused an UPDATE that set the version column lower than it was
    (no writer may move a version backwards), or, a strict guard (``mode="strict"``),
    one that left it unchanged (a blind write). Nothing of the statement was written."""


class TransientStoreError(StoreError):
    """The store could not be reached or timed out; the outcome of a commit is unknown.

    Retry with the same intent: if the first attempt landed, the retry reports
    ``Duplicate`` and nothing is written twice.
    """


class SerializationFailure(TransientStoreError):
    """A call through ``store.using(conn)`` cannot be judged (or written) in your
    transaction: its snapshot (``REPEATABLE READ``, ``SERIALIZABLE``, or SQLite's read
    transaction) is older than the latest commit to the row, which the intent may have
    been decided against. Nothing of the call remains in your transaction, which is left
    usable; roll it back and run the whole transaction again: a new snapshot judges the
    intent on the row as it is then (the retry, with the same intent, may commit)."""


class LockTimeout(TransientStoreError):
    """A statement on one of the store's own connections waited the store's lock timeout
    (PostgreSQL: the URL's ``lock_timeout``, default 5 s; MySQL: InnoDB's
    ``innodb_lock_wait_timeout``) for a lock another transaction holds, and was cancelled
    whole: nothing of it was written. Retryable: the queue integrations retry it.
    ``pids``: the server sessions that held it, when known."""

    def __init__(self, message: str, pids: tuple[int, ...] = ()) -> None:
        super().__init__(message)
        self.pids = pids


class SelfDeadlock(LockTimeout):
    """The lock is held by your own open transaction, on a connection of this thread (or
    asyncio task) that you gave to ``store.using``: it would be released only when that
    transaction ends, and your code is waiting here, so it could never be granted. Make
    the call through ``store.using(conn)`` (it then runs inside your transaction), or end
    your transaction first. ``pids`` holds that connection's server pid."""
