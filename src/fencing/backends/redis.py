"""The Redis backend: ``redis://`` and ``rediss://`` URLs, standalone or Cluster, sync and asyncio.

Every primitive that reads or writes more than one value is one Lua script (reviewed
text in ``redis_lua/``), loaded once with SCRIPT LOAD and called by its SHA (EVALSHA; on
NOSCRIPT, loaded again and re-sent); reading a collection record (HMGET), deleting it
(DEL) and reading a table's declared columns (SMEMBERS) are single commands.
The commit script judges and writes in one atomic step, in the order of
``fencing._rules.judge()``: missing, duplicate, fenced, stale; then it writes the state,
version + 1, fence = max(fence, token), and records the intent's claim (its root id:
every ``Recompute`` derivation ``<root>~<n>`` shares it). A commit is one
round trip; ``commit_many`` is one pipeline for the whole batch. The store's clock is
the Redis server's (``TIME`` inside the scripts; Redis 7 replicates scripts by their
effects, so reading the clock is safe). Requires Redis 7.0 or newer.

URL: ``redis://[user:password@]host[:port][/db][?option=value...]`` (``rediss://`` for
TLS). Options (in the URL or as keyword arguments of ``fencing.open``):

- ``prefix`` (default ``fencing``): the first part of every key fencing owns.
- ``table_prefix`` (default empty): prepended to guarded table row keys (see below).
- ``wait_replicas=N``, ``wait_timeout_ms`` (default 1000): after every write, ``WAIT``
  for N replicas (see Durability).
- ``cluster=true``: connect to a Redis Cluster.
- ``socket_timeout`` (default 10 s), ``connect_timeout`` (default 5 s), ``client_name``.
- ``allow_eviction=true``: accept a ``maxmemory-policy`` that evicts any key (see below).

Other keyword arguments go to ``redis.Redis`` / ``RedisCluster`` as they are (for
example ``ssl_ca_certs``). fencing never re-sends a command that may have run (redis-py's
retries are turned off; only a script the server reports it does not know is loaded and
sent again): a dropped connection or a timeout raises ``TransientStoreError``, the
outcome is unknown; retry with the same intent and expect ``Duplicate`` if the first
attempt landed. A dead idle connection is replaced by redis-py before use.

Keys (``P`` is the prefix; ``C`` a collection, ``K`` a key, ``T`` a table, ``R`` a
table row's key ``<table_prefix>T:K``)::

    P:schema                 the schema version
    P:c:C:{C/K}:rec          a record: a hash of v (version), f (fence), s (state JSON)
    P:c:C:{C/K}:applied      the record's applied intents (root ids): a sorted set scored
                             by applied time (server clock, microseconds); prune() trims
                             it; it outlives a delete, as the other backends' rows do
    P:c:C:{C/K}:tomb         the last version of the deleted record (a re-created record
                             continues after it: versions of a key never repeat)
    P:lease:{name}           a lease: a hash of token, owner, exp (expiry, microseconds
                             of the server's clock)
    P:table:T                a guarded table's declared columns (a set)
    P:t:T:{R}:applied        a table row's applied intents
    P:t:T:{R}:fence          a table row's fence (the highest token that wrote it)
    R                        a guarded table row: a hash the user owns
    P:fx:{P}:rows            every recorded effect: a hash of idempotency key -> the row,
                             a JSON array in ``EFFECT_COLUMNS`` order (times are integer
                             microseconds of the server's clock, as text; NULL is null)
    P:fx:{P}:intent:D        one intent's effects: a sorted set of their keys scored by
                             recorded_at (``D``: a digest of the scope and the intent's
                             root id, which may both hold ``:``)
    P:fx:{P}:open            the effects that need reconciling (settled, not reconciled):
                             a sorted set of their keys scored by recorded_at

The collection name appears outside the braces so that collection ``a`` key ``b/c`` and
collection ``a/b`` key ``c`` never share a key. No two kinds share a key (each kind is
its own second part, followed by ``:``; a collection name has no ``{``, so the first
``:{`` ends it; suffixes differ in their last letter). Guarded rows are the user's
hashes and any key may follow ``<table_prefix><table>:``, so a table whose rows could
be named like fencing's keys (with the default empty ``table_prefix``, the table named
like the prefix) is refused with ``InvalidIdentifier`` before anything is sent.

Lease hashes have no TTL and are never deleted: a release removes the owner and keeps
the token, expiry is judged against the server clock inside the scripts, so tokens only
grow per name, across release, expiry, reconnects and restarts (given persistence,
below). One hash per lease name ever used stays in the store.

Redis Cluster: the text between braces is the hash tag, so a record, its applied ids and
its fence share one hash slot, and a lease shares it when it is named after the record:
``<collection>/<key>`` (``orders/o-1``) for a collection record, ``<table_prefix><table>:<key>``
(``orders:42``) for a table row. A fenced commit whose lease lives in another slot cannot
be atomic in a Cluster and is refused with ``InvalidInput`` before anything is sent (so
is a table row whose key holds a ``{...}`` hash tag of its own, and, in ``commit_many``,
any item under such a lease: the whole batch is refused). ``commit_many`` sends one
pipeline that redis-py splits per node. The scripts are loaded on every primary; a
primary that answers NOSCRIPT (a promoted replica: Redis 7 does not replicate the script
cache, or a node that took over a slot) gets them all again and the call is re-sent.
MOVED and ASK are followed; redis-py's re-sending after a lost connection is turned off
(``cluster_error_retry_attempts``), except that redis-py's Cluster *pipeline* re-sends a
command whose connection dropped to the node that now serves its slot: in
``commit_many`` that is the retry of the same intent, which answers ``Duplicate`` if the
first attempt landed. ``prune`` scans every primary; ``migrate`` checks the version and
the eviction policy of every primary. ``wait_replicas`` is not available with
``cluster=true``. ``cluster=true`` against a server that is not a Cluster, or a plain
URL against a Cluster node, is a ``ConfigurationError``.

Effects (``fencing._effects``): each effect operation is one script, so one atomic step
and one round trip: ``record_effect`` writes the row only if its key is absent and
returns the stored row either way (the first recording wins, however many processes
race); ``mark_effect`` and ``settle_effects`` rewrite rows and keep ``P:fx:{P}:open`` in
step with them (settling adds an effect that is not reconciled, reconciling removes it);
``list_effects`` reads an index and its rows in one step, oldest first (recorded_at, then
the key: a sorted set orders equal scores by member). Every effects key carries the hash
tag ``{P}``, so every script touches one slot and is Redis Cluster safe; the price is
that a store's effects are never spread over a Cluster's nodes: they all live on the
node of that slot. Effects are rare (one per external call a task makes), so this is
the layout chosen. Effects are kept: ``prune`` forgets applied intent ids only, never an
effect, as on every other backend, so a settled effect stays listed until it is
reconciled, however late. ``wait_replicas`` applies to the effect writes too.

Guarded tables: a row is the hash ``<table_prefix><table>:<key>`` (an integer key is
written in decimal, so the keys ``42`` and ``"42"`` name the same row). Redis has no
schema, so a table is *declared*: ``store.table(name, key=..., version=...,
columns=[...])`` adds the columns to the set ``P:table:<table>`` on first use
(``backend.declare_table`` replaces the declaration, to take a column away);
a table that was never declared is a ``SchemaError``, and a commit may only set declared
columns. A hash holds text: a commit writes ``str`` as is, ``int`` in decimal, ``float``
as ``repr()``, ``True``/``False`` as ``true``/``false``, and ``None`` removes the field;
a row reads back as text, and a table guard compares that text (``None``: the field is
absent). The version field, when the table has one, must hold a decimal integer. The key
field is not stored in the hash (the key is in its name); if present it is not state.

Collection guards compare JSON values as the other backends do (``true`` is not ``1``;
``1`` equals ``1.0``); Lua numbers are doubles, so a collection guard may not hold an
integer beyond 2**53 (refused with ``InvalidState``).

``commit_many`` is one round trip but not one transaction: each commit in the batch is
atomic on its own and the outcomes come back in order; if the connection drops during a
batch, some commits may have landed: retry the batch with the same intents (those that
landed report ``Duplicate``).

Durability (read this before trusting tokens to Redis)
------------------------------------------------------
Redis acknowledges a write once the primary holds it in memory. What survives depends
on the server's configuration, not on fencing:

- Replication is asynchronous. If the primary fails and a replica that had not yet
  received a write is promoted (Sentinel, Cluster, or by hand), the write is gone: a
  commit that returned ``Committed`` can be lost, and a lease token counter can go back,
  so a new holder may be handed a token an old holder already used. Fencing is only as
  strong as the store's memory of tokens.
- ``wait_replicas=N`` sends ``WAIT N wait_timeout_ms`` after every write in the same
  round trip; when fewer than N replicas acknowledged in time, the call raises
  ``TransientStoreError``: the write is on the primary but may not survive a failover, so
  treat the outcome as unknown and retry with the same intent. ``WAIT`` narrows the window
  but does not make Redis strongly consistent; with N equal to the number of replicas and
  a failover that promotes the most up-to-date replica, an acknowledged write survives
  the loss of the primary.
- Restarts: with no persistence a restarted Redis is empty and tokens start again at 1.
  For the guarantee use ``appendonly yes`` with ``appendfsync always`` (every write is on
  disk before it is acknowledged). ``appendfsync everysec`` can lose about the last second
  of writes on a crash of the machine (not of the Redis process alone); RDB snapshots
  alone lose everything since the last snapshot. Never let a primary without persistence
  restart automatically while it has replicas: they would copy its empty dataset.
- Eviction: a ``maxmemory-policy`` of ``allkeys-*`` can evict records, applied ids and
  lease counters. ``migrate()`` refuses such a server (``ConfigurationError``) unless
  ``allow_eviction=true``; use ``noeviction`` (fencing's keys have no TTL, so the
  ``volatile-*`` policies never evict them). Scripts that write are refused when Redis is
  out of memory, before they write anything.

The Redis that fencing's own test suite runs against has no persistence at all
(``appendonly no``, no RDB snapshots): the tests prove atomicity and the fencing rules,
not durability across a restart.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.resources
import json
import re
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, TypeVar
from urllib.parse import unquote

from .._effects import Effect, EffectQuery, NewEffect, effect_from_row, pending, prunable
from .._errors import (
    AlreadyExists,
    ConfigurationError,
    FencingError,
    InvalidIdentifier,
    InvalidInput,
    InvalidState,
    SchemaError,
    StoreError,
    TransientStoreError,
)
from .._flow import adrive, drive
from .._request import CommitRequest, CommitResult, LeaseAnswer, Target
from .._rules import LeaseRow, Status, judge
from .._validate import check_column
from .._values import Record
from ._redis_conn import guard_cluster, guard_pool, guarded_async
from ._redis_errors import dropped_under_us, lost_connection, revive

if TYPE_CHECKING:
    import redis as redis_sync
    import redis.asyncio as redis_async
    import redis.asyncio.cluster as redis_async_cluster
    import redis.cluster as redis_sync_cluster

    from .._url import StoreURL

    SyncClient = redis_sync.Redis | redis_sync_cluster.RedisCluster
    AsyncClient = redis_async.Redis | redis_async_cluster.RedisCluster

__all__ = [
    "SCHEMA_VERSION",
    "AsyncRedisBackend",
    "Call",
    "Layout",
    "RedisBackend",
    "Settings",
    "check_slots",
    "commit_result",
    "effect_reply",
    "field_text",
    "judge_call",
    "judge_reply",
    "key_slot",
    "open_async_backend",
    "open_backend",
]

T = TypeVar("T")

#: 2: effects (1 -> 2 only added keys, which the scripts make on first use)
SCHEMA_VERSION: Final = 2
#: The error code the scripts use for a table row fencing cannot read.
SCHEMA_ERROR: Final = "FENCING_SCHEMA"
#: Integers a Lua number (a double) holds exactly.
MAX_EXACT_INT: Final = 2**53
_SCAN_COUNT: Final = 1000
_PREFIX = re.compile(r"[A-Za-z0-9_.:\-]{1,64}")
_TABLE_PREFIX = re.compile(r"[A-Za-z0-9_.:\-]{0,128}")
_INTEGER = re.compile(r"0|-?[1-9][0-9]*")
#: The kinds of fencing's own keys, ``<prefix>:<kind>:...`` (and ``<prefix>:schema``):
#: each is followed by ``:``, so no two kinds share a key (see ``Layout.check_table``).
_KINDS: Final = ("c", "lease", "table", "t", "fx")


# -- the scripts ----------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Script:
    name: str
    text: str
    sha: str


def _load_scripts() -> dict[str, Script]:
    """Each script is its ``#!lua`` line, then ``prelude.lua``, then its body."""
    root = importlib.resources.files("fencing.backends").joinpath("redis_lua")
    prelude = root.joinpath("prelude.lua").read_text("utf-8")
    scripts = {}
    for name in (
        "commit",
        "probe",
        "read",
        "create",
        "delete",
        "acquire",
        "renew",
        "release",
        "lease_state",
        "prune",
        "declare",
        "migrate",
        "record_effect",
        "mark_effect",
        "settle_effects",
        "list_effects",
        "scan_effects",
        "prune_effects",
        "is_applied",
    ):
        shebang, body = root.joinpath(f"{name}.lua").read_text("utf-8").split("\n", 1)
        assert shebang.startswith("#!lua"), name
        text = f"{shebang}\n{prelude}\n{body}"
        scripts[name] = Script(name, text, hashlib.sha1(text.encode()).hexdigest())
    return scripts


