"""The I/O-free core, without any store: intents, records, outcomes, rules and flows."""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import pickle
import random
import re
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import pytest

import fencing
from fencing import (
    SKIP,
    Committed,
    Contended,
    Drop,
    Duplicate,
    Fenced,
    FenceReason,
    Intent,
    InvalidIntent,
    Missing,
    Outcome,
    Recompute,
    Reconcile,
    Record,
    Skipped,
    Stale,
)
from fencing._flow import Sleep
from fencing._policy import (
    AcquireStep,
    CommitStep,
    DecideStep,
    ProbeStep,
    ReconcileStep,
    RenewStep,
    RetakeStep,
    SettleStep,
    StalePolicy,
    apply_flow,
    check_policy,
    heartbeat_flow,
    lease_wait_flow,
)
from fencing._request import CommitResult, LeaseAnswer, outcome_for
from fencing._rules import (
    MAX_TTL,
    MIN_TTL,
    LeaseRef,
    LeaseRow,
    Status,
    check_ttl,
    guard_holds,
    judge,
    lease_grant,
    lease_renewal,
)
from fencing._values import INTENT_FORMAT, MAX_INTENT_BYTES, MAX_VERSION

TRACE = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def make_intent(**fields: Any) -> Intent:
    base: dict[str, Any] = {
        "id": "i-1",
        "collection": "orders",
        "key": "o-1",
        "expected_version": 3,
        "transition": "ship",
    }
    base.update(fields)
    return Intent(**base)


def make_record(
    version: int = 3,
    fence: int = 0,
    state: Mapping[str, Any] | None = None,
    key: str | int = "o-1",
    kind: Any = "collection",
) -> Record:
    return Record("orders", key, version, fence, state or {"status": "new"}, kind)


def payload(**changes: Any) -> str:
    """A valid intent's JSON with some fields replaced (or removed, with a value of ...)."""
    data = make_intent().to_dict()
    for name, value in changes.items():
        if value is ...:
            del data[name]
        else:
            data[name] = value
    return json.dumps(data)


# -- Intent: every field, type and bound ---------------------------------------------------
BAD_FIELDS: list[tuple[str, object]] = [
    ("id", ""),
    ("id", "a b"),
    ("id", "x" * 129),
    ("id", "a/b"),
    ("id", "é"),
    ("id", 7),
    ("id", None),
    ("collection", ""),
    ("collection", "x" * 129),
    ("collection", "or ders"),
    ("collection", "-orders"),
    ("collection", "orders;"),
    ("collection", "orders; DROP TABLE x"),
    ("collection", "ördérs"),
    ("collection", 5),
    ("collection", None),
    ("key", ""),
    ("key", "x" * 513),
    ("key", "a\x00b"),
    ("key", True),
    ("key", 1.5),
    ("key", None),
    ("key", [1]),
    ("key", 2**63),
    ("key", -(2**63) - 1),
    ("key", "\ud800"),
    ("expected_version", -1),
    ("expected_version", MAX_VERSION + 1),
    ("expected_version", True),
    ("expected_version", False),
    ("expected_version", 1.0),
    ("expected_version", "3"),
    ("expected_version", [3]),
    ("transition", ""),
    ("transition", "ship it"),
    ("transition", "x" * 129),
    ("transition", 3),
    ("transition", None),
    ("guard", {}),
    ("guard", []),
    ("guard", "status"),
    ("guard", {"bad field": 1}),
    ("guard", {"a": [1]}),
    ("guard", {"a": {"b": 1}}),
    ("guard", {"a": math.nan}),
    ("guard", {"a": math.inf}),
    ("guard", {1: "a"}),
    ("guard", {"a": "\udfff"}),
    ("guard", {"a": 2**63}),
    ("guard", {"a": -(2**63) - 1}),
    ("kind", "other"),
    ("kind", None),
    ("kind", 1),
    ("decided_at", math.nan),
    ("decided_at", math.inf),
    ("decided_at", -math.inf),
    ("decided_at", "now"),
    ("decided_at", True),
    ("decided_at", None),
]


@pytest.mark.parametrize(("field", "value"), BAD_FIELDS, ids=lambda v: repr(v)[:40])
def test_intent_refuses_bad_field(field: str, value: object) -> None:
    with pytest.raises(InvalidIntent):
        make_intent(**{field: value})


@pytest.mark.parametrize(("field", "value"), BAD_FIELDS, ids=lambda v: repr(v)[:40])
def test_from_json_refuses_bad_field(field: str, value: object) -> None:
    # json.dumps writes NaN/Infinity literals and a lone surrogate as an escape
    with pytest.raises(InvalidIntent):
        Intent.from_json(payload(**{field: value}))


GOOD_FIELDS: list[tuple[str, object]] = [
    ("id", "a" * 128),
    ("id", "A-z_0.9:~x"),
    ("collection", "c" * 128),
    ("collection", "a/b.c:d_e-f"),
    ("collection", "0rders"),
    ("key", "k" * 512),
    ("key", "ключ ü 🔑"),
    ("key", 2**63 - 1),
    ("key", -(2**63)),
    ("key", 0),
    ("expected_version", 0),
    ("expected_version", MAX_VERSION),
    ("guard", {"status": "packed", "n": 1, "x": 1.5, "flag": False, "gone": None}),
    ("guard", {"big": 2**63 - 1, "small": -(2**63)}),
    ("kind", "table"),
    ("decided_at", -1.5),
    ("decided_at", 10**6),
]


@pytest.mark.parametrize(("field", "value"), GOOD_FIELDS, ids=lambda v: repr(v)[:40])
def test_intent_accepts_edge_values_and_round_trips(field: str, value: object) -> None:
    intent = make_intent(**{field: value})
    assert getattr(intent, field) == value
    again = Intent.from_json(intent.to_json())
    assert again == intent
    assert again.to_json() == intent.to_json()
    assert Intent.from_json(intent.to_json().encode()) == intent


def test_intent_needs_a_version_or_a_guard() -> None:
    with pytest.raises(InvalidIntent, match="expected_version, a guard"):
        make_intent(expected_version=None)
    guarded = make_intent(expected_version=None, guard={"status": "packed"})
    assert guarded.expected_version is None and dict(guarded.guard or {}) == {"status": "packed"}


def test_intent_is_immutable_and_copies_its_guard() -> None:
    guard = {"status": "packed"}
    intent = make_intent(guard=guard)
    guard["status"] = "changed"
    assert intent.guard is not None and intent.guard["status"] == "packed"
    with pytest.raises(dataclasses.FrozenInstanceError):
        intent.expected_version = 4  # type: ignore[misc]
    with pytest.raises(TypeError):
        intent.guard["status"] = "x"  # type: ignore[index]


def test_intent_new_gives_unique_ids_and_a_decision_time() -> None:
    ids = {Intent.new("orders", "o-1", 1, "ship").id for _ in range(200)}
    assert len(ids) == 200
    intent = Intent.new("orders", "o-1", 1, "ship")
    assert intent.decided_at > 0 and intent.root_id == intent.id


