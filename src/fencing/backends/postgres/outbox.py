"""PostgreSQL's outbox (``_contract.OutboxFlows``), part of the store's ``PostgresFlows``.
Each operation is ONE statement: one round trip, its own transaction on the store's
connections, a savepoint of the caller's transaction through ``store.using(conn)``.

* ``outbox_add`` inserts the row and queues ``pg_notify('fencing_outbox', kind)`` in the
  same statement: a relay listening on the channel (``listen.py``) wakes when the
  writer's transaction commits, and never for a rolled-back row.
* ``outbox_claim`` locks its candidates ``FOR UPDATE SKIP LOCKED`` (relays never wait
  for each other, and never take the same row), then keeps a candidate's key only if it
  could also lock every unsent row of that key and none is under a live claim: a key
  whose earlier row another claim (committed, or in flight) holds is skipped whole, so
  two concurrent claims never split a key. The token is ``nextval`` of a sequence.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from ..._flow import Flow
from ..._outbox import (
    OUTBOX_COLUMNS,
    STORED_COLUMNS,
    OutboxClaim,
    OutboxMessage,
    OutboxRow,
    OutboxStats,
    check_dead,
    outbox_row,
)
from .._contract import prune_batches
from .statements import NOW, prune_batch, quoted
from .steps import Answer, Query, pruning, read_only

__all__ = ["CHANNEL", "PostgresOutboxFlows", "wake_prefix"]

#: The channel ``outbox_add`` notifies when its row commits; the payload is
#: ``wake_prefix(schema) + kind``, so a relay hears its own store's rows only.
CHANNEL: Final = "fencing_outbox"


def wake_prefix(schema: str | None) -> str:
    """What a notification's payload starts with for a store in ``schema``."""
    return f"{schema or ''}:"


