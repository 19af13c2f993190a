"""MySQL's and MariaDB's outbox (``_contract.OutboxFlows``), part of the store's
``MySQLFlows``. Pending rows (unsent, not dead) are read through the stored columns
``unsent_kind`` and ``unsent_key`` and their indexes (``schema.sql``), never through the
sent history; a dead row has neither, so it is never claimed and holds no key back.

* ``outbox_add``: the INSERT and the row read back by ``LAST_INSERT_ID()``, one batch
  (one round trip; a savepoint of the caller's transaction through ``store.using``).
* ``outbox_claim``, one transaction in three round trips: its candidates (unsent rows
  of the kind whose key no live claim holds, in id order) locked ``FOR UPDATE SKIP
  LOCKED``, so relays never wait for each other nor take the same row; then every
  unsent row of their keys, locked ``SKIP LOCKED`` too, beside their count as the
  snapshot has it: a key is kept only if every one of its unsent rows could be locked
  and none is under a live claim, so a key whose earlier row another claim (committed
  or in flight) holds is skipped whole and two claims never split a key, and of a kept
  key only a prefix of its rows (a candidate past a row left out stays); then the new
  token (``fencing_outbox_claims``, AUTO_INCREMENT) and the rows taken, read back.
  SKIP LOCKED needs MariaDB 10.6+ or MySQL 8.0+.
"""

from __future__ import annotations

from collections import defaultdict
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
from .restart import restarts_on_deadlock
from .statements import NOW, SET_NOW, prune_batch
from .steps import Result, Script, one, pruning

__all__ = ["MySQLOutboxFlows"]

_COLUMNS: Final = ", ".join(OUTBOX_COLUMNS)
ADD: Final = (
    "INSERT INTO fencing_outbox (kind, task, queue, payload, options, okey, created_at)"
    f" VALUES (%s, %s, %s, %s, %s, %s, {NOW})"
)
READ_ADDED: Final = f"SELECT {_COLUMNS} FROM fencing_outbox WHERE id = LAST_INSERT_ID()"
#: a superseding send: the key's, kind's and task's waiting rows under no live claim,
#: locked (a claim skips them; one that took a row first keeps it), with when their
#: burst began; then those settled and the new row written, due as ``due_times`` says
TO_SUPERSEDE: Final = (
    "SELECT id, COALESCE(burst_at, created_at) FROM fencing_outbox WHERE unsent_key = %s"
    " AND kind = %s AND task = %s AND COALESCE(claimed_until, 0) <= @f_now FOR UPDATE"
)
SUPERSEDE: Final = (
    "UPDATE fencing_outbox SET sent_at = @f_now, superseded_at = @f_now, claim_token = NULL,"
    " claimed_by = NULL, claimed_until = NULL WHERE id IN ({ids})"
)
ADD_DUE: Final = (
    "INSERT INTO fencing_outbox (kind, task, queue, payload, options, okey, created_at,"
    " due_at, burst_at) VALUES (%s, %s, %s, %s, %s, %s, @f_now, %s, %s)"
)
# "no unsent row of the key is under a live claim, nor up to the candidate a row not yet
# due (debounced) or of another queue kind (never: 1e300)", as the latest deadline of
# the key's unsent rows, read from fencing_outbox_key alone, per candidate key: MariaDB
# turns the same test written NOT EXISTS into a NOT IN over every unsent row (the whole
# backlog)
CANDIDATES: Final = (
    "SELECT o.id, o.okey FROM fencing_outbox o WHERE o.unsent_kind = %s"
    " AND COALESCE((SELECT MAX(GREATEST(COALESCE(p.claimed_until, 0),"
    " IF(p.id <= o.id, IF(p.kind <> o.kind, 1e300, COALESCE(p.due_at, 0)), 0)))"
    " FROM fencing_outbox p WHERE p.unsent_key = o.okey), 0) <= @f_now"
    " ORDER BY o.id LIMIT %s FOR UPDATE SKIP LOCKED"
)
NEW_CLAIM: Final = "INSERT INTO fencing_outbox_claims (relay, claimed_at) VALUES (%s, @f_now)"
DONE: Final = (
    f"UPDATE fencing_outbox SET sent_at = {NOW}, claimed_until = NULL"
    " WHERE claim_token = %s AND sent_at IS NULL AND id IN ({ids})"
)
#: give back (release) or give up as dead (bury: the third ``%s`` true, ``dead_at`` now)
GIVE_BACK: Final = (
    "UPDATE fencing_outbox SET attempts = attempts + 1, strikes = strikes + %s,"
    f" last_error = %s, dead_at = IF(%s, {NOW}, NULL), claim_token = NULL,"
    " claimed_by = NULL, claimed_until = NULL WHERE claim_token = %s AND sent_at IS NULL"
    " AND dead_at IS NULL AND id IN ({ids})"
)
_DEAD: Final = "dead_at IS NOT NULL AND sent_at IS NULL"
LIST_DEAD_ALL: Final = f"SELECT {_COLUMNS} FROM fencing_outbox WHERE {_DEAD} ORDER BY id LIMIT %s"
LIST_DEAD_KIND: Final = (
    f"SELECT {_COLUMNS} FROM fencing_outbox WHERE {_DEAD} AND kind = %s ORDER BY id LIMIT %s"
)
COUNT_DEAD_ALL: Final = f"SELECT COUNT(*) FROM fencing_outbox WHERE {_DEAD}"
COUNT_DEAD_KIND: Final = f"SELECT COUNT(*) FROM fencing_outbox WHERE {_DEAD} AND kind = %s"
_SUPERSEDED: Final = "SELECT COUNT(*) FROM fencing_outbox WHERE superseded_at IS NOT NULL"
COUNT_SUPERSEDED_ALL: Final = _SUPERSEDED
COUNT_SUPERSEDED_KIND: Final = f"{_SUPERSEDED} AND kind = %s"
FIND: Final = f"SELECT id, {_DEAD} FROM fencing_outbox WHERE id IN ({{ids}}) FOR UPDATE"
RETRY: Final = (
    "UPDATE fencing_outbox SET attempts = 0, strikes = 0, dead_at = NULL WHERE id IN ({ids})"
)
DROP: Final = "DELETE FROM fencing_outbox WHERE id IN ({ids})"
LIST_ALL: Final = (
    f"SELECT {_COLUMNS} FROM fencing_outbox WHERE unsent_kind IS NOT NULL ORDER BY id LIMIT %s"
)
LIST_KIND: Final = (
    f"SELECT {_COLUMNS} FROM fencing_outbox WHERE unsent_kind = %s ORDER BY id LIMIT %s"
)
STATS_ALL: Final = (
    f"SELECT COUNT(*), MIN(created_at), {NOW} FROM fencing_outbox WHERE unsent_kind IS NOT NULL"
)
STATS_KIND: Final = (
    f"SELECT COUNT(*), MIN(created_at), {NOW} FROM fencing_outbox WHERE unsent_kind = %s"
)
#: sent rows, and superseded ones (settled then: their ``sent_at`` is when)
PRUNE: Final = prune_batch("fencing_outbox", "sent_at", "sent_at, id")
# the newest claim is kept: its AUTO_INCREMENT then never goes back, even on old servers
PRUNE_CLAIMS: Final = (
    "SET @f_top = (SELECT MAX(token) FROM fencing_outbox_claims);\n"
    + prune_batch("fencing_outbox_claims", "claimed_at", "claimed_at, token", " AND token < @f_top")
)


