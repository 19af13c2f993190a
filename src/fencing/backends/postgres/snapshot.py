"""PostgreSQL's ``latest`` for a view of ``store.using(conn)``: a refusal the caller's
transaction answered, checked against the latest committed rows (``_abound``).

Under ``REPEATABLE READ`` and ``SERIALIZABLE`` the caller's transaction reads one
snapshot, taken at its first statement. A commit whose conditional ``UPDATE`` finds the
row there at a version other than the intent's updates nothing, and the server raises no
serialization failure for a row it did not try to lock: the statement answers the
snapshot's row (older than the one the intent was decided against), or none for a row
created since. So a refusal such a snapshot could explain (``snapshot_may_explain``) is
checked, in two statements, on the refused path only:

1. on the caller's connection, its isolation level and snapshot (``pg_current_snapshot``);
   ``READ COMMITTED`` takes a new one at every statement: the refusal stands;
2. on the store's own connection, which transaction created the latest committed version
   of the record's row (``xmin``), and, for a refusal by the lease, of the lease row.

If that transaction committed after the caller's snapshot was taken, the caller's
transaction sees an older row, or none: ``SerializationFailure`` (run it again).
Otherwise it sees the latest committed row, with its own uncommitted writes on top,
which are then what refuse the intent (it moved the version on, or deleted the row):
the refusal stands, as it holds once the caller commits.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Final

from ..._flow import Flow
from ..._request import CommitRequest, CommitResult, Target
from ..._rules import Status
from .._abound import snapshot_too_old
from .statements import quoted
from .steps import Answer, Query, read_only

__all__ = ["Ours", "committed_after", "latest"]

#: On the caller's connection: what its transaction reads.
_SNAPSHOT: Final = "SELECT current_setting('transaction_isolation'), pg_current_snapshot()::text"
_ONE_SNAPSHOT: Final = frozenset({"repeatable read", "serializable"})
_LEASE_ROW: Final = "SELECT l.xmin::text FROM fencing_leases l WHERE l.name = %(lease)s"
_XID_SPACE: Final = 1 << 32


@dataclass(frozen=True, slots=True)
class Ours:
    """A step: a flow run on the store's own connections, not the caller's."""

    flow: Flow[Any]


@lru_cache(maxsize=256)
def _creators(target: Target) -> str:
    """The creating transactions of a key's latest committed row and of a lease's row
    (NULL: no such row), and the first transaction id not yet begun by then."""
    if target.kind == "collection":
        row = (
            "SELECT r.xmin::text FROM fencing_records r"
            " WHERE r.collection = %(name)s AND r.key = %(key)s"
        )
    else:
        row = (
            f"SELECT fencing_row.xmin::text FROM {quoted(target.name)} AS fencing_row"
            f" WHERE fencing_row.{quoted(target.key_column)} = %(key)s"
        )
    return f"SELECT ({row}), ({_LEASE_ROW}), pg_snapshot_xmax(pg_current_snapshot())::text"


def committed_after(snapshot: str, xmin: str, newest: str) -> bool:
    """Whether transaction ``xmin`` (a row's ``xmin``: 32 bits) committed after
    ``snapshot`` (``pg_current_snapshot()``'s text, ``xmin:xmax:xip,...``, 64-bit ids)
    was taken: it is one of the snapshot's running transactions, or began at or after
    its ``xmax`` and before ``newest`` (the first id not yet begun when the row was read,
    which bounds a committed row's creator). The 32-bit id is placed within 2**31 of
    ``xmax``; an id frozen long ago that lands in neither range is seen as before."""
    low, high, running = snapshot.split(":")
    xid = int(xmin)
    if xid < 3:  # bootstrap and frozen ids: before every snapshot
        return False
    top = int(high)
    delta = (xid - top) % _XID_SPACE
    if delta >= _XID_SPACE // 2:
        delta -= _XID_SPACE
    full = top + delta
    if top <= full < int(newest):
        return True
    return int(low) <= full < top and str(full) in running.split(",")


def latest(request: CommitRequest, result: CommitResult) -> Flow[CommitResult]:
    """``result``, a refusal a snapshot could explain, if it holds on the latest
    committed rows as the caller's transaction sees them; else ``SerializationFailure``."""
    found: Answer = yield Query(_SNAPSHOT)
    level, snapshot = found.rows[0]
    if level not in _ONE_SNAPSHOT:
        return result
    target, lease = request.target, request.lease
    by_lease = result.status in (Status.FENCED_NEWER, Status.FENCED_EXPIRED)
    params = {
        "name": target.name,
        "key": request.intent.key,
        "lease": lease.name if lease is not None and by_lease else None,
    }
    rows: Answer = yield Ours(read_only(Query(_creators(target), params)))
    record, lease_row, newest = rows.rows[0]
    for xmin in (record, lease_row):
        if xmin is not None and committed_after(snapshot, xmin, newest):
            raise snapshot_too_old("postgresql", request)
    return result
