"""A catalogue of bad inputs: each gets its typed error, and the store is left unchanged.

Every case runs on every backend through the sync and the async API (``store``), compared
record by record before and after; on a SQLite file the whole database is compared as
a dump of every table, before and after each case.
"""

from __future__ import annotations

import datetime
import decimal
import math
import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import fencing
from fencing import (
    ConfigurationError,
    Drop,
    FencingError,
    Intent,
    InvalidIdentifier,
    InvalidInput,
    InvalidIntent,
    InvalidLeaseRequest,
    InvalidState,
    Recompute,
    Reconcile,
    SchemaError,
    Signer,
)
from fencing._rules import MAX_TTL
from fencing._validate import dump_state

from ._backends import CASES, TABLE_COLUMNS
from ._syncify import Loop, Syncified

NAN, INF = math.nan, math.inf


def _deep(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth):
        value = [value]
    return value


def _circular() -> dict[str, Any]:
    loop: list[Any] = []
    loop.append(loop)
    return {"loop": loop}


@dataclass
class Ctx:
    """A populated store and the handles the cases use."""

    store: Any
    orders: Any
    other: Any
    table: Any
    intent: Intent
    table_intent: Intent
    lease: Any
    foreign_lease: fencing.Lease
    signer: Signer
    decided: list[Any] = field(default_factory=list)

    def decider(self, value: Any) -> Callable[[Any], Any]:
        def decide(record: Any) -> Any:
            self.decided.append(record)
            return value

        return decide

    def decide(self, record: Any) -> Any:
        self.decided.append(record)
        return {"status": "decided"}


def populate(store: Any, create_table: Callable[..., Any]) -> Ctx:
    orders = store.collection("orders")
    first = orders.create("o-1", {"status": "new", "n": 1})
    assert orders.commit(first.intent("pack"), {"status": "packed", "n": 2}).committed
    orders.create("o-2", {"status": "new", "items": [1, {"a": None}]})
    other = store.collection("other")
    other.create("o-1", {"x": 1})
    table = create_table(
        "orders_t",
        [{"id": 1, "status": "packed", "total": 10, "note": "keep"}, {"id": 2, "status": "new"}],
    )
    lease = store.acquire("orders/o-1", owner="worker", ttl=600)
    foreign = fencing.open("memory://").acquire("orders/o-1", owner="elsewhere", ttl=600)
    return Ctx(
        store=store,
        orders=orders,
        other=other,
        table=table,
        intent=orders.intent("o-1", "ship"),
        table_intent=table.intent(1, "ship"),
        lease=lease,
        foreign_lease=foreign,
        signer=Signer(keys={"k1": b"0123456789abcdef0123"}, current="k1"),
    )


def snapshot(c: Ctx) -> dict[str, Any]:
    """Every record the cases could touch, as get() returns it."""
    return {
        "orders": {k: c.orders.get(k) for k in ("o-1", "o-2", "o-9")},
        "other": c.other.get("o-1"),
        "table": {k: c.table.get(k) for k in (1, 2)},
    }


def tampered(c: Ctx) -> str:
    kid, body, mac = c.signer.sign(c.intent).split(".")
    return f"{kid}.{body}.{mac[:-2]}{'AA' if mac[-2:] != 'AA' else 'BB'}"


@dataclass(frozen=True)
class Bad:
    name: str
    error: type[FencingError]
    call: Callable[[Ctx], object]
    decides: int = 0  # how many times the case's decide function runs before the error