def test_intent_ids_sort_by_the_time_they_were_made() -> None:
    # the applied-intent index of every store then grows at its right edge
    first = Intent.new("orders", "o-1", 1, "ship")
    time.sleep(0.002)
    later = [Intent.new("orders", "o-1", 1, "ship").id for _ in range(50)]
    assert all(re.fullmatch(r"[0-9a-f]{32}", i) for i in [first.id, *later])
    assert all(first.id < i for i in later)
    assert abs(int(first.id[:12], 16) / 1000 - first.decided_at) < 1.0


# -- JSON: unknown, missing, format version, truncated, constants, oversize ----------------------
def test_to_json_is_compact_canonical_and_versioned() -> None:
    intent = make_intent(guard={"b": 1, "a": 2})
    text = intent.to_json()
    assert " " not in text
    data = json.loads(text)
    # written in the oldest format that holds it: 1 unless a guard value is tagged
    assert data["v"] == 1 and INTENT_FORMAT == 3
    assert list(data) == sorted(data)
    assert json.dumps(data, sort_keys=True, separators=(",", ":")) == text


def test_an_intent_with_a_trace_is_written_in_format_3_and_read_back() -> None:
    intent = make_intent(trace=TRACE, guard=None)
    data = intent.to_dict()
    assert data == {**make_intent(guard=None).to_dict(), "v": 3, "trace": TRACE}
    assert json.loads(intent.to_json()) == data
    for read in (Intent.from_json(intent.to_json()), Intent.from_dict(data)):
        assert read == intent and read.trace == TRACE
    tagged = make_intent(trace=TRACE, guard={"at": uuid.UUID(int=5)}, kind="table")
    assert Intent.from_json(tagged.to_json()).guard == {"at": uuid.UUID(int=5)}
    assert json.loads(tagged.to_json())["v"] == 3


_BAD_TAG = "guard value for 'a' has an unknown tag 'x' (one of $decimal, $datetime, $date, $time,"


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (5, "payload must be str or bytes, not int"),
        ("[]", "expected a JSON object, got list"),
        ('"intent"', "expected a JSON object, got str"),
        ("[" * MAX_INTENT_BYTES, "JSON nested too deeply"),  # the largest payload is read
        ("[" * (MAX_INTENT_BYTES + 1), "payload is 65537 bytes, above 65536"),
        (payload(v=4), "format version 4 is not supported (this reads 1 to 3)"),
        (payload(v="1"), "format version '1' is not supported (this reads 1 to 3)"),
        (payload(v=2, trace=TRACE), "field 'trace' needs format 3, not 2"),
        (payload(v=1, trace=TRACE), "field 'trace' needs format 3, not 1"),
        (payload(v=2, guard={"a": {"x": "1"}}), _BAD_TAG),
        (payload(v=3, guard={"a": {"x": "1"}}), _BAD_TAG),
    ],
    ids=[
        "int",
        "list",
        "string",
        "deepest",
        "one byte over",
        "format 4",
        "format as text",
        "trace in format 2",
        "trace in format 1",
        "bad tag in format 2",
        "bad tag in format 3",
    ],
)
def test_from_json_says_what_is_wrong(text: Any, problem: str) -> None:
    with pytest.raises(InvalidIntent) as raised:
        Intent.from_json(text)
    assert str(raised.value).startswith(f"invalid intent: {problem}")
    if not problem.endswith(","):
        assert str(raised.value) == f"invalid intent: {problem}"


def test_a_format_1_guard_is_read_as_it_is() -> None:
    """Only formats 2 and 3 tag guard values: in format 1 an object is a plain value
    (refused as a guard value, by the intent's own check, not read as a tag)."""
    with pytest.raises(InvalidIntent) as raised:
        Intent.from_json(payload(v=1, kind="table", guard={"a": {"$uuid": str(uuid.UUID(int=5))}}))
    assert str(raised.value) == (
        "invalid intent: guard value for 'a' takes a string, number, boolean, None, Decimal,"
        " datetime, date, time, timedelta, UUID or bytes (or an enum of those), not dict"
    )
    tagged = payload(v=2, kind="table", guard={"a": {"$uuid": str(uuid.UUID(int=5))}})
    assert Intent.from_json(tagged).guard == {"a": uuid.UUID(int=5)}


_NAME_RULE = (
    "is not allowed: use 1 to 128 letters, digits and '_ - . : /', starting with a letter or digit"
)
_TRACE_RULE = "trace must be a W3C traceparent ('00-<32 hex>-<16 hex>-<2 hex>')"


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"id": "a b"}, "id 'a b' must be 1-128 of letters, digits and '_ . : ~ -'"),
        ({"kind": "other"}, "kind 'other' must be 'collection' or 'table'"),
        ({"collection": "or ders"}, f"collection name 'or ders' {_NAME_RULE}"),
        ({"collection": "or ders", "kind": "table"}, f"table name 'or ders' {_NAME_RULE}"),
        ({"transition": "ship it"}, f"transition name 'ship it' {_NAME_RULE}"),
        ({"expected_version": -1}, "expected_version -1 must be an integer from 0 to 2**63-1"),
        ({"expected_version": None}, "an intent needs an expected_version, a guard, or both"),
        ({"decided_at": math.nan}, "decided_at nan must be a finite number"),
        ({"trace": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331"}, _TRACE_RULE),
        ({"trace": 5}, _TRACE_RULE),
    ],
    ids=[
        "id",
        "kind",
        "collection",
        "table",
        "transition",
        "expected_version",
        "no version nor guard",
        "decided_at",
        "trace",
        "trace not text",
    ],
)
def test_a_bad_intent_says_what_is_wrong(fields: dict[str, Any], problem: str) -> None:
    with pytest.raises(InvalidIntent) as raised:
        make_intent(**fields)
    assert str(raised.value) == f"invalid intent: {problem}"


def test_a_new_intent_carries_the_current_trace(monkeypatch: pytest.MonkeyPatch) -> None:
    from fencing._observe import HUB

    assert Intent.new("orders", "o-1", 3, "ship").trace is None
    monkeypatch.setattr(HUB, "trace", lambda: TRACE)
    assert Intent.new("orders", "o-1", 3, "ship").trace == TRACE
    monkeypatch.setattr(HUB, "trace", lambda: None)  # no span: no trace
    assert Intent.new("orders", "o-1", 3, "ship").trace is None


@pytest.mark.parametrize("name", ["extra", "V", "Id", "lease", ""])
def test_from_json_refuses_unknown_field(name: str) -> None:
    with pytest.raises(InvalidIntent, match="unknown field"):
        Intent.from_json(payload(**{name: 1}))


@pytest.mark.parametrize("name", ["v", "id", "collection", "key", "expected_version", "transition"])
def test_from_json_refuses_missing_field(name: str) -> None:
    with pytest.raises(InvalidIntent, match="missing field"):
        Intent.from_json(payload(**{name: ...}))


