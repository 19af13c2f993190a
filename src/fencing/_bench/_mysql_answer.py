"""MySQL / MariaDB: the hand-written transactions that give the same answer as fencing."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any, Final

from ._answer import Answer
from ._common import one_check

__all__ = ["MY_ANSWERS", "MySQLAnswers"]

NOW: Final = "UNIX_TIMESTAMP(NOW(6))"
UPDATE_RECORD: Final = (
    f"UPDATE fencing_bench_records SET state = %s, version = version + 1, updated_at = {NOW}"
    " WHERE collection = %s AND `key` = %s AND version = %s"
)
UPDATE_RECORD_FENCED: Final = (
    "UPDATE fencing_bench_records SET state = %s, version = version + 1,"
    f" fence = GREATEST(fence, %s), updated_at = {NOW}"
    " WHERE collection = %s AND `key` = %s AND version = %s AND fence <= %s"
)
UPDATE_ORDER: Final = (
    "UPDATE fencing_bench_orders SET status = %s, total = %s, version = version + 1"
    " WHERE id = %s AND version = %s"
)
INSERT_APPLIED: Final = (
    "INSERT INTO fencing_bench_applied (scope, intent_id, key_text, applied_at)"
    f" VALUES (%s, %s, %s, {NOW})"
)
READ: Final = (
    "SELECT version, state FROM fencing_bench_records WHERE collection = %s AND `key` = %s"
)
LEASE_LIVE: Final = (
    "SELECT token FROM fencing_bench_leases WHERE name = %s AND token = %s"
    f" AND owner IS NOT NULL AND expires_at > {NOW} LOCK IN SHARE MODE"
)

# The same answer: after the UPDATE, the row read back in the same transaction (MariaDB
# has no UPDATE ... RETURNING); on refusal the current row and whether the id was applied.
READ_ROW_APPLIED: Final = (
    "SELECT version, state, EXISTS (SELECT 1 FROM fencing_bench_applied"
    " WHERE scope = %s AND intent_id = %s) FROM fencing_bench_records"
    " WHERE collection = %s AND `key` = %s"
)
READ_ORDER: Final = "SELECT version, status, total, note FROM fencing_bench_orders WHERE id = %s"
READ_ORDER_APPLIED: Final = (
    "SELECT version, status, total, note, EXISTS (SELECT 1 FROM fencing_bench_applied"
    " WHERE scope = %s AND intent_id = %s) FROM fencing_bench_orders WHERE id = %s"
)
MY_ANSWERS: Final = {
    "commit": "UPDATE ... AND version=%s; INSERT applied; COMMIT (the new version is the"
    " expected + 1 under the row lock; refused: SELECT version, state, EXISTS applied id)",
    "table": "UPDATE orders ... AND version=%s; INSERT applied; SELECT version, status, total,"
    " note; COMMIT",
    "apply": "SELECT version, state; COMMIT; decide; the same-answer transaction",
    "many": "per item UPDATE ... AND version=%s (refused: SELECT the row, EXISTS applied);"
    " one multi-row INSERT applied; COMMIT",
    "fenced": "SELECT the live lease LOCK IN SHARE MODE; UPDATE ... fence; INSERT applied; COMMIT",
}


class MySQLAnswers:
    """The hand-written code that answers as fencing does (see ``_answer``)."""

    conn: Any
    cur: Any

    def create_records(self, collection: str, keys: Sequence[str]) -> None:
        raise NotImplementedError

    answer_methods = MY_ANSWERS

    def answer_records(self, collection: str, keys: Sequence[str]) -> None:
        self.create_records(collection, keys)

    def _refused(self, scope: str, intent_id: str, collection: str, key: str) -> Answer:
        cur = self.cur
        cur.execute(READ_ROW_APPLIED, (scope, intent_id, collection, key))
        row = cur.fetchone()
        if row is None:
            return ("missing", 0, {})
        return ("duplicate" if row[2] else "stale", row[0], json.loads(row[1]))

    def _answer_txn(self, body: Callable[[Any], Answer]) -> Answer:
        conn = self.conn
        try:
            answer = body(self.cur)
        except BaseException:
            conn.rollback()
            raise
        conn.commit()
        return answer

    def answer_commit(
        self, collection: str, key: str, version: int, state: dict[str, Any], intent_id: str
    ) -> Answer:
        scope = f"c:{collection}"

        def body(cur: Any) -> Answer:
            if cur.execute(UPDATE_RECORD, (json.dumps(state), collection, key, version)) != 1:
                return self._refused(scope, intent_id, collection, key)
            cur.execute(INSERT_APPLIED, (scope, intent_id, key))
            return ("committed", version + 1, state)

        return self._answer_txn(body)

    def answer_read(self, collection: str, key: str) -> tuple[int, dict[str, Any]]:
        self.cur.execute(READ, (collection, key))
        row = self.cur.fetchone()
        self.conn.commit()
        one_check(row is not None, f"read of {key}")
        return row[0], json.loads(row[1])

    def answer_table(
        self, key: int, version: int, status: str, total: int, intent_id: str
    ) -> Answer:
        scope = "t:fencing_bench_orders"

        def body(cur: Any) -> Answer:
            if cur.execute(UPDATE_ORDER, (status, total, key, version)) != 1:
                cur.execute(READ_ORDER_APPLIED, (scope, intent_id, key))
                got = cur.fetchone()
                if got is None:
                    return ("missing", 0, {})
                kind = "duplicate" if got[4] else "stale"
                return (kind, got[0], {"status": got[1], "total": got[2], "note": got[3]})
            cur.execute(INSERT_APPLIED, (scope, intent_id, str(key)))
            cur.execute(READ_ORDER, (key,))
            row = cur.fetchone()
            return ("committed", row[0], {"status": row[1], "total": row[2], "note": row[3]})

        return self._answer_txn(body)

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
        scope = f"c:{collection}"
        args = (json.dumps(state), token, collection, key, version, token)

        def body(cur: Any) -> Answer:
            live = cur.execute(LEASE_LIVE, (lease_name, token)) == 1
            if not live or cur.execute(UPDATE_RECORD_FENCED, args) != 1:
                return self._refused(scope, intent_id, collection, key)
            cur.execute(INSERT_APPLIED, (scope, intent_id, key))
            return ("committed", version + 1, state)

        return self._answer_txn(body)

    def answer_many(
        self, collection: str, items: Sequence[tuple[str, str, int, dict[str, Any]]]
    ) -> list[Answer]:
        scope = f"c:{collection}"
        out: list[Answer] = []

        def body(cur: Any) -> Answer:
            applied = []
            for intent_id, key, version, state in items:
                if cur.execute(UPDATE_RECORD, (json.dumps(state), collection, key, version)) == 1:
                    applied.append((scope, intent_id, key))
                    out.append(("committed", version + 1, state))
                else:
                    out.append(self._refused(scope, intent_id, collection, key))
            if applied:
                cur.executemany(INSERT_APPLIED, applied)
            return ("committed", 0, {})

        self._answer_txn(body)
        return out