def _state_cases() -> list[Bad]:
    states: list[tuple[str, Any]] = [
        ("str", "status=shipped"),
        ("list", ["status", "shipped"]),
        ("pairs", [("status", "shipped")]),
        ("none", None),
        ("int", 42),
        ("float", 1.5),
        ("bytes", b'{"status": "shipped"}'),
        ("set", {"status"}),
        ("json text", '{"status": "shipped"}'),
        ("nested set", {"s": {1, 2}}),
        ("frozenset", {"s": frozenset()}),
        ("bytes value", {"b": b"x"}),
        ("bytearray value", {"b": bytearray(b"x")}),
        ("object value", {"o": object()}),
        ("date value", {"d": datetime.date(2024, 1, 1)}),
        ("decimal value", {"d": decimal.Decimal("1.5")}),
        ("complex value", {"c": 1j}),
        ("nan", {"f": NAN}),
        ("inf", {"f": INF}),
        ("-inf", {"f": -INF}),
        ("nested nan", {"n": {"deep": [1, NAN]}}),
        ("int key", {1: "a"}),
        ("none key", {None: 1}),
        ("bool key", {True: 1}),
        ("float key", {1.5: 1}),
        ("tuple key", {(1, 2): "x"}),
        ("nested int key", {"n": {1: "a"}}),
        ("int key in list", {"l": [{2: "b"}]}),
        ("lone surrogate value", {"s": "\ud800"}),
        ("lone surrogate key", {"\udc00": 1}),
        ("too deep", {"d": _deep(100_000)}),
        ("circular", _circular()),
        ("oversize", {"s": "x" * (1 << 20)}),
        ("oversize multibyte", {"s": "é" * (1 << 19)}),
    ]
    cases: list[Bad] = []
    for label, state in states:
        cases += [
            Bad(f"commit {label}", InvalidState, lambda c, s=state: c.orders.commit(c.intent, s)),
            Bad(f"create {label}", InvalidState, lambda c, s=state: c.orders.create("o-9", s)),
            Bad(
                f"decide returns {label}",
                InvalidState,
                lambda c, s=state: c.orders.apply(c.intent, c.decider(s)),
                decides=1,
            ),
            Bad(
                f"batch with {label}",
                InvalidState,
                lambda c, s=state: c.orders.commit_many(
                    [(c.intent, {"status": "ok"}), (c.orders.intent("o-2", "x"), s)]
                ),
            ),
        ]
        if label not in COLUMN_TYPES:  # a column takes these (tests/test_column_types.py)
            cases.append(
                Bad(
                    f"table commit {label}",
                    InvalidState,
                    lambda c, s=state: c.table.commit(c.table_intent, s),
                )
            )
    return cases


COLUMN_TYPES = {"bytes value", "bytearray value", "date value", "decimal value"}


def _table_cases() -> list[Bad]:
    def commit(state: dict[str, Any]) -> Callable[[Ctx], object]:
        return lambda c: c.table.commit(c.table_intent, state)

    return [
        Bad("table sets version", InvalidState, commit({"version": 5})),
        Bad("table sets key", InvalidState, commit({"id": 9})),
        Bad("table sets key and more", InvalidState, commit({"status": "x", "id": 9})),
        Bad("table sets version and more", InvalidState, commit({"status": "x", "version": 1})),
        Bad("table sets nothing", InvalidState, commit({})),
        Bad("table list value", InvalidState, commit({"status": [1]})),
        Bad("table dict value", InvalidState, commit({"status": {"a": 1}})),
        Bad("table nan value", InvalidState, commit({"total": NAN})),
        Bad("table unknown column", SchemaError, commit({"nope": 1})),
        Bad("table unknown and known", SchemaError, commit({"status": "x", "nope": 1})),
        Bad("table unsafe column", InvalidIdentifier, commit({"status x": 1})),
        Bad(
            "table injected column",
            InvalidIdentifier,
            commit({"status = 'x'; DROP TABLE orders_t; --": 1}),
        ),
        Bad("missing table get", SchemaError, lambda c: c.store.table("no_such_table").get(1)),
        Bad(
            "missing table intent",
            SchemaError,
            lambda c: c.store.table("no_such_table").intent(1, "x"),
        ),
        Bad(
            "missing table commit",
            SchemaError,
            lambda c: c.store.table("no_such_table").commit(
                Intent.new("no_such_table", 1, 1, "x", kind="table"), {"status": "x"}
            ),
        ),
        Bad(
            "missing key column",
            SchemaError,
            lambda c: c.store.table("orders_t", key="nope").get(1),
        ),
        Bad(
            "missing version column",
            SchemaError,
            lambda c: c.store.table("orders_t", version="nope").get(1),
        ),
        Bad(
            "missing version column commit",
            SchemaError,
            lambda c: c.store.table("orders_t", version="nope").commit(
                c.table_intent, {"status": "x"}
            ),
        ),
    ]


UNSAFE_NAMES: list[object] = [
    "",
    "x" * 129,
    "a b",
    " orders",
    "orders ",
    "o'rders",
    'o"rders',
    "orders;",
    "orders; DROP TABLE x",
    "orders'; DROP TABLE fencing_records; --",
    "or\nders",
    "or\x00ders",
    "ördérs",
    "заказы",
    "-orders",
    "/orders",
    ".orders",
    "orders*",
    "orders%",
    None,
    42,
    b"orders",
    ["orders"],
]

