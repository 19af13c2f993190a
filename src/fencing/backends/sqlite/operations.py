"""SQLite's operations, each a function of a connection already in its transaction (and
the store's clock, read once that transaction began): they never begin, commit or roll
back, so they run the same on the store's connection or on one a caller gives."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from typing import Any

from ..._effects import Effect, effect_from_row
from ..._errors import AlreadyExists
from ..._request import CommitRequest, CommitResult, LeaseAnswer, Target, table_version
from ..._rules import LeaseRow, Status, judge, lease_grant, lease_renewal
from ..._values import Record
from . import statements as sql
from .statements import Statements, quote
from .values import bound

__all__ = [
    "acquire",
    "commit",
    "create",
    "delete",
    "describe",
    "effects",
    "judged",
    "probed",
    "read",
    "release",
    "renew",
]


def describe(conn: sqlite3.Connection, name: str) -> tuple[frozenset[str], frozenset[str]] | None:
    """Table ``name``'s columns (``schema.table`` too: ``main.orders``, an attached
    database's) and those unique on their own, or None if there is no such table. Unique:
    the column of a one-column primary key (an INTEGER PRIMARY KEY is the rowid and has no
    index), and each column a unique index without a WHERE covers alone."""
    schema, dot, table = name.rpartition(".")
    if dot and schema not in {r[1] for r in conn.execute("PRAGMA database_list")}:
        return None
    prefix = quote(schema) + "." if dot else ""
    info = conn.execute(f"PRAGMA {prefix}table_info({quote(table)})").fetchall()
    if not info:
        return None
    primary = [r[1] for r in info if r[5]]
    unique = set(primary) if len(primary) == 1 else set()
    for index in conn.execute(f"PRAGMA {prefix}index_list({quote(table)})").fetchall():
        _, index_name, is_unique, _, partial = index[:5]
        if not is_unique or partial:
            continue
        quoted = '"' + str(index_name).replace('"', '""') + '"'  # the name may hold a dot
        covered = conn.execute(f"PRAGMA {prefix}index_info({quoted})").fetchall()
        if len(covered) == 1 and covered[0][2] is not None:  # None: an expression
            unique.add(covered[0][2])
    return frozenset(r[1] for r in info), frozenset(unique)


def table_record(
    target: Target, key: str | int, description: Any, row: Sequence[Any], fence: int
) -> Record:
    values = dict(zip([d[0] for d in description], row, strict=True))
    vcol = target.version_column
    version = table_version(values.pop(vcol), target, key) if vcol else 0
    values.pop(target.key_column, None)
    return Record(target.name, key, version, fence, values, "table")


def read(conn: sqlite3.Connection, target: Target, key: str | int) -> Record | None:
    if target.kind == "collection":
        row = conn.execute(sql.READ_RECORD, (target.name, key)).fetchone()
        if row is None:
            return None
        return Record(target.name, key, row[0], row[1], json.loads(row[2]))
    cur = conn.execute(sql.table_read(target), (key,))
    found = cur.fetchone()
    if found is None:
        return None
    fence = conn.execute(sql.READ_FENCE, (target.scope, key)).fetchone()
    return table_record(target, key, cur.description, found, fence[0] if fence else 0)


def lease_row(conn: sqlite3.Connection, name: str) -> LeaseRow | None:
    row = conn.execute(sql.READ_LEASE, (name,)).fetchone()
    return None if row is None else LeaseRow(name, row[0], row[1], row[2])


def judged(conn: sqlite3.Connection, request: CommitRequest, now: float) -> CommitResult:
    """Why a commit would not apply (or that it would), from what the store holds now."""
    target, intent, lease = request.target, request.intent, request.lease
    record = read(conn, target, intent.key)
    args = (target.scope, request.claim_id, intent.key)
    applied = conn.execute(sql.IS_APPLIED, args).fetchone() is not None
    row = lease_row(conn, lease.name) if lease is not None else None
    held = None
    if target.kind == "table" and intent.guard and record is not None:
        # SQLite compares the guard, as the UPDATE does (a column's affinity applies)
        guard = intent.guard
        found = conn.execute(
            sql.guard_held(target, tuple(guard)), [*bound(guard.values()), intent.key]
        ).fetchone()
        held = found is not None and bool(found[0])
    return CommitResult(judge(record, applied, intent, lease, row, now, held), record)


def probed(
    conn: sqlite3.Connection,
    statements: Statements,
    request: CommitRequest,
    now: float,
    refusal: bool = False,
) -> CommitResult:
    """An unfenced probe: the record and whether the intent is applied, read by one
    statement in one snapshot (so it needs no transaction of its own), judged. For a
    refused commit (``refusal``) the same statement tells whether the intent has an
    effect to settle (``CommitResult.unsettled``); with no record it does not know."""
    target, intent = request.target, request.intent
    scope, claim, key = target.scope, request.claim_id, intent.key
    tail = 2 if refusal else 1  # the EXISTS columns after the record's
    record = None
    if target.kind == "collection":
        if refusal:
            found = conn.execute(
                sql.REFUSAL_PROBE, (scope, claim, key, scope, claim, target.name, key)
            ).fetchone()
        else:
            found = conn.execute(sql.PROBE_RECORD, (scope, claim, key, target.name, key)).fetchone()
        if found is not None:
            state = json.loads(found[2])
            record = Record(target.name, key, found[0], found[1], state)
    else:
        args: tuple[Any, ...] = (scope, key, scope, claim, key)
        if refusal:
            args += (scope, claim)
        cur = conn.execute(statements.row(target, True, refusal), (*args, key))
        found = cur.fetchone()
        if found is not None:
            cut = -1 - tail
            fence, names, values = found[cut] or 0, cur.description[:cut], found[:cut]
            record = table_record(target, key, names, values, fence)
    applied = found is not None and bool(found[-tail])
    status = judge(record, applied, intent, None, None, now)
    return CommitResult(status, record, found is None or bool(found[-1]) if refusal else True)


def create(
    conn: sqlite3.Connection, target: Target, key: str | int, state_json: str, now: float
) -> Record:
    # A record created again after a delete continues the deleted one's versions, so an
    # intent decided against the deleted record never matches.
    gone = conn.execute(sql.TOMBSTONE_VERSION, (target.name, key)).fetchone()
    version = (gone[0] if gone else 0) + 1
    try:
        conn.execute(sql.CREATE, (target.name, key, version, state_json, now))
    except sqlite3.IntegrityError:
        raise AlreadyExists(f"{target.name}/{key} already exists") from None
    return Record(target.name, key, version, 0, json.loads(state_json))


def delete(conn: sqlite3.Connection, target: Target, key: str | int) -> bool:
    gone = conn.execute(sql.DELETE, (target.name, key)).fetchone()
    if gone is None:
        return False
    conn.execute(sql.TOMBSTONE, (target.name, key, gone[0]))
    return True


def commit(
    conn: sqlite3.Connection, statements: Statements, request: CommitRequest, now: float
) -> CommitResult:
    """Write if every condition holds (the intent not applied yet among them), then claim
    the intent; else judge, having written nothing."""
    target, intent, lease = request.target, request.intent, request.lease
    collection = target.kind == "collection"
    if collection and intent.guard is not None:
        # A JSON guard is judged in Python, under the write lock this transaction holds.
        found = judged(conn, request, now)
        if found.status is not Status.OK:
            return found
    scope, key = target.scope, intent.key
    cur = conn.execute(statements.update(request), sql.update_params(request, now))
    if collection:
        row = cur.fetchone()  # RETURNING version, fence
        if row is not None:
            conn.execute(sql.CLAIM, (scope, request.claim_id, key, now))
            record = Record(target.name, key, row[0], row[1], request.state)
            return CommitResult(Status.APPLIED, record)
    elif cur.rowcount > 0:
        conn.execute(sql.CLAIM, (scope, request.claim_id, key, now))
        if lease is not None:
            conn.execute(sql.RAISE_FENCE, (scope, key, lease.token))
        cur = conn.execute(statements.row(target, probe=False), (scope, key, key))
        row = cur.fetchone()
        # every column of the row but the last, which is its fence
        record = table_record(target, key, cur.description[:-1], row[:-1], row[-1] or 0)
        return CommitResult(Status.APPLIED, record)
    if lease is None and (collection or intent.guard is None):
        found = probed(conn, statements, request, now, refusal=True)  # (one statement)
    else:
        found = judged(conn, request, now)
        if found.status is not Status.DUPLICATE:  # (a duplicate settles nothing)
            unsettled = conn.execute(sql.UNSETTLED, (scope, request.claim_id)).fetchone()
            found = found._replace(unsettled=unsettled is not None)
    # refused although judged to apply: only a condition of the UPDATE can tell (as on
    # the server backends, the store's own comparison has the last word): Stale
    return found._replace(status=Status.STALE) if found.status is Status.OK else found


def _write_lease(conn: sqlite3.Connection, row: LeaseRow) -> None:
    conn.execute(sql.WRITE_LEASE, (row.name, row.owner, row.token, row.expires_at))


def acquire(conn: sqlite3.Connection, name: str, owner: str, ttl: float, now: float) -> LeaseAnswer:
    old = lease_row(conn, name)
    new = lease_grant(name, old, owner, ttl, now)
    if new is not None:
        _write_lease(conn, new)
    return LeaseAnswer(new is not None, new or old, now)


def renew(conn: sqlite3.Connection, name: str, token: int, ttl: float, now: float) -> LeaseAnswer:
    old = lease_row(conn, name)
    new = lease_renewal(old, token, ttl, now)
    if new is not None:
        _write_lease(conn, new)
    return LeaseAnswer(new is not None, new or old, now)


def release(conn: sqlite3.Connection, name: str, token: int, now: float) -> LeaseAnswer:
    old = lease_row(conn, name)
    if old is None or old.token != token or not old.held_at(now):
        return LeaseAnswer(False, old, now)
    new = LeaseRow(name, None, token, 0.0)
    _write_lease(conn, new)
    return LeaseAnswer(True, new, now)


def effects(conn: sqlite3.Connection, where: str, args: Sequence[Any]) -> list[Effect]:
    """The effects ``where`` selects, oldest first (the last argument is the limit)."""
    text = f"SELECT {sql.EFFECT_ROW} FROM fencing_effects WHERE {where}{sql.EFFECT_ORDER}"
    return [effect_from_row(r) for r in conn.execute(text, args).fetchall()]