def _ids(ids: Sequence[int]) -> str:
    return ", ".join(str(int(i)) for i in ids) or "NULL"


def _marks(n: int) -> str:
    return ", ".join(["%s"] * n)


class MySQLOutboxFlows:
    """The outbox's flows for MySQL and MariaDB (a mixin of ``MySQLFlows``)."""

    __slots__ = ()

    @restarts_on_deadlock
    def outbox_add(self, message: OutboxMessage) -> Flow[OutboxRow]:
        if message.supersede:
            return (yield from self._supersede(message))
        script = Script(begin=True)
        script.add(ADD, *message.stored())
        read = script.add(READ_ADDED)
        results: list[Result] = yield script.batch(end=True)
        return outbox_row(results[read].rows[0])

    def _supersede(self, message: OutboxMessage) -> Flow[OutboxRow]:
        script = Script(begin=True)
        script.add(SET_NOW)
        now_at = script.add("SELECT @f_now")
        old_at = script.add(TO_SUPERSEDE, message.key, message.kind, message.task)
        results: list[Result] = yield script.batch()
        now = float(results[now_at].rows[0][0])
        old = results[old_at].rows
        due, burst = due_times(message, now, min((float(b) for _, b in old), default=None))
        script = Script()
        if old:
            script.add(SUPERSEDE.format(ids=_ids([int(i) for i, _ in old])))
        script.add(ADD_DUE, *message.stored(), due, burst)
        read = script.add(READ_ADDED)
        results = yield script.batch(end=True)
        return outbox_row(results[read].rows[0])

    @restarts_on_deadlock
    def outbox_claim(self, relay: str, kind: str, limit: int, ttl: float) -> Flow[OutboxClaim]:
        script = Script(begin=True)
        script.add(SET_NOW)
        now_at = script.add("SELECT @f_now")
        cand_at = script.add(CANDIDATES, kind, limit)
        results: list[Result] = yield script.batch()
        now = float(results[now_at].rows[0][0])
        cand = [(int(i), str(k)) for i, k in results[cand_at].rows]
        keys = sorted({k for _, k in cand})
        free: set[str] = set()
        earlier: dict[str, list[int]] = defaultdict(list)  # a key's unsent rows, any kind
        if keys:
            last = max(i for i, _ in cand)  # a key's later rows do not matter: not locked
            script = Script()
            mine_at = script.add(
                "SELECT id, okey, claimed_until FROM fencing_outbox"
                f" WHERE unsent_key IN ({_marks(len(keys))}) AND id <= %s FOR UPDATE SKIP LOCKED",
                *keys,
                last,
            )
            seen_at = script.add(
                "SELECT okey, COUNT(*) FROM fencing_outbox"
                f" WHERE unsent_key IN ({_marks(len(keys))}) AND id <= %s GROUP BY okey",
                *keys,
                last,
            )
            results = yield script.batch()
            lockable: dict[str, int] = defaultdict(int)
            held: set[str] = set()
            for rid, key, until in results[mine_at].rows:
                lockable[str(key)] += 1
                if until is not None and float(until) > now:
                    held.add(str(key))
                earlier[str(key)].append(int(rid))
            seen = {str(k): int(n) for k, n in results[seen_at].rows}
            free = {k for k in keys if k not in held and seen.get(k) == lockable.get(k)}
        # of a free key, a prefix of its rows: never a candidate past a row left out
        # (skipped while another claim held it, since released; of another kind)
        taken = {i for i, _ in cand}
        ids = []
        for i, k in cand:
            if k in free and all(e in taken for e in earlier[k] if e < i):
                ids.append(i)
        script = Script()
        script.add(NEW_CLAIM, relay)
        token_at = script.add("SELECT LAST_INSERT_ID()")
        rows_at = None
        if ids:
            script.add(
                "UPDATE fencing_outbox SET claim_token = LAST_INSERT_ID(), claimed_by = %s,"
                f" claimed_until = @f_now + %s WHERE id IN ({_ids(ids)})",
                relay,
                float(ttl),
            )
            rows_at = script.add(
                f"SELECT {_COLUMNS} FROM fencing_outbox WHERE id IN ({_ids(ids)}) ORDER BY id"
            )
        results = yield script.batch(end=True)
        token = int(results[token_at].rows[0][0])
        rows = () if rows_at is None else tuple(outbox_row(r) for r in results[rows_at].rows)
        return OutboxClaim(token, rows, now + ttl, now)

    @restarts_on_deadlock
    def outbox_done(self, token: int, ids: Sequence[int]) -> Flow[int]:
        results: list[Result] = yield one(DONE.format(ids=_ids(ids)), int(token))
        return results[0].affected

    def outbox_release(
        self, token: int, ids: Sequence[int], error: str | None, strike: bool
    ) -> Flow[int]:
        return self._give_back(token, ids, error, strike, False)

    def outbox_bury(self, token: int, ids: Sequence[int], error: str | None) -> Flow[int]:
        return self._give_back(token, ids, error, True, True)

    @restarts_on_deadlock
    def _give_back(
        self, token: int, ids: Sequence[int], error: str | None, strike: bool, dead: bool
    ) -> Flow[int]:
        sql = GIVE_BACK.format(ids=_ids(ids))
        results: list[Result] = yield one(sql, int(strike), error, int(dead), int(token))
        return results[0].affected

    @restarts_on_deadlock
    def outbox_dead(self, kind: str | None, limit: int) -> Flow[list[OutboxRow]]:
        batch = one(LIST_DEAD_ALL, limit) if kind is None else one(LIST_DEAD_KIND, kind, limit)
        results: list[Result] = yield batch
        return [outbox_row(r) for r in results[0].rows]

    @restarts_on_deadlock
    def _named(self, then: str, ids: Sequence[int], verb: str) -> Flow[int]:
        script = Script(begin=True)
        script.add(FIND.format(ids=_ids(ids)))
        results: list[Result] = yield script.batch()
        check_dead(ids, {int(i): bool(dead) for i, dead in results[0].rows}, verb)
        results = yield Script(then.format(ids=_ids(ids))).batch(end=True)
        return results[0].affected

    def outbox_retry(self, ids: Sequence[int]) -> Flow[int]:
        return self._named(RETRY, ids, "retry")

    def outbox_drop(self, ids: Sequence[int]) -> Flow[int]:
        return self._named(DROP, ids, "drop")

    @restarts_on_deadlock
    def outbox_list(self, kind: str | None, limit: int) -> Flow[list[OutboxRow]]:
        batch = one(LIST_ALL, limit) if kind is None else one(LIST_KIND, kind, limit)
        results: list[Result] = yield batch
        return [outbox_row(r) for r in results[0].rows]

    @restarts_on_deadlock
    def outbox_stats(self, kind: str | None) -> Flow[OutboxStats]:
        script = Script()
        if kind is None:
            script.add(STATS_ALL)
            script.add(COUNT_DEAD_ALL)
            script.add(COUNT_SUPERSEDED_ALL)
        else:
            script.add(STATS_KIND, kind)
            script.add(COUNT_DEAD_KIND, kind)
            script.add(COUNT_SUPERSEDED_KIND, kind)
        results: list[Result] = yield script.batch()
        count, oldest, now = results[0].rows[0]
        age = 0.0 if oldest is None else max(0.0, float(now) - float(oldest))
        dead, superseded = int(results[1].rows[0][0]), int(results[2].rows[0][0])
        return OutboxStats(int(count), age, float(now), dead, superseded)

    def outbox_prune(self, older_than: float) -> Flow[int]:
        gone = yield from prune_batches(pruning(PRUNE, older_than))
        yield from prune_batches(pruning(PRUNE_CLAIMS, older_than))
        return gone