SCRIPTS: Final = _load_scripts()


# -- settings and keys ----------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Layout:
    """Where fencing's keys live; pure string building (see the module docstring)."""

    prefix: str = "fencing"
    table_prefix: str = ""
    cluster: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.prefix, str) or _PREFIX.fullmatch(self.prefix) is None:
            raise ConfigurationError(
                f"redis prefix {self.prefix!r}: use 1 to 64 letters, digits and '_ . : -'"
            )
        if not isinstance(self.table_prefix, str) or not _TABLE_PREFIX.fullmatch(self.table_prefix):
            raise ConfigurationError(
                f"redis table_prefix {self.table_prefix!r}: use up to 128 letters, digits"
                " and '_ . : -'"
            )

    def check_table(self, name: str) -> str:
        """Refuse a table whose rows could be named like one of fencing's own keys.

        A row is ``<table_prefix><table>:<key>`` with any key, so it could be any key
        that starts with ``<table_prefix><table>:``; fencing's keys are ``<prefix>:schema``
        and ``<prefix>:<kind>:...`` for the kinds in ``_KINDS``. With the default empty
        ``table_prefix`` the table named like the prefix would address them all (a
        commit to its row ``lease:{name}`` set that lease's token back to 0).
        """
        rows = f"{self.table_prefix}{name}:"
        own = f"{self.prefix}:"
        if own.startswith(rows) or any(rows.startswith(f"{own}{kind}:") for kind in _KINDS):
            raise InvalidIdentifier(
                f"redis: table {name!r} with table_prefix {self.table_prefix!r} would name"
                f" its rows like fencing's own keys (prefix {self.prefix!r}): choose another"
                " table name or table_prefix"
            )
        return name

    def tag(self, target: Target, key: str | int) -> str:
        """The hash tag of a record: also the name of a lease that shares its slot."""
        if target.kind == "collection":
            return f"{target.name}/{key}"
        return f"{self.table_prefix}{self.check_table(target.name)}:{key}"

    def record_keys(self, target: Target, key: str | int) -> tuple[str, str, str]:
        """A record's own key, its applied set and its fence key (all in one hash slot).

        A collection keeps its fence in the record (field ``f``): its fence key is the
        record's. A table row is the user's hash ``<table_prefix><table>:<key>``.
        """
        tag = self.tag(target, key)
        if target.kind == "collection":
            base = f"{self.prefix}:c:{target.name}:{{{tag}}}"
            return f"{base}:rec", f"{base}:applied", f"{base}:rec"
        base = f"{self.prefix}:t:{target.name}:{{{tag}}}"
        return self.row(target.name, key), f"{base}:applied", f"{base}:fence"

    def record(self, target: Target, key: str | int) -> str:
        return self.record_keys(target, key)[0]

    def tombstone(self, target: Target, key: str | int) -> str:
        """A deleted collection record's last version (same slot as the record)."""
        return f"{self.prefix}:c:{target.name}:{{{self.tag(target, key)}}}:tomb"

    def applied(self, target: Target, key: str | int) -> str:
        return self.record_keys(target, key)[1]

    def fence(self, target: Target, key: str | int) -> str:
        return self.record_keys(target, key)[2]

    def row(self, table: str, key: str | int) -> str:
        """The hash holding a guarded table's row (owned by the user)."""
        return f"{self.table_prefix}{self.check_table(table)}:{key}"

    def lease(self, name: str) -> str:
        return f"{self.prefix}:lease:{{{name}}}"

    def table(self, name: str) -> str:
        return f"{self.prefix}:table:{self.check_table(name)}"

    @property
    def schema(self) -> str:
        return f"{self.prefix}:schema"

    @property
    def effects(self) -> str:
        """The start of every effects key: one hash tag (one slot) for all of them."""
        return f"{self.prefix}:fx:{{{self.prefix}}}"

    @property
    def effect_rows(self) -> str:
        """The hash of every effect: idempotency key -> its row as JSON."""
        return f"{self.effects}:rows"

    @property
    def effects_open(self) -> str:
        """The keys of the effects that need reconciling, scored by recorded_at."""
        return f"{self.effects}:open"

    def effect_intent(self, scope: str, intent_id: str) -> str:
        """The keys of one intent's effects, scored by recorded_at.

        Named by a digest: scopes and intent ids may hold ``:``, and the name must never
        end in ``:applied`` (``prune`` scans those).
        """
        digest = hashlib.sha256(f"{scope}\n{intent_id}".encode()).hexdigest()[:40]
        return f"{self.effects}:intent:{digest}"

    @property
    def applied_pattern(self) -> str:
        return f"{self.prefix}:*:applied"


