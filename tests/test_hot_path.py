"""What the commit path's shortcuts must keep true: the JSON written, the errors raised,
and the values made without their dataclass's generated ``__init__``.

``dump_state`` and ``compact_json`` encode through one C encoder made once (no
circular-reference markers) and judge every failure again on the checked path;
``Record``, ``Committed``, ``CommitRequest`` and SQLite's ``Txn`` set their slots
through ``slot_setters``; ``Target.scope`` is made once; a lease keeps its ``LeaseRef``;
SQLite runs a commit's one step without driving its flow. Each test here fails when
its shortcut gives another answer than the long way.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import pickle
import sqlite3
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest

import fencing
from fencing import Committed, Intent, InvalidState, Record
from fencing._flow import drive
from fencing._request import CommitRequest, Target
from fencing._rules import LeaseRef, Status
from fencing._validate import compact_json, dump_state
from fencing._values import FrozenState, slot_setters
from fencing.backends.sqlite.steps import Txn


def _reference(value: object) -> str:
    """The JSON a state is written as, by the standard library's own call."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


STATES: list[dict[str, Any]] = [
    {},
    {"status": "shipped", "n": 1},
    {"b": 1, "a": 2, "c": {"z": 1, "y": [3, 2, 1]}},  # written in the order given
    {"text": "é ü 中文 🚚", "quote": '"\\/', "ctl": "\x00\x01\n\t\u2028\u2029"},
    {"floats": [0.1, -0.0, 1e16, 1e-7, 1.5e300, 2.0, 123456789.125]},
    {"ints": [0, -1, 2**63 - 1, -(2**63), 10**30], "bools": [True, False], "none": None},
    {"deep": {"a": {"b": {"c": {"d": [[[{"e": []}]]]}}}}, "empty": {"": ""}},
    {"shared": [1, 2], "again": [1, 2]},
]


@pytest.mark.parametrize("state", STATES, ids=range(len(STATES)))
def test_dump_state_writes_the_bytes_json_dumps_writes(state: dict[str, Any]) -> None:
    assert dump_state(state) == _reference(state)
    assert compact_json(state) == _reference(state)
    assert dump_state(state).encode() == _reference(state).encode()


def test_one_object_twice_in_a_state_is_not_a_cycle_even_after_a_refused_cycle() -> None:
    shared: list[Any] = [1, {"x": 2}]
    state = {"a": shared, "b": shared, "c": {"d": shared}}
    loop: list[Any] = []
    loop.append(loop)
    for _ in range(3):
        with pytest.raises(InvalidState, match="Circular reference detected"):
            dump_state({"loop": loop, "shared": shared})
        assert dump_state(state) == _reference(state)


def _nan() -> dict[str, Any]:
    return {"a": [1, {"b": math.nan}]}


def _cycle() -> dict[str, Any]:
    inner: dict[str, Any] = {}
    inner["self"] = inner
    return {"ok": 1, "inner": inner}


def _deep(depth: int) -> dict[str, Any]:
    value: list[Any] = []
    for _ in range(depth):
        value = [value]
    return {"d": value}


class _Plain(Mapping[str, Any]):
    """A mapping that is not a dict."""

    def __init__(self, data: dict[str, Any]) -> None:
        self._data = data

    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)


REFUSED: list[tuple[object, str]] = [
    ({"a": math.nan}, "state is not JSON: Out of range float values are not JSON compliant"),
    ({"a": -math.inf}, "state is not JSON: Out of range float values are not JSON compliant"),
    (_nan(), "state is not JSON: Out of range float values are not JSON compliant"),
    ({1: "x"}, "state keys must be strings, not 1"),
    ({"ok": 1, None: "x"}, "state keys must be strings, not None"),
    ({"a": {1: "x"}}, "state keys must be strings, not 1"),
    ({"a": [{"b": {True: 1}}]}, "state keys must be strings, not True"),
    ({"a": {(1, 2): "x"}}, "state is not JSON: keys must be str, int, float, bool or None,"),
    ({"a": (1, 2)}, "state holds a tuple (1, 2): use a list"),
    ({"a": [1, (2,)]}, "state holds a tuple (2,): use a list"),
    ({"a": {1, 2}}, "field 'a' holds {1, 2} of type set, which JSON cannot hold"),
    ({"a": [0, {"b": b"x"}]}, "field 'a[1].b' holds b'x' of type bytes, which JSON cannot"),
    ({"s": "\ud800"}, "state holds a lone surrogate"),
    (_cycle(), "state is not JSON: Circular reference detected"),
    (_deep(100_000), "state is nested too deeply"),
    ([1, 2], "state must be a JSON object (a dict), not list"),
    ("{}", "state must be a JSON object (a dict), not str"),
    (None, "state must be a JSON object (a dict), not NoneType"),
    (_Plain({"a": math.inf}), "state is not JSON: Out of range float values"),
    (OrderedDict([(1, 2)]), "state keys must be strings, not 1"),
    ({"s": "x" * 200}, "state is 208 bytes of JSON, above 100"),
    ({"s": "é" * 60}, "state is 128 bytes of JSON, above 100"),
]