_COLUMNS: Final = ", ".join(OUTBOX_COLUMNS)
_OF_R: Final = ", ".join(f"r.{c}" for c in OUTBOX_COLUMNS)
_OF_O: Final = ", ".join(f"o.{c}" for c in OUTBOX_COLUMNS)
_OF_T: Final = ", ".join(f"t.{c}" for c in OUTBOX_COLUMNS)
#: a superseding send (``%(supersede)s``): the key's, kind's and task's waiting rows
#: under no live claim settled (``old``, locked: a claim skips them, and a claim that
#: took one first keeps it), and the new row due as ``_outbox.due_times`` says
ADD_DUE: Final = (
    f"WITH c AS (SELECT {NOW} AS now), old AS (UPDATE fencing_outbox o SET sent_at = c.now,"
    " superseded_at = c.now, claim_token = NULL, claimed_by = NULL, claimed_until = NULL"
    " FROM c WHERE o.okey = %(okey)s AND o.kind = %(kind)s AND o.task = %(task)s"
    " AND o.sent_at IS NULL AND o.dead_at IS NULL"
    " AND (o.claimed_until IS NULL OR o.claimed_until <= c.now)"
    " RETURNING coalesce(o.burst_at, o.created_at) AS began),"
    " b AS (SELECT least(coalesce(min(old.began), c.now), c.now) AS began, c.now FROM c"
    " LEFT JOIN old ON true GROUP BY c.now),"
    " r AS (INSERT INTO fencing_outbox (kind, task, queue, payload, options, okey,"
    " created_at, due_at, burst_at) SELECT %(kind)s, %(task)s, %(queue)s, %(payload)s,"
    " %(options)s, %(okey)s, b.now, CASE WHEN %(debounce)s::float8 IS NOT NULL THEN"
    " greatest(b.now, least(b.now + %(debounce)s::float8, b.began + %(max_wait)s::float8))"
    f" END, b.began FROM b RETURNING {_COLUMNS})"
    f" SELECT {_OF_R}, pg_notify('{CHANNEL}', %(wake)s || r.kind)::text FROM r"
)
ADD: Final = (
    "WITH r AS (INSERT INTO fencing_outbox (kind, task, queue, payload, options, okey,"
    f" created_at) VALUES (%(kind)s, %(task)s, %(queue)s, %(payload)s, %(options)s,"
    f" %(okey)s, {NOW}) RETURNING {_COLUMNS})"
    f" SELECT {_OF_R}, pg_notify('{CHANNEL}', %(wake)s || r.kind)::text FROM r"
)
#: Candidates: unsent rows of a kind whose key no committed live claim holds, nor up to
#: the row a row not yet due (a debounced send) or of another queue kind (dead and
#: superseded rows are settled), locked
#: (skipping rows another transaction holds); ``mine``: every unsent row of their keys
#: up to the last candidate this claim could lock, as they are now (a key's later rows
#: do not matter, and are not locked: a claim costs its rows, not the key's backlog);
#: ``seen``: as the snapshot has them. A key is
#: kept if both agree and no row of it is under a live claim; of a kept key, a candidate
#: is taken only if every earlier unsent row of its key (of any kind) is a candidate too (a
#: row skipped while another claim held it, since released, stays behind with all the
#: key's later rows: a claim takes a prefix of each key's rows, never a row past a gap).
CLAIM: Final = (
    "WITH cand AS (SELECT o.id, o.okey FROM fencing_outbox o WHERE o.sent_at IS NULL"
    " AND o.dead_at IS NULL AND o.kind = %(kind)s AND NOT EXISTS (SELECT 1 FROM fencing_outbox p"
    " WHERE p.okey = o.okey AND p.sent_at IS NULL AND p.dead_at IS NULL"
    f" AND (p.claimed_until > {NOW} OR (p.id <= o.id AND (p.due_at > {NOW}"
    " OR p.kind <> %(kind)s))))"
    " ORDER BY o.id LIMIT %(limit)s FOR UPDATE OF o SKIP LOCKED),"
    " mine AS (SELECT p.id, p.okey, p.kind, p.claimed_until FROM fencing_outbox p"
    " WHERE p.okey IN (SELECT okey FROM cand) AND p.sent_at IS NULL AND p.dead_at IS NULL"
    " AND p.id <= (SELECT max(id) FROM cand) FOR UPDATE OF p SKIP LOCKED),"
    " seen AS (SELECT p.okey, count(*) AS n FROM fencing_outbox p"
    " WHERE p.okey IN (SELECT okey FROM cand) AND p.sent_at IS NULL AND p.dead_at IS NULL"
    " AND p.id <= (SELECT max(id) FROM cand) GROUP BY p.okey),"
    " free AS (SELECT s.okey FROM seen s WHERE s.n = (SELECT count(*) FROM mine m"
    f" WHERE m.okey = s.okey AND (m.claimed_until IS NULL OR m.claimed_until <= {NOW}))),"
    f" c AS (SELECT nextval(%(seq)s::regclass) AS token, {NOW} AS now),"
    " took AS (UPDATE fencing_outbox o SET claim_token = c.token, claimed_by = %(relay)s,"
    " claimed_until = c.now + %(ttl)s::float8 FROM c WHERE o.id IN (SELECT cand.id"
    " FROM cand JOIN free USING (okey) WHERE NOT EXISTS (SELECT 1 FROM mine m"
    " WHERE m.okey = cand.okey AND m.id < cand.id"
    f" AND m.id NOT IN (SELECT id FROM cand))) RETURNING {_OF_O})"
    f" SELECT c.token, c.now, {_OF_T}"
    " FROM c LEFT JOIN took t ON true ORDER BY t.id"
)
DONE: Final = (
    f"UPDATE fencing_outbox SET sent_at = {NOW}, claimed_until = NULL"
    " WHERE claim_token = %(token)s AND sent_at IS NULL AND id = ANY(%(ids)s::bigint[])"
)
#: give back (release) or give up as dead (bury: ``%(dead)s``, then ``dead_at`` is now)
GIVE_BACK: Final = (
    "UPDATE fencing_outbox SET attempts = attempts + 1, strikes = strikes + %(strike)s,"
    f" last_error = %(error)s, dead_at = CASE WHEN %(dead)s THEN {NOW} END,"
    " claim_token = NULL, claimed_by = NULL, claimed_until = NULL"
    " WHERE claim_token = %(token)s AND sent_at IS NULL AND dead_at IS NULL"
    " AND id = ANY(%(ids)s::bigint[])"
)
LIST: Final = (
    f"SELECT {_COLUMNS} FROM fencing_outbox WHERE sent_at IS NULL AND dead_at IS NULL"
    " AND (%(kind)s::text IS NULL OR kind = %(kind)s) ORDER BY id LIMIT %(limit)s"
)
LIST_DEAD: Final = (
    f"SELECT {_COLUMNS} FROM fencing_outbox WHERE sent_at IS NULL AND dead_at IS NOT NULL"
    " AND (%(kind)s::text IS NULL OR kind = %(kind)s) ORDER BY id LIMIT %(limit)s"
)
STATS: Final = (
    "SELECT count(*) FILTER (WHERE dead_at IS NULL),"
    f" min(created_at) FILTER (WHERE dead_at IS NULL), {NOW},"
    " count(*) FILTER (WHERE dead_at IS NOT NULL), (SELECT count(*) FROM fencing_outbox"
    " WHERE superseded_at IS NOT NULL AND (%(kind)s::text IS NULL OR kind = %(kind)s))"
    " FROM fencing_outbox WHERE sent_at IS NULL AND (%(kind)s::text IS NULL OR kind = %(kind)s)"
)
#: retry / drop: the named rows locked, and changed only if every one is there and dead
#: (one statement: all or nothing); answers each row found, whether it is dead, and how
#: many were changed
_NAMED: Final = (
    "WITH named AS (SELECT id, sent_at IS NULL AND dead_at IS NOT NULL AS dead"
    " FROM fencing_outbox WHERE id = ANY(%(ids)s::bigint[]) FOR UPDATE),"
    " ok AS (SELECT count(*) = cardinality(%(ids)s::bigint[]) AND coalesce(bool_and(dead),"
    " false) AS ok FROM named),"
)
#: (a row put back wakes the relays listening, as a sent one does)
RETRY: Final = (
    f"{_NAMED} done AS (UPDATE fencing_outbox o SET attempts = 0, strikes = 0,"
    " dead_at = NULL FROM ok WHERE ok.ok AND o.id IN (SELECT id FROM named)"
    " RETURNING o.id, o.kind)"
    " SELECT named.id, named.dead, (SELECT count(*) FROM done),"
    f" (SELECT count(pg_notify('{CHANNEL}', %(wake)s || k.kind))"
    " FROM (SELECT DISTINCT kind FROM done) k)"
    " FROM named"
)
DROP: Final = (
    f"{_NAMED} done AS (DELETE FROM fencing_outbox o USING ok WHERE ok.ok"
    " AND o.id IN (SELECT id FROM named) RETURNING o.id)"
    " SELECT named.id, named.dead, (SELECT count(*) FROM done) FROM named"
)
#: sent rows, and superseded ones (settled then: their ``sent_at`` is when)
PRUNE: Final = prune_batch("fencing_outbox", "sent_at", "id", " sent_at IS NOT NULL AND")