def test_from_json_optional_fields_default() -> None:
    intent = Intent.from_json(payload(guard=..., kind=..., decided_at=...))
    assert (intent.guard, intent.kind, intent.decided_at) == (None, "collection", 0.0)


@pytest.mark.parametrize("v", [0, 4, -1, "1", True, 1.0, 2.0, 3.0, None, [1]])
def test_from_json_refuses_other_format_versions(v: object) -> None:
    with pytest.raises(InvalidIntent):
        Intent.from_json(payload(v=v))


@pytest.mark.parametrize(
    "text", ["[]", "null", "1", '"intent"', "true", "[1, 2]", "{}", "", " ", "{", "}", "nul"]
)
def test_from_json_refuses_non_objects_and_garbage(text: str) -> None:
    with pytest.raises(InvalidIntent):
        Intent.from_json(text)


def test_from_json_refuses_every_truncation() -> None:
    text = make_intent(guard={"status": "packed"}).to_json()
    for end in range(len(text)):
        with pytest.raises(InvalidIntent):
            Intent.from_json(text[:end])
    assert Intent.from_json(text).guard is not None


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
@pytest.mark.parametrize("field", ["decided_at", "expected_version", "key"])
def test_from_json_refuses_non_finite_constants(constant: str, field: str) -> None:
    text = json.dumps(make_intent().to_dict())
    data = json.loads(text)
    text = text.replace(f'"{field}": {json.dumps(data[field])}', f'"{field}": {constant}')
    assert constant in text
    with pytest.raises(InvalidIntent):
        Intent.from_json(text)


def test_from_json_refuses_non_finite_in_guard() -> None:
    text = payload(guard={"a": 1}).replace('"a": 1', '"a": NaN')
    with pytest.raises(InvalidIntent):
        Intent.from_json(text)


def test_from_json_refuses_oversize_payloads() -> None:
    big = payload(transition="t").replace('"transition"', " " * MAX_INTENT_BYTES + '"transition"')
    with pytest.raises(InvalidIntent, match="bytes"):
        Intent.from_json(big)
    with pytest.raises(InvalidIntent, match="bytes"):
        Intent.from_json(big.encode())


@pytest.mark.parametrize("depth", [100, 10_000, 30_000])
def test_from_json_refuses_deep_nesting(depth: int) -> None:
    for text in ("[" * depth + "]" * depth, payload(guard=None).replace("null", "[" * depth)):
        with pytest.raises(InvalidIntent):
            Intent.from_json(text)


@pytest.mark.parametrize("value", [None, 1, 1.5, ["{}"], {"v": 1}, bytearray(b"{}")])
def test_from_json_refuses_non_text(value: Any) -> None:
    with pytest.raises(InvalidIntent):
        Intent.from_json(value)


@pytest.mark.parametrize("raw", [b"\xff\xfe", b'{"v": 1, "id": "\xff"}', b"\x80"])
def test_from_json_refuses_bytes_that_are_not_utf8(raw: bytes) -> None:
    with pytest.raises(InvalidIntent):
        Intent.from_json(raw)


def test_from_dict_refuses_non_dicts() -> None:
    for value in (None, [], "x", 1, make_intent()):
        with pytest.raises(InvalidIntent):
            Intent.from_dict(value)


def test_invalid_intent_is_a_typed_value_error() -> None:
    with pytest.raises(fencing.InvalidInput) as info:
        Intent.from_json("{")
    assert isinstance(info.value, fencing.FencingError)
    assert isinstance(info.value, ValueError)


# -- derive and root_id --------------------------------------------------------------------
def test_derive_keeps_the_work_and_changes_the_version() -> None:
    intent = make_intent(decided_at=12.5, guard={"status": "packed"})
    derived = intent.derive(7, 2)
    assert derived.id == "i-1~2" and derived.root_id == "i-1"
    assert derived.expected_version == 7
    assert (derived.collection, derived.key, derived.transition, derived.kind) == (
        intent.collection,
        intent.key,
        intent.transition,
        intent.kind,
    )
    assert derived.decided_at == 12.5
    # decide() judged the current record, so the original guard is not carried over
    assert derived.guard is None
    assert intent.derive(7, 2) == derived  # deterministic: a redelivery derives the same id
    again = derived.derive(9, 3)
    assert again.id == "i-1~3" and again.root_id == "i-1"
    # the span that decided the work is still the one its derivations belong to
    traced = make_intent(trace=TRACE)
    assert traced.derive(7, 2).trace == TRACE and traced.derive(7, 2).derive(8, 3).trace == TRACE
    assert intent.derive(7, 2).trace is None


def test_derive_with_guard_only() -> None:
    intent = make_intent(expected_version=None, guard={"status": "packed"}, kind="table")
    derived = intent.derive(None, 1, guard={"status": "shipped"})
    assert derived.expected_version is None
    assert dict(derived.guard or {}) == {"status": "shipped"}
    with pytest.raises(InvalidIntent):
        intent.derive(None, 1)  # neither a version nor a guard


def test_derive_validates() -> None:
    with pytest.raises(InvalidIntent):
        make_intent().derive(-1, 1)
    with pytest.raises(InvalidIntent):
        make_intent(id="x" * 127).derive(1, 10)  # the derived id would be too long


def test_root_id_of_plain_and_tilde_ids() -> None:
    assert make_intent(id="abc").root_id == "abc"
    assert make_intent(id="abc~4").root_id == "abc"


# -- Record ------------------------------------------------------------------------------
def test_record_is_immutable_and_owns_its_state() -> None:
    state = {"status": "new", "items": [1]}
    record = make_record(state=state)
    state["status"] = "changed"
    assert record.state["status"] == "new"
    with pytest.raises(TypeError):
        record.state["status"] = "x"  # type: ignore[index]
    with pytest.raises(TypeError):
        del record.state["status"]  # type: ignore[attr-defined]
    for name, value in [("version", 9), ("fence", 9), ("state", {}), ("key", "k")]:
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(record, name, value)
    with pytest.raises((AttributeError, TypeError)):
        record.extra = 1  # type: ignore[attr-defined]