@pytest.mark.parametrize(("state", "message"), REFUSED, ids=range(len(REFUSED)))
def test_dump_state_refuses_with_the_same_typed_error(state: object, message: str) -> None:
    with pytest.raises(InvalidState) as caught:
        dump_state(state, 100)
    assert str(caught.value).startswith(message)
    assert type(caught.value) is InvalidState


def test_dump_state_takes_other_mappings_as_before() -> None:
    for state in ({"b": 1, "a": [1.5]}, {"é": {"x": None}}):
        for given in (
            _Plain(state),
            MappingProxyType(state),
            OrderedDict(state),
            FrozenState(state),
        ):
            assert dump_state(given) == _reference(state)


def test_dump_state_refuses_what_it_refused_after_writing_it_fine() -> None:
    # the C encoder keeps nothing from one call to the next: a refusal leaves none behind
    good = {"a": [1, 2], "b": {"c": "d"}}
    for bad, _message in REFUSED[:14]:
        with pytest.raises(InvalidState):
            dump_state(bad)
        assert dump_state(good) == _reference(good)


# -- values made through slot_setters ----------------------------------------------------


def _intent(**changes: Any) -> Intent:
    fields: dict[str, Any] = {
        "id": "i-1",
        "collection": "orders",
        "key": "o-1",
        "expected_version": 3,
        "transition": "ship",
    }
    return Intent(**{**fields, **changes})


def test_slot_setters_follow_the_fields() -> None:
    for cls in (Record, Committed, CommitRequest, Txn):
        names = [f.name for f in dataclasses.fields(cls)]
        setters = slot_setters(cls)
        assert len(setters) == len(names)
        obj = object.__new__(cls)
        for i, setter in enumerate(setters):
            setter(obj, ("value", i))
        assert [getattr(obj, name) for name in names] == [("value", i) for i in range(len(names))]


def test_a_record_is_what_its_dataclass_made() -> None:
    state = {"status": "new", "n": [1]}
    rec = Record("orders", "o-1", 4, 2, state, "table")
    assert (rec.collection, rec.key, rec.version, rec.fence, rec.kind) == (
        "orders",
        "o-1",
        4,
        2,
        "table",
    )
    assert type(rec.state) is FrozenState and rec.state == state and rec.state is not state
    assert repr(rec) == (
        "Record(collection='orders', key='o-1', version=4, fence=2,"
        " state={'status': 'new', 'n': [1]}, kind='table')"
    )
    same = Record(collection="orders", key="o-1", version=4, fence=2, state=state, kind="table")
    assert rec == same and hash(rec) == hash(same)
    assert rec != dataclasses.replace(rec, version=5)
    assert Record("orders", "o-1", 4, 2, state).kind == "collection"
    for name in ("collection", "key", "version", "fence", "state", "kind"):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(rec, name, 1)
        with pytest.raises(dataclasses.FrozenInstanceError):
            delattr(rec, name)
    assert pickle.loads(pickle.dumps(rec)) == rec
    assert copy.copy(rec) == rec and copy.deepcopy(rec) == rec


def test_committed_is_what_its_dataclass_made() -> None:
    rec = Record("orders", "o-1", 4, 0, {"a": 1})
    intent = _intent()
    done = Committed(rec, intent)
    assert done.record is rec and done.intent is intent and done.current is rec
    assert done.committed and done.kind == "committed"
    assert Committed(rec).intent is None
    assert Committed(record=rec, intent=intent) == done == Committed(rec)  # intent not compared
    assert hash(done) == hash(Committed(rec))
    assert repr(done).startswith("Committed(record=Record(collection='orders'")
    assert ", intent=Intent(id='i-1'" in repr(done)
    with pytest.raises(dataclasses.FrozenInstanceError):
        done.record = rec  # type: ignore[misc]
    assert pickle.loads(pickle.dumps(done)) == done
    match done:
        case Committed(record):
            assert record is rec
        case _:  # pragma: no cover
            pytest.fail("Committed did not match")


