"""The SQL of a request, built from identifiers the front checked: a user table's row by
key, matched exactly, and the statements of one conditional commit for each shape of
request (built once per shape, and cached), with their parameters in order."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, NamedTuple

from ..._request import CommitRequest, Target
from . import statements as sql
from .steps import Script
from .values import bind, bound

__all__ = [
    "Reads",
    "Slots",
    "add_commit",
    "add_judge_reads",
    "add_read",
    "key_locks",
    "key_text",
    "quote",
]


def quote(identifier: str) -> str:
    """Quote an identifier already checked by ``check_column`` (or ``check_table``: a
    ``database.table`` name is quoted part by part)."""
    return ".".join("`" + part.replace("`", "``") + "`" for part in identifier.split("."))


def key_text(key: str | int) -> str:
    """A table key as text that cannot collide: ``i:42`` is never ``s:42``."""
    return f"i:{key}" if isinstance(key, int) else f"s:{key}"


def _key_sql(target: Target, text: bool) -> str:
    """A user table's row by key, matched exactly: an integer key matches only a numeric
    (or binary) key column, a text key only a text column, character for character.
    MySQL alone would find row 0 of an INTEGER column for ``'abc'``, row ``'05'`` of a
    text column for ``5``, and ``'K'`` or ``'k '`` for ``'k'`` under a case-insensitive
    PAD SPACE collation; and one row under two keys would split its fence."""
    k = quote(target.key_column)
    if not text:
        return f"({k} = %s AND CHARSET({k}) = 'binary')"
    return (
        f"({k} = %s AND CHARSET({k}) <> 'binary'"
        f" AND CAST({k} AS CHAR) COLLATE utf8mb4_bin = %s AND CHAR_LENGTH({k}) = %s)"
    )


def _key_params(key: str | int) -> tuple[Any, ...]:
    return (key, key, len(key)) if isinstance(key, str) else (key,)


def _table_select(target: Target, text_key: bool, head: str = "", lock: str = "") -> str:
    table = quote(target.name)
    where = _key_sql(target, text_key)
    return f"SELECT {head}{sql.FENCE_OF}, {table}.* FROM {table} WHERE {where}{lock}"


def add_read(script: Script, target: Target, key: str | int, lock: str = "") -> int:
    if target.kind == "collection":
        return script.add(sql.READ_RECORD + lock, target.name, key)
    text = _table_select(target, isinstance(key, str), lock=lock)
    return script.add(text, target.scope, key_text(key), *_key_params(key))


@dataclass(frozen=True, slots=True)
class Reads:
    """Where the answers of ``add_judge_reads`` are in its batch's results."""

    meta: int
    record: int
    lease: int | None


def add_judge_reads(script: Script, request: CommitRequest, lock: bool) -> Reads:
    """The lease row, the record, whether the intent is applied and the server's now;
    with ``lock``, in the order of the commit's own locks (lease shared, record exclusive)."""
    target, intent, lease = request.target, request.intent, request.lease
    lease_at = None
    if lease is not None:
        lease_at = script.add(sql.READ_LEASE + (" LOCK IN SHARE MODE" if lock else ""), lease.name)
    record = add_read(script, target, intent.key, " FOR UPDATE" if lock else "")
    meta = script.add(sql.JUDGE_META, target.scope, request.claim_id, key_text(intent.key))
    return Reads(meta, record, lease_at)


class _Shape(NamedTuple):
    """A shape of request on a user table: what its statements' text depends on."""

    columns: tuple[str, ...]  # the columns written
    text_key: bool
    versioned: bool  # whether the version is checked
    guard: tuple[tuple[str, bool], ...]  # the guarded columns, and whether each is text
    fenced: bool
    sql_values: tuple[tuple[str, str], ...]  # columns the database computes (onupdate)


def _table_update_sql(target: Target, shape: _Shape) -> str:
    """The conditional UPDATE of a user table for one shape of request."""
    columns, text_key, versioned, guard, fenced, sql_values = shape
    sets = [f"{quote(c)} = %s" for c in columns]
    sets += [f"{quote(c)} = {expression}" for c, expression in sql_values]
    where = [_key_sql(target, text_key)]
    if target.version_column:
        v = quote(target.version_column)
        sets.append(f"{v} = {v} + {sql.DONE}")  # (@f_done := 1) is 1: written, and flagged
        if versioned:
            where.append(f"{v} = %s")
    else:  # the first column's value, flagging the write on the way
        sets[0] = f"{quote(columns[0])} = IF({sql.DONE} = 1, %s, NULL)"
    for column, is_text in guard:
        if is_text:  # exact text: binary collation, and the length (no PAD SPACE)
            col = quote(column)
            where.append(f"({col} = %s COLLATE utf8mb4_bin AND CHAR_LENGTH({col}) = %s)")
        else:
            where.append(f"{quote(column)} <=> %s")
    where.append("@f_claimed = 1")
    if fenced:
        where.append(
            "NOT EXISTS (SELECT 1 FROM fencing_fences WHERE scope = %s AND key_text = %s"
            " AND fence > %s)" + sql.LEASE_LIVE
        )
    return f"UPDATE {quote(target.name)} SET {', '.join(sets)} WHERE {' AND '.join(where)}"


@dataclass(frozen=True, slots=True)
class _Template:
    """The statements of one shape of commit, joined; where its answers are."""

    sql: str
    statements: int
    result: int  # the SELECT of the record after the commit (``UNSETTLED`` just before)
    lease: int | None  # the SELECT of the lease row (fenced commits)


