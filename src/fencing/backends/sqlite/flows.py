"""SQLite's flows: each operation is one step, ``Txn``: a function of a connection run in
one transaction (``BEGIN IMMEDIATE`` when it writes, so a commit's check and write happen
under SQLite's write lock: atomic across threads and processes). The function never
begins, commits or rolls back: the driver that carries the step out does, on whatever
connection it holds."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any, TypeVar

from ..._checks import check_unique_key
from ..._effects import PENDING, Effect, EffectQuery, NewEffect
from ..._errors import SchemaError
from ..._flow import Flow
from ..._request import (
    AppliedIntent,
    CommitRequest,
    CommitResult,
    LeaseAnswer,
    StoreStats,
    Target,
    effect_counts,
    scope_stats,
    stats_scopes,
)
from ..._values import Record
from .._contract import prune_batches
from . import guard, schema
from . import operations as op
from . import statements as sql
from .outbox import SQLiteOutboxFlows
from .statements import Statements, quote
from .steps import Txn, keyed_pruning, one, pruning, txn

__all__ = ["SQLiteFlows", "Txn", "txn"]

T = TypeVar("T")


def _rows(conn: sqlite3.Connection, table: str) -> int | None:
    """How many rows ``table`` (``schema.table`` too) has; None if it is gone."""
    try:
        found = conn.execute(f"SELECT COUNT(*) FROM {quote(table)}")
    except sqlite3.OperationalError:  # no such table (dropped since it was written)
        return None
    return int(found.fetchone()[0])


class SQLiteFlows(SQLiteOutboxFlows):
    """The flows of ``_contract.Flows`` for SQLite (one ``Statements`` cache per store)."""

    __slots__ = ("statements",)

    def __init__(self) -> None:
        self.statements = Statements()

    def migrate(self) -> Flow[None]:
        yield Txn(schema.migrate)

    def check_schema(self) -> Flow[None]:
        yield Txn(schema.check, write=False)

    def columns(self, target: Target, declare: frozenset[str] | None) -> Flow[frozenset[str]]:
        found: tuple[frozenset[str], frozenset[str]] | None = yield Txn(
            lambda conn, now: op.describe(conn, target.name), begin=False
        )
        if found is None:
            raise SchemaError(f"table {target.name!r} does not exist")
        names, unique = found
        check_unique_key(target, names, unique)
        return names

    def read(self, target: Target, key: str | int) -> Flow[Record | None]:
        return txn(lambda conn, now: op.read(conn, target, key), write=False)

    def probe(self, request: CommitRequest) -> Flow[CommitResult]:
        return one(self.probe_step(request))

    def probe_step(self, request: CommitRequest) -> Txn:
        """``probe``'s one step (the driver runs it without driving the flow)."""
        if request.lease is not None or (
            request.target.kind == "table" and request.intent.guard is not None
        ):
            # fenced, or a table guard SQLite compares: judged in one read transaction
            return Txn(lambda conn, now: op.judged(conn, request, now), write=False)
        statements = self.statements
        return Txn(lambda conn, now: op.probed(conn, statements, request, now), begin=False)

    def create(self, target: Target, key: str | int, state_json: str) -> Flow[Record]:
        return txn(lambda conn, now: op.create(conn, target, key, state_json, now))

    def delete(self, target: Target, key: str | int) -> Flow[bool]:
        return txn(lambda conn, now: op.delete(conn, target, key))

    def commit(self, request: CommitRequest) -> Flow[CommitResult]:
        return one(self.commit_step(request))

    def commit_step(self, request: CommitRequest) -> Txn:
        """``commit``'s one step (the driver runs it without driving the flow)."""
        statements = self.statements
        return Txn(lambda conn, now: op.commit(conn, statements, request, now))

    def commit_many(self, requests: Sequence[CommitRequest]) -> Flow[list[CommitResult]]:
        return one(self.commit_many_step(requests))

    def commit_many_step(self, requests: Sequence[CommitRequest]) -> Txn:
        """``commit_many``'s one step (the driver runs it without driving the flow)."""
        statements = self.statements

        def body(conn: sqlite3.Connection, now: float) -> list[CommitResult]:
            return [op.commit(conn, statements, r, now) for r in requests]

        return Txn(body)

    def acquire(self, name: str, owner: str, ttl: float) -> Flow[LeaseAnswer]:
        return txn(lambda conn, now: op.acquire(conn, name, owner, ttl, now))

    def renew(self, name: str, token: int, ttl: float) -> Flow[LeaseAnswer]:
        return txn(lambda conn, now: op.renew(conn, name, token, ttl, now))

    def release(self, name: str, token: int) -> Flow[LeaseAnswer]:
        return txn(lambda conn, now: op.release(conn, name, token, now))

    def lease_state(self, name: str) -> Flow[LeaseAnswer]:
        def body(conn: sqlite3.Connection, now: float) -> LeaseAnswer:
            return LeaseAnswer(False, op.lease_row(conn, name), now)

        return txn(body, write=False)

    def prune(self, older_than: float) -> Flow[int]:
        return prune_batches(pruning(sql.PRUNE_APPLIED, older_than))

    # -- effects ------------------------------------------------------------------------
    def record_effect(self, row: NewEffect) -> Flow[Effect]:
        def body(conn: sqlite3.Connection, now: float) -> Effect:
            conn.execute(sql.RECORD_EFFECT, (*row, now, now))
            return op.effects(conn, sql.EFFECT_WHERE["key"], (row[0], 1))[0]

        return txn(body)

    def mark_effect(
        self, idempotency_key: str, status: str | None, detail_json: str | None, reconcile: bool
    ) -> Flow[Effect | None]:
        def body(conn: sqlite3.Connection, now: float) -> Effect | None:
            args = (status, detail_json, now, reconcile, now, idempotency_key)
            conn.execute(sql.MARK_EFFECT, args)
            found = op.effects(conn, sql.EFFECT_WHERE["key"], (idempotency_key, 1))
            return found[0] if found else None

        return txn(body)

    def settle_effects(self, scope: str, intent_id: str, outcome: str) -> Flow[list[Effect]]:
        where, args = sql.EFFECT_WHERE["intent"], (scope, intent_id, -1)
        # Most refused intents recorded no effect: one read, and no write transaction
        # (whose BEGIN IMMEDIATE would wait for the write lock) unless one is unsettled.
        found: list[Effect] = yield Txn(
            lambda conn, now: op.effects(conn, where, args), begin=False
        )
        if all(e.outcome is not None for e in found):
            return found

        def body(conn: sqlite3.Connection, now: float) -> list[Effect]:
            conn.execute(sql.SETTLE_EFFECTS, (outcome, now, scope, intent_id))
            return op.effects(conn, where, args)

        return (yield from txn(body))

    def list_effects(self, query: EffectQuery) -> Flow[list[Effect]]:
        def body(conn: sqlite3.Connection, now: float) -> list[Effect]:
            args: list[Any]
            if query.idempotency_key is not None:
                where, args = sql.EFFECT_WHERE["key"], [query.idempotency_key]
            elif query.intent_id is not None:
                where, args = sql.EFFECT_WHERE["intent"], [query.scope, query.intent_id]
            elif query.pending_for is not None:
                where, args = PENDING.format(cutoff="?"), [now - query.pending_for]
            else:
                where, args = sql.EFFECT_WHERE["open"], []
            return op.effects(conn, where, [*args, query.limit])

        return txn(body, write=False)

    def prune_effects(self, older_than: float) -> Flow[int]:
        """In batches, like ``prune`` (``_contract.prune_batches``), in key order."""
        return prune_batches(keyed_pruning(sql.PRUNE_EFFECTS, older_than))

    # -- reads for looking (``_contract``) -------------------------------------------------
    def applied(self, target: Target, key: str | int, limit: int) -> Flow[list[AppliedIntent]]:
        def body(conn: sqlite3.Connection, now: float) -> list[AppliedIntent]:
            rows = conn.execute(sql.APPLIED_TO_KEY, (target.scope, key, limit)).fetchall()
            return [AppliedIntent(r[0], float(r[1])) for r in rows]

        return txn(body, write=False)

    def stats(self) -> Flow[StoreStats]:
        def body(conn: sqlite3.Connection, now: float) -> StoreStats:
            records: dict[str, int | None] = {
                f"c:{name}": n for name, n in conn.execute(sql.STATS_RECORDS)
            }
            applied = dict(conn.execute(sql.STATS_APPLIED).fetchall())
            effects = effect_counts(conn.execute(sql.STATS_EFFECTS).fetchall())
            tables = {s[2:] for s in stats_scopes(records, applied, effects) if s[0] == "t"}
            tables |= {name for (name,) in conn.execute(sql.GUARDED_TABLES)}
            for table in tables:
                records[f"t:{table}"] = _rows(conn, table)
            held = {}
            for scope in stats_scopes(records, applied, effects):
                prefix = f"{scope[2:]}/"
                args = (now, len(prefix), prefix)
                held[scope[2:]] = conn.execute(sql.LEASES_HELD_UNDER, args).fetchone()[0]
            total = conn.execute(sql.LEASES_HELD, (now,)).fetchone()[0]
            return StoreStats(scope_stats(records, applied, effects, held), total, now)

        return txn(body, write=False)

    # -- the guard trigger on a user's table (``guard``) ----------------------------------
    def guard_table(self, target: Target) -> Flow[None]:
        # there as it would be: nothing to write, and no write lock to wait for
        if (yield from txn(lambda conn, now: guard.installed(conn, target), write=False)):
            return
        yield from txn(lambda conn, now: guard.install(conn, target))

    def unguard_table(self, target: Target) -> Flow[None]:
        return txn(lambda conn, now: guard.remove(conn, target))