def test_record_state_is_a_json_object_that_refuses_changes() -> None:
    """``json.dumps(record.state)`` works as it is (the state is a read-only ``dict``);
    every way to change it in place raises ``TypeError``; copies, pickles and ``==``
    with a plain dict work; a copy to change is a plain dict."""
    state = {"status": "new", "items": [1, {"sku": "a"}], "meta": {"tags": ["x"], "n": None}}
    record = make_record(state=json.loads(json.dumps(state)))
    assert json.loads(json.dumps(record.state)) == state
    assert json.loads(json.dumps(record.to_dict()))["state"] == state
    assert record.state == state and state == record.state
    attempts: list[Callable[[Any], object]] = [
        lambda s: s.__setitem__("status", "x"),
        lambda s: s.__delitem__("status"),
        lambda s: s.clear(),
        lambda s: s.pop("status"),
        lambda s: s.pop("absent", None),
        lambda s: s.popitem(),
        lambda s: s.setdefault("new", 1),
        lambda s: s.update(status="x"),
        lambda s: s.update({}),
        lambda s: s.__ior__({"status": "x"}),
    ]
    for attempt in attempts:
        with pytest.raises(TypeError, match="read-only"):
            attempt(record.state)
    merged = record.state
    with pytest.raises(TypeError):
        merged |= {"status": "x"}
    assert record.state == state
    for copied in (dict(record.state), record.state.copy(), {**record.state}):
        assert type(copied) is dict and copied == state
        copied["status"] = "changed"  # a copy is the caller's to change
    assert record.state | {"status": "x"} == {**state, "status": "x"}
    assert record.state["status"] == "new"
    for again in (pickle.loads(pickle.dumps(record)), copy.deepcopy(record), copy.copy(record)):
        assert again == record and again.state == state
        with pytest.raises(TypeError):
            again.state["status"] = "x"  # type: ignore[index]
    deep = copy.deepcopy(record)
    assert deep.state["items"] is not record.state["items"]  # a deep copy is deep
    assert repr(record).endswith(f"state={state!r}, kind='collection')")


def test_record_intent_and_to_dict() -> None:
    record = make_record(version=5, fence=2, state={"status": "packed"})
    intent = record.intent("ship", guard={"status": "packed"})
    assert (intent.collection, intent.key, intent.expected_version) == ("orders", "o-1", 5)
    assert intent.transition == "ship" and intent.kind == "collection"
    assert record.intent("ship").id != record.intent("ship").id
    assert record.to_dict() == {
        "collection": "orders",
        "kind": "collection",
        "key": "o-1",
        "version": 5,
        "fence": 2,
        "state": {"status": "packed"},
    }
    table_record = make_record(key=42, kind="table")
    assert table_record.intent("ship").kind == "table"
    with pytest.raises(InvalidIntent):
        record.intent("not a name")


def test_records_compare_by_value() -> None:
    assert make_record(state={"a": 1}) == make_record(state={"a": 1})
    assert make_record(state={"a": 1}) != make_record(state={"a": 2})
    assert make_record(version=1) != make_record(version=2)


def test_records_intents_and_outcomes_are_hashable() -> None:
    # A record's state and an intent's guard are read-only mappings; the values still
    # hash (sets of seen intents, dict keys, functools caches), consistently with ==.
    a, b = make_record(state={"a": [1, 2]}), make_record(state={"a": [1, 2]})
    assert hash(a) == hash(b) and len({a, b}) == 1
    assert len({a, make_record(version=9)}) == 2
    guarded = Intent.new("orders", "k", 1, "ship", guard={"status": "packed"})
    same = Intent.from_json(guarded.to_json())
    assert same == guarded and hash(same) == hash(guarded)
    assert len({guarded, same, guarded.derive(2, 1)}) == 2
    assert len({Committed(a), Committed(b), Stale(a)}) == 2


# -- outcomes ------------------------------------------------------------------------------
REC = make_record()


def every_outcome() -> list[Outcome]:
    return [
        Committed(REC),
        Stale(REC),
        Duplicate(REC),
        Fenced(REC, FenceReason.NEWER_OWNER),
        Fenced(REC, FenceReason.EXPIRED),
        Missing(),
        Skipped(REC),
        Skipped(),
        Contended(REC, 3),
    ]


def test_only_committed_is_committed() -> None:
    flags = {type(o).__name__: o.committed for o in every_outcome()}
    assert flags == {
        "Committed": True,
        "Stale": False,
        "Duplicate": False,
        "Fenced": False,
        "Missing": False,
        "Skipped": False,
        "Contended": False,
    }


def test_outcome_current_and_kind() -> None:
    currents = [o.current for o in every_outcome()]
    assert currents == [REC, REC, REC, REC, REC, None, REC, None, REC]
    kinds = [o.kind for o in every_outcome()]
    assert kinds == [
        "committed",
        "stale",
        "duplicate",
        "fenced",
        "fenced",
        "missing",
        "skipped",
        "skipped",
        "contended",
    ]
    assert all(isinstance(o, Outcome) for o in every_outcome())


def describe(outcome: Outcome) -> str:
    match outcome:
        case Committed(record):
            return f"committed v{record.version}"
        case Stale(current):
            return f"stale v{current.version}"
        case Duplicate(record):
            return f"duplicate v{record.version}"
        case Fenced(current, FenceReason.NEWER_OWNER):
            return f"fenced newer v{current.version}"
        case Fenced(current, FenceReason.EXPIRED):
            return f"fenced expired v{current.version}"
        case Missing():
            return "missing"
        case Skipped(None):
            return "skipped nothing"
        case Skipped(current):
            return f"skipped v{current.version}"
        case Contended(current, attempts):
            return f"contended v{current.version} after {attempts}"
        case _:
            return "unmatched"


def test_every_outcome_matches_its_pattern() -> None:
    assert [describe(o) for o in every_outcome()] == [
        "committed v3",
        "stale v3",
        "duplicate v3",
        "fenced newer v3",
        "fenced expired v3",
        "missing",
        "skipped v3",
        "skipped nothing",
        "contended v3 after 3",
    ]


def test_outcomes_are_immutable_values_ignoring_the_intent() -> None:
    a, b = make_intent(id="a"), make_intent(id="b")
    assert Committed(REC, a) == Committed(REC, b)
    assert Committed(REC) != Stale(REC)
    with pytest.raises(dataclasses.FrozenInstanceError):
        Committed(REC).record = REC  # type: ignore[misc]
    assert FenceReason.NEWER_OWNER == "newer_owner" and FenceReason.EXPIRED == "expired"


def test_skip_is_a_singleton() -> None:
    assert fencing.SKIP is SKIP
    assert repr(SKIP) == "fencing.SKIP"


# -- the rules: judge order and lease rules ------------------------------------------------
LEASE = LeaseRef("orders/o-1", 5)
HELD = LeaseRow("orders/o-1", "w", 5, 100.0)
NOW = 50.0