@dataclass(frozen=True, slots=True)
class Settings:
    """A Redis store's connection and behaviour, parsed from its URL and options."""

    layout: Layout
    host: str = "localhost"
    port: int = 6379
    db: int = 0
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    ssl: bool = False
    wait_replicas: int = 0
    wait_timeout_ms: int = 1000
    socket_timeout: float = 10.0
    connect_timeout: float = 5.0
    client_name: str | None = None
    allow_eviction: bool = False

    @property
    def wait(self) -> Command | None:
        if self.wait_replicas <= 0:
            return None
        return ("WAIT", self.wait_replicas, self.wait_timeout_ms)


_OPTIONS: Final = frozenset(
    {
        "prefix",
        "table_prefix",
        "wait_replicas",
        "wait_timeout_ms",
        "cluster",
        "socket_timeout",
        "connect_timeout",
        "client_name",
        "allow_eviction",
    }
)


def _bool(name: str, value: object) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ConfigurationError(f"redis option {name}={value!r} must be true or false")


def _number(name: str, value: object, low: float, high: float, *, integer: bool) -> float:
    try:
        if isinstance(value, bool):
            raise ValueError
        number = int(str(value)) if integer else float(str(value))
    except ValueError:
        kind = "an integer" if integer else "a number"
        raise ConfigurationError(f"redis option {name}={value!r} must be {kind}") from None
    if not low <= number <= high:
        raise ConfigurationError(f"redis option {name}={value!r} must be from {low} to {high}")
    return number


def parse_settings(url: StoreURL, options: dict[str, Any]) -> Settings:
    """Settings from a URL and ``fencing.open`` keyword options.

    Our own options are removed from ``options``; what is left goes to redis-py.
    """
    unknown = set(url.options) - _OPTIONS
    if unknown:
        raise ConfigurationError(
            f"unknown redis URL option(s) {sorted(unknown)}; known: {sorted(_OPTIONS)}"
        )
    raw: dict[str, object] = dict(url.options)
    raw.update({name: options.pop(name) for name in list(options) if name in _OPTIONS})
    cluster = _bool("cluster", raw.get("cluster", False))
    layout = Layout(str(raw.get("prefix", "fencing")), str(raw.get("table_prefix", "")), cluster)
    path = url.path.strip("/")
    if path and not path.isdigit():
        raise ConfigurationError(f"redis URL path {url.path!r} must be a database number")
    db = int(path or 0)
    if cluster and db != 0:
        raise ConfigurationError("Redis Cluster has only database 0")
    wait = int(_number("wait_replicas", raw.get("wait_replicas", 0), 0, 100, integer=True))
    if cluster and wait:
        raise ConfigurationError("wait_replicas is not available with cluster=true")
    name = raw.get("client_name")
    return Settings(
        layout=layout,
        host=url.host or "localhost",
        port=url.port or 6379,
        db=db,
        username=unquote(url.username) if url.username else None,
        password=unquote(url.password) if url.password else None,
        ssl=url.scheme == "rediss",
        wait_replicas=wait,
        wait_timeout_ms=int(
            _number("wait_timeout_ms", raw.get("wait_timeout_ms", 1000), 1, 3_600_000, integer=True)
        ),
        socket_timeout=_number(
            "socket_timeout", raw.get("socket_timeout", 10.0), 0.001, 3600, integer=False
        ),
        connect_timeout=_number(
            "connect_timeout", raw.get("connect_timeout", 5.0), 0.001, 3600, integer=False
        ),
        client_name=None if name is None else str(name),
        allow_eviction=_bool("allow_eviction", raw.get("allow_eviction", False)),
    )


# -- commands and calls ---------------------------------------------------------------
Command = tuple[str | int, ...]


@dataclass(frozen=True, slots=True)
class Call:
    """One script invocation: EVALSHA sha numkeys keys... args..."""

    script: Script
    keys: tuple[str, ...]
    args: tuple[str, ...]

    def command(self) -> Command:
        return ("EVALSHA", self.script.sha, len(self.keys), *self.keys, *self.args)


def key_slot(key: str) -> int:
    """The Redis Cluster hash slot of ``key`` (CRC16 of its hash tag, mod 16384)."""
    from redis.crc import key_slot as crc_slot

    return int(crc_slot(key.encode()))


def check_slots(call: Call, hint: str = "") -> Call:
    """Refuse a call whose keys span hash slots (Cluster could not run it atomically)."""
    slots = {key_slot(k) for k in call.keys}
    if len(slots) > 1:
        raise InvalidInput(
            f"in Redis Cluster the keys of one {call.script.name} must share a hash slot,"
            f" and {list(call.keys)} do not{hint}"
        )
    return call


def _call(layout: Layout, name: str, keys: Sequence[str], args: Sequence[str]) -> Call:
    call = Call(SCRIPTS[name], tuple(keys), tuple(args))
    return check_slots(call) if layout.cluster else call


