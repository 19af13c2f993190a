"""MySQL's flows: each operation of the contract as batches of statements (``steps.Batch``)
and what their results mean. I/O-free: whichever connection the driver runs a flow on,
all the batches of one flow meet that one connection, in order (a ``commit_many`` may
span several batches of one transaction). A flow's transaction is not written here: its
first batch says it ``begin``s it and its last that it ``end``s it, and the driver frames
them (``steps.framed``: the store's own transaction, or a savepoint in the caller's).
Every flow starts again after a deadlock (``restart``). How each one works:
``docs/backends/mysql.md``."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Final

from ..._checks import check_unique_key
from ..._errors import AlreadyExists, SchemaError
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
from ..._rules import Status
from ..._values import Record
from .._contract import prune_batches
from . import guard, schema
from . import statements as sql
from .answers import commit_result, judged, lease_answer, record_of
from .effects import EffectFlows
from .errors import DuplicateKey
from .outbox import MySQLOutboxFlows
from .restart import restarts_on_deadlock
from .steps import Result, Script, one, pruning
from .templates import (
    Slots,
    add_commit,
    add_judge_reads,
    add_read,
    key_locks,
    key_text,
    quote,
)

__all__ = ["MySQLFlows"]

_BATCH_BYTES: Final = 1 << 20  # flush a commit_many batch (same transaction) past this
_migrate: Final = restarts_on_deadlock(schema.migrate)


@restarts_on_deadlock
def _commit_all(requests: Sequence[CommitRequest]) -> Flow[list[CommitResult]]:
    """One transaction for all ``requests``, one round trip unless a guard is judged here."""
    out: list[CommitResult | None] = [None] * len(requests)
    script = Script(begin=True)
    pending: list[tuple[int, Slots]] = []
    if len(requests) > 1 and requests[0].target.kind == "collection":
        # A batch first locks its keys (their tombstone rows, in key order), so no record
        # of the batch is created or deleted before it commits: an item answered Missing
        # is still missing then, like every other answer of the batch.
        keys = sorted({str(r.intent.key) for r in requests})
        key_locks(script, requests[0].target.name, keys)

    def settle(results: list[Result]) -> None:
        for i, slots in pending:
            out[i] = commit_result(results, slots, requests[i])
        pending.clear()

    for i, request in enumerate(requests):
        if request.target.kind == "collection" and request.intent.guard is not None:
            # A JSON guard is judged in Python on the record read FOR UPDATE.
            at = add_judge_reads(script, request, lock=True)
            results: list[Result] = yield script.batch()
            settle(results)
            script = Script()
            answer = judged(results, at, request)
            if answer.status is not Status.OK:
                out[i] = answer
                continue
        pending.append((i, add_commit(script, request)))
        if script.size > _BATCH_BYTES and i + 1 < len(requests):
            settle((yield script.batch()))
            script = Script()
    settle((yield script.batch(end=True)))
    done = [r for r in out if r is not None]
    assert len(done) == len(requests)
    return done


@restarts_on_deadlock
def _lease(name: str, lock: str, change: str, *params: Any) -> Flow[LeaseAnswer]:
    """Lock the lease row, read the clock (after the lock), change the row if the
    condition holds, read it back: one transaction, one round trip."""
    script = Script(begin=True)
    script.add(lock, name)
    script.add(sql.SET_NOW)
    changed = script.add(change, *params)
    read = script.add(sql.LEASE_READ.format(now="@f_now"), name)
    results: list[Result] = yield script.batch(end=True)
    return lease_answer(name, results[read], results[changed].affected == 1)


def _row_counts(tables: set[str]) -> Flow[dict[str, int | None]]:
    """Each table's row count by its scope (None: no such table): which exist, then
    how many rows those have, in two round trips."""
    names = sorted(tables)
    if not names:
        return {}
    script = Script()
    for name in names:
        database, _, table = name.rpartition(".")
        script.add(sql.TABLE_EXISTS, database, table)
    found: list[Result] = yield script.batch()
    there = [n for n, r in zip(names, found, strict=True) if r.rows[0][0]]
    counts: dict[str, int | None] = dict.fromkeys((f"t:{n}" for n in names), None)
    if there:
        script = Script()
        for name in there:
            script.add(f"SELECT COUNT(*) FROM {quote(name)}")
        rows: list[Result] = yield script.batch()
        counts.update({f"t:{n}": int(r.rows[0][0]) for n, r in zip(there, rows, strict=True)})
    return counts


class MySQLFlows(EffectFlows, MySQLOutboxFlows):
    """The flows of ``_contract.Flows`` for MySQL / MariaDB."""

    __slots__ = ()

    def migrate(self) -> Flow[None]:
        return _migrate()

    def check_schema(self) -> Flow[None]:
        return schema.check()

    @restarts_on_deadlock
    def columns(self, target: Target, declare: frozenset[str] | None) -> Flow[frozenset[str]]:
        name = target.name
        database, _, table = name.rpartition(".")  # ``database.table``, or this database's
        script = Script()
        engine_at = script.add(sql.ENGINE, database or None, table)
        columns_at = script.add(sql.COLUMNS, database or None, table)
        unique_at = script.add(sql.UNIQUE_INDEXES, database or None, table)
        results: list[Result] = yield script.batch()
        tables = results[engine_at].rows
        exact = [r for r in tables if r[0] == table]
        if not exact and tables and int(tables[0][2] or 0) > 0:  # lower_case_table_names
            exact = [r for r in tables if str(r[0]).lower() == table.lower()]
        if not exact:
            raise SchemaError(f"table {name!r} does not exist")
        table_name, engine = exact[0][0], exact[0][1]
        if str(engine).lower() != "innodb":
            raise SchemaError(
                f"table {name!r} uses the {engine} engine: fencing guards InnoDB tables only"
                " (its commits must be transactional)"
            )
        names = frozenset(str(c) for t, c in results[columns_at].rows if t == table_name)
        indexes: dict[str, list[str | None]] = {}
        for t, index, column in results[unique_at].rows:
            if t == table_name:  # a functional index's column is NULL (MySQL 8)
                indexes.setdefault(str(index), []).append(None if column is None else str(column))
        unique = frozenset(c[0] for c in indexes.values() if len(c) == 1 and c[0] is not None)
        check_unique_key(target, names, unique)
        return names

    @restarts_on_deadlock
    def read(self, target: Target, key: str | int) -> Flow[Record | None]:
        script = Script()
        at = add_read(script, target, key)
        results: list[Result] = yield script.batch()
        return record_of(results[at], target, key)

    @restarts_on_deadlock
    def probe(self, request: CommitRequest) -> Flow[CommitResult]:
        script = Script()
        at = add_judge_reads(script, request, lock=False)
        return judged((yield script.batch()), at, request)

    @restarts_on_deadlock
    def create(self, target: Target, key: str | int, state_json: str) -> Flow[Record]:
        """Lock the key (its tombstone row), insert after the tombstone's version unless the
        record exists, read what happened: one transaction, one round trip."""
        exists = f"{target.name}/{key} already exists"
        script = Script(begin=True)
        script.add(sql.KEY_LOCK, target.name, key)
        script.add(sql.CREATE, state_json, target.name, key)
        read = script.add(sql.CREATED, target.name, key)
        try:
            results: list[Result] = yield script.batch(end=True)
        except DuplicateKey as exc:
            raise AlreadyExists(exists) from exc
        made, version = results[read].rows[0]
        if not made:
            raise AlreadyExists(exists)
        return Record(target.name, key, int(version), 0, json.loads(state_json))

    @restarts_on_deadlock
    def delete(self, target: Target, key: str | int) -> Flow[bool]:
        """Lock the key (its tombstone row), then the record; delete it and raise the
        tombstone to its version: one transaction, one round trip."""
        script = Script("SET @f_gone = NULL", begin=True)
        script.add(sql.KEY_LOCK, target.name, key)
        script.add(sql.DELETE_LOCK, target.name, key)
        deleted = script.add(sql.DELETE, target.name, key)
        script.add(sql.TOMBSTONE, target.name, key)
        results: list[Result] = yield script.batch(end=True)
        return results[deleted].affected > 0

    def commit(self, request: CommitRequest) -> Flow[CommitResult]:
        results = yield from _commit_all([request])
        return results[0]

    def commit_many(self, requests: Sequence[CommitRequest]) -> Flow[list[CommitResult]]:
        return _commit_all(requests)

    def acquire(self, name: str, owner: str, ttl: float) -> Flow[LeaseAnswer]:
        return _lease(name, sql.LEASE_LOCK_NEW, sql.LEASE_GRANT, owner, ttl, name)

    def renew(self, name: str, token: int, ttl: float) -> Flow[LeaseAnswer]:
        return _lease(name, sql.LEASE_LOCK, sql.LEASE_RENEW, ttl, name, token)

    def release(self, name: str, token: int) -> Flow[LeaseAnswer]:
        return _lease(name, sql.LEASE_LOCK, sql.LEASE_RELEASE, name, token)

    @restarts_on_deadlock
    def lease_state(self, name: str) -> Flow[LeaseAnswer]:
        results: list[Result] = yield one(sql.LEASE_READ.format(now=sql.NOW), name)
        return lease_answer(name, results[0], False)

    def prune(self, older_than: float) -> Flow[int]:
        return prune_batches(pruning(sql.PRUNE, older_than))

    # -- reads for looking (``_contract``) -------------------------------------------------
    @restarts_on_deadlock
    def applied(self, target: Target, key: str | int, limit: int) -> Flow[list[AppliedIntent]]:
        results: list[Result] = yield one(sql.APPLIED_TO_KEY, target.scope, key_text(key), limit)
        return [AppliedIntent(str(r[0]), float(r[1])) for r in results[0].rows]

    @restarts_on_deadlock
    def stats(self) -> Flow[StoreStats]:
        script = Script()
        counts = (
            sql.STATS_RECORDS,
            sql.STATS_APPLIED,
            sql.STATS_EFFECTS,
            sql.LEASES_HELD,
            sql.GUARDED_TABLES,
        )
        for text in counts:
            script.add(text)
        found: list[Result] = yield script.batch()
        records: dict[str, int | None] = {f"c:{name}": int(n) for name, n in found[0].rows}
        applied = {str(scope): int(n) for scope, n in found[1].rows}
        effects = effect_counts(found[2].rows)
        total, now = found[3].rows[0]
        tables = {s[2:] for s in stats_scopes(records, applied, effects) if s[0] == "t"}
        records.update((yield from _row_counts(tables | {str(t) for (t,) in found[4].rows})))
        names = sorted({s[2:] for s in stats_scopes(records, applied, effects)})
        held: dict[str, int] = {}
        if names:
            script = Script()
            for name in names:
                script.add(sql.LEASES_HELD_UNDER, len(name) + 1, f"{name}/")
            under: list[Result] = yield script.batch()
            held = {name: int(r.rows[0][0]) for name, r in zip(names, under, strict=True)}
        return StoreStats(scope_stats(records, applied, effects, held), int(total), float(now))

    # -- the guard trigger on a user's table (``guard``) ----------------------------------
    def guard_table(self, target: Target) -> Flow[None]:
        columns = yield from self.columns(target, None)
        yield from guard.install(target, columns)

    def unguard_table(self, target: Target) -> Flow[None]:
        return guard.remove(target)