UNSAFE_COLUMNS: list[object] = [
    *UNSAFE_NAMES,
    "orders--",
    "x" * 64,
    "1abc",
    "a-b",
    "a.b",
    "a/b",
    "a:b",
]


def _identifier_cases() -> list[Bad]:
    cases: list[Bad] = []
    for name in UNSAFE_NAMES:
        cases += [
            Bad(f"collection {name!r}", InvalidIdentifier, lambda c, n=name: c.store.collection(n)),
            Bad(
                f"acquire {name!r}",
                InvalidIdentifier,
                lambda c, n=name: c.store.acquire(n, owner="w", ttl=5),
            ),
            Bad(
                f"try_acquire {name!r}",
                InvalidIdentifier,
                lambda c, n=name: c.store.try_acquire(n, owner="w", ttl=5),
            ),
            Bad(
                f"lease {name!r}",
                InvalidIdentifier,
                lambda c, n=name: c.store.lease(n, owner="w", ttl=5),
            ),
            Bad(
                f"transition {name!r}",
                InvalidIdentifier,
                lambda c, n=name: c.orders.intent("o-1", n),
            ),
        ]
    qualified_bad = ["a.b.c", ".orders", "shop.", "shop.fencing_records", "1x.orders"]
    table_names = [n for n in UNSAFE_COLUMNS if n != "a.b"]  # schema.table is a table name
    extra = [n for n in qualified_bad if n not in table_names]
    for name in [*table_names, *extra, "fencing_records", "FENCING_leases", "fencing_x"]:
        cases.append(Bad(f"table {name!r}", InvalidIdentifier, lambda c, n=name: c.store.table(n)))
    for name in UNSAFE_COLUMNS:
        cases.append(
            Bad(
                f"key column {name!r}",
                InvalidIdentifier,
                lambda c, n=name: c.store.table("orders_t", key=n),
            )
        )
        if name is not None:  # version=None: a table without a version column
            cases.append(
                Bad(
                    f"version column {name!r}",
                    InvalidIdentifier,
                    lambda c, n=name: c.store.table("orders_t", version=n),
                )
            )
    bad_keys: list[object] = [
        True,
        False,
        1.5,
        None,
        "",
        "x" * 513,
        "a\x00b",
        "\ud800",
        ["o-1"],
        ("o-1",),
        b"o-1",
    ]
    for key in [*bad_keys, 1, -1, 0]:  # a collection's keys are strings
        cases += [
            Bad(f"get key {key!r:.20}", InvalidIdentifier, lambda c, k=key: c.orders.get(k)),
            Bad(
                f"create key {key!r:.20}",
                InvalidIdentifier,
                lambda c, k=key: c.orders.create(k, {"a": 1}),
            ),
            Bad(f"delete key {key!r:.20}", InvalidIdentifier, lambda c, k=key: c.orders.delete(k)),
            Bad(
                f"intent key {key!r:.20}",
                InvalidIdentifier,
                lambda c, k=key: c.orders.intent(k, "x"),
            ),
        ]
    for key in [*bad_keys, 2**63, -(2**63) - 1]:
        cases.append(
            Bad(f"table key {key!r:.20}", InvalidIdentifier, lambda c, k=key: c.table.get(k))
        )
    return cases


