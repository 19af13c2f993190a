"""Redis: fencing beside hand-written Lua scripts with the same guarantee.

The main baseline is what a careful engineer writes for one round trip: a Lua script
(sent by EVALSHA) that checks the version, records the intent id (``ZADD NX``) and
writes, atomically. For readers comparing approaches, a redis-py ``Lock`` does the
same job in four round trips (acquire, GET, MULTI SET + SADD, release), and with a
weaker guarantee: a lock that expires mid-write lets a second writer in, and nothing
fences it out.

Both sides use keys under ``fencing_bench:<id>:`` (fencing's through its ``prefix``
and ``table_prefix`` options, unless the URL sets a prefix), deleted afterwards.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from typing import Any, Final

import fencing

from .._errors import MissingDependency, StoreError, TransientStoreError
from .._url import StoreURL
from ._answer import Answer
from ._common import (
    ANSWER_ROWS,
    KEYS,
    START,
    Bench,
    Cursor,
    collection_state,
    decide_state,
    hand_lease_cycle,
    new_id,
    one_check,
)
from ._harness import Block, Side, Skip

__all__ = ["RedisBench"]

# KEYS: record hash {v, s}, applied sorted set. ARGV: expected version, state, intent id.
COMMIT_LUA: Final = """
local v = redis.call('HGET', KEYS[1], 'v')
if not v then return -1 end
if tonumber(v) ~= tonumber(ARGV[1]) then return 0 end
local t = redis.call('TIME')
if redis.call('ZADD', KEYS[2], 'NX', t[1] * 1000000 + t[2], ARGV[3]) == 0 then return -2 end
redis.call('HSET', KEYS[1], 'v', tonumber(v) + 1, 's', ARGV[2])
return 1
"""
# KEYS: row hash {version, status, total}, applied set. ARGV: version, status, total, id.
TABLE_LUA: Final = """
local v = redis.call('HGET', KEYS[1], 'version')
if not v then return -1 end
if tonumber(v) ~= tonumber(ARGV[1]) then return 0 end
local t = redis.call('TIME')
if redis.call('ZADD', KEYS[2], 'NX', t[1] * 1000000 + t[2], ARGV[4]) == 0 then return -2 end
redis.call('HSET', KEYS[1], 'version', tonumber(v) + 1, 'status', ARGV[2], 'total', ARGV[3])
return 1
"""
# KEYS: record, applied, lease hash {token, owner, exp}. ARGV: version, state, id, token.
FENCED_LUA: Final = """
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local lease = redis.call('HMGET', KEYS[3], 'token', 'owner', 'exp')
if lease[1] ~= ARGV[4] or not lease[2] or tonumber(lease[3]) <= now then return -3 end
local rec = redis.call('HMGET', KEYS[1], 'v', 'f')
if not rec[1] then return -1 end
if tonumber(rec[2] or '0') > tonumber(ARGV[4]) then return -3 end
if tonumber(rec[1]) ~= tonumber(ARGV[1]) then return 0 end
if redis.call('ZADD', KEYS[2], 'NX', now, ARGV[3]) == 0 then return -2 end
redis.call('HSET', KEYS[1], 'v', tonumber(rec[1]) + 1, 's', ARGV[2], 'f', ARGV[4])
return 1
"""
# KEYS: lease hash. ARGV: owner, ttl in microseconds. The token survives release.
ACQUIRE_LUA: Final = """
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local cur = redis.call('HMGET', KEYS[1], 'owner', 'exp')
if cur[1] and tonumber(cur[2]) > now then return 0 end
local token = redis.call('HINCRBY', KEYS[1], 'token', 1)
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'exp', now + ARGV[2])
return token
"""
# KEYS: lease hash. ARGV: token, ttl in microseconds (0: release).
RENEW_LUA: Final = """
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local cur = redis.call('HMGET', KEYS[1], 'token', 'owner', 'exp')
if cur[1] ~= ARGV[1] or not cur[2] or tonumber(cur[3]) <= now then return 0 end
if tonumber(ARGV[2]) == 0 then
  redis.call('HDEL', KEYS[1], 'owner')
  redis.call('HSET', KEYS[1], 'exp', 0)
else
  redis.call('HSET', KEYS[1], 'exp', now + ARGV[2])