@pytest.mark.parametrize(
    ("record", "applied", "intent", "lease", "row", "now", "status"),
    [
        # missing comes first, whatever else is wrong
        (None, True, make_intent(expected_version=1), LEASE, None, NOW, Status.MISSING),
        (None, False, make_intent(), None, None, NOW, Status.MISSING),
        # then duplicate, even when fenced and stale
        (
            make_record(fence=9),
            True,
            make_intent(expected_version=1),
            LEASE,
            None,
            NOW,
            Status.DUPLICATE,
        ),
        (make_record(), True, make_intent(), None, None, NOW, Status.DUPLICATE),
        # then fenced (newer owner), even when stale
        (
            make_record(fence=6),
            False,
            make_intent(expected_version=1),
            LEASE,
            HELD,
            NOW,
            Status.FENCED_NEWER,
        ),
        (
            make_record(),
            False,
            make_intent(expected_version=1),
            LEASE,
            None,
            NOW,
            Status.FENCED_NEWER,
        ),
        (
            make_record(),
            False,
            make_intent(),
            LEASE,
            dataclasses.replace(HELD, token=6),
            NOW,
            Status.FENCED_NEWER,
        ),
        (
            make_record(),
            False,
            make_intent(),
            LEASE,
            dataclasses.replace(HELD, token=4),
            NOW,
            Status.FENCED_NEWER,
        ),
        # a newer token took the lease and it has since expired: still a newer owner
        (
            make_record(),
            False,
            make_intent(),
            LEASE,
            LeaseRow("orders/o-1", "w2", 6, 10.0),
            NOW,
            Status.FENCED_NEWER,
        ),
        # then fenced (expired): ran out, or was released, nobody took over
        (
            make_record(),
            False,
            make_intent(expected_version=1),
            LEASE,
            HELD,
            100.0,
            Status.FENCED_EXPIRED,
        ),
        (make_record(), False, make_intent(), LEASE, HELD, 150.0, Status.FENCED_EXPIRED),
        (
            make_record(),
            False,
            make_intent(),
            LEASE,
            dataclasses.replace(HELD, owner=None),
            NOW,
            Status.FENCED_EXPIRED,
        ),
        # a record fenced by exactly this token is fine
        (make_record(fence=5), False, make_intent(), LEASE, HELD, NOW, Status.OK),
        # then stale: version, then guard
        (make_record(), False, make_intent(expected_version=2), LEASE, HELD, NOW, Status.STALE),
        (make_record(), False, make_intent(expected_version=4), None, None, NOW, Status.STALE),
        (
            make_record(state={"status": "new"}),
            False,
            make_intent(guard={"status": "old"}),
            None,
            None,
            NOW,
            Status.STALE,
        ),
        (make_record(), False, make_intent(), None, None, NOW, Status.OK),
        (make_record(), False, make_intent(), LEASE, HELD, NOW, Status.OK),
        (
            make_record(state={"status": "new"}),
            False,
            make_intent(expected_version=None, guard={"status": "new"}),
            None,
            None,
            NOW,
            Status.OK,
        ),
        # no lease: lease rows are not consulted
        (make_record(fence=99), False, make_intent(), None, None, NOW, Status.OK),
    ],
)
def test_judge(
    record: Record | None,
    applied: bool,
    intent: Intent,
    lease: LeaseRef | None,
    row: LeaseRow | None,
    now: float,
    status: Status,
) -> None:
    assert judge(record, applied, intent, lease, row, now) is status


def test_judge_takes_the_stores_own_guard_comparison_when_given() -> None:
    """SQLite compares a guard's ``Decimal`` or ``datetime`` with the column's affinity,
    which Python cannot repeat: its answer, when given, is the one that counts."""
    intent = make_intent(expected_version=None, guard={"a": 1}, kind="table")
    held, moved = make_record(state={"a": 1}), make_record(state={"a": 2})
    assert judge(moved, False, intent, None, None, NOW) is Status.STALE
    assert judge(moved, False, intent, None, None, NOW, guard_held=True) is Status.OK
    assert judge(held, False, intent, None, None, NOW) is Status.OK
    assert judge(held, False, intent, None, None, NOW, guard_held=False) is Status.STALE


@pytest.mark.parametrize(
    ("guard", "state", "holds"),
    [
        (None, {}, True),
        ({"a": 1}, {"a": 1}, True),
        ({"a": 1}, {"a": 1.0}, True),
        ({"a": 1}, {"a": True}, False),
        ({"a": True}, {"a": 1}, False),
        ({"a": False}, {"a": 0}, False),
        ({"a": None}, {}, False),
        ({"a": None}, {"a": None}, True),
        ({"a": "x", "b": 2}, {"a": "x", "b": 2, "c": 3}, True),
        ({"a": "x", "b": 2}, {"a": "x", "b": 3}, False),
        ({"a": "1"}, {"a": 1}, False),
        # a column value beyond JSON against its text, both ways (issue 23's mutants)
        ({"a": "00000000-0000-0000-0000-000000000005"}, {"a": uuid.UUID(int=5)}, True),
        ({"a": uuid.UUID(int=5)}, {"a": "00000000-0000-0000-0000-000000000005"}, True),
        ({"a": "00000000-0000-0000-0000-000000000006"}, {"a": uuid.UUID(int=5)}, False),
    ],
)
def test_guard_holds_is_json_equality(
    guard: dict[str, Any] | None, state: dict[str, Any], holds: bool
) -> None:
    assert guard_holds(guard, state) is holds


def test_lease_grant() -> None:
    first = lease_grant("l", None, "a", 10.0, 100.0)
    assert first == LeaseRow("l", "a", 1, 110.0)
    assert lease_grant("l", first, "b", 10.0, 109.999) is None  # held
    assert lease_grant("l", first, "a", 10.0, 105.0) is None  # held, even by the same owner
    at_expiry = lease_grant("l", first, "b", 5.0, 110.0)  # expires_at is exclusive
    assert at_expiry == LeaseRow("l", "b", 2, 115.0)
    released = LeaseRow("l", None, 7, 0.0)
    assert lease_grant("l", released, "c", 1.0, 1.0) == LeaseRow("l", "c", 8, 2.0)
    # tokens never go back, whatever the clock says
    assert lease_grant("l", LeaseRow("l", "x", 41, 500.0), "y", 1.0, 600.0) == LeaseRow(
        "l", "y", 42, 601.0
    )


def test_lease_renewal() -> None:
    row = LeaseRow("l", "a", 3, 110.0)
    assert lease_renewal(row, 3, 20.0, 100.0) == LeaseRow("l", "a", 3, 120.0)
    assert lease_renewal(row, 3, 1.0, 100.0) == LeaseRow("l", "a", 3, 101.0)  # may shorten
    assert lease_renewal(row, 2, 20.0, 100.0) is None  # not this token
    assert lease_renewal(row, 4, 20.0, 100.0) is None
    assert lease_renewal(row, 3, 20.0, 110.0) is None  # expired: renewal cannot revive it
    assert lease_renewal(None, 3, 20.0, 100.0) is None
    assert lease_renewal(LeaseRow("l", None, 3, 0.0), 3, 20.0, 0.0) is None  # released


def test_lease_row_held_at() -> None:
    row = LeaseRow("l", "a", 1, 10.0)
    assert row.held_at(9.99) and not row.held_at(10.0) and not row.held_at(11.0)
    assert not LeaseRow("l", None, 1, 10.0).held_at(0.0)


@pytest.mark.parametrize(
    "ttl",
    [0, 0.0, -1, MIN_TTL / 2, MAX_TTL * 1.01, 1e18, math.nan, math.inf, -math.inf],
)
def test_check_ttl_refuses(ttl: float) -> None:
    number = math.isfinite(ttl)
    with pytest.raises(fencing.InvalidLeaseRequest) as raised:
        check_ttl(ttl)
    assert str(raised.value) == (
        f"ttl {ttl!r}s is outside 0.001s to 604800s (one week)"
        if number
        else f"ttl must be a finite number of seconds, not {ttl!r}"
    )
    with pytest.raises(fencing.InvalidLeaseRequest) as named:
        check_ttl(ttl, "heartbeat")
    assert str(named.value).startswith(f"heartbeat {ttl!r}s is" if number else "heartbeat must")