def _intent_cases() -> list[Bad]:
    def commit_to_orders(make: Callable[[Ctx], Any]) -> Callable[[Ctx], object]:
        return lambda c: c.orders.commit(make(c), {"status": "x"})

    return [
        Bad("intent is a string", InvalidIntent, commit_to_orders(lambda c: "o-1")),
        Bad("intent is its json", InvalidIntent, commit_to_orders(lambda c: c.intent.to_json())),
        Bad("intent is its dict", InvalidIntent, commit_to_orders(lambda c: c.intent.to_dict())),
        Bad("intent is None", InvalidIntent, commit_to_orders(lambda c: None)),
        Bad("intent is a record", InvalidIntent, commit_to_orders(lambda c: c.orders.get("o-1"))),
        Bad(
            "intent for another collection",
            InvalidIntent,
            lambda c: c.other.commit(c.intent, {"x": 2}),
        ),
        Bad(
            "intent for a collection that does not exist",
            InvalidIntent,
            lambda c: c.store.collection("nobody").commit(c.intent, {"x": 2}),
        ),
        Bad(
            "collection intent to a table",
            InvalidIntent,
            lambda c: c.table.commit(c.intent, {"status": "x"}),
        ),
        Bad(
            "table intent to a collection",
            InvalidIntent,
            commit_to_orders(lambda c: c.table_intent),
        ),
        Bad(
            "table-kind intent named like the collection",
            InvalidIntent,
            commit_to_orders(lambda c: Intent.new("orders", "o-1", 2, "x", kind="table")),
        ),
        Bad(
            "collection-kind intent named like the table",
            InvalidIntent,
            lambda c: c.table.commit(Intent.new("orders_t", "1", 1, "x"), {"status": "x"}),
        ),
        Bad(
            "integer key for a collection",
            InvalidIntent,
            commit_to_orders(lambda c: Intent.new("orders", 1, 1, "x")),
        ),
        Bad(
            "versioned table without expected version",
            InvalidIntent,
            lambda c: c.table.commit(
                Intent.new("orders_t", 1, None, "x", guard={"status": "packed"}, kind="table"),
                {"status": "x"},
            ),
        ),
        Bad(
            "apply with a foreign intent",
            InvalidIntent,
            lambda c: c.other.apply(c.intent, c.decide),
        ),
        Bad(
            "apply with a non-intent",
            InvalidIntent,
            lambda c: c.orders.apply(c.intent.to_json(), c.decide),
        ),
        Bad(
            "batch holding one intent twice",
            InvalidIntent,
            lambda c: c.orders.commit_many([(c.intent, {"a": 1}), (c.intent, {"a": 2})]),
        ),
        Bad(
            "batch holding a foreign intent",
            InvalidIntent,
            lambda c: c.orders.commit_many(
                [(c.intent, {"a": 1}), (c.other.intent("o-1", "x"), {"a": 2})]
            ),
        ),
        Bad("tampered signed intent", InvalidIntent, lambda c: c.signer.verify(tampered(c))),
        Bad(
            "commit of a tampered signed intent",
            InvalidIntent,
            lambda c: c.orders.commit(c.signer.verify(tampered(c)), {"a": 1}),
        ),
        Bad("truncated intent", InvalidIntent, lambda c: Intent.from_json(c.intent.to_json()[:-1])),
        Bad(
            "guard with an unsafe field",
            InvalidIntent,
            lambda c: c.orders.intent("o-1", "x", guard={"status; --": "packed"}),
        ),
        Bad(
            "guard with a nested value",
            InvalidIntent,
            lambda c: c.orders.intent("o-1", "x", guard={"status": ["packed"]}),
        ),
        Bad(
            "table guard beyond 64 bits",
            InvalidIntent,
            lambda c: c.table.intent(1, "x", guard={"total": 2**70}),
        ),
        Bad(
            "lease that is a string",
            InvalidInput,
            lambda c: c.orders.commit(c.intent, {"a": 1}, lease="orders/o-1"),
        ),
        Bad(
            "lease that is a token",
            InvalidInput,
            lambda c: c.orders.commit(c.intent, {"a": 1}, lease=c.lease.token),
        ),
        Bad(
            "lease from another store",
            InvalidInput,
            lambda c: c.orders.commit(c.intent, {"a": 1}, lease=c.foreign_lease),
        ),
        Bad(
            "apply under a lease from another store",
            InvalidInput,
            lambda c: c.orders.apply(c.intent, c.decide, lease=c.foreign_lease),
        ),
    ]


BAD_TTLS: list[object] = [
    0,
    0.0,
    -1,
    -0.5,
    0.0001,
    NAN,
    INF,
    -INF,
    MAX_TTL * 2,
    1e18,
    True,
    False,
    "5",
    None,
    [5],
]
BAD_OWNERS: list[object] = ["", None, 5, "x" * 201, b"worker", ["w"]]
BAD_WAITS: list[object] = [-1, -0.001, NAN, INF, -INF, True, "1", [1]]


