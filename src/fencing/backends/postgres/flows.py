"""PostgreSQL's flows: each operation of the contract as an I/O-free generator of
``Query`` and ``Pipeline`` steps (``steps``), the statements of ``statements``; the
driver runs each step on a connection and sends back its ``Answer``. A commit is ONE
statement and a batch ONE pipeline: one round trip. A statement re-runs only where its
answer says a concurrent writer made it unclear (``Retry``, a refusal its snapshot
cannot explain, a deadlock's victim), and a read once more on a lost connection. Why:
``docs/backends/postgres.md``."""

from __future__ import annotations

import json
import json.encoder
from collections.abc import Callable, Mapping, Sequence
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
    table_version,
)
from ..._rules import LeaseRow, Status, judge, lease_grant, lease_renewal
from ..._values import Record
from .._contract import prune_batches
from . import guard, schema
from . import statements as sql
from .effects import EffectFlows
from .errors import Deadlock, Retry
from .outbox import PostgresOutboxFlows
from .statements import FIXED
from .steps import Answer, Pipeline, Query, pruning, read_only

__all__ = ["PostgresFlows"]

# ``json.dumps`` of a str with the default options, in C
_json_str: Callable[[str], str] = json.encoder.encode_basestring_ascii

# How often a statement refused by a concurrent writer (or rolled back by a
# concurrent claim of the same intent) is run again before giving up.
_ATTEMPTS: Final = 5


def _key_json(key: str | int) -> str:
    """The JSON text of a key (``json.dumps``'s, without its per-call setup)."""
    return _json_str(key) if isinstance(key, str) else json.dumps(key)


def _probe_query(target: Target, key: str | int, claim_id: str | None, lease: str | None) -> Query:
    params = {
        "name": target.name,
        "key": key,
        "key_json": _key_json(key),
        "scope": target.scope,
        "id": claim_id,
        "lease": lease,
    }
    if target.kind == "collection":
        return Query(sql.COLLECTION_READ if lease is None else sql.COLLECTION_PROBE, params)
    return Query(sql.table_probe(target), params, names=True)


def _request_probe(request: CommitRequest) -> Query:
    lease = request.lease.name if request.lease is not None else None
    return _probe_query(request.target, request.intent.key, request.claim_id, lease)


def _commit_query(request: CommitRequest) -> Query:
    target, intent, lease = request.target, request.intent, request.lease
    params: dict[str, Any] = {
        "name": target.name,
        "key": intent.key,
        "key_json": _key_json(intent.key),
        "scope": target.scope,
        "id": request.claim_id,  # every derivation of one intent shares its claim
        "version": intent.expected_version,
        "lease": None,
    }
    if lease is not None:
        params["lease"], params["token"] = lease.name, lease.token
    if target.kind == "collection":
        params["state"] = request.state_json
        if intent.guard is not None:
            params["guard"] = json.dumps(dict(intent.guard))
        return Query(sql.collection_commit(intent.guard is not None, lease is not None), params)
    guard = intent.guard or {}
    params.update({f"s{i}": v for i, v in enumerate(request.state.values())})
    params.update({f"g{i}": v for i, v in enumerate(guard.values())})
    check = intent.expected_version is not None
    text = sql.table_commit(
        target, tuple(request.state), tuple(guard), check, lease is not None, request.sql_values
    )
    return Query(text, params, names=True)


def _record(target: Target, key: str | int, found: Answer, row: Sequence[Any]) -> Record | None:
    """The record in the columns after the fixed ones, or None when missing."""
    fence = row[2] or 0
    if target.kind == "collection":
        version, state = row[FIXED], row[FIXED + 1]
        return None if version is None else Record(target.name, key, version, fence, state)
    values = dict(zip(found.names[FIXED:], row[FIXED:], strict=True))
    if values.pop(target.key_column, None) is None:
        return None
    vcol = target.version_column
    version = table_version(values.pop(vcol), target, key) if vcol is not None else 0
    return Record(target.name, key, version, fence, values, "table")