@pytest.mark.parametrize("ttl", [True, False, "5", None, [5]])
def test_check_ttl_refuses_what_is_not_a_number(ttl: object) -> None:
    with pytest.raises(fencing.InvalidLeaseRequest) as raised:
        check_ttl(ttl)
    assert str(raised.value) == f"ttl must be a finite number of seconds, not {ttl!r}"


@pytest.mark.parametrize("ttl", [MIN_TTL, 1, 0.5, 30, MAX_TTL])
def test_check_ttl_accepts(ttl: float) -> None:
    assert check_ttl(ttl) == float(ttl) and isinstance(check_ttl(ttl), float)


# -- policies ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs",
    [
        {"attempts": 0},
        {"attempts": -1},
        {"attempts": 1001},
        {"attempts": True},
        {"attempts": 2.0},
        {"attempts": "3"},
        {"attempts": None},
        {"backoff": -0.1},
        {"backoff": math.nan},
        {"backoff": math.inf},
        {"backoff": "0.1"},
        {"max_backoff": -1},
        {"max_backoff": math.inf},
        {"max_backoff": None},
    ],
)
def test_recompute_validates(kwargs: dict[str, Any]) -> None:
    with pytest.raises(fencing.InvalidInput):
        Recompute(**kwargs)


def test_recompute_accepts_bounds() -> None:
    assert Recompute(attempts=1).attempts == 1
    assert Recompute(attempts=1000, backoff=0, max_backoff=0).attempts == 1000


@pytest.mark.parametrize("handler", [None, "handler", 3, {"a": 1}])
def test_reconcile_needs_a_callable(handler: object) -> None:
    with pytest.raises(fencing.InvalidInput):
        Reconcile(handler)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "policy", [None, "drop", Drop, Recompute, Reconcile, 3, lambda: None, {"attempts": 3}]
)
def test_check_policy_refuses_non_policies(policy: object) -> None:
    with pytest.raises(fencing.InvalidInput):
        check_policy(policy)


def test_check_policy_accepts_policies() -> None:
    for policy in (Drop(), Recompute(), Reconcile(print)):
        assert check_policy(policy) is policy


def test_recompute_delay_is_jittered_within_bounds() -> None:
    policy = Recompute(attempts=50, backoff=0.01, max_backoff=0.3)
    rng = random.Random(7)
    for attempt in range(1, 60):
        cap = min(0.3, 0.01 * 2 ** (attempt - 1))
        samples = [policy.delay(attempt, rng) for _ in range(50)]
        assert all(0.0 <= s <= cap for s in samples), attempt
        assert len(set(samples)) > 1, "the delay must be jittered"
    assert Recompute(backoff=0).delay(5) == 0.0


# -- apply_flow, driven by hand ------------------------------------------------------------
def applied(record: Record, state: Mapping[str, Any]) -> CommitResult:
    return CommitResult(
        Status.APPLIED, dataclasses.replace(record, version=record.version + 1, state=state)
    )


class Driver:
    """Carries out a flow's steps from scripted answers and records every step."""

    def __init__(
        self,
        probe: CommitResult,
        commit: Callable[[Intent, Mapping[str, Any]], CommitResult],
        decide: Callable[[Record], object] = lambda r: {"n": r.version},
    ) -> None:
        self.probe = probe
        self.commit = commit
        self.decide = decide
        self.steps: list[Any] = []
        self.settled: tuple[Any, ...] = ()  # the effects a SettleStep answers with

    def run(self, intent: Intent, policy: StalePolicy, rng: random.Random | None = None) -> Outcome:
        flow = apply_flow(intent, policy, rng)
        answer: Any = None
        try:
            step = next(flow)
            while True:
                self.steps.append(step)
                if isinstance(step, ProbeStep):
                    answer = self.probe
                elif isinstance(step, DecideStep):
                    answer = self.decide(step.record)
                elif isinstance(step, CommitStep):
                    answer = self.commit(step.intent, step.state)
                elif isinstance(step, Sleep | ReconcileStep | RetakeStep):
                    answer = None  # RetakeStep: no lease to take again
                elif isinstance(step, SettleStep):
                    answer = list(self.settled)
                else:  # pragma: no cover
                    raise AssertionError(step)
                step = flow.send(answer)
        except StopIteration as stop:
            outcome: Outcome = stop.value
            return outcome

    def count(self, kind: type) -> int:
        return sum(isinstance(s, kind) for s in self.steps)

    def kinds(self) -> list[str]:
        return [type(s).__name__ for s in self.steps]


ALWAYS_STALE_FROM = 3


def always_stale() -> Callable[[Intent, Mapping[str, Any]], CommitResult]:
    """Every commit finds that someone else got in first (the version moves on)."""
    version = [ALWAYS_STALE_FROM]

    def commit(intent: Intent, state: Mapping[str, Any]) -> CommitResult:
        version[0] += 1
        return CommitResult(Status.STALE, make_record(version=version[0]))

    return commit


def test_flow_commits_once() -> None:
    intent = make_intent()
    record = make_record()
    driver = Driver(CommitResult(Status.OK, record), lambda i, s: applied(record, s))
    outcome = driver.run(intent, Drop())
    assert isinstance(outcome, Committed) and outcome.record.version == 4
    assert outcome.intent is intent
    assert driver.kinds() == ["ProbeStep", "DecideStep", "CommitStep"]
    probe, decide, commit = driver.steps
    assert probe.intent is intent and decide.record is record
    assert commit.intent is intent and commit.state == {"n": 3}


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (Status.MISSING, Missing),
        (Status.DUPLICATE, Duplicate),
        (Status.FENCED_NEWER, Fenced),
        (Status.FENCED_EXPIRED, Fenced),
    ],
)
@pytest.mark.parametrize(
    "policy", [Drop(), Recompute(attempts=3), Reconcile(print)], ids=["drop", "recompute", "rec"]
)
def test_flow_stops_at_probe_without_deciding(
    status: Status, expected: type, policy: StalePolicy
) -> None:
    record = None if status is Status.MISSING else make_record()
    driver = Driver(CommitResult(status, record), lambda i, s: pytest.fail("no commit"))
    outcome = driver.run(make_intent(), policy)
    assert isinstance(outcome, expected)
    # an outcome that ends the work uncommitted for good settles its effects; Duplicate
    # does not, nor does an expired lease (it is taken again first: test_policy_flow.py)
    if status is Status.FENCED_EXPIRED:
        assert driver.kinds() == ["ProbeStep", "RetakeStep"]
    settles = expected is not Duplicate and status is not Status.FENCED_EXPIRED
    if status is not Status.FENCED_EXPIRED:
        assert driver.kinds() == ["ProbeStep", "SettleStep"] if settles else ["ProbeStep"]
    if settles:
        settle = driver.steps[-1]
        assert settle.outcome == outcome.kind and settle.intent is outcome.intent
    if isinstance(outcome, Fenced):
        want = FenceReason.NEWER_OWNER if status is Status.FENCED_NEWER else FenceReason.EXPIRED
        assert outcome.reason is want