def _lease_cases() -> list[Bad]:
    cases: list[Bad] = []
    for ttl in BAD_TTLS:
        cases += [
            Bad(
                f"acquire ttl {ttl!r}",
                InvalidLeaseRequest,
                lambda c, t=ttl: c.store.acquire("jobs/x", owner="w", ttl=t),
            ),
            Bad(
                f"try_acquire ttl {ttl!r}",
                InvalidLeaseRequest,
                lambda c, t=ttl: c.store.try_acquire("jobs/x", owner="w", ttl=t),
            ),
            Bad(
                f"lease ttl {ttl!r}",
                InvalidLeaseRequest,
                lambda c, t=ttl: c.store.lease("jobs/x", owner="w", ttl=t),
            ),
        ]
        if ttl is not None:  # None means "the lease's own TTL" here
            cases += [
                Bad(f"renew ttl {ttl!r}", InvalidLeaseRequest, lambda c, t=ttl: c.lease.renew(t)),
                Bad(
                    f"heartbeat interval {ttl!r}",
                    InvalidLeaseRequest,
                    lambda c, t=ttl: c.lease.start_heartbeat(interval=t),
                ),
            ]
    for owner in BAD_OWNERS:
        cases += [
            Bad(
                f"acquire owner {owner!r:.20}",
                InvalidLeaseRequest,
                lambda c, o=owner: c.store.acquire("jobs/x", owner=o, ttl=5),
            ),
            Bad(
                f"try_acquire owner {owner!r:.20}",
                InvalidLeaseRequest,
                lambda c, o=owner: c.store.try_acquire("jobs/x", owner=o, ttl=5),
            ),
            Bad(
                f"lease owner {owner!r:.20}",
                InvalidLeaseRequest,
                lambda c, o=owner: c.store.lease("jobs/x", owner=o, ttl=5),
            ),
        ]
    for wait in BAD_WAITS:
        cases += [
            Bad(
                f"acquire wait {wait!r}",
                InvalidLeaseRequest,
                lambda c, w=wait: c.store.acquire("jobs/x", owner="w", ttl=5, wait=w),
            ),
            Bad(
                f"lease wait {wait!r}",
                InvalidLeaseRequest,
                lambda c, w=wait: c.store.lease("jobs/x", owner="w", ttl=5, wait=w),
            ),
        ]
    return cases


def _policy_cases() -> list[Bad]:
    def apply_with(policy: Callable[[], Any]) -> Callable[[Ctx], object]:
        return lambda c: c.orders.apply(c.intent, c.decide, on_stale=policy())

    return [
        Bad("on_stale a string", InvalidInput, apply_with(lambda: "drop")),
        Bad("on_stale the Drop class", InvalidInput, apply_with(lambda: Drop)),
        Bad("on_stale the Recompute class", InvalidInput, apply_with(lambda: Recompute)),
        Bad("on_stale a number", InvalidInput, apply_with(lambda: 3)),
        Bad("on_stale a dict", InvalidInput, apply_with(lambda: {"attempts": 3})),
        Bad("Recompute(attempts=0)", InvalidInput, apply_with(lambda: Recompute(attempts=0))),
        Bad("Recompute(attempts=-1)", InvalidInput, apply_with(lambda: Recompute(attempts=-1))),
        Bad("Recompute(attempts=True)", InvalidInput, apply_with(lambda: Recompute(attempts=True))),
        Bad("Recompute(backoff=nan)", InvalidInput, apply_with(lambda: Recompute(backoff=NAN))),
        Bad("Recompute(backoff=True)", InvalidInput, apply_with(lambda: Recompute(backoff=True))),
        Bad(
            "Recompute(max_backoff=False)",
            InvalidInput,
            apply_with(lambda: Recompute(max_backoff=False)),
        ),
        Bad("Reconcile(None)", InvalidInput, apply_with(lambda: Reconcile(None))),  # type: ignore[arg-type]
    ]


CATALOGUE: list[Bad] = [
    *_state_cases(),
    *_table_cases(),
    *_identifier_cases(),
    *_intent_cases(),
    *_lease_cases(),
    *_policy_cases(),
]


def test_catalogue_names_are_unique() -> None:
    names = [case.name for case in CATALOGUE]
    assert len(names) == len(set(names))
    assert len(CATALOGUE) > 400


def run_catalogue(c: Ctx, fingerprint: Callable[[], object]) -> None:
    """Run every case; each must raise its error and leave ``fingerprint()`` unchanged."""
    failures: list[str] = []
    before = fingerprint()
    for case in CATALOGUE:
        decided = len(c.decided)
        try:
            case.call(c)
        except case.error:
            pass
        except Exception as exc:
            failures.append(f"{case.name}: raised {type(exc).__name__}: {exc!s:.200}")
        else:
            failures.append(f"{case.name}: raised nothing, expected {case.error.__name__}")
        if len(c.decided) - decided != case.decides:
            failures.append(f"{case.name}: decide ran {len(c.decided) - decided} times")
        after = fingerprint()
        if after != before:
            failures.append(f"{case.name}: changed the store")
            before = after
    assert not failures, "\n".join(failures)


