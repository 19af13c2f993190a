"""SQLite's outbox (``_contract.OutboxFlows``): each operation one ``Txn`` step, so the
claim's read and update happen under the write lock (one relay claims at a time) and a
send through ``store.using(conn)`` is a row of the caller's transaction. Claim tokens
come from ``fencing_outbox_claims`` (AUTOINCREMENT: never reused, even once pruned)."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Final

from ..._flow import Flow
from ..._outbox import (
    OUTBOX_COLUMNS,
    OutboxClaim,
    OutboxMessage,
    OutboxRow,
    OutboxStats,
    check_dead,
    due_times,
    outbox_row,
)
from .._contract import prune_batches
from .steps import pruning, txn

__all__ = ["SQLiteOutboxFlows"]

_COLUMNS: Final = ", ".join(OUTBOX_COLUMNS)
ADD: Final = (
    "INSERT INTO fencing_outbox (kind, task, queue, payload, options, okey, created_at)"
    f" VALUES (?, ?, ?, ?, ?, ?, ?) RETURNING {_COLUMNS}"
)
ADD_DUE: Final = (
    "INSERT INTO fencing_outbox (kind, task, queue, payload, options, okey, created_at,"
    f" due_at, burst_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING {_COLUMNS}"
)
#: the rows a superseding send settles: the key's, kind's and task's waiting rows under
#: no live claim (a claimed row is on its way); answers when their burst began
SUPERSEDE: Final = (
    "UPDATE fencing_outbox SET sent_at = ?1, superseded_at = ?1, claim_token = NULL,"
    " claimed_by = NULL, claimed_until = NULL WHERE okey = ?2 AND kind = ?3 AND task = ?4"
    " AND sent_at IS NULL AND dead_at IS NULL AND (claimed_until IS NULL OR claimed_until <= ?1)"
    " RETURNING coalesce(burst_at, created_at)"
)
NEW_CLAIM: Final = "INSERT INTO fencing_outbox_claims (relay, claimed_at) VALUES (?, ?)"
#: pending rows of a kind, in id order, whose key has no pending row under a live claim
#: nor, up to the row, a pending row the claim cannot take: one not yet due (a
#: debounced send) or of another queue kind (dead and superseded rows are settled;
#: an older row of the kind comes first in id order: the claim takes it too)
CLAIMABLE: Final = (
    "SELECT o.id FROM fencing_outbox AS o WHERE o.sent_at IS NULL AND o.kind = ?1"
    " AND o.dead_at IS NULL AND NOT EXISTS (SELECT 1 FROM fencing_outbox AS p"
    " WHERE p.okey = o.okey AND p.sent_at IS NULL AND p.dead_at IS NULL"
    " AND (p.claimed_until > ?2 OR (p.id <= o.id AND (p.due_at > ?2 OR p.kind <> ?1))))"
    " ORDER BY o.id LIMIT ?3"
)
_ONE_OF: Final = "id IN (SELECT value FROM json_each(?))"
TAKE: Final = (
    f"UPDATE fencing_outbox SET claim_token = ?, claimed_by = ?, claimed_until = ?"
    f" WHERE {_ONE_OF} RETURNING {_COLUMNS}"
)
DONE: Final = (
    "UPDATE fencing_outbox SET sent_at = ?, claimed_until = NULL"
    f" WHERE claim_token = ? AND sent_at IS NULL AND {_ONE_OF}"
)
#: give back (release: ``dead_at`` stays NULL) or give up as dead (bury: the clock)
GIVE_BACK: Final = (
    "UPDATE fencing_outbox SET attempts = attempts + 1, strikes = strikes + ?,"
    " last_error = ?, dead_at = ?, claim_token = NULL, claimed_by = NULL,"
    " claimed_until = NULL WHERE claim_token = ? AND sent_at IS NULL AND dead_at IS NULL"
    f" AND {_ONE_OF}"
)
LIST: Final = (
    f"SELECT {_COLUMNS} FROM fencing_outbox WHERE sent_at IS NULL AND dead_at IS NULL"
    " AND (? IS NULL OR kind = ?) ORDER BY id LIMIT ?"
)
LIST_DEAD: Final = (
    f"SELECT {_COLUMNS} FROM fencing_outbox WHERE sent_at IS NULL AND dead_at IS NOT NULL"
    " AND (? IS NULL OR kind = ?) ORDER BY id LIMIT ?"
)
STATS: Final = (
    "SELECT COUNT(*) FILTER (WHERE dead_at IS NULL),"
    " MIN(created_at) FILTER (WHERE dead_at IS NULL), COUNT(*) FILTER (WHERE dead_at IS NOT NULL),"
    " (SELECT COUNT(*) FROM fencing_outbox WHERE superseded_at IS NOT NULL"
    " AND (?1 IS NULL OR kind = ?1))"
    " FROM fencing_outbox WHERE sent_at IS NULL AND (?1 IS NULL OR kind = ?1)"
)
FIND: Final = (
    f"SELECT id, dead_at IS NOT NULL AND sent_at IS NULL FROM fencing_outbox WHERE {_ONE_OF}"
)
RETRY: Final = (
    f"UPDATE fencing_outbox SET attempts = 0, strikes = 0, dead_at = NULL WHERE {_ONE_OF}"
)
DROP: Final = f"DELETE FROM fencing_outbox WHERE {_ONE_OF}"
#: sent rows, and superseded ones (settled then: their ``sent_at`` is when)
#: (a batch of a prune: the oldest, by the fencing_outbox_sent index, at most the limit)
PRUNE: Final = (
    "DELETE FROM fencing_outbox WHERE id IN (SELECT id FROM fencing_outbox"
    " WHERE sent_at IS NOT NULL AND sent_at < ? ORDER BY sent_at LIMIT ?)"
)
#: old claims, in token order (the order they were made in: their claimed_at grows too)
PRUNE_CLAIMS: Final = (
    "DELETE FROM fencing_outbox_claims WHERE token IN (SELECT token FROM fencing_outbox_claims"
    " WHERE claimed_at < ? ORDER BY token LIMIT ?)"
)


def _ids(ids: Sequence[int]) -> str:
    return "[" + ",".join(str(int(i)) for i in ids) + "]"


class SQLiteOutboxFlows:
    """The outbox's flows for SQLite (a mixin of ``SQLiteFlows``)."""

    __slots__ = ()

    def outbox_add(self, message: OutboxMessage) -> Flow[OutboxRow]:
        args = message.stored()

        def body(conn: sqlite3.Connection, now: float) -> OutboxRow:
            if not message.supersede:
                return outbox_row(conn.execute(ADD, (*args, now)).fetchone())
            which = (now, message.key, message.kind, message.task)
            began = [float(b) for (b,) in conn.execute(SUPERSEDE, which)]
            due, burst = due_times(message, now, min(began, default=None))
            return outbox_row(conn.execute(ADD_DUE, (*args, now, due, burst)).fetchone())

        return txn(body)

    def outbox_claim(self, relay: str, kind: str, limit: int, ttl: float) -> Flow[OutboxClaim]:
        def body(conn: sqlite3.Connection, now: float) -> OutboxClaim:
            ids = [r[0] for r in conn.execute(CLAIMABLE, (kind, now, limit))]
            token = int(conn.execute(NEW_CLAIM, (relay, now)).lastrowid or 0)
            until = now + ttl
            rows = [outbox_row(r) for r in conn.execute(TAKE, (token, relay, until, _ids(ids)))]
            rows.sort(key=lambda r: r.id)
            return OutboxClaim(token, tuple(rows), until, now)

        return txn(body)

    def outbox_done(self, token: int, ids: Sequence[int]) -> Flow[int]:
        def body(conn: sqlite3.Connection, now: float) -> int:
            return conn.execute(DONE, (now, token, _ids(ids))).rowcount

        return txn(body)

    def outbox_release(
        self, token: int, ids: Sequence[int], error: str | None, strike: bool
    ) -> Flow[int]:
        def body(conn: sqlite3.Connection, now: float) -> int:
            return conn.execute(GIVE_BACK, (int(strike), error, None, token, _ids(ids))).rowcount

        return txn(body)

    def outbox_bury(self, token: int, ids: Sequence[int], error: str | None) -> Flow[int]:
        def body(conn: sqlite3.Connection, now: float) -> int:
            return conn.execute(GIVE_BACK, (1, error, now, token, _ids(ids))).rowcount

        return txn(body)

    def outbox_dead(self, kind: str | None, limit: int) -> Flow[list[OutboxRow]]:
        def body(conn: sqlite3.Connection, now: float) -> list[OutboxRow]:
            return [outbox_row(r) for r in conn.execute(LIST_DEAD, (kind, kind, limit))]

        return txn(body, write=False)

    def _dead_only(self, ids: Sequence[int], verb: str, then: str) -> Flow[int]:
        def body(conn: sqlite3.Connection, now: float) -> int:
            found = {int(i): bool(dead) for i, dead in conn.execute(FIND, (_ids(ids),))}
            check_dead(ids, found, verb)
            return conn.execute(then, (_ids(ids),)).rowcount

        return txn(body)

    def outbox_retry(self, ids: Sequence[int]) -> Flow[int]:
        return self._dead_only(ids, "retry", RETRY)

    def outbox_drop(self, ids: Sequence[int]) -> Flow[int]:
        return self._dead_only(ids, "drop", DROP)

    def outbox_list(self, kind: str | None, limit: int) -> Flow[list[OutboxRow]]:
        def body(conn: sqlite3.Connection, now: float) -> list[OutboxRow]:
            return [outbox_row(r) for r in conn.execute(LIST, (kind, kind, limit))]

        return txn(body, write=False)

    def outbox_stats(self, kind: str | None) -> Flow[OutboxStats]:
        def body(conn: sqlite3.Connection, now: float) -> OutboxStats:
            count, oldest, dead, superseded = conn.execute(STATS, (kind,)).fetchone()
            age = 0.0 if oldest is None else max(0.0, now - float(oldest))
            return OutboxStats(int(count), age, now, int(dead), int(superseded))

        return txn(body, write=False)

    def outbox_prune(self, older_than: float) -> Flow[int]:
        gone = yield from prune_batches(pruning(PRUNE, older_than))
        yield from prune_batches(pruning(PRUNE_CLAIMS, older_than))
        return gone