def field_text(value: object) -> str:
    """The text a table row's hash field holds for a column value (see the docstring)."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)
    raise InvalidState(f"a Redis table field cannot hold {type(value).__name__}")


def _guard_text(request: CommitRequest) -> str:
    guard = request.intent.guard
    if guard is None:
        return ""
    if request.target.kind == "table":
        text = {f: None if v is None else field_text(v) for f, v in guard.items()}
        return json.dumps(text, separators=(",", ":"))
    for name, value in guard.items():
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_EXACT_INT:
            raise InvalidState(
                f"guard value for {name!r} is beyond 2**53: the Redis backend compares"
                " JSON numbers as doubles and cannot compare it exactly"
            )
    return json.dumps(dict(guard), separators=(",", ":"))


def judge_call(layout: Layout, request: CommitRequest, name: str) -> Call:
    """The ``commit`` or ``probe`` script call for a request (refused before sending in a
    Cluster when its keys span slots)."""
    target, intent, lease = request.target, request.intent, request.lease
    key = intent.key
    keys: tuple[str, ...] = layout.record_keys(target, key)
    if lease is not None:
        keys += (layout.lease(lease.name),)
    expected = intent.expected_version
    args = [
        "c" if target.kind == "collection" else "t",
        request.claim_id,  # the root id: every derivation of one intent shares one claim
        "" if expected is None else str(expected),
        "" if lease is None else str(lease.token),
        _guard_text(request),
        target.version_column or "",
        target.key_column,
    ]
    if name == "commit":
        if target.kind == "collection":
            args.append(request.state_json)
        else:
            for column, value in request.state.items():
                args += [column, "-" if value is None else "=" + field_text(value)]
    call = Call(SCRIPTS[name], keys, tuple(args))
    if layout.cluster:
        hint = ""
        if lease is not None:
            hint = (
                f": a fenced commit needs its lease in the record's slot; name the lease"
                f" {layout.tag(target, key)!r} (it is {lease.name!r})"
            )
        check_slots(call, hint)
    return call


# -- reading replies ------------------------------------------------------------------
def _text(value: object) -> str:
    if isinstance(value, bytes):
        try:
            return value.decode()
        except UnicodeDecodeError as exc:
            raise StoreError(f"redis: a value is not UTF-8 text ({exc})") from exc
    if isinstance(value, str):
        return value
    if isinstance(value, int):
        return str(value)
    raise StoreError(f"redis: unexpected reply {value!r}")


def _int(value: object) -> int:
    if isinstance(value, int):
        return value
    if isinstance(value, bytes | str):
        try:
            return int(value)
        except ValueError:
            pass
    raise StoreError(f"redis: expected an integer, got {value!r}")


def _list(value: object, length: int | None = None) -> list[object]:
    if not isinstance(value, list | tuple) or (length is not None and len(value) != length):
        raise StoreError(f"redis: unexpected reply {value!r}")
    return list(value)


def _fields(row: object) -> dict[str, str]:
    flat = [_text(v) for v in _list(row)]
    return dict(zip(flat[::2], flat[1::2], strict=True))


def _table_record(
    target: Target, key: str | int, version: object, fence: object, row: object
) -> Record:
    fields = _fields(row)
    vcol = target.version_column
    if version is None and vcol is not None:
        # read path: the client checks the version field as the scripts do
        text = fields.get(vcol)
        if text is None or _INTEGER.fullmatch(text) is None:
            raise SchemaError(
                f"table row {target.name}:{key} has no integer {vcol} field (NULL or missing)"
            )
        version = text
    fields.pop(target.key_column, None)
    if vcol is not None:
        fields.pop(vcol, None)
    return Record(
        target.name, key, 0 if vcol is None else _int(version), _int(fence), fields, "table"
    )


def _record(request: CommitRequest, items: list[object], status: Status) -> Record:
    target, key = request.target, request.intent.key
    if target.kind == "table":
        return _table_record(target, key, items[1], items[2], items[3])
    if status is Status.APPLIED:
        state: Mapping[str, Any] = request.state
    else:
        state = json.loads(_text(items[3]))
    return Record(target.name, key, _int(items[1]), _int(items[2]), state)


_STATUS: Final = {s.value.encode(): s for s in Status}


def _status(value: object) -> Status:
    status = _STATUS.get(value) if isinstance(value, bytes) else None
    if status is None:
        raise StoreError(f"redis: unexpected status {value!r}")
    return status


def commit_result(request: CommitRequest, reply: object) -> CommitResult:
    """A commit or probe reply as the contract's answer (the status comes from Lua).

    Replies: ``[status, version, fence, state JSON or row, applied, lease token, lease
    owner, lease expiry, now]``, or ``[b"applied", version, fence, row]`` after a write.
    """
    if not isinstance(reply, list) or len(reply) not in (4, 9):
        raise StoreError(f"redis: unexpected reply {reply!r}")
    status = _status(reply[0])
    if status is Status.MISSING:
        return CommitResult(status, None)
    return CommitResult(status, _record(request, reply, status))


def judge_reply(request: CommitRequest, reply: object) -> Status:
    """What ``fencing._rules.judge()`` says about the facts a probe reply carries.

    The scripts decide the status themselves; tests hold them to this.
    """
    items = _list(reply, 9)
    status = _status(items[0])
    record = None if status is Status.MISSING else _record(request, items, status)
    lease = request.lease
    row = None
    if lease is not None and items[5] is not None:
        owner = None if items[6] is None else _text(items[6])
        row = LeaseRow(lease.name, owner, _int(items[5]), _int(items[7]) / 1e6)
    applied = items[4] is not None and _int(items[4]) == 1
    return judge(record, applied, request.intent, lease, row, _int(items[8]) / 1e6)


def lease_answer(name: str, reply: object) -> LeaseAnswer:
    granted, token, owner, expires, now = _list(reply, 5)
    row = None
    if token is not None:
        row = LeaseRow(
            name,
            None if owner is None else _text(owner),
            _int(token),
            0.0 if expires is None else _int(expires) / 1e6,
        )
    return LeaseAnswer(_int(granted) == 1, row, _int(now) / 1e6)


def _ttl_us(ttl: float) -> str:
    return str(max(1, round(ttl * 1_000_000)))


# -- flows: the logic, once; the backends below only carry out their steps ------------
@dataclass(frozen=True, slots=True)
class Send:
    """Send these commands in one round trip; replies come back in order, error
    replies as exception values."""

    commands: tuple[Command, ...]


@dataclass(frozen=True, slots=True)
class Load:
    """SCRIPT LOAD every script (on every primary of a Cluster)."""


@dataclass(frozen=True, slots=True)
class Scan:
    """One SCAN step over applied sets: ``state`` is (node index, cursor)."""

    state: tuple[int, int]
    match: str


@dataclass(frozen=True, slots=True)
class Each:
    """Send these commands to every primary of a Cluster (to the server when standalone);
    the replies come back as one list per node, error replies raised."""

    commands: tuple[Command, ...]


Step = Send | Load | Scan | Each
Flow = Generator[Step, Any, T]


def _raise_error(reply: object) -> None:
    if isinstance(reply, BaseException):
        raise translate(reply) from reply


@functools.cache
def _driver() -> _Driver:
    from redis import exceptions as rx

    return _Driver(rx.NoScriptError, rx.ResponseError, (rx.RedisError, rx.RedisClusterException))


@dataclass(frozen=True, slots=True)
class _Driver:
    """The redis-py exception classes the flows and backends use (imported once, lazily)."""

    no_script: type[BaseException]
    response: type[BaseException]
    errors: tuple[type[BaseException], ...]


def _eval(settings: Settings, calls: Sequence[Call], *, write: bool) -> Flow[list[object]]:
    """Run script calls in one round trip (plus WAIT after writes, if configured)."""
    commands = [c.command() for c in calls]
    wait = settings.wait if write else None
    if wait is None and len(commands) == 1:
        replies: list[object] = yield Send((commands[0],))
        if not isinstance(replies[0], BaseException):
            return replies  # the common case: one script call, answered
        tail: tuple[Command, ...] = ()
    else:
        tail = (wait,) if wait is not None else ()
        replies = yield Send((*commands, *tail))
    no_script = _driver().no_script
    replies = list(replies)
    waits = replies[len(commands) :]
    replies = replies[: len(commands)]
    redo = [i for i, r in enumerate(replies) if isinstance(r, no_script)]
    if redo:
        # The server lost its script cache (a restart, SCRIPT FLUSH): nothing of those
        # calls ran, so load the scripts and send them again.
        yield Load()
        again = list((yield Send((*(commands[i] for i in redo), *tail))))
        for i, reply in zip(redo, again, strict=False):
            replies[i] = reply
        waits += again[len(redo) :]
    for reply in replies:
        _raise_error(reply)
    for acked in waits:
        _raise_error(acked)
        if _int(acked) < settings.wait_replicas:
            raise TransientStoreError(
                f"redis: only {_int(acked)} of {settings.wait_replicas} replicas acknowledged"
                f" the write within {settings.wait_timeout_ms} ms; it is on the primary but"
                " may not survive a failover: the outcome is unknown, retry with the same"
                " intent"
            )
    return replies


def _one(settings: Settings, call: Call, *, write: bool) -> Flow[object]:
    return (yield from _eval(settings, [call], write=write))[0]


def _send(commands: Sequence[Command]) -> Flow[list[object]]:
    replies = list((yield Send(tuple(commands))))
    for reply in replies:
        _raise_error(reply)
    return replies


def migrate_flow(settings: Settings) -> Flow[None]:
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
                    " could forget records, applied intents and lease tokens. Use noeviction"
                    " (or a volatile-* policy), or pass allow_eviction=true to accept the risk"
                )
    # one script: set the version on a new store, raise an older one (1 -> 2 only
    # added keys), leave a newer one to be refused below
    call = _call(layout, "migrate", [layout.schema], [str(SCHEMA_VERSION)])
    version = _int((yield from _one(settings, call, write=False)))
    if version > SCHEMA_VERSION:
        raise SchemaError(
            f"this store's schema is version {version}, newer than this fencing"
            f" ({SCHEMA_VERSION}); upgrade fencing"
        )
    yield Load()


def columns_flow(layout: Layout, target: Target) -> Flow[frozenset[str]]:
    (members,) = yield from _send([("SMEMBERS", layout.table(target.name))])
    if not isinstance(members, set | list | tuple) or not members:
        raise SchemaError(
            f"table {target.name!r} is not declared in this Redis store"
            f" ({layout.table(target.name)!r} is empty); declare it with"
            " store.table(name, key=..., version=..., columns=[...])"
        )
    return frozenset(_text(m) for m in members)


def table_columns_flow(
    settings: Settings, target: Target, declare: frozenset[str] | None
) -> Flow[frozenset[str]]:
    """A table's declared columns; with ``declare``, add those to the declaration first."""
    if declare is None:
        return (yield from columns_flow(settings.layout, target))
    return (
        yield from declare_flow(
            settings, target.name, target.key_column, target.version_column, declare, "add"
        )
    )