def _judged(request: CommitRequest, found: Answer) -> CommitResult:
    """What ``judge`` says of an answer's probe columns (``Status.OK``: it would apply)."""
    row, lease = found.rows[0], request.lease
    record = _record(request.target, request.intent.key, found, row)
    lease_row = None
    if lease is not None and row[4] is not None:
        lease_row = LeaseRow(lease.name, row[3], row[4], row[5])
    status = judge(record, bool(row[1]), request.intent, lease, lease_row, row[6])
    return CommitResult(status, record, row[0] is not None)  # (REFUSED: NULL, none)


def _commit_result(request: CommitRequest, found: Answer) -> CommitResult:
    """A commit statement's answer. ``Status.OK`` means it was refused although its
    snapshot says it would apply: a concurrent writer got there first."""
    row, target, key = found.rows[0], request.target, request.intent.key
    if not row[0]:
        return _judged(request, found)
    if target.kind == "collection":
        return CommitResult(
            Status.APPLIED, Record(target.name, key, row[FIXED], row[2], request.state)
        )
    return CommitResult(Status.APPLIED, _record(target, key, found, row))


def _batch_query(requests: Sequence[CommitRequest]) -> tuple[Query, list[int]] | None:
    """The one-statement batch and the items' order in it; None for the shapes it
    does not take: a guarded table's, or a key twice (a later item must see the one
    before it: only one statement per item, in order, gives that)."""
    first = requests[0]
    if first.target.kind != "collection":
        return None
    keys = [r.intent.key for r in requests]
    if len(set(keys)) != len(keys):
        return None
    # The items go in key order, so batches over the same keys take their row locks
    # in the same order and seldom wait for each other in a circle; a deadlock that
    # happens anyway rolls the batch back whole, and it runs again (``_run_batch``).
    order = sorted(range(len(requests)), key=keys.__getitem__)
    lease = first.lease  # one lease (or none) for the whole batch
    # The items as one JSON document (json_to_recordset): the states go in as the
    # canonical JSON they already are, and the server parses the lot at C speed.
    dumps = json.dumps
    rows = []
    for i in order:
        r = requests[i]
        key_json = _key_json(keys[i])
        guard = "null" if r.intent.guard is None else dumps(dict(r.intent.guard))
        rows.append(
            f'{{"k":{key_json},"j":{dumps(key_json)},"i":{dumps(r.claim_id)},'
            f'"v":{r.intent.expected_version},"s":{r.state_json},"g":{guard}}}'
        )
    params: dict[str, Any] = {
        "name": first.target.name,
        "scope": first.target.scope,
        "items": f"[{','.join(rows)}]",
    }
    if lease is not None:
        params["lease"], params["token"] = lease.name, lease.token
    return Query(sql.collection_batch(lease is not None), params), order


# The values a guarded table's batch statement takes as JSON: each reads as the column's
# type exactly as a single commit's parameter of the same value does (``table_batch``).
_BATCH_VALUES: Final = frozenset({str, int, bool, type(None)})


def _table_batch_query(requests: Sequence[CommitRequest]) -> Query | None:
    """A guarded table's batch in one statement (``statements.table_batch``); None for
    a key twice (a later item must see the one before it), keys of mixed types, items of
    different shapes, or a value beyond ``_BATCH_VALUES``."""
    first = requests[0]
    target, lease, kinds = first.target, first.lease, _BATCH_VALUES
    shape = tuple(first.state), tuple(first.intent.guard or ()), first.sql_values
    check = first.intent.expected_version is not None
    keys = [r.intent.key for r in requests]
    if len(set(keys)) != len(keys) or len({type(k) for k in keys}) != 1:
        return None
    dumps, kcol, rows = json.dumps, target.key_column, []
    for n, r in enumerate(requests):
        intent, guard = r.intent, r.intent.guard or {}
        if (
            (tuple(r.state), tuple(guard), r.sql_values) != shape
            or (intent.expected_version is not None) is not check
            or any(type(v) not in kinds for v in r.state.values())
            or any(type(v) not in kinds for v in guard.values())
        ):
            return None
        key_json = _key_json(keys[n])
        rows.append(
            f'{{"n":{n},"i":{dumps(r.claim_id)},"j":{dumps(key_json)},'
            f'"v":{dumps(intent.expected_version)},"k":{{{dumps(kcol)}:{key_json}}},'
            f'"s":{dumps(dict(r.state))},"g":{dumps(dict(guard))}}}'
        )
    params: dict[str, Any] = {
        "scope": target.scope,
        "keys": keys,
        "lease": None,
        "table": sql.quoted(target.name),
        "items": f"[{','.join(rows)}]",
    }
    if lease is not None:
        params["lease"], params["token"] = lease.name, lease.token
    text = sql.table_batch(target, shape[0], shape[1], check, lease is not None, shape[2])
    return Query(text, params, names=True)