end
return 1
"""

# The same answer in one round trip: {1, new version} when applied (the state is the one
# sent), else {0 stale / -2 duplicate, current version, current state}; {-1} missing.
ANSWER_LUA: Final = """
local v = redis.call('HGET', KEYS[1], 'v')
if not v then return {-1} end
if tonumber(v) ~= tonumber(ARGV[1]) then
  local why = 0
  if redis.call('ZSCORE', KEYS[2], ARGV[3]) then why = -2 end
  return {why, tonumber(v), redis.call('HGET', KEYS[1], 's')}
end
local t = redis.call('TIME')
if redis.call('ZADD', KEYS[2], 'NX', t[1] * 1000000 + t[2], ARGV[3]) == 0 then
  return {-2, tonumber(v), redis.call('HGET', KEYS[1], 's')}
end
redis.call('HSET', KEYS[1], 'v', tonumber(v) + 1, 's', ARGV[2])
return {1, tonumber(v) + 1}
"""
ANSWER_TABLE_LUA: Final = """
local row = redis.call('HMGET', KEYS[1], 'version', 'status', 'total', 'note')
if not row[1] then return {-1} end
local v = tonumber(row[1])
if v ~= tonumber(ARGV[1]) then
  local why = 0
  if redis.call('ZSCORE', KEYS[2], ARGV[4]) then why = -2 end
  return {why, v, row[2], row[3], row[4]}
end
local t = redis.call('TIME')
if redis.call('ZADD', KEYS[2], 'NX', t[1] * 1000000 + t[2], ARGV[4]) == 0 then
  return {-2, v, row[2], row[3], row[4]}
end
redis.call('HSET', KEYS[1], 'version', v + 1, 'status', ARGV[2], 'total', ARGV[3])
return {1, v + 1, ARGV[2], ARGV[3], row[4]}
"""
ANSWER_FENCED_LUA: Final = """
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local rec = redis.call('HMGET', KEYS[1], 'v', 'f')
if not rec[1] then return {-1} end
local lease = redis.call('HMGET', KEYS[3], 'token', 'owner', 'exp')
if lease[1] ~= ARGV[4] or not lease[2] or tonumber(lease[3]) <= now
   or tonumber(rec[2] or '0') > tonumber(ARGV[4]) then
  return {-3, tonumber(rec[1]), redis.call('HGET', KEYS[1], 's')}
end
if tonumber(rec[1]) ~= tonumber(ARGV[1]) then
  local why = 0
  if redis.call('ZSCORE', KEYS[2], ARGV[3]) then why = -2 end
  return {why, tonumber(rec[1]), redis.call('HGET', KEYS[1], 's')}
end
if redis.call('ZADD', KEYS[2], 'NX', now, ARGV[3]) == 0 then
  return {-2, tonumber(rec[1]), redis.call('HGET', KEYS[1], 's')}