def check_nothing_was_claimed(c: Ctx) -> None:
    """The intents the cases used were never recorded as applied, and leases are intact."""
    out = c.orders.commit(c.intent, {"status": "shipped"}, lease=c.lease)
    assert isinstance(out, fencing.Committed), out
    assert out.record.version == 3 and out.record.fence == c.lease.token
    assert c.table.commit(c.table_intent, {"status": "shipped"}).committed
    assert c.orders.commit(c.orders.intent("o-2", "x"), {"status": "ok"}).committed
    assert not c.lease.lost
    assert c.store.try_acquire("orders/o-1", owner="other", ttl=5) is None
    fresh = c.store.acquire("jobs/x", owner="w", ttl=5)  # no bad request created this lease
    assert fresh.token == 1
    fresh.release()
    c.lease.release()


def test_bad_input_leaves_every_backend_unchanged(store: Any, make_table: Any) -> None:
    c = populate(store, lambda name, rows: make_table(name, rows))
    run_catalogue(c, lambda: snapshot(c))
    check_nothing_was_claimed(c)


# -- the same catalogue on a SQLite file, compared as a dump of every table -------------------
@pytest.fixture(params=["sync", "async"])
def sqlite_file(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Any, Path]]:
    path = tmp_path / "bad-input.sqlite"
    url = f"sqlite:///{path}"
    if request.param == "sync":
        s = fencing.open(url)
        yield s, path
        s.close()
        return
    loop = Loop()
    a = Syncified(loop.run(fencing.open_async(url)), loop)
    yield a, path
    a.close()
    loop.close()


def dump(path: Path) -> list[str]:
    conn = sqlite3.connect(path)
    try:
        return list(conn.iterdump())
    finally:
        conn.close()


def test_bad_input_leaves_sqlite_file_byte_for_byte(sqlite_file: tuple[Any, Path]) -> None:
    store, path = sqlite_file
    target = store.unwrapped if isinstance(store, Syncified) else store
    create = CASES["sqlite-file"].create_table
    assert create is not None

    def make(name: str, rows: list[dict[str, Any]]) -> Any:
        create(target, name, "id", "version", TABLE_COLUMNS, rows)
        return store.table(name)

    c = populate(store, make)
    baseline = dump(path)
    assert any("fencing_records" in line for line in baseline)
    assert any("orders_t" in line for line in baseline)
    run_catalogue(c, lambda: dump(path))
    assert dump(path) == baseline
    check_nothing_was_claimed(c)


def test_sqlite_file_without_schema_is_a_schema_error(tmp_path: Path) -> None:
    path = tmp_path / "empty.sqlite"
    store = fencing.open(f"sqlite:///{path}", migrate=False)
    try:
        before = dump(path)
        orders = store.collection("orders")
        with pytest.raises(SchemaError):
            orders.get("o-1")
        with pytest.raises(SchemaError):
            orders.create("o-1", {"a": 1})
        with pytest.raises(SchemaError):
            store.acquire("jobs/x", owner="w", ttl=5)
        assert dump(path) == before
    finally:
        store.close()


# -- state size limits ---------------------------------------------------------------------
@pytest.fixture
def small_store(store_url: str, api: str) -> Iterator[Any]:
    """A store on each backend that accepts at most 100 bytes of state JSON."""
    if api == "sync":
        s = fencing.open(store_url, max_state_bytes=100)
        yield s
        s.close()
        return
    loop = Loop()
    a = Syncified(loop.run(fencing.open_async(store_url, max_state_bytes=100)), loop)
    yield a
    a.close()
    loop.close()


def test_max_state_bytes_is_exact(small_store: Any) -> None:
    orders = small_store.collection("sized")
    fits = {"s": "x" * 92}  # {"s":"x...x"} is 100 bytes
    assert len(dump_state(fits)) == 100
    rec = orders.create("k", fits)
    with pytest.raises(InvalidState, match="above 100"):
        orders.create("k2", {"s": "x" * 93})
    with pytest.raises(InvalidState, match="above 100"):
        orders.commit(rec.intent("grow"), {"s": "x" * 93})
    with pytest.raises(InvalidState, match="above 100"):
        orders.commit(rec.intent("grow"), {"s": "é" * 47})  # 94 bytes of UTF-8 in 47 chars
    with pytest.raises(InvalidState):
        orders.apply(rec.intent("grow"), lambda r: {"s": "x" * 200})
    assert orders.get("k2") is None
    assert orders.get("k") == rec
    out = orders.commit(rec.intent("fit"), {"s": "é" * 46})  # exactly 100 bytes
    assert out.committed and out.record.version == 2