def _batch_locks(requests: Sequence[CommitRequest]) -> tuple[Query, ...]:
    """The statements that lock what a batch's answer depends on (``statements.BATCH_KEYS_NEW``)."""
    first = requests[0]
    target = first.target
    params = {"name": target.name, "keys": list(dict.fromkeys(r.intent.key for r in requests))}
    if target.kind == "collection":
        locks = [
            Query(sql.BATCH_KEYS_NEW, params),
            Query(sql.BATCH_KEYS_LOCK, params),
            Query(sql.BATCH_RECORDS_LOCK, params),
        ]
    else:  # a user's rows: those that exist (a row inserted meanwhile is not locked)
        locks = [Query(sql.table_rows_lock(target), params)]
    if first.lease is not None:
        locks.append(Query(sql.BATCH_LEASE_LOCK, {"lease": first.lease.name}))
    return tuple(locks)


def _run_batch(step: Pipeline) -> Flow[list[Answer]]:
    """Run a batch (one pipeline: one transaction) again when it rolled back whole: a
    concurrent claim of one of its intents, or chosen as a deadlock's victim. Nothing
    was written; bounded."""
    for attempt in range(1, _ATTEMPTS + 1):
        try:
            answers: list[Answer] = yield step
            return answers
        except (Retry, Deadlock):
            if attempt == _ATTEMPTS:
                raise
    raise AssertionError("unreachable")  # pragma: no cover


def _one_by_one(
    requests: Sequence[CommitRequest], locks: tuple[Query, ...]
) -> Flow[list[CommitResult]]:
    """The locks, then one commit statement per item, in order (a key twice)."""
    answers = yield from _run_batch(Pipeline((*locks, *(_commit_query(r) for r in requests))))
    return [_commit_result(r, a) for r, a in zip(requests, answers[len(locks) :], strict=True)]


def _lease_flow(
    text: str,
    params: Mapping[str, Any],
    name: str,
    consistent: Callable[[LeaseRow | None, float], bool],
) -> Flow[LeaseAnswer]:
    """A lease statement; a refusal its snapshot cannot explain (``consistent`` says
    whether the snapshot row agrees) came from a concurrent change: run it again."""
    for attempt in range(1, _ATTEMPTS + 1):
        found: Answer = yield Query(text, params)
        granted, owner, token, expires_at, now = found.rows[0]
        row = None if token is None else LeaseRow(name, owner, token, expires_at)
        if granted or consistent(row, now) or attempt == _ATTEMPTS:
            return LeaseAnswer(bool(granted), row, now)
    raise AssertionError("unreachable")  # pragma: no cover