end
redis.call('HSET', KEYS[1], 'v', tonumber(rec[1]) + 1, 's', ARGV[2], 'f', ARGV[4])
return {1, tonumber(rec[1]) + 1}
"""
_KINDS: Final = {1: "committed", 0: "stale", -2: "duplicate", -3: "fenced", -1: "missing"}
REDIS_ANSWERS: Final = {
    "commit": "EVALSHA: HGET v; compare (refused: ZSCORE applied id -> duplicate or stale,"
    " HGET state); ZADD NX applied; HSET v+1, state; returns {kind, version[, state]}",
    "table": "EVALSHA: HMGET version, status, total, note; compare; ZADD NX; HSET;"
    " returns the row at its new version, or the current row and why",
    "apply": "HMGET v, s; decide; the same-answer EVALSHA",
    "many": "one pipeline of the same-answer EVALSHA per item",
    "fenced": "EVALSHA: the lease check, fence, version (refused: the row and why);"
    " ZADD NX; HSET v+1, state, fence",
}

LUA: Final = "1-trip Lua"
LOCK: Final = "redis-py Lock"


def _redis() -> Any:
    try:
        import redis
    except ModuleNotFoundError as exc:
        raise MissingDependency(
            "the redis bench needs redis-py: pip install 'fencing[redis]'"
        ) from exc
    return redis


class RedisHand:
    """Hand-written scripts (loaded once, sent by EVALSHA) and redis-py locks."""

    def __init__(self, client: Any, prefix: str) -> None:
        self.r = client
        self.prefix = prefix
        self.sha = {
            name: client.script_load(text)
            for name, text in (
                ("commit", COMMIT_LUA),
                ("table", TABLE_LUA),
                ("fenced", FENCED_LUA),
                ("acquire", ACQUIRE_LUA),
                ("renew", RENEW_LUA),
                ("answer", ANSWER_LUA),
                ("answer_table", ANSWER_TABLE_LUA),
                ("answer_fenced", ANSWER_FENCED_LUA),
            )
        }
        pipe = client.pipeline(transaction=False)
        for k in range(2 * KEYS + 1, ANSWER_ROWS + 1):  # the same-answer side's table rows
            pipe.hset(f"{prefix}orders:{k}", mapping={"version": 1, "status": "new", "total": 0})
        pipe.execute()

    def close(self) -> None:
        self.r.close()

    def rec(self, collection: str, key: str) -> tuple[str, str]:
        tag = f"{self.prefix}{{{collection}/{key}}}"
        return f"{tag}:rec", f"{tag}:applied"

    def lease(self, name: str) -> str:
        return f"{self.prefix}lease:{{{name}}}"

    def create_records(self, collection: str, keys: Sequence[str]) -> None:
        pipe, text = self.r.pipeline(transaction=False), json.dumps(START)
        for key in keys:
            pipe.hset(self.rec(collection, key)[0], mapping={"v": 1, "s": text})
            # the Lock baseline's copy: one JSON string holding version and state
            pipe.set(self.rec(collection, key)[0] + ":json", json.dumps({"v": 1, "s": START}))
        pipe.execute()

    def _script(self, name: str, keys: Sequence[str], *args: Any) -> Any:
        return self.r.evalsha(self.sha[name], len(keys), *keys, *args)

    def commit(self, collection: str, keys: Sequence[str]) -> list[Side]:
        lua, locked, sha, evalsha, r = (
            Cursor(keys),
            Cursor(keys),
            self.sha["commit"],
            self.r.evalsha,
            self.r,
        )

        def one_trip(n: int) -> Block:
            items = [
                (*self.rec(collection, k), v, json.dumps(collection_state(i)), new_id())
                for i, (k, v) in enumerate(lua.take(n))
            ]

            def op(i: int) -> None:
                rec, applied, version, state, intent_id = items[i]
                one_check(evalsha(sha, 2, rec, applied, version, state, intent_id) == 1, "commit")

            return Block([op])

        def with_lock(n: int) -> Block:
            items = [
                (self.rec(collection, k), v, collection_state(i), new_id())
                for i, (k, v) in enumerate(locked.take(n))
            ]

            def op(i: int) -> None:
                (rec, applied), version, state, intent_id = items[i]
                doc_key = rec + ":json"
                lock = r.lock(rec + ":lock", timeout=10.0, blocking_timeout=5.0)
                one_check(lock.acquire(), "lock")
                try:
                    doc = json.loads(r.get(doc_key))
                    one_check(doc["v"] == version, f"locked read at {version}")
                    pipe = r.pipeline(transaction=True)
                    pipe.set(doc_key, json.dumps({"v": version + 1, "s": state}))
                    pipe.sadd(applied + ":set", intent_id)
                    pipe.execute()
                finally:
                    lock.release()

            return Block([op])

        return [
            Side(
                LUA,
                "EVALSHA: HGET v; compare; ZADD NX applied (server TIME); HSET v+1, state",
                one_trip,
            ),
            Side(
                LOCK,
                "lock.acquire(); GET; compare; MULTI SET + SADD applied; lock.release()"
                " (no fencing: an expired lock lets a second writer in)",
                with_lock,
            ),
        ]

    def table_commit(self, keys: Sequence[int]) -> list[Side]:
        cursor, sha, evalsha = Cursor(keys), self.sha["table"], self.r.evalsha
        pipe = self.r.pipeline(transaction=False)
        for k in keys:
            pipe.hset(
                f"{self.prefix}orders:{k}", mapping={"version": 1, "status": "new", "total": 0}
            )
        pipe.execute()

        def prepare(n: int) -> Block:
            items = [
                (f"{self.prefix}orders:{k}", f"{self.prefix}{{orders:{k}}}:applied", v, i, new_id())
                for i, (k, v) in enumerate(cursor.take(n))
            ]

            def op(i: int) -> None:
                row, applied, version, total, intent_id = items[i]
                result = evalsha(sha, 2, row, applied, version, "shipped", total, intent_id)
                one_check(result == 1, "table commit")

            return Block([op])

        method = "EVALSHA: HGET version; compare; ZADD NX applied; HSET version+1, status, total"
        return [Side(LUA, method, prepare)]

    def apply(self, collection: str, keys: Sequence[str]) -> list[Side]:
        cursor, sha, r = Cursor(keys), self.sha["commit"], self.r

        def prepare(n: int) -> Block:
            items = [(*self.rec(collection, k), v, new_id()) for k, v in cursor.take(n)]

            def op(i: int) -> None:
                rec, applied, version, intent_id = items[i]
                v, s = r.hmget(rec, "v", "s")
                one_check(v is not None and int(v) == version, "read")
                state = json.dumps(decide_state(json.loads(s)))
                one_check(r.evalsha(sha, 2, rec, applied, version, state, intent_id) == 1, "apply")

            return Block([op])

        return [Side(LUA, "HMGET v, s; decide; the EVALSHA commit", prepare)]

    def commit_many(self, collection: str, keys: Sequence[str]) -> list[Side]:
        cursor, sha, r, batch = Cursor(keys), self.sha["commit"], self.r, len(keys)

        def prepare(n: int) -> Block:
            calls = [
                [
                    (*self.rec(collection, k), v, json.dumps(collection_state(j)), new_id())
                    for j, (k, v) in enumerate(cursor.take(batch))
                ]
                for _ in range(n)
            ]

            def op(i: int) -> None:
                pipe = r.pipeline(transaction=False)
                for rec, applied, version, state, intent_id in calls[i]:
                    pipe.evalsha(sha, 2, rec, applied, version, state, intent_id)
                one_check(all(x == 1 for x in pipe.execute()), "batch commit")

            return Block([op])

        return [Side(LUA, f"one pipeline of {batch} EVALSHA commits", prepare)]

    def acquire(self, name: str, ttl: float) -> int:
        token = self._script("acquire", [self.lease(name)], "bench", int(ttl * 1e6))
        one_check(token > 0, f"acquire of {name}")
        return int(token)

    def renew(self, name: str, token: int, ttl: float) -> None:
        ok = self._script("renew", [self.lease(name)], token, int(ttl * 1e6))
        one_check(ok == 1, f"renew of {name}")

    def release(self, name: str, token: int) -> None:
        one_check(self._script("renew", [self.lease(name)], token, 0) == 1, f"release of {name}")

    def fenced(self, collection: str, keys: Sequence[str], lease_name: str) -> list[Side]:
        cursor, sha, evalsha, lease = (
            Cursor(keys),
            self.sha["fenced"],
            self.r.evalsha,
            self.lease(lease_name),
        )

        def prepare(n: int) -> Block:
            token = self.acquire(lease_name, 3600.0)
            items = [
                (*self.rec(collection, k), v, json.dumps(collection_state(i)), new_id())
                for i, (k, v) in enumerate(cursor.take(n))
            ]

            def op(i: int) -> None:
                rec, applied, version, state, intent_id = items[i]
                result = evalsha(sha, 3, rec, applied, lease, version, state, intent_id, token)
                one_check(result == 1, "fenced commit")

            return Block([op], close=lambda: self.release(lease_name, token))

        method = (
            "EVALSHA: lease hash holds this token, an owner, exp > TIME; fence <= token;"
            " version; ZADD NX applied; HSET v+1, state, fence"
        )
        return [Side(LUA, method, prepare)]

    # -- the same answer as fencing's (see _answer) ----------------------------------------
    answer_methods = REDIS_ANSWERS

    def answer_records(self, collection: str, keys: Sequence[str]) -> None:
        self.create_records(collection, keys)

    @staticmethod
    def _answer(reply: Any, state: dict[str, Any]) -> Answer:
        kind = _KINDS[int(reply[0])]
        if kind == "missing":
            return (kind, 0, {})
        if kind == "committed":
            return (kind, int(reply[1]), state)
        return (kind, int(reply[1]), json.loads(reply[2]))

    def answer_commit(
        self, collection: str, key: str, version: int, state: dict[str, Any], intent_id: str
    ) -> Answer:
        rec, applied = self.rec(collection, key)
        reply = self.r.evalsha(
            self.sha["answer"], 2, rec, applied, version, json.dumps(state), intent_id
        )
        return self._answer(reply, state)

    def answer_read(self, collection: str, key: str) -> tuple[int, dict[str, Any]]:
        v, s = self.r.hmget(self.rec(collection, key)[0], "v", "s")
        one_check(v is not None, f"read of {key}")
        return int(v), json.loads(s)

    def answer_table(
        self, key: int, version: int, status: str, total: int, intent_id: str
    ) -> Answer:
        row, applied = f"{self.prefix}orders:{key}", f"{self.prefix}{{orders:{key}}}:applied"
        reply = self.r.evalsha(
            self.sha["answer_table"], 2, row, applied, version, status, total, intent_id
        )
        kind = _KINDS[int(reply[0])]
        if kind == "missing":
            return (kind, 0, {})
        # Redis keeps strings and no absent field: the row as fencing's table reads it
        values = {"status": reply[2].decode(), "total": reply[3].decode()}
        if len(reply) > 4 and reply[4] is not None:
            values["note"] = reply[4].decode()
        return (kind, int(reply[1]), values)

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
        rec, applied = self.rec(collection, key)
        reply = self.r.evalsha(
            self.sha["answer_fenced"],
            3,
            rec,
            applied,
            self.lease(lease_name),
            version,
            json.dumps(state),
            intent_id,
            token,
        )
        return self._answer(reply, state)

    def answer_many(
        self, collection: str, items: Sequence[tuple[str, str, int, dict[str, Any]]]
    ) -> list[Answer]:
        pipe, sha = self.r.pipeline(transaction=False), self.sha["answer"]
        for intent_id, key, version, state in items:
            rec, applied = self.rec(collection, key)
            pipe.evalsha(sha, 2, rec, applied, version, json.dumps(state), intent_id)
        replies = pipe.execute()
        return [self._answer(reply, item[3]) for reply, item in zip(replies, items, strict=True)]

    def lease_cycle(self, lease_name: str) -> list[Side]:
        method = "one EVALSHA each: HINCRBY token if free; HSET exp if this token holds it"
        return hand_lease_cycle(self, lease_name, LUA, method)


class RedisBench(Bench):
    """A Redis server: fencing via ``fencing.open(url)`` beside hand-written Lua."""

    store_name = "redis"

    def __init__(self, url: str) -> None:
        redis = _redis()
        parsed = StoreURL.parse(url)
        suffix = uuid.uuid4().hex[:8]
        self.scratch = f"fencing_bench:{suffix}:"
        self.setting = (
            f"server {parsed.host or 'localhost'}:{parsed.port or 6379}/{parsed.path or 0}"
        )
        self.table_name = f"bench_orders_{suffix}"
        plain = url.split("?", 1)[0]  # fencing's options are not redis-py's
        try:
            client = redis.Redis.from_url(plain, socket_timeout=10)
            client.ping()
        except redis.RedisError as exc:
            raise TransientStoreError(f"redis: cannot connect: {exc}") from exc
        try:
            hand = RedisHand(client, self.scratch)
            own = "prefix" in parsed.options
            if own:
                store = fencing.open(url)
            else:
                store = fencing.open(
                    url, prefix=f"{self.scratch}f", table_prefix=f"{self.scratch}t:"
                )
        except BaseException as exc:
            client.close()
            if isinstance(exc, redis.RedisError):
                raise StoreError(f"redis: cannot set up the bench: {exc}") from exc
            raise
        self.table_prefix = parsed.options.get("table_prefix", "") if own else f"{self.scratch}t:"
        self.cleanup_records = own  # scratch keys are deleted by pattern
        super().__init__(store, hand, suffix)
        self._client = client

    def fencing_table(self) -> fencing.Table | Skip:
        pipe = self._client.pipeline(transaction=False)
        for k in range(1, KEYS + 1):
            row = f"{self.table_prefix}{self.table_name}:{k}"
            pipe.hset(row, mapping={"version": 1, "status": "new", "total": 0})
        pipe.execute()
        table = self.store.table(self.table_name, columns=["status", "total", "note"])
        table.get(1)  # declares the columns (Redis has no schema) before the clock runs
        return table

    def drop(self) -> None:
        r = self._client
        batch: list[bytes] = []
        for key in r.scan_iter(match=f"{self.scratch}*", count=1000):
            batch.append(key)
            if len(batch) >= 500:
                r.delete(*batch)
                batch.clear()
        if batch:
            r.delete(*batch)
        if self.cleanup_records:  # the URL's own prefix: only the bench's table rows go
            rows = [f"{self.table_prefix}{self.table_name}:{k}" for k in range(1, KEYS + 1)]
            r.delete(*rows)