def _template(statements: list[str], result: str, lease: str | None) -> _Template:
    statements = [*statements, result] + ([lease] if lease else [])
    at = len(statements) - (2 if lease else 1)
    return _Template(";\n".join(statements), len(statements), at, at + 1 if lease else None)


def _locks(fenced: bool, lock_record: str) -> list[str]:
    """Claim the intent; under a lease, lock the lease row, then the record, then read
    the clock (after any lock wait)."""
    if not fenced:
        return [sql.INIT_FLAGS, sql.CLAIM, sql.SET_NOW]
    return [sql.INIT_FLAGS, sql.CLAIM, sql.LOCK_LEASE, lock_record, sql.SET_NOW]


@functools.lru_cache(maxsize=2)
def _collection_template(fenced: bool) -> _Template:
    update = sql.COLLECTION_UPDATE.format(
        fence_set=", fence = GREATEST(fence, %s)" if fenced else "",
        fence_where=" AND fence <= %s" + sql.LEASE_LIVE if fenced else "",
    )
    if not fenced:  # the record locked first; a stale intent claims nothing
        statements = [sql.INIT_FRESH, sql.FRESH, sql.CLAIM_FRESH, sql.SET_NOW, update]
        statements += [sql.APPLIED, sql.UNSETTLED]
        return _template(statements, sql.COLLECTION_RESULT, None)
    statements = [*_locks(fenced, sql.LOCK_RECORD), update, sql.UNCLAIM, sql.UNSETTLED]
    return _template(statements, sql.COLLECTION_RESULT, sql.LEASE_AFTER_REFUSAL if fenced else None)


@functools.lru_cache(maxsize=1024)
def _table_template(target: Target, shape: _Shape) -> _Template:
    table, where = quote(target.name), _key_sql(target, shape.text_key)
    update = _table_update_sql(target, shape)
    lock_row = f"SELECT 1 FROM {table} WHERE {where} FOR UPDATE"
    statements = [*_locks(shape.fenced, lock_row), update, sql.UNCLAIM]
    if shape.fenced:
        statements.append(sql.RAISE_FENCE)
    statements.append(sql.UNSETTLED)
    head, lock = "@f_claimed, @f_done, @f_now, ", " FOR UPDATE"
    result = _table_select(target, shape.text_key, head, lock)
    return _template(statements, result, sql.LEASE_AFTER_REFUSAL if shape.fenced else None)


@dataclass(frozen=True, slots=True)
class Slots:
    """Where one commit's answers are in its batch's results."""

    result: int
    lease: int | None

    @property
    def unsettled(self) -> int:
        """``UNSETTLED``'s answer: the statement before the result."""
        return self.result - 1


def add_commit(script: Script, request: CommitRequest) -> Slots:
    """The statements of one conditional commit (docs/backends/mysql.md), and their
    parameters in order; the SQL text is built once per shape of request."""
    target, intent, lease = request.target, request.intent, request.lease
    scope, key, text = target.scope, intent.key, key_text(intent.key)
    claim = request.claim_id  # the root id: an intent and its derivations share one claim
    params: list[Any] = [scope, claim, text]
    if lease is not None:
        params.append(lease.name)
    if target.kind == "collection":
        template = _collection_template(lease is not None)
        if lease is None:
            # FRESH, CLAIM_FRESH (scope, claim, text: above), the UPDATE, APPLIED
            params = [intent.expected_version, target.name, key, *params]
            params += [request.state_json, target.name, key, intent.expected_version]
            params += [scope, claim, text, scope, claim, target.name, key]
        else:
            token = lease.token
            params += [target.name, key]  # the record's lock
            params += [request.state_json, token, target.name, key, intent.expected_version]
            params += [token, lease.name, token]
            params += [scope, claim, text, scope, claim, target.name, key]
    else:
        guard = intent.guard or {}
        versioned = bool(target.version_column) and intent.expected_version is not None
        guarded = tuple((c, isinstance(v, str)) for c, v in guard.items())
        shape = _Shape(
            tuple(request.state),
            isinstance(key, str),
            versioned,
            guarded,
            lease is not None,
            request.sql_values,
        )
        template = _table_template(target, shape)
        if lease is not None:
            params += _key_params(key)  # the row's lock
        params += bound(request.state.values())
        params += _key_params(key)
        if versioned:
            params.append(intent.expected_version)
        for value in guard.values():
            params += [value, len(value)] if isinstance(value, str) else [bind(value)]
        if lease is not None:
            params += [scope, text, lease.token, lease.name, lease.token]
        params += [scope, claim, text]
        if lease is not None:
            params += [scope, text, lease.token, lease.token]
        params += [scope, claim, scope, text, *_key_params(key)]
    if lease is not None:
        params.append(lease.name)
    at = script.add(template.sql, *params, statements=template.statements)
    return Slots(at + template.result, None if template.lease is None else at + template.lease)


def key_locks(script: Script, collection: str, keys: list[str]) -> None:
    """Lock a collection's ``keys`` (their tombstone rows, in the order given), as
    ``create`` and ``delete`` lock their one key before anything else."""
    values = ", ".join(["(%s, %s, 0)"] * len(keys))
    script.add(
        f"INSERT INTO fencing_tombstones (collection, `key`, version) VALUES {values}"
        " ON DUPLICATE KEY UPDATE version = version",
        *(p for k in keys for p in (collection, k)),
    )