class PostgresFlows(EffectFlows, PostgresOutboxFlows):
    """The flows of ``_contract.Flows`` for PostgreSQL (the effects' from ``EffectFlows``).
    ``schema`` is where ``migrate`` makes fencing's tables; the driver puts every
    statement's tables there (``statements.qualified``)."""

    __slots__ = ("_unfit", "schema")

    def __init__(self, schema: str | None) -> None:
        self.schema = schema
        # guarded tables whose batches run one statement per item (``table_batch``)
        self._unfit: set[Target] = set()

    def migrate(self) -> Flow[None]:
        return schema.migrate(self.schema)

    def check_schema(self) -> Flow[None]:
        return schema.check(self.schema)

    def columns(self, target: Target, declare: frozenset[str] | None) -> Flow[frozenset[str]]:
        found: Answer = yield from read_only(Query(sql.COLUMNS, {"name": sql.quoted(target.name)}))
        if not found.rows:
            raise SchemaError(f"table {target.name!r} does not exist")
        unique = frozenset(name for name, is_unique in found.rows if is_unique)
        names = frozenset(name for name, _ in found.rows)
        check_unique_key(target, names, unique)
        return names

    def read(self, target: Target, key: str | int) -> Flow[Record | None]:
        found: Answer = yield from read_only(_probe_query(target, key, None, None))
        return _record(target, key, found, found.rows[0])

    def probe(self, request: CommitRequest) -> Flow[CommitResult]:
        found: Answer = yield from read_only(_request_probe(request))
        return _judged(request, found)

    def create(self, target: Target, key: str | int, state_json: str) -> Flow[Record]:
        params = {"name": target.name, "key": key, "state": state_json}
        done: Answer = yield Query(sql.CREATE, params)
        if not done.rows:
            raise AlreadyExists(f"{target.name}/{key} already exists")
        return Record(target.name, key, int(done.rows[0][0]), 0, json.loads(state_json))

    def delete(self, target: Target, key: str | int) -> Flow[bool]:
        """Lock the key's tombstone, then delete and raise the tombstone to the deleted
        version: two statements, one transaction, one round trip."""
        params = {"name": target.name, "key": key}
        done: list[Answer] = yield Pipeline(
            (Query(sql.KEY_LOCK, params), Query(sql.DELETE, params))
        )
        return done[1].rowcount > 0

    def commit(self, request: CommitRequest) -> Flow[CommitResult]:
        """One statement; run again only when a concurrent writer made its answer unclear."""
        query = _commit_query(request)
        for attempt in range(1, _ATTEMPTS + 1):
            try:
                found: Answer = yield query
            except Retry:
                if attempt == _ATTEMPTS:
                    raise
                continue
            result = _commit_result(request, found)
            if result.status is not Status.OK:
                return result
        # Refused each time by a writer that got there first: the intent is stale.
        return CommitResult(Status.STALE, result.record, result.unsettled)

    def commit_many(self, requests: Sequence[CommitRequest]) -> Flow[list[CommitResult]]:
        """One transaction, one round trip: one statement for a batch of distinct keys
        (a guarded table's locks what its answer depends on itself; a collection's after
        the lock statements), else lock first and then one commit statement per item.
        Every outcome describes the store at the batch's commit."""
        if requests[0].target.kind == "collection":
            results = yield from self._collection_many(requests)
        else:
            results = yield from self._table_many(requests)
        # Refused although the rules find nothing wrong with the row as read: with the rows
        # locked, only a value the server compared differently from Python (a user table's
        # column type) or a user row inserted meanwhile; nothing was written: stale.
        return [
            CommitResult(Status.STALE, res.record) if res.status is Status.OK else res
            for res in results
        ]

    def _collection_many(self, requests: Sequence[CommitRequest]) -> Flow[list[CommitResult]]:
        locks = _batch_locks(requests)
        batch = _batch_query(requests)
        if batch is None:
            return (yield from _one_by_one(requests, locks))
        query, order = batch
        answers = yield from _run_batch(Pipeline((*locks, query)))
        # one row per item, in the statement's (key) order: back to the caller's
        by_item = {
            i: _commit_result(requests[i], Answer((), [row], 1))
            for i, row in zip(order, answers[-1].rows, strict=True)
        }
        return [by_item[i] for i in range(len(requests))]

    def _table_many(self, requests: Sequence[CommitRequest]) -> Flow[list[CommitResult]]:
        """The batch's statement alone; when a row it locked had changed since its
        snapshot (``statements.table_batch``: it wrote nothing), or it rolled back (a
        concurrent claim, a deadlock), again after the lock statements, in one
        transaction. A batch it does not take: locks, then one statement per item."""
        query = _table_batch_query(requests)
        locks = _batch_locks(requests)
        if query is None or requests[0].target in self._unfit:
            return (yield from _one_by_one(requests, locks))
        step: Query | Pipeline = query
        for attempt in range(1, _ATTEMPTS + 1):
            try:
                found = yield step
            except (Retry, Deadlock):
                if attempt == _ATTEMPTS:
                    raise
                step = Pipeline((*locks, query))
                continue
            answer: Answer = found[-1] if isinstance(found, list) else found
            rows = sorted(answer.rows, key=lambda row: int(row[0]))
            if rows[0][2]:  # a column type the JSON values may not read as a parameter
                self._unfit.add(requests[0].target)
                return (yield from _one_by_one(requests, locks))
            if not rows[0][1]:  # nothing moved: the answer holds
                names = answer.names[3:]
                return [
                    _commit_result(r, Answer(names, [row[3:]], 1))
                    for r, row in zip(requests, rows, strict=True)
                ]
            step = Pipeline((*locks, query))
        raise Retry("postgresql: the batch's rows kept changing under it; nothing was written")

    def acquire(self, name: str, owner: str, ttl: float) -> Flow[LeaseAnswer]:
        return _lease_flow(
            sql.ACQUIRE,
            {"name": name, "owner": owner, "ttl": ttl},
            name,
            lambda row, now: lease_grant(name, row, owner, ttl, now) is None,
        )

    def renew(self, name: str, token: int, ttl: float) -> Flow[LeaseAnswer]:
        return _lease_flow(
            sql.RENEW,
            {"name": name, "token": token, "ttl": ttl},
            name,
            lambda row, now: lease_renewal(row, token, ttl, now) is None,
        )

    def release(self, name: str, token: int) -> Flow[LeaseAnswer]:
        return _lease_flow(
            sql.RELEASE,
            {"name": name, "token": token},
            name,
            lambda row, now: row is None or row.token != token or not row.held_at(now),
        )

    def lease_state(self, name: str) -> Flow[LeaseAnswer]:
        found: Answer = yield from read_only(Query(sql.LEASE_STATE, {"name": name}))
        _, owner, token, expires_at, now = found.rows[0]
        return LeaseAnswer(
            False, None if token is None else LeaseRow(name, owner, token, expires_at), now
        )

    def prune(self, older_than: float) -> Flow[int]:
        return prune_batches(pruning(sql.PRUNE_APPLIED, older_than))

    # -- reads for looking (``_contract``) -------------------------------------------------
    def applied(self, target: Target, key: str | int, limit: int) -> Flow[list[AppliedIntent]]:
        params = {"scope": target.scope, "key_json": _key_json(key), "limit": limit}
        found: Answer = yield from read_only(Query(sql.APPLIED_TO_KEY, params))
        return [AppliedIntent(row[0], float(row[1])) for row in found.rows]

    def stats(self) -> Flow[StoreStats]:
        counts = (
            sql.STATS_RECORDS,
            sql.STATS_APPLIED,
            sql.STATS_EFFECTS,
            sql.LEASES_HELD,
            sql.GUARDED_TABLES,
        )
        schema = {"schema": self.schema}
        found: list[Answer] = yield Pipeline(tuple(Query(text, schema) for text in counts))
        records: dict[str, int | None] = {f"c:{name}": int(n) for name, n in found[0].rows}
        applied = {scope: int(n) for scope, n in found[1].rows}
        effects = effect_counts(found[2].rows)
        total, now = found[3].rows[0]
        named = {s[2:] for s in stats_scopes(records, applied, effects) if s[0] == "t"}
        tables = sorted(named | {name for (name,) in found[4].rows})
        if tables:
            params = {"names": tables, "quoted": [sql.quoted(t) for t in tables]}
            rows: Answer = yield from read_only(Query(sql.ROW_COUNTS, params))
            records.update({f"t:{name}": n for name, n in rows.rows})
        names = sorted({s[2:] for s in stats_scopes(records, applied, effects)})
        held: dict[str, int] = {}
        if names:
            under: Answer = yield from read_only(Query(sql.LEASES_HELD_UNDER, {"names": names}))
            held = {name: int(n) for name, n in under.rows}
        return StoreStats(scope_stats(records, applied, effects, held), int(total), float(now))

    # -- the guard trigger on a user's table (``guard``) ----------------------------------
    def guard_table(self, target: Target) -> Flow[None]:
        return guard.install(target)

    def unguard_table(self, target: Target) -> Flow[None]:
        return guard.remove(target)