def declare_flow(
    settings: Settings,
    name: str,
    key: str,
    version: str | None,
    columns: Iterable[str],
    mode: str = "replace",
) -> Flow[frozenset[str]]:
    check_column(name, "table")
    names = [check_column(key, "key column")]
    if version is not None:
        names.append(check_column(version, "version column"))
    names += [check_column(c) for c in columns]
    layout = settings.layout
    call = _call(layout, "declare", [layout.table(name)], [mode, *names])
    members = yield from _one(settings, call, write=True)
    return frozenset(_text(m) for m in _list(members, None))


def read_flow(settings: Settings, target: Target, key: str | int) -> Flow[Record | None]:
    layout = settings.layout
    if target.kind == "collection":
        (found,) = yield from _send([("HMGET", layout.record(target, key), "v", "f", "s")])
        version, fence, state = _list(found, 3)
        if version is None:
            return None
        return Record(target.name, key, _int(version), _int(fence), json.loads(_text(state)))
    keys = [layout.record(target, key), layout.fence(target, key)]
    reply = yield from _one(settings, _call(layout, "read", keys, []), write=False)
    if reply is None:
        return None
    fence, row = _list(reply, 2)
    return _table_record(target, key, None, fence, row)


def commit_many_flow(
    settings: Settings, requests: Sequence[CommitRequest]
) -> Flow[list[CommitResult]]:
    calls = [judge_call(settings.layout, r, "commit") for r in requests]
    replies = yield from _eval(settings, calls, write=True)
    return [commit_result(r, reply) for r, reply in zip(requests, replies, strict=True)]


def create_flow(
    settings: Settings, target: Target, key: str | int, state_json: str
) -> Flow[Record]:
    layout = settings.layout
    keys = [layout.record(target, key), layout.tombstone(target, key)]
    version = _int(
        (yield from _one(settings, _call(layout, "create", keys, [state_json]), write=True))
    )
    if version == 0:
        raise AlreadyExists(f"{target.name}/{key} already exists")
    return Record(target.name, key, version, 0, json.loads(state_json))


def delete_flow(settings: Settings, target: Target, key: str | int) -> Flow[bool]:
    layout = settings.layout
    keys = [layout.record(target, key), layout.tombstone(target, key)]
    return _int((yield from _one(settings, _call(layout, "delete", keys, []), write=True))) > 0


def lease_flow(
    settings: Settings, script: str, name: str, *args: str, write: bool = True
) -> Flow[LeaseAnswer]:
    layout = settings.layout
    call = _call(layout, script, [layout.lease(name)], args)
    return lease_answer(name, (yield from _one(settings, call, write=write)))


def prune_flow(settings: Settings, older_than: float) -> Flow[int]:
    layout = settings.layout
    age = str(max(0, round(older_than * 1_000_000)))
    removed = 0
    state: tuple[int, int] | None = (0, 0)
    while state is not None:
        state, keys = yield Scan(state, layout.applied_pattern)
        if keys:
            calls = [Call(SCRIPTS["prune"], (_text(k),), (age,)) for k in keys]
            removed += sum(_int(r) for r in (yield from _eval(settings, calls, write=False)))
    return removed


def effect_reply(reply: object) -> Effect:
    """A stored effect row (JSON, see ``record_effect.lua``) as an :class:`Effect`.

    The scripts keep times as integer microseconds of the server's clock (text); the
    row is handed to ``effect_from_row`` with them as seconds, like every other time.
    """
    try:
        row = _list(json.loads(_text(reply)), 12)
    except ValueError as exc:
        raise StoreError(f"redis: an effect row is not JSON ({exc})") from exc
    for i in (9, 10, 11):
        if row[i] is not None:
            row[i] = _int(row[i]) / 1e6
    return effect_from_row(row)


def _optional(text: str | None) -> str:
    """A value the scripts may leave alone: ``'='`` and the text, or ``'-'`` for None."""
    return "-" if text is None else "=" + text


def record_effect_flow(settings: Settings, row: NewEffect) -> Flow[Effect]:
    layout = settings.layout
    keys = [layout.effect_rows, layout.effect_intent(row[1], row[3])]
    call = _call(layout, "record_effect", keys, [*row[:7], _optional(row[7])])
    return effect_reply((yield from _one(settings, call, write=True)))