def test_a_commit_request_is_what_its_dataclass_made() -> None:
    target = Target("table", "orders", "id", "version")
    intent = _intent(collection="orders", kind="table", key=7)
    lease = LeaseRef("orders/7", 3)
    request = CommitRequest(target, intent, {"status": "b"}, None, lease, (("at", "now()"),))
    assert (request.target, request.intent, request.state, request.json_text) == (
        target,
        intent,
        {"status": "b"},
        None,
    )
    assert request.lease is lease and request.sql_values == (("at", "now()"),)
    plain = CommitRequest(target, intent, {}, "{}")
    assert plain.lease is None and plain.sql_values == ()
    assert request.state_json == '{"status":"b"}' == request.json_text  # made once, kept
    assert request == CommitRequest(
        target=target,
        intent=intent,
        state={"status": "b"},
        json_text='{"status":"b"}',
        lease=lease,
        sql_values=(("at", "now()"),),
    )
    assert repr(plain).startswith("CommitRequest(target=Target(kind='table', name='orders'")
    with pytest.raises(dataclasses.FrozenInstanceError):
        request.json_text = "{}"  # type: ignore[misc]
    assert request.claim_id == "i-1"


def test_a_txn_is_what_its_dataclass_made() -> None:
    def body(conn: sqlite3.Connection, now: float) -> int:
        return 1

    step = Txn(body)
    assert (step.body, step.write, step.begin) == (body, True, True)
    assert Txn(body, False, False) == Txn(body=body, write=False, begin=False)
    assert Txn(body, write=False).begin and not Txn(body, write=False).write
    with pytest.raises(dataclasses.FrozenInstanceError):
        step.write = False  # type: ignore[misc]


def test_target_scope_is_made_once_and_names_nothing_else() -> None:
    collection, table = Target("collection", "orders"), Target("table", "shop.orders", "id")
    assert (collection.scope, table.scope) == ("c:orders", "t:shop.orders")
    assert collection == Target("collection", "orders")
    assert hash(collection) == hash(Target("collection", "orders"))
    assert collection != Target("table", "orders") and "scope" not in repr(collection)
    assert dataclasses.replace(table, name="x").scope == "t:x"
    with pytest.raises(dataclasses.FrozenInstanceError):
        collection.scope = "t:x"  # type: ignore[misc]


# -- a store's commit path ---------------------------------------------------------------


@pytest.fixture
def store(tmp_path: Path) -> Iterator[fencing.Store]:
    with fencing.open(f"sqlite:///{tmp_path / 'hot.db'}?synchronous=NORMAL") as opened:
        yield opened


def test_a_lease_names_its_current_token_in_every_commit(store: fencing.Store) -> None:
    orders = store.collection("orders")
    rec = orders.create("o-1", {"n": 0})
    lease = store.acquire("orders/o-1", owner="w", ttl=30)
    first = lease.ref
    assert lease.ref is first and (first.name, first.token) == ("orders/o-1", lease.token)
    done = orders.commit(rec.intent("a"), {"n": 1}, lease=lease)
    assert done.committed and done.current is not None and done.current.fence == lease.token
    lease.release()
    newer = store.acquire("orders/o-1", owner="w2", ttl=30)
    assert newer.token == lease.token + 1
    # the old lease object, told of a newer token, names it (as _taken_again does)
    lease.token = newer.token
    assert lease.ref.token == newer.token and lease.ref is not first
    assert done.current is not None
    again = orders.commit(done.current.intent("b"), {"n": 2}, lease=newer)
    assert again.committed and again.current is not None and again.current.fence == newer.token


def test_sqlite_runs_a_commit_step_as_its_flow_would(store: fencing.Store) -> None:
    orders = store.collection("orders")
    backend: Any = store.backend
    recs = [orders.create(f"o-{i}", {"n": i}) for i in range(3)]
    requests = [orders._request(r.intent("ship"), {"n": 10}, None) for r in recs]
    direct = backend.commit(requests[0])
    flowed = drive(backend.flows.commit(requests[1]), backend._run)
    assert direct.status is flowed.status is Status.APPLIED
    assert direct.record is not None and flowed.record is not None
    assert (direct.record.version, flowed.record.version) == (2, 2)
    # the same request again: refused alike (a duplicate), by both ways
    assert backend.commit(requests[0]).status is Status.DUPLICATE
    assert drive(backend.flows.commit(requests[1]), backend._run).status is Status.DUPLICATE
    probe = orders._probe_request(recs[2].intent("x"), None)
    assert backend.probe(probe) == drive(backend.flows.probe(probe), backend._run)
    many = backend.commit_many([requests[2], requests[0]])
    assert [r.status for r in many] == [Status.APPLIED, Status.DUPLICATE]


def test_a_collection_commit_writes_dump_states_bytes(store: fencing.Store) -> None:
    orders = store.collection("orders")
    rec = orders.create("o-1", {"n": 0})
    state = STATES[3] | STATES[4]
    assert orders.commit(rec.intent("a"), state).committed
    backend: Any = store.backend
    (text,) = backend.conn.execute(
        "SELECT state FROM fencing_records WHERE collection = 'orders' AND key = 'o-1'"
    ).fetchone()
    assert text == _reference(state)