class PostgresOutboxFlows:
    """The outbox's flows for PostgreSQL (a mixin of ``PostgresFlows``)."""

    __slots__ = ()
    schema: str | None

    def _sequence(self) -> str:
        name = "fencing_outbox_claim"
        return name if self.schema is None else f"{quoted(self.schema)}.{name}"

    def outbox_add(self, message: OutboxMessage) -> Flow[OutboxRow]:
        params: dict[str, object] = dict(zip(STORED_COLUMNS, message.stored(), strict=True))
        params["wake"] = wake_prefix(self.schema)
        if message.supersede:
            params["debounce"] = message.debounce
            params["max_wait"] = message.max_wait
        found: Answer = yield Query(ADD_DUE if message.supersede else ADD, params)
        return outbox_row(found.rows[0])

    def outbox_claim(self, relay: str, kind: str, limit: int, ttl: float) -> Flow[OutboxClaim]:
        params = {
            "relay": relay,
            "kind": kind,
            "limit": limit,
            "ttl": ttl,
            "seq": self._sequence(),
        }
        found: Answer = yield Query(CLAIM, params)
        token, now = int(found.rows[0][0]), float(found.rows[0][1])
        rows = tuple(outbox_row(r[2:]) for r in found.rows if r[2] is not None)
        return OutboxClaim(token, rows, now + ttl, now)

    def outbox_done(self, token: int, ids: Sequence[int]) -> Flow[int]:
        found = yield from read_only(Query(DONE, {"token": token, "ids": list(ids)}))
        return int(found.rowcount)

    def outbox_release(
        self, token: int, ids: Sequence[int], error: str | None, strike: bool
    ) -> Flow[int]:
        return self._give_back(token, ids, error, strike, False)

    def outbox_bury(self, token: int, ids: Sequence[int], error: str | None) -> Flow[int]:
        return self._give_back(token, ids, error, True, True)

    def _give_back(
        self, token: int, ids: Sequence[int], error: str | None, strike: bool, dead: bool
    ) -> Flow[int]:
        params = {
            "token": token,
            "ids": list(ids),
            "error": error,
            "strike": int(strike),
            "dead": dead,
        }
        found = yield from read_only(Query(GIVE_BACK, params))
        return int(found.rowcount)

    def outbox_dead(self, kind: str | None, limit: int) -> Flow[list[OutboxRow]]:
        found = yield from read_only(Query(LIST_DEAD, {"kind": kind, "limit": limit}))
        return [outbox_row(r) for r in found.rows]

    def _named(self, sql: str, ids: Sequence[int], verb: str) -> Flow[int]:
        found: Answer = yield Query(sql, {"ids": list(ids), "wake": wake_prefix(self.schema)})
        check_dead(ids, {int(i): bool(r[0]) for i, *r in found.rows}, verb)
        return int(found.rows[0][2])

    def outbox_retry(self, ids: Sequence[int]) -> Flow[int]:
        return self._named(RETRY, ids, "retry")

    def outbox_drop(self, ids: Sequence[int]) -> Flow[int]:
        return self._named(DROP, ids, "drop")

    def outbox_list(self, kind: str | None, limit: int) -> Flow[list[OutboxRow]]:
        found = yield from read_only(Query(LIST, {"kind": kind, "limit": limit}))
        return [outbox_row(r) for r in found.rows]

    def outbox_stats(self, kind: str | None) -> Flow[OutboxStats]:
        found = yield from read_only(Query(STATS, {"kind": kind}))
        count, oldest, now, dead, superseded = found.rows[0]
        age = 0.0 if oldest is None else max(0.0, float(now) - float(oldest))
        return OutboxStats(int(count), age, float(now), int(dead), int(superseded))

    def outbox_prune(self, older_than: float) -> Flow[int]:
        return prune_batches(pruning(PRUNE, older_than))