@pytest.mark.parametrize(
    "options",
    [
        {"max_state_bytes": 0},
        {"max_state_bytes": 1},
        {"max_state_bytes": -5},
        {"max_state_bytes": True},
        {"max_state_bytes": 1.5},
        {"max_state_bytes": "100"},
        {"max_state_bytes": (64 << 20) + 1},
        {"retention": 0},
        {"retention": -1},
        {"retention": NAN},
        {"retention": "30d"},
    ],
    ids=repr,
)
def test_bad_store_options_are_refused(options: dict[str, Any], tmp_path: Path) -> None:
    path = tmp_path / "opts.sqlite"
    with pytest.raises(InvalidInput):
        fencing.open(f"sqlite:///{path}", **options)
    with pytest.raises(InvalidInput):
        fencing.open("memory://", **options)
    assert not path.exists()  # refused before the file was created


# -- URLs and backend options --------------------------------------------------------------
BAD_URLS: list[object] = [
    "nosuch://x",
    "http://example.com/db",
    "file:///tmp/x.db",
    "SQLITE3:///x.db",
    "",
    "memory",
    "sqlite",
    "sqlite:",
    "sqlite://",
    "sqlite:///",
    "sqlite://?synchronous=full",
    "://x",
    "sqlite:///x.db?synchronous=bogus",
    "sqlite:///x.db?synchronous=off",
    "sqlite:///x.db?synchronous=",
    "sqlite:///x.db?synchronous",
    "sqlite:///x.db?busy_timeout=abc",
    "sqlite:///x.db?bogus=1",
    "sqlite:///x.db?synchronous=full&bogus=1",
    "sqlite:///x.db?a=1&&",
    "sqlite://:memory:?synchronous=bogus",
    "postgresql://localhost:notaport/db",
    "redis://localhost:99999/0",
    None,
    42,
    b"memory://",
]


@pytest.mark.parametrize("url", BAD_URLS, ids=repr)
def test_bad_url_is_a_configuration_error(
    url: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigurationError):
        fencing.open(url)
    loop = Loop()
    try:
        with pytest.raises(ConfigurationError):
            loop.run(fencing.open_async(url))
    finally:
        loop.close()
    assert list(tmp_path.iterdir()) == []  # no database file was created


@pytest.mark.parametrize(
    "options",
    [
        {"synchronous": "bogus"},
        {"synchronous": ""},
        {"busy_timeout": "abc"},
        {"bogus": 1},
        {"journal_mode": "delete"},
    ],
    ids=repr,
)
def test_bad_sqlite_options_are_configuration_errors(
    options: dict[str, Any], tmp_path: Path
) -> None:
    path = tmp_path / "x.sqlite"
    with pytest.raises(ConfigurationError):
        fencing.open(f"sqlite:///{path}", **options)
    with pytest.raises(ConfigurationError):
        fencing.open("sqlite://:memory:", **options)
    assert not path.exists()


@pytest.mark.parametrize("value", ["nan", "inf", "-5"])
def test_sqlite_busy_timeout_must_be_a_sane_number(value: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError):
        fencing.open(f"sqlite:///{tmp_path / 'x.sqlite'}?busy_timeout={value}")


@pytest.mark.parametrize("how", ["keyword", "query"])
def test_memory_unknown_options_are_configuration_errors(how: str) -> None:
    url, options = ("memory://", {"bogus": 1}) if how == "keyword" else ("memory://?bogus=1", {})
    with pytest.raises(ConfigurationError):
        fencing.open(url, **options)


def test_table_value_beyond_64_bits_is_invalid_state(make_table: Any) -> None:
    table = make_table(rows=[{"id": 1, "status": "a", "total": 1}])
    with pytest.raises(InvalidState):
        table.commit(table.intent(1, "x"), {"total": 2**70})


def test_lease_owner_with_a_lone_surrogate(store: Any) -> None:
    with pytest.raises(InvalidLeaseRequest):
        store.acquire("jobs/x", owner="w\ud800", ttl=5)
