"""fencing: background tasks that cannot commit stale decisions.

Work carries the version it was decided against; the write is conditional on it;
"stale" is a normal, typed outcome; leases hand out strictly increasing tokens that
the store itself checks. Start with :func:`open`.
"""

from __future__ import annotations

from ._aoutbox import AsyncOutbox
from ._astore import AsyncCollection, AsyncLease, AsyncStore, AsyncTable
from ._effects import Effect
from ._errors import (
    AlreadyExists,
    ConfigurationError,
    FencingError,
    GuardRefused,
    InvalidIdentifier,
    InvalidInput,
    InvalidIntent,
    InvalidLeaseRequest,
    InvalidState,
    LeaseError,
    LeaseExpired,
    LeaseHeld,
    LeaseLost,
    LockTimeout,
    MissingDependency,
    OutboxRowError,
    OutboxRowNotDead,
    RecordNotFound,
    SchemaError,
    SelfDeadlock,
    SerializationFailure,
    StoreClosed,
    StoreError,
    StoreNotMigrated,
    TransientStoreError,
    UnknownOutboxRow,
    WrongEventLoop,
)
from ._open import DEFAULT_RETENTION, open_async
from ._open import open as open  # public, but not in __all__ (see below)
from ._outbox import OutboxClaim, OutboxMessage, OutboxRow, OutboxStats
from ._outbox_front import Outbox
from ._policy import Drop, Recompute, Reconcile, StalePolicy
from ._signing import Signer
from ._store import Collection, Lease, Store, Table
from ._values import (
    SKIP,
    Committed,
    Contended,
    Duplicate,
    Fenced,
    FenceReason,
    Intent,
    Missing,
    Outcome,
    Record,
    Skipped,
    SkipType,
    Stale,
)

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_RETENTION",
    "SKIP",
    "AlreadyExists",
    "AsyncCollection",
    "AsyncLease",
    "AsyncOutbox",
    "AsyncStore",
    "AsyncTable",
    "Collection",
    "Committed",
    "ConfigurationError",
    "Contended",
    "Drop",
    "Duplicate",
    "Effect",
    "FenceReason",
    "Fenced",
    "FencingError",
    "GuardRefused",
    "Intent",
    "InvalidIdentifier",
    "InvalidInput",
    "InvalidIntent",
    "InvalidLeaseRequest",
    "InvalidState",
    "Lease",
    "LeaseError",
    "LeaseExpired",
    "LeaseHeld",
    "LeaseLost",
    "LockTimeout",
    "Missing",
    "MissingDependency",
    "Outbox",
    "OutboxClaim",
    "OutboxMessage",
    "OutboxRow",
    "OutboxRowError",
    "OutboxRowNotDead",
    "OutboxStats",
    "Outcome",
    "Recompute",
    "Reconcile",
    "Record",
    "RecordNotFound",
    "SchemaError",
    "SelfDeadlock",
    "SerializationFailure",
    "Signer",
    "SkipType",
    "Skipped",
    "Stale",
    "StalePolicy",
    "Store",
    "StoreClosed",
    "StoreError",
    "StoreNotMigrated",
    "Table",
    "TransientStoreError",
    "UnknownOutboxRow",
    "WrongEventLoop",
    "__version__",
    "open_async",
]
# ``fencing.open`` is public but not in ``__all__``: ``from fencing import *`` must not
# shadow the builtin ``open``.