def mark_effect_flow(
    settings: Settings,
    idempotency_key: str,
    status: str | None,
    detail_json: str | None,
    reconcile: bool,
) -> Flow[Effect | None]:
    layout = settings.layout
    args = [idempotency_key, status or "", _optional(detail_json), "1" if reconcile else "0"]
    call = _call(layout, "mark_effect", [layout.effect_rows, layout.effects_open], args)
    reply = yield from _one(settings, call, write=True)
    return None if reply is None else effect_reply(reply)


def settle_effects_flow(
    settings: Settings, scope: str, intent_id: str, outcome: str
) -> Flow[list[Effect]]:
    layout = settings.layout
    keys = [layout.effect_rows, layout.effect_intent(scope, intent_id), layout.effects_open]
    call = _call(layout, "settle_effects", keys, [scope, intent_id, outcome])
    return [effect_reply(r) for r in _list((yield from _one(settings, call, write=True)))]


def list_effects_flow(settings: Settings, query: EffectQuery) -> Flow[list[Effect]]:
    if query.pending_for is not None:
        return (yield from pending_effects_flow(settings, query))
    layout = settings.layout
    keys = [layout.effect_rows]
    if query.idempotency_key is None:
        if query.intent_id is not None:
            keys.append(layout.effect_intent(query.scope or "", query.intent_id))
        else:
            keys.append(layout.effects_open)
    args = [query.idempotency_key or "", str(query.limit)]
    reply = yield from _one(settings, _call(layout, "list_effects", keys, args), write=False)
    # the index keys are digests: the rows themselves say whether they match
    return [e for e in map(effect_reply, _list(reply)) if query.matches(e)]


Page = tuple[list[Effect], set[str], float]


def _effect_pages(settings: Settings, older_than: float) -> Flow[list[Page]]:
    """Every effect, a page at a time (read-only steps): ``(effects, the keys of those
    old and unsettled whose work committed, the cutoff in seconds)``.

    Whether an unsettled effect's work committed is read from its record's applied
    ids, in their own slots (one pipelined round trip a page). Not atomic with what
    the caller does next, and it need not be: an applied id stays until ``prune``
    forgets applied ids, which ``Store.prune`` does after the effects.
    """
    layout = settings.layout
    age = max(0, round(older_than * 1_000_000))
    pages: list[Page] = []
    cursor = "0"
    while True:
        call = _call(layout, "scan_effects", [layout.effect_rows], [cursor, "200"])
        page = _list((yield from _one(settings, call, write=False)))
        cursor, cutoff = _text(page[0]), (_int(page[1]) - age) / 1e6
        effects = [effect_reply(row) for row in page[2:]]
        unsettled = [e for e in effects if e.outcome is None and e.updated_at < cutoff]
        committed: set[str] = set()
        if unsettled:
            checks = [
                _call(
                    layout,
                    "is_applied",
                    [layout.applied(Target(e.kind, e.collection), e.key)],
                    [e.intent_id],
                )
                for e in unsettled
            ]
            answers = yield from _eval(settings, checks, write=False)
            pairs = zip(unsettled, answers, strict=True)
            committed = {e.idempotency_key for e, a in pairs if _int(a)}
        pages.append((effects, committed, cutoff))
        if cursor == "0":
            return pages


def prune_effects_flow(settings: Settings, older_than: float) -> Flow[int]:
    """Remove the prunable effects of each page in one script that judges each again on
    its row as it is then."""
    layout = settings.layout
    removed = 0
    for effects, committed, cutoff in (yield from _effect_pages(settings, older_than)):
        old = [e for e in effects if prunable(e, cutoff, e.idempotency_key in committed)]
        if old:
            keys = [layout.effect_rows, *(layout.effect_intent(e.scope, e.intent_id) for e in old)]
            args = [str(round(cutoff * 1e6)), *(e.idempotency_key for e in old)]
            call = _call(layout, "prune_effects", keys, args)
            removed += _int((yield from _one(settings, call, write=True)))
    return removed


def pending_effects_flow(settings: Settings, query: EffectQuery) -> Flow[list[Effect]]:
    """The effects still pending ``query.pending_for`` seconds or more, work not committed."""
    assert query.pending_for is not None
    found = [
        e
        for effects, committed, cutoff in (yield from _effect_pages(settings, query.pending_for))
        for e in effects
        if pending(e, cutoff, e.idempotency_key in committed)
    ]
    found.sort(key=lambda e: (e.recorded_at, e.idempotency_key))
    return found[: query.limit]


# -- errors ---------------------------------------------------------------------------
def translate(exc: BaseException) -> FencingError:
    """A driver error as fencing's error (raise it ``from exc``)."""
    from redis import exceptions as rx

    text = f"redis: {exc}"
    if isinstance(exc, rx.AuthenticationError | rx.AuthorizationError):
        # refused credentials or ACL: retrying cannot fix it
        return ConfigurationError(f"{text} (the URL's credentials or the user's ACL)")
    if isinstance(
        exc,
        rx.ConnectionError
        | rx.TimeoutError
        | rx.TryAgainError
        | rx.ClusterError
        | rx.ReadOnlyError,
    ):
        return TransientStoreError(
            f"{text} (the outcome is unknown: retry with the same intent; a commit that"
            " landed reports Duplicate)"
        )
    if isinstance(exc, rx.RedisClusterException):
        # raised by redis-py's Cluster client itself, before or instead of a command
        if "cluster mode is not enabled" in str(exc).lower():
            return ConfigurationError(
                f"{text} (this server is not a Redis Cluster: drop cluster=true)"
            )
        cause = exc.__cause__
        # "cannot be connected": no node answered while redis-py rediscovered the
        # Cluster; after connections dropped, its threads can also break each other's
        # reconnect (a parser reset under another thread): either way, a lost connection
        if (
            isinstance(exc, rx.SlotNotCoveredError)
            or isinstance(cause, rx.ConnectionError | rx.TimeoutError)
            or "cannot be connected" in str(exc)
        ):
            return TransientStoreError(
                f"{text} (the outcome is unknown: retry with the same intent; a commit that"
                " landed reports Duplicate)"
            )
    if isinstance(exc, rx.ResponseError) and str(exc).startswith(("MOVED ", "ASK ")):
        # a redirection only reaches us from a client that does not follow them
        return ConfigurationError(
            f"{text} (this server is a Redis Cluster node: add cluster=true to the URL)"
        )
    if isinstance(exc, rx.ResponseError) and str(exc).startswith(SCHEMA_ERROR):
        return SchemaError(f"redis: {str(exc)[len(SCHEMA_ERROR) :].strip()}")
    if "shebang" in str(exc).lower():
        return ConfigurationError(f"{text} (fencing needs Redis 7.0 or newer)")
    return StoreError(text)


def _next_scan(
    state: tuple[int, int], nodes: int, cursor: object, keys: object
) -> tuple[tuple[int, int] | None, list[object]]:
    if isinstance(cursor, dict):  # a Cluster answers per node
        cursor = next(iter(cursor.values()), 0)
    node, nxt = state[0], _int(cursor)
    if nxt == 0:
        node, nxt = node + 1, 0
    return (None if node >= nodes else (node, nxt)), _list(keys)


def _first_key(command: Command) -> str:
    """The first key of a command fencing sends (a script call, HMGET or SMEMBERS)."""
    if str(command[0]).upper() == "EVALSHA":
        return str(command[3])
    return str(command[1])


