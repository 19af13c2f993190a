"""PostgreSQL: the hand-written statements that give the same answer as fencing."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Final

from ._answer import Answer
from ._common import one_check

__all__ = ["PG_ANSWERS", "PostgresAnswers"]

NOW: Final = "extract(epoch from now())"
READ: Final = (
    "SELECT version, state FROM {s}.fencing_bench_records WHERE collection = %s AND key = %s"
)
# The commit alone (the second-SELECT variant's first statement), as the 1-trip baseline's.
COMMIT_CTE: Final = (
    "WITH upd AS (UPDATE {s}.fencing_bench_records"
    f" SET state = %(state)s::jsonb, version = version + 1, updated_at = {NOW}"
    " WHERE collection = %(c)s AND key = %(k)s AND version = %(v)s RETURNING key)"
    " INSERT INTO {s}.fencing_bench_applied (scope, intent_id, key, applied_at)"
    f" SELECT %(scope)s, %(id)s, key, {NOW} FROM upd"
)

# The same answer in one round trip: the row at its new version from RETURNING, or (when
# the UPDATE matched nothing) the current row and whether the intent id was applied.
_REFUSED_TAIL: Final = (
    " UNION ALL SELECT CASE WHEN EXISTS (SELECT 1 FROM {s}.fencing_bench_applied a"
    " WHERE a.scope = %(scope)s AND a.intent_id = %(id)s) THEN 'duplicate' ELSE 'stale' END,"
    " r.version, r.state FROM {s}.fencing_bench_records r"
    " WHERE r.collection = %(c)s AND r.key = %(k)s AND NOT EXISTS (SELECT 1 FROM upd)"
)
ANSWER_CTE: Final = (
    "WITH upd AS (UPDATE {s}.fencing_bench_records"
    f" SET state = %(state)s::jsonb, version = version + 1, updated_at = {NOW}"
    " WHERE collection = %(c)s AND key = %(k)s AND version = %(v)s RETURNING key, version),"
    " ins AS (INSERT INTO {s}.fencing_bench_applied (scope, intent_id, key, applied_at)"
    f" SELECT %(scope)s, %(id)s, key, {NOW} FROM upd)"
    " SELECT 'committed', version, NULL::jsonb FROM upd" + _REFUSED_TAIL
)
ANSWER_FENCED_CTE: Final = (
    "WITH upd AS (UPDATE {s}.fencing_bench_records"
    " SET state = %(state)s::jsonb, version = version + 1, fence = GREATEST(fence, %(t)s),"
    f" updated_at = {NOW}"
    " WHERE collection = %(c)s AND key = %(k)s AND version = %(v)s AND fence <= %(t)s"
    " AND EXISTS (SELECT 1 FROM {s}.fencing_bench_leases WHERE name = %(lease)s"
    f" AND token = %(t)s AND owner IS NOT NULL AND expires_at > {NOW}) RETURNING key, version),"
    " ins AS (INSERT INTO {s}.fencing_bench_applied (scope, intent_id, key, applied_at)"
    f" SELECT %(scope)s, %(id)s, key, {NOW} FROM upd)"
    " SELECT 'committed', version, NULL::jsonb FROM upd" + _REFUSED_TAIL
)
ANSWER_TABLE_CTE: Final = (
    "WITH upd AS (UPDATE {s}.fencing_bench_orders"
    " SET status = %(status)s, total = %(total)s, version = version + 1"
    " WHERE id = %(k)s AND version = %(v)s RETURNING id, version, status, total, note),"
    " ins AS (INSERT INTO {s}.fencing_bench_applied (scope, intent_id, key, applied_at)"
    f" SELECT %(scope)s, %(id)s, id::text, {NOW} FROM upd)"
    " SELECT 'committed', version, status, total, note FROM upd"
    " UNION ALL SELECT CASE WHEN EXISTS (SELECT 1 FROM {s}.fencing_bench_applied a"
    " WHERE a.scope = %(scope)s AND a.intent_id = %(id)s) THEN 'duplicate' ELSE 'stale' END,"
    " o.version, o.status, o.total, o.note FROM {s}.fencing_bench_orders o"
    " WHERE o.id = %(k)s AND NOT EXISTS (SELECT 1 FROM upd)"
)
# The batch in one statement, each item's answer: RETURNING for those that applied, the
# current row and whether the id was applied for the others.
ANSWER_BATCH_CTE: Final = (
    "WITH item AS (SELECT * FROM unnest(%(ids)s::text[], %(keys)s::text[],"
    " %(versions)s::bigint[], %(states)s::jsonb[]) WITH ORDINALITY"
    " AS i(intent_id, key, version, state, n)),"
    " upd AS (UPDATE {s}.fencing_bench_records r SET state = item.state,"
    f" version = r.version + 1, updated_at = {NOW} FROM item"
    " WHERE r.collection = %(c)s AND r.key = item.key AND r.version = item.version"
    " RETURNING item.n, r.key, r.version, item.intent_id),"
    " ins AS (INSERT INTO {s}.fencing_bench_applied (scope, intent_id, key, applied_at)"
    f" SELECT %(scope)s, intent_id, key, {NOW} FROM upd)"
    " SELECT n, 'committed', version, NULL::jsonb FROM upd"
    " UNION ALL SELECT item.n, CASE WHEN EXISTS (SELECT 1 FROM {s}.fencing_bench_applied a"
    " WHERE a.scope = %(scope)s AND a.intent_id = item.intent_id) THEN 'duplicate'"
    " ELSE 'stale' END, r.version, r.state FROM item JOIN {s}.fencing_bench_records r"
    " ON r.collection = %(c)s AND r.key = item.key"
    " WHERE NOT EXISTS (SELECT 1 FROM upd WHERE upd.n = item.n)"
)
# The same answer with a second statement: the commit CTE, then SELECT the row and
# whether the id is applied, in one transaction sent as one pipeline.
ANSWER_SELECT: Final = (
    "SELECT version, state, EXISTS (SELECT 1 FROM {s}.fencing_bench_applied a"
    " WHERE a.scope = %(scope)s AND a.intent_id = %(id)s)"
    " FROM {s}.fencing_bench_records WHERE collection = %(c)s AND key = %(k)s"
)
PG_ANSWERS: Final = {
    "commit": "one statement: WITH upd AS (UPDATE ... AND version RETURNING version),"
    " ins AS (INSERT applied FROM upd) SELECT 'committed', version FROM upd UNION ALL"
    " SELECT 'duplicate'/'stale' (EXISTS applied id), the current row WHERE NOT EXISTS upd",
    "table": "the same one statement on the user table: RETURNING version, status, total,"
    " note; on refusal the current row and why",
    "apply": "SELECT version, state; decide; the same-answer statement",
    "many": "one statement for the batch: unnest(...) WITH ORDINALITY -> UPDATE ... FROM item"
    " RETURNING -> INSERT applied; each item's answer (refused: its row, EXISTS applied)",
    "fenced": "the same-answer statement with fence = GREATEST(fence, token), fence <= token"
    " AND EXISTS (the live lease row)",
}


class PostgresAnswers:
    """The hand-written code that answers as fencing does (see ``_answer``)."""

    conn: Any

    def sql(self, text: str) -> str:
        raise NotImplementedError

    def create_records(self, collection: str, keys: Sequence[str]) -> None:
        raise NotImplementedError

    answer_methods = PG_ANSWERS

    def answer_records(self, collection: str, keys: Sequence[str]) -> None:
        self.create_records(collection, keys)

    def answer_commit(
        self, collection: str, key: str, version: int, state: dict[str, Any], intent_id: str
    ) -> Answer:
        params = {
            "state": json.dumps(state),
            "c": collection,
            "k": key,
            "v": version,
            "scope": f"c:{collection}",
            "id": intent_id,
        }
        row = self.conn.execute(self.sql(ANSWER_CTE), params).fetchone()
        if row is None:
            return ("missing", 0, {})
        return (row[0], row[1], state if row[0] == "committed" else row[2])

    def answer_commit_select(
        self, collection: str, key: str, version: int, state: dict[str, Any], intent_id: str
    ) -> Answer:
        """The commit statement, then a SELECT of the row: one transaction, one pipeline."""
        conn = self.conn
        params = {
            "state": json.dumps(state),
            "c": collection,
            "k": key,
            "v": version,
            "scope": f"c:{collection}",
            "id": intent_id,
        }
        with conn.pipeline(), conn.transaction():
            done = conn.execute(self.sql(COMMIT_CTE), params)
            read = conn.execute(self.sql(ANSWER_SELECT), params)
        row = read.fetchone()
        if row is None:
            return ("missing", 0, {})
        if done.rowcount == 1:
            return ("committed", row[0], row[1])
        return ("duplicate" if row[2] else "stale", row[0], row[1])

    def answer_read(self, collection: str, key: str) -> tuple[int, dict[str, Any]]:
        row = self.conn.execute(self.sql(READ), (collection, key)).fetchone()
        one_check(row is not None, f"read of {key}")
        return row[0], row[1]

    def answer_table(
        self, key: int, version: int, status: str, total: int, intent_id: str
    ) -> Answer:
        params = {
            "status": status,
            "total": total,
            "k": key,
            "v": version,
            "scope": "t:fencing_bench_orders",
            "id": intent_id,
        }
        row = self.conn.execute(self.sql(ANSWER_TABLE_CTE), params).fetchone()
        if row is None:
            return ("missing", 0, {})
        return (row[0], row[1], {"status": row[2], "total": row[3], "note": row[4]})

    def answer_fenced(
        self,
        collection: str,
        key: str,
        version: int,
        state: dict[str, Any],
        intent_id: str,
        lease_name: str,
        token: int,
    ) -> Answer:
        params = {
            "state": json.dumps(state),
            "c": collection,
            "k": key,
            "v": version,
            "t": token,
            "lease": lease_name,
            "scope": f"c:{collection}",
            "id": intent_id,
        }
        row = self.conn.execute(self.sql(ANSWER_FENCED_CTE), params).fetchone()
        if row is None:
            return ("missing", 0, {})
        return (row[0], row[1], state if row[0] == "committed" else row[2])

    def answer_many(
        self, collection: str, items: Sequence[tuple[str, str, int, dict[str, Any]]]
    ) -> list[Answer]:
        params = {
            "ids": [i[0] for i in items],
            "keys": [i[1] for i in items],
            "versions": [i[2] for i in items],
            "states": [json.dumps(i[3]) for i in items],
            "c": collection,
            "scope": f"c:{collection}",
        }
        out: list[Answer] = [("missing", 0, {})] * len(items)
        for n, kind, version, state in self.conn.execute(self.sql(ANSWER_BATCH_CTE), params):
            at = n - 1
            out[at] = (kind, version, items[at][3] if kind == "committed" else state)
        return out