@pytest.mark.parametrize(
    ("status", "expected", "reason"),
    [
        (Status.MISSING, Missing, None),
        (Status.DUPLICATE, Duplicate, None),
        (Status.FENCED_NEWER, Fenced, FenceReason.NEWER_OWNER),
        (Status.FENCED_EXPIRED, Fenced, FenceReason.EXPIRED),
        (Status.APPLIED, Committed, None),
        (Status.STALE, Stale, None),
    ],
)
def test_outcome_for(status: Status, expected: type, reason: FenceReason | None) -> None:
    intent = make_intent()
    outcome = outcome_for(CommitResult(status, make_record()), intent)
    assert type(outcome) is expected
    assert getattr(outcome, "intent", None) is intent
    if reason is not None:
        assert isinstance(outcome, Fenced) and outcome.reason is reason
    assert isinstance(outcome_for(CommitResult(Status.STALE, None), intent), Missing)


def test_outcome_for_a_probe_only_status_is_a_bug_said_plainly() -> None:
    with pytest.raises(AssertionError) as raised:
        outcome_for(CommitResult(Status.OK, make_record()), make_intent())
    assert str(raised.value) == "unexpected status Status.OK"


def test_flow_skip_commits_nothing() -> None:
    record = make_record()
    driver = Driver(
        CommitResult(Status.OK, record), lambda i, s: pytest.fail("no commit"), lambda r: SKIP
    )
    outcome = driver.run(make_intent(), Recompute(attempts=3))
    assert isinstance(outcome, Skipped) and outcome.current is record
    assert driver.kinds() == ["ProbeStep", "DecideStep"]


def test_flow_drop_never_decides_on_stale_probe() -> None:
    current = make_record(version=9)
    driver = Driver(CommitResult(Status.STALE, current), lambda i, s: pytest.fail("no commit"))
    outcome = driver.run(make_intent(), Drop())
    assert isinstance(outcome, Stale) and outcome.current is current
    assert driver.kinds() == ["ProbeStep", "SettleStep"]


def test_flow_drop_reports_a_stale_commit_after_one_decide() -> None:
    driver = Driver(CommitResult(Status.OK, make_record()), always_stale())
    outcome = driver.run(make_intent(), Drop())
    assert isinstance(outcome, Stale) and outcome.current.version == 4
    assert driver.kinds() == ["ProbeStep", "DecideStep", "CommitStep", "SettleStep"]


@pytest.mark.parametrize("probe_stale", [True, False])
def test_flow_reconcile_calls_handler_exactly_once(probe_stale: bool) -> None:
    record = make_record(version=3)
    if probe_stale:
        driver = Driver(CommitResult(Status.STALE, record), lambda i, s: pytest.fail("no commit"))
    else:
        driver = Driver(CommitResult(Status.OK, record), always_stale())
    intent = make_intent()
    driver.settled = ("effect-1", "effect-2")
    outcome = driver.run(intent, Reconcile(print))
    assert isinstance(outcome, Stale)
    assert driver.count(ReconcileStep) == 1
    assert driver.count(SettleStep) == 1 and isinstance(driver.steps[-2], SettleStep)
    assert driver.steps[-2].outcome == "stale" and driver.steps[-1].effects == driver.settled
    assert driver.count(DecideStep) == (0 if probe_stale else 1)
    call = next(s for s in driver.steps if isinstance(s, ReconcileStep))
    assert call.intent is intent and call.record == outcome.current
    assert driver.steps[-1] is call  # nothing happens after the handler


@pytest.mark.parametrize("attempts", [1, 2, 3, 7])
@pytest.mark.parametrize("probe_stale", [True, False])
def test_flow_recompute_is_bounded_and_ends_contended(attempts: int, probe_stale: bool) -> None:
    record = make_record(version=3)
    probe = CommitResult(Status.STALE if probe_stale else Status.OK, record)
    seen: list[int] = []
    committed: list[Intent] = []

    def decide(r: Record) -> dict[str, Any]:
        seen.append(r.version)
        return {"n": r.version}

    stale = always_stale()

    def commit(intent: Intent, state: Mapping[str, Any]) -> CommitResult:
        committed.append(intent)
        assert state == {"n": intent.expected_version}  # decided against what it expects
        return stale(intent, state)

    policy = Recompute(attempts=attempts, backoff=0.02, max_backoff=0.05)
    intent = make_intent()
    outcome = Driver(probe, commit, decide).run(intent, policy, random.Random(1))
    assert isinstance(outcome, Contended)
    assert outcome.attempts == attempts == len(seen) == len(committed)
    assert outcome.current.version == 3 + attempts
    # every decide ran against the latest record seen
    assert seen == list(range(3, 3 + attempts))
    ids = [i.id for i in committed]
    if probe_stale:
        assert ids == [f"i-1~{n}" for n in range(1, attempts + 1)]
    else:
        assert ids == ["i-1"] + [f"i-1~{n}" for n in range(2, attempts + 1)]
    assert len(set(ids)) == len(ids)
    assert all(i.root_id == "i-1" for i in committed)


def test_flow_recompute_sleeps_between_attempts_within_bounds() -> None:
    policy = Recompute(attempts=8, backoff=0.01, max_backoff=0.05)
    driver = Driver(CommitResult(Status.OK, make_record()), always_stale())
    driver.run(make_intent(), policy, random.Random(3))
    sleeps = [s.seconds for s in driver.steps if isinstance(s, Sleep)]
    assert len(sleeps) == 7  # between attempts only, never after the last
    for n, seconds in enumerate(sleeps, start=1):
        assert 0.0 <= seconds <= min(0.05, 0.01 * 2 ** (n - 1))
    assert len(set(sleeps)) == len(sleeps)  # jittered
    # each sleep comes right before a decide
    for i, step in enumerate(driver.steps):
        if isinstance(step, Sleep):
            assert isinstance(driver.steps[i + 1], DecideStep)


def test_flow_recompute_commits_when_the_record_settles() -> None:
    versions = iter([4, 5])

    def commit(intent: Intent, state: Mapping[str, Any]) -> CommitResult:
        version = next(versions, None)
        if version is None:
            return applied(make_record(version=5), state)
        return CommitResult(Status.STALE, make_record(version=version))

    driver = Driver(CommitResult(Status.OK, make_record()), commit)
    outcome = driver.run(make_intent(), Recompute(attempts=3, backoff=0))
    assert isinstance(outcome, Committed) and outcome.record.version == 6
    assert outcome.intent is not None and outcome.intent.id == "i-1~3"
    assert outcome.intent.expected_version == 5
    assert driver.count(DecideStep) == 3