def _client_options(settings: Settings, extra: dict[str, Any]) -> dict[str, Any]:
    options: dict[str, Any] = {
        "username": settings.username,
        "password": settings.password,
        "socket_timeout": settings.socket_timeout,
        "socket_connect_timeout": settings.connect_timeout,
        "client_name": settings.client_name,
        "decode_responses": False,
    }
    if settings.ssl:
        options["ssl"] = True
    options.update(extra)
    return options


# -- the two backends: they carry out the steps of the flows above, and send the one ---
# -- script call of commit and probe straight (the flow takes over when it must) -------
class RedisBackend:
    """The synchronous Redis backend (``fencing.open("redis://...")``)."""

    scheme = "redis"

    def __init__(self, settings: Settings, client: SyncClient) -> None:
        self.settings = settings
        self.layout = settings.layout
        self.client = client
        self._response_error = _driver().response
        self._no_script = _driver().no_script
        self._errors = _driver().errors
        self._direct = settings.wait is None
        self._known: dict[str, Any] = {}  # Cluster node addresses seen (see revive)

    def _drive(self, flow: Flow[T]) -> T:
        try:
            return drive(flow, self._step)
        except self._errors as exc:
            raise translate(exc) from exc
        except (AttributeError, TypeError, RuntimeError) as exc:
            if not dropped_under_us(exc):
                raise
            raise lost_connection(exc) from exc

    def _script(self, call: Call, *, write: bool) -> object:
        """One script call, sent straight (the hot path of commit and probe); the flow
        takes over when it needs more (WAIT, or a script the server does not know)."""
        if self._direct or not write:
            try:
                return self._command(call.command())
            except self._no_script:
                pass  # it did not run: the flow loads the scripts and sends it again
            except self._errors as exc:
                raise translate(exc) from exc
            except (AttributeError, TypeError, RuntimeError) as exc:
                if not dropped_under_us(exc):
                    raise
                raise lost_connection(exc) from exc
        return self._drive(_one(self.settings, call, write=write))

    def _command(self, command: Command) -> object:
        # redis-py types its commands as "a value or an awaitable" for both clients;
        # the replies are checked where they are read. A Cluster client is made with
        # cluster_error_retry_attempts=0: it follows MOVED and ASK, never re-sends.
        client: Any = self.client
        if self.layout.cluster:
            revive(client, (self.settings.host, self.settings.port), "redis.cluster", self._known)
        return client.execute_command(*command)

    def _step(self, step: Step) -> object:
        client: Any = self.client  # see _command
        if isinstance(step, Send):
            if len(step.commands) == 1:
                try:
                    return [self._command(step.commands[0])]
                except self._response_error as exc:
                    return [exc]
            with client.pipeline(transaction=False) as pipe:
                for command in step.commands:
                    pipe.execute_command(*command)
                return pipe.execute(raise_on_error=False)
        if isinstance(step, Load):
            for script in SCRIPTS.values():
                client.script_load(script.text)  # a Cluster client loads on every primary
            return None
        if isinstance(step, Each):
            if not self.layout.cluster:
                return [[client.execute_command(*c) for c in step.commands]]
            return [
                [client.execute_command(*c, target_nodes=node) for c in step.commands]
                for node in client.get_primaries()
            ]
        nodes: list[Any] = client.get_primaries() if self.layout.cluster else [None]
        target = {} if nodes[step.state[0]] is None else {"target_nodes": nodes[step.state[0]]}
        cursor, keys = client.scan(
            step.state[1], match=step.match, count=_SCAN_COUNT, _type="zset", **target
        )
        return _next_scan(step.state, len(nodes), cursor, keys)

    def migrate(self) -> None:
        self._drive(migrate_flow(self.settings))

    def close(self) -> None:
        self.client.close()

    def declare_table(
        self, name: str, *, key: str = "id", version: str | None = "version", columns: Iterable[str]
    ) -> None:
        """Declare a guarded table and its columns, replacing an earlier declaration.

        ``store.table(name, columns=[...])`` declares too, adding to what is declared.
        """
        self._drive(declare_flow(self.settings, name, key, version, columns))

    def columns(self, target: Target, declare: frozenset[str] | None = None) -> frozenset[str]:
        return self._drive(table_columns_flow(self.settings, target, declare))

    def read(self, target: Target, key: str | int) -> Record | None:
        return self._drive(read_flow(self.settings, target, key))

    def probe(self, request: CommitRequest) -> CommitResult:
        call = judge_call(self.layout, request, "probe")
        return commit_result(request, self._script(call, write=False))

    def create(self, target: Target, key: str | int, state_json: str) -> Record:
        return self._drive(create_flow(self.settings, target, key, state_json))

    def delete(self, target: Target, key: str | int) -> bool:
        return self._drive(delete_flow(self.settings, target, key))

    def commit(self, request: CommitRequest) -> CommitResult:
        call = judge_call(self.layout, request, "commit")
        return commit_result(request, self._script(call, write=True))

    def commit_many(self, requests: Sequence[CommitRequest]) -> list[CommitResult]:
        return self._drive(commit_many_flow(self.settings, requests))

    def acquire(self, name: str, owner: str, ttl: float) -> LeaseAnswer:
        return self._drive(lease_flow(self.settings, "acquire", name, owner, _ttl_us(ttl)))

    def renew(self, name: str, token: int, ttl: float) -> LeaseAnswer:
        return self._drive(lease_flow(self.settings, "renew", name, str(token), _ttl_us(ttl)))

    def release(self, name: str, token: int) -> LeaseAnswer:
        return self._drive(lease_flow(self.settings, "release", name, str(token)))

    def lease_state(self, name: str) -> LeaseAnswer:
        return self._drive(lease_flow(self.settings, "lease_state", name, write=False))

    def prune(self, older_than: float) -> int:
        return self._drive(prune_flow(self.settings, older_than))

    def record_effect(self, row: NewEffect) -> Effect:
        return self._drive(record_effect_flow(self.settings, row))

    def mark_effect(
        self, idempotency_key: str, status: str | None, detail_json: str | None, reconcile: bool
    ) -> Effect | None:
        return self._drive(
            mark_effect_flow(self.settings, idempotency_key, status, detail_json, reconcile)
        )

    def settle_effects(self, scope: str, intent_id: str, outcome: str) -> list[Effect]:
        return self._drive(settle_effects_flow(self.settings, scope, intent_id, outcome))

    def list_effects(self, query: EffectQuery) -> list[Effect]:
        return self._drive(list_effects_flow(self.settings, query))

    def prune_effects(self, older_than: float) -> int:
        return self._drive(prune_effects_flow(self.settings, older_than))


