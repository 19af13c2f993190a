"""Redis's flows: the logic of every operation, once, as the steps it needs (``steps``);
the drivers only carry the steps out.

The commit script judges and writes in one atomic step, in the order of
``fencing._rules.judge()``: missing, duplicate, fenced, stale. A commit is one round
trip; ``commit_many`` is one pipeline for the whole batch (one round trip, not one
transaction: each commit in it is atomic on its own). Reading a collection record
(HMGET) and a table's declared columns (SMEMBERS) are single commands.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Final

from ..._errors import AlreadyExists, ConfigurationError, SchemaError, StoreNotMigrated
from ..._flow import Flow
from ..._request import CommitRequest, CommitResult, LeaseAnswer, Target
from ..._validate import check_column
from ..._values import Record
from .._contract import no_guard
from .looking import LookFlows
from .replies import as_int, as_list, as_text, commit_result, lease_answer, table_record
from .scripts import SCRIPTS, Call, judge_call, run_call, run_calls, script_call, send
from .steps import Each, Load, Scan

__all__ = ["SCHEMA_VERSION", "RedisFlows"]

#: 2: effects (1 -> 2 only added keys, which the scripts make on first use)
SCHEMA_VERSION: Final = 2


def _ttl_us(ttl: float) -> str:
    return str(max(1, round(ttl * 1_000_000)))


class RedisFlows(LookFlows):
    """The flows of ``_contract.Flows`` for Redis (the effects flows and the reads for
    looking are inherited)."""

    __slots__ = ()

    def migrate(self) -> Flow[None]:
        settings = self.settings
        layout = settings.layout
        # every primary of a Cluster holds some of the keys: each one is checked
        nodes: list[list[object]] = yield Each((("INFO", "server"), ("INFO", "memory")))
        for server, memory in nodes:
            if isinstance(server, dict):
                release = str(server.get("redis_version", "0"))
                major = release.split(".")[0]
                if major.isdigit() and int(major) < 7:
                    raise ConfigurationError(
                        f"fencing's Redis backend needs Redis 7.0 or newer (this is {release})"
                    )
            if isinstance(memory, dict):
                policy = str(memory.get("maxmemory_policy", "noeviction"))
                if policy.startswith("allkeys") and not settings.allow_eviction:
                    raise ConfigurationError(
                        f"this Redis evicts any key when full (maxmemory-policy {policy}): it"
                        " could forget records, applied intents and lease tokens. Use"
                        " noeviction (or a volatile-* policy), or pass allow_eviction=true"
                        " to accept the risk"
                    )
        # one script: set the version on a new store, raise an older one (1 -> 2 only
        # added keys), leave a newer one to be refused below
        call = script_call(layout, "migrate", [layout.schema], [str(SCHEMA_VERSION)])
        version = as_int((yield from run_call(settings, call, write=False)))
        if version > SCHEMA_VERSION:
            raise SchemaError(
                f"this store's schema is version {version}, newer than this fencing"
                f" ({SCHEMA_VERSION}); upgrade fencing"
            )
        yield Load()

    def check_schema(self) -> Flow[None]:
        """Read only: the schema key (``<prefix>:schema``) at this fencing's version."""
        (found,) = yield from send([("GET", self.settings.layout.schema)])
        version = None if found is None else as_int(found)
        if version is None:
            raise StoreNotMigrated(
                f"no {self.settings.layout.schema!r} key in this Redis", None, SCHEMA_VERSION
            )
        if version > SCHEMA_VERSION:
            raise SchemaError(
                f"this store's schema is version {version}, newer than this fencing"
                f" ({SCHEMA_VERSION}); upgrade fencing"
            )
        if version < SCHEMA_VERSION:
            raise StoreNotMigrated(f"schema version {version}", version, SCHEMA_VERSION)

    def columns(self, target: Target, declare: frozenset[str] | None) -> Flow[frozenset[str]]:
        """A table's declared columns; with ``declare``, add those to the declaration first."""
        if declare is not None:
            key, version = target.key_column, target.version_column
            return (yield from self.declare(target.name, key, version, declare, "add"))
        layout = self.settings.layout
        (members,) = yield from send([("SMEMBERS", layout.table(target.name))])
        if not isinstance(members, set | list | tuple) or not members:
            raise SchemaError(
                f"table {target.name!r} is not declared in this Redis store"
                f" ({layout.table(target.name)!r} is empty); declare it with"
                " store.table(name, key=..., version=..., columns=[...])"
            )
        return frozenset(as_text(m) for m in members)

    def declare(
        self,
        name: str,
        key: str,
        version: str | None,
        columns: Iterable[str],
        mode: str = "replace",
    ) -> Flow[frozenset[str]]:
        """Declare a guarded table's columns (``mode``: replace the declaration, or add)."""
        check_column(name, "table")
        names = [check_column(key, "key column")]
        if version is not None:
            names.append(check_column(version, "version column"))
        names += [check_column(c) for c in columns]
        layout = self.settings.layout
        call = script_call(layout, "declare", [layout.table(name)], [mode, *names])
        members = yield from run_call(self.settings, call, write=True)
        return frozenset(as_text(m) for m in as_list(members, None))

    def read(self, target: Target, key: str | int) -> Flow[Record | None]:
        layout = self.settings.layout
        if target.kind == "collection":
            (found,) = yield from send([("HMGET", layout.record(target, key), "v", "f", "s")])
            version, fence, state = as_list(found, 3)
            if version is None:
                return None
            state = json.loads(as_text(state))
            return Record(target.name, key, as_int(version), as_int(fence), state)
        keys = [layout.record(target, key), layout.fence(target, key)]
        call = script_call(layout, "read", keys, [])
        reply = yield from run_call(self.settings, call, write=False)
        if reply is None:
            return None
        fence, row = as_list(reply, 2)
        return table_record(target, key, None, fence, row)

    def probe(self, request: CommitRequest) -> Flow[CommitResult]:
        call = judge_call(self.settings.layout, request, "probe")
        return commit_result(request, (yield from run_call(self.settings, call, write=False)))

    def commit(self, request: CommitRequest) -> Flow[CommitResult]:
        call = judge_call(self.settings.layout, request, "commit")
        return commit_result(request, (yield from run_call(self.settings, call, write=True)))

    def commit_many(self, requests: Sequence[CommitRequest]) -> Flow[list[CommitResult]]:
        calls = [judge_call(self.settings.layout, r, "commit") for r in requests]
        replies = yield from run_calls(self.settings, calls, write=True)
        return [commit_result(r, reply) for r, reply in zip(requests, replies, strict=True)]

    def create(self, target: Target, key: str | int, state_json: str) -> Flow[Record]:
        layout = self.settings.layout
        keys = [layout.record(target, key), layout.tombstone(target, key)]
        call = script_call(layout, "create", keys, [state_json])
        version = as_int((yield from run_call(self.settings, call, write=True)))
        if version == 0:
            raise AlreadyExists(f"{target.name}/{key} already exists")
        return Record(target.name, key, version, 0, json.loads(state_json))

    def delete(self, target: Target, key: str | int) -> Flow[bool]:
        layout = self.settings.layout
        keys = [layout.record(target, key), layout.tombstone(target, key)]
        call = script_call(layout, "delete", keys, [])
        return as_int((yield from run_call(self.settings, call, write=True))) > 0

    def acquire(self, name: str, owner: str, ttl: float) -> Flow[LeaseAnswer]:
        return self._lease("acquire", name, owner, _ttl_us(ttl))

    def renew(self, name: str, token: int, ttl: float) -> Flow[LeaseAnswer]:
        return self._lease("renew", name, str(token), _ttl_us(ttl))

    def release(self, name: str, token: int) -> Flow[LeaseAnswer]:
        return self._lease("release", name, str(token))

    def lease_state(self, name: str) -> Flow[LeaseAnswer]:
        return self._lease("lease_state", name, write=False)

    def _lease(self, script: str, name: str, *args: str, write: bool = True) -> Flow[LeaseAnswer]:
        layout = self.settings.layout
        call = script_call(layout, script, [layout.lease(name)], args)
        return lease_answer(name, (yield from run_call(self.settings, call, write=write)))

    def prune(self, older_than: float) -> Flow[int]:
        layout = self.settings.layout
        age = str(max(0, round(older_than * 1_000_000)))
        removed = 0
        state: tuple[int, int] | None = (0, 0)
        while state is not None:
            state, keys = yield Scan(state, layout.applied_pattern)
            if keys:
                calls = [Call(SCRIPTS["prune"], (as_text(k),), (age,)) for k in keys]
                replies = yield from run_calls(self.settings, calls, write=False)
                removed += sum(as_int(r) for r in replies)
        return removed

    # -- a guard trigger: none (``_contract``): Redis has no UPDATE for one to watch ------
    def guard_table(self, target: Target) -> Flow[None]:
        raise no_guard("redis", _NO_TRIGGER)

    def unguard_table(self, target: Target) -> Flow[None]:
        raise no_guard("redis", _NO_TRIGGER)


_NO_TRIGGER: Final = (
    "Redis has no triggers, and a table's hash is versioned by fencing's scripts alone"
    " (a foreign HSET is outside any guard)"
)