@pytest.mark.parametrize("status", [Status.DUPLICATE, Status.MISSING, Status.FENCED_NEWER])
def test_flow_recompute_stops_on_a_final_answer(status: Status) -> None:
    answers = iter([CommitResult(Status.STALE, make_record(version=4))])

    def commit(intent: Intent, state: Mapping[str, Any]) -> CommitResult:
        return next(answers, CommitResult(status, make_record(version=4)))

    driver = Driver(CommitResult(Status.OK, make_record()), commit)
    outcome = driver.run(make_intent(), Recompute(attempts=10, backoff=0))
    assert outcome.kind == {"duplicate": "duplicate", "missing": "missing"}.get(
        status.value, "fenced"
    )
    assert driver.count(DecideStep) == 2


def test_flow_recompute_of_a_guard_only_intent_reguards_current_values() -> None:
    intent = make_intent(expected_version=None, guard={"status": "packed"}, kind="table")
    current = make_record(version=0, state={"status": "held", "n": 1}, key=42, kind="table")
    commits: list[Intent] = []

    def commit(i: Intent, s: Mapping[str, Any]) -> CommitResult:
        commits.append(i)
        return applied(current, s)

    intent = dataclasses.replace(intent, key=42)
    driver = Driver(CommitResult(Status.STALE, current), commit)
    outcome = driver.run(intent, Recompute(attempts=2, backoff=0))
    assert isinstance(outcome, Committed)
    (derived,) = commits
    assert derived.expected_version is None
    assert dict(derived.guard or {}) == {"status": "held"}
    assert derived.id == "i-1~1"


def test_flow_never_decides_more_than_attempts_whatever_the_answers() -> None:
    statuses = [Status.STALE, Status.APPLIED, Status.DUPLICATE, Status.MISSING, Status.STALE]
    for seed in range(300):
        rng = random.Random(seed)
        attempts = rng.randint(1, 6)
        version = [3]

        def commit(
            intent: Intent,
            state: Mapping[str, Any],
            rng: random.Random = rng,
            version: list[int] = version,
        ) -> Any:
            version[0] += 1
            status = rng.choice(statuses)
            return CommitResult(
                status, None if status is Status.MISSING else make_record(version[0])
            )

        probe_status = rng.choice([Status.OK, Status.STALE])
        driver = Driver(CommitResult(probe_status, make_record()), commit)
        outcome = driver.run(make_intent(), Recompute(attempts=attempts, backoff=0), rng)
        assert driver.count(DecideStep) <= attempts
        assert driver.count(CommitStep) == driver.count(DecideStep)
        if isinstance(outcome, Contended):
            assert driver.count(DecideStep) == attempts


# -- acquire_flow and heartbeat_flow, driven by hand ---------------------------------------
class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_acquire_flow_without_wait_tries_once() -> None:
    flow = lease_wait_flow(None)
    assert isinstance(next(flow), AcquireStep)
    refused = LeaseAnswer(False, LeaseRow("l", "a", 1, 10.0), 5.0)
    with pytest.raises(StopIteration) as stop:
        flow.send(refused)
    assert stop.value.value is refused


def test_acquire_flow_waits_jittered_until_the_deadline() -> None:
    clock = FakeClock()
    start = clock.now
    flow = lease_wait_flow(1.0, clock, random.Random(5))
    step = next(flow)
    sleeps: list[tuple[float, float]] = []  # (seconds, time left before the sleep)
    held = LeaseAnswer(False, LeaseRow("l", "a", 1, 5.0 + 0.3), 5.0)  # 0.3 s left on the store
    while True:
        assert isinstance(step, AcquireStep)
        clock.now += 0.002  # a round trip to the store
        try:
            step = flow.send(held)
        except StopIteration as stop:
            result = stop.value
            break
        assert isinstance(step, Sleep)
        sleeps.append((step.seconds, start + 1.0 - clock.now))
        clock.now += step.seconds
        step = next(flow)
    assert result is held
    assert clock.now >= start + 1.0  # it waited until the deadline, then gave up
    delay = 0.005
    for seconds, left in sleeps:
        # never past the deadline, the holder's expiry or the backoff; jittered to half
        cap = min(left, max(0.001, min(0.3, delay)))
        assert cap / 2 <= seconds <= cap
        delay = min(delay * 2, 0.25)
    assert len({s for s, _ in sleeps}) > len(sleeps) // 2


def test_acquire_flow_returns_when_granted() -> None:
    flow = lease_wait_flow(10.0, FakeClock())
    next(flow)
    flow.send(LeaseAnswer(False, LeaseRow("l", "a", 1, 2.0), 1.0))
    next(flow)
    granted = LeaseAnswer(True, LeaseRow("l", "b", 2, 9.0), 2.0)
    with pytest.raises(StopIteration) as stop:
        flow.send(granted)
    assert stop.value.value is granted


def test_heartbeat_flow_renews_until_refused() -> None:
    clock = FakeClock()
    flow = heartbeat_flow(3.0, 1.0, clock)
    step = next(flow)
    for _ in range(5):
        assert isinstance(step, Sleep) and step.seconds == 1.0
        clock.now += 10.0  # successful renewals reset the clock of failures
        assert isinstance(flow.send(None), RenewStep)
        step = flow.send(True)
    assert isinstance(step, Sleep)
    assert isinstance(flow.send(None), RenewStep)
    with pytest.raises(StopIteration) as stop:
        flow.send(False)
    assert stop.value.value is None  # refused by the store: lost, no error text


def test_heartbeat_flow_retries_errors_for_one_ttl() -> None:
    clock = FakeClock()
    flow = heartbeat_flow(3.0, 1.0, clock)
    step = next(flow)
    errors = 0
    while True:
        assert isinstance(step, Sleep)
        clock.now += step.seconds
        assert isinstance(flow.send(None), RenewStep)
        try:
            step = flow.send(OSError("connection refused"))
        except StopIteration as stop:
            reason = stop.value
            break
        errors += 1
    assert errors == 2  # retried at +1 s and +2 s, given up at +3 s (a whole TTL)
    assert "renewal failed" in reason and "connection refused" in reason


def test_heartbeat_flow_counts_errors_from_the_last_renewal_not_the_start() -> None:
    """A job that has run for many TTLs renewing fine is not lost at its first error:
    the TTL of grace runs from the last successful renewal (issue 23's survivor)."""
    clock = FakeClock()
    flow = heartbeat_flow(3.0, 1.0, clock)
    step = next(flow)
    for _ in range(10):  # ten seconds of good renewals: more than three TTLs
        assert isinstance(step, Sleep)
        clock.now += step.seconds
        assert isinstance(flow.send(None), RenewStep)
        step = flow.send(True)
    errors = 0
    while True:
        assert isinstance(step, Sleep)
        clock.now += step.seconds
        assert isinstance(flow.send(None), RenewStep)
        try:
            step = flow.send(OSError("connection refused"))
        except StopIteration as stop:
            reason = stop.value
            break
        errors += 1
    assert errors == 2  # +1 s and +2 s after the last renewal retried; lost at +3 s
    assert "renewal failed" in reason