class AsyncRedisBackend:
    """The asyncio Redis backend (``fencing.open_async("redis://...")``)."""

    scheme = "redis"

    def __init__(self, settings: Settings, client: AsyncClient) -> None:
        self.settings = settings
        self.layout = settings.layout
        self.client = client
        self._response_error = _driver().response
        self._no_script = _driver().no_script
        self._errors = _driver().errors
        self._direct = settings.wait is None
        self._known: dict[str, Any] = {}  # Cluster node addresses seen (see revive)

    async def _drive(self, flow: Flow[T]) -> T:
        try:
            return await adrive(flow, self._step)
        except self._errors as exc:
            raise translate(exc) from exc
        except (AttributeError, TypeError, RuntimeError) as exc:
            if not dropped_under_us(exc):
                raise
            raise lost_connection(exc) from exc

    async def _script(self, call: Call, *, write: bool) -> object:
        """See ``RedisBackend._script``."""
        if self._direct or not write:
            try:
                return await self._command(call.command())
            except self._no_script:
                pass  # it did not run: the flow loads the scripts and sends it again
            except self._errors as exc:
                raise translate(exc) from exc
            except (AttributeError, TypeError, RuntimeError) as exc:
                if not dropped_under_us(exc):
                    raise
                raise lost_connection(exc) from exc
        return await self._drive(_one(self.settings, call, write=write))

    async def _command(self, command: Command) -> object:
        client: Any = self.client  # see RedisBackend._command
        if not self.layout.cluster:
            return await client.execute_command(*command)
        # The asyncio Cluster client re-sends a command after a lost connection unless
        # it is told the node (its pipelines need cluster_error_retry_attempts=1 to run
        # at all): name the node of the command's first key; MOVED and ASK are followed.
        revive(
            client, (self.settings.host, self.settings.port), "redis.asyncio.cluster", self._known
        )
        await client.initialize()
        node = client.get_node_from_key(_first_key(command))
        return await client.execute_command(*command, target_nodes=node)

    async def _step(self, step: Step) -> object:
        client: Any = self.client  # see RedisBackend._command
        if self.layout.cluster:
            revive(
                client,
                (self.settings.host, self.settings.port),
                "redis.asyncio.cluster",
                self._known,
            )
        if isinstance(step, Send):
            if len(step.commands) == 1:
                try:
                    return [await self._command(step.commands[0])]
                except self._response_error as exc:
                    return [exc]
            async with client.pipeline(transaction=False) as pipe:
                for command in step.commands:
                    pipe.execute_command(*command)
                return await pipe.execute(raise_on_error=False)
        if isinstance(step, Load):
            for script in SCRIPTS.values():
                await client.script_load(script.text)  # on every primary of a Cluster
            return None
        if self.layout.cluster:
            await client.initialize()  # its node list is empty until then
        if isinstance(step, Each):
            if not self.layout.cluster:
                return [[await client.execute_command(*c) for c in step.commands]]
            return [
                [await client.execute_command(*c, target_nodes=node) for c in step.commands]
                for node in client.get_primaries()
            ]
        nodes: list[Any] = client.get_primaries() if self.layout.cluster else [None]
        target = {} if nodes[step.state[0]] is None else {"target_nodes": nodes[step.state[0]]}
        cursor, keys = await client.scan(
            step.state[1], match=step.match, count=_SCAN_COUNT, _type="zset", **target
        )
        return _next_scan(step.state, len(nodes), cursor, keys)

    async def migrate(self) -> None:
        await self._drive(migrate_flow(self.settings))

    async def close(self) -> None:
        await self.client.aclose()  # redis-py >= 5.0.1

    async def declare_table(
        self, name: str, *, key: str = "id", version: str | None = "version", columns: Iterable[str]
    ) -> None:
        """Declare a guarded table and its columns, replacing an earlier declaration.

        ``store.table(name, columns=[...])`` declares too, adding to what is declared.
        """
        await self._drive(declare_flow(self.settings, name, key, version, columns))

    async def columns(
        self, target: Target, declare: frozenset[str] | None = None
    ) -> frozenset[str]:
        return await self._drive(table_columns_flow(self.settings, target, declare))

    async def read(self, target: Target, key: str | int) -> Record | None:
        return await self._drive(read_flow(self.settings, target, key))

    async def probe(self, request: CommitRequest) -> CommitResult:
        call = judge_call(self.layout, request, "probe")
        return commit_result(request, await self._script(call, write=False))

    async def create(self, target: Target, key: str | int, state_json: str) -> Record:
        return await self._drive(create_flow(self.settings, target, key, state_json))

    async def delete(self, target: Target, key: str | int) -> bool:
        return await self._drive(delete_flow(self.settings, target, key))

    async def commit(self, request: CommitRequest) -> CommitResult:
        call = judge_call(self.layout, request, "commit")
        return commit_result(request, await self._script(call, write=True))

    async def commit_many(self, requests: Sequence[CommitRequest]) -> list[CommitResult]:
        return await self._drive(commit_many_flow(self.settings, requests))

    async def acquire(self, name: str, owner: str, ttl: float) -> LeaseAnswer:
        return await self._drive(lease_flow(self.settings, "acquire", name, owner, _ttl_us(ttl)))

    async def renew(self, name: str, token: int, ttl: float) -> LeaseAnswer:
        return await self._drive(lease_flow(self.settings, "renew", name, str(token), _ttl_us(ttl)))

    async def release(self, name: str, token: int) -> LeaseAnswer:
        return await self._drive(lease_flow(self.settings, "release", name, str(token)))

    async def lease_state(self, name: str) -> LeaseAnswer:
        return await self._drive(lease_flow(self.settings, "lease_state", name, write=False))

    async def prune(self, older_than: float) -> int:
        return await self._drive(prune_flow(self.settings, older_than))

    async def record_effect(self, row: NewEffect) -> Effect:
        return await self._drive(record_effect_flow(self.settings, row))

    async def mark_effect(
        self, idempotency_key: str, status: str | None, detail_json: str | None, reconcile: bool
    ) -> Effect | None:
        return await self._drive(
            mark_effect_flow(self.settings, idempotency_key, status, detail_json, reconcile)
        )

    async def settle_effects(self, scope: str, intent_id: str, outcome: str) -> list[Effect]:
        return await self._drive(settle_effects_flow(self.settings, scope, intent_id, outcome))

    async def list_effects(self, query: EffectQuery) -> list[Effect]:
        return await self._drive(list_effects_flow(self.settings, query))

    async def prune_effects(self, older_than: float) -> int:
        return await self._drive(prune_effects_flow(self.settings, older_than))


# -- opening --------------------------------------------------------------------------
def _no_retry() -> dict[str, Any]:
    """fencing never re-sends a command by itself: a lost reply is TransientStoreError."""
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    return {"retry": Retry(NoBackoff(), 0)}


def _checked(make: Callable[[], T]) -> T:
    try:
        return make()
    except TypeError as exc:
        raise ConfigurationError(f"redis: bad client option ({exc})") from exc
    except _driver().errors as exc:  # a Cluster client connects as it is made
        raise translate(exc) from exc


def open_backend(url: StoreURL, **options: Any) -> RedisBackend:
    """``redis://host:port/db?prefix=...`` (see the module docstring for the options)."""
    import redis
    import redis.cluster

    settings = parse_settings(url, options)
    kwargs = _client_options(settings, options)
    client: SyncClient
    if settings.layout.cluster:
        client = _checked(
            lambda: redis.cluster.RedisCluster(
                host=settings.host,
                port=settings.port,
                cluster_error_retry_attempts=0,  # follow MOVED/ASK, never re-send
                **kwargs,
            )
        )
        guard_cluster(client)
    else:
        client = _checked(
            lambda: redis.Redis(
                host=settings.host, port=settings.port, db=settings.db, **_no_retry(), **kwargs
            )
        )
        guard_pool(client.connection_pool)  # (no connection is made before the first command)
    return RedisBackend(settings, client)


async def open_async_backend(url: StoreURL, **options: Any) -> AsyncRedisBackend:
    """The asyncio twin of :func:`open_backend`, over ``redis.asyncio``."""
    import redis.asyncio
    import redis.asyncio.cluster

    settings = parse_settings(url, options)
    kwargs = _client_options(settings, options)
    client: AsyncClient
    if settings.layout.cluster:
        client = _checked(
            lambda: redis.asyncio.cluster.RedisCluster(
                host=settings.host,
                port=settings.port,
                # one attempt of a pipeline (0 would run none); single commands name
                # their node, which turns the retries off (AsyncRedisBackend._command)
                cluster_error_retry_attempts=1,
                **kwargs,
            )
        )
    else:
        client = _checked(
            lambda: redis.asyncio.Redis(
                host=settings.host, port=settings.port, db=settings.db, **_no_retry(), **kwargs
            )
        )
        pool = client.connection_pool
        pool.connection_class = guarded_async(pool.connection_class)
    return AsyncRedisBackend(settings, client)
