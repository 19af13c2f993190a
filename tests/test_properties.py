"""Property-based tests: intent JSON, commits against a model, leases against a model.

The commit machine runs on every backend through the sync and async API (``store``), each
example in a fresh collection. The lease machine runs on the memory backend with a fake
store clock, so time moves only when a rule says so.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import json
import string
import uuid
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    multiple,
    rule,
    run_state_machine_as_test,
)

import fencing
from fencing import (
    Committed,
    Duplicate,
    Fenced,
    FenceReason,
    Intent,
    InvalidIntent,
    LeaseHeld,
    LeaseLost,
    Missing,
    Outcome,
    Recompute,
    Signer,
    Stale,
)
from fencing._store import Store
from fencing._storebase import StoreOptions
from fencing.backends.memory import MemoryBackend

# -- strategies ----------------------------------------------------------------------------
NAMES = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_\-.:/]{0,127}", fullmatch=True)
IDS = st.from_regex(r"[A-Za-z0-9_.:~\-]{1,128}", fullmatch=True)
COLUMNS = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,62}", fullmatch=True)
STR_KEYS = st.text(min_size=1, max_size=512).filter(lambda s: "\x00" not in s)
INT_KEYS = st.integers(-(2**63), 2**63 - 1)
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)
GUARD_VALUES = (
    st.none()
    | st.booleans()
    | INT_KEYS
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)
GUARDS = st.dictionaries(COLUMNS, GUARD_VALUES, min_size=1, max_size=4)
# fixed offsets only: a zoneinfo zone travels as its offset, and PEP 495 makes an
# ambiguous local time unequal to the same instant in another zone
DAY = dt.timedelta(hours=23, minutes=59)
OFFSETS = st.builds(dt.timezone, st.timedeltas(min_value=-DAY, max_value=DAY))
TZ = st.none() | st.just(dt.UTC) | OFFSETS
COLUMN_VALUES = (  # what a table column takes beyond JSON scalars
    st.decimals(allow_nan=False, allow_infinity=False)
    | st.datetimes(timezones=TZ)
    | st.dates()
    | st.times(timezones=TZ)
    | st.timedeltas()
    | st.uuids()
    | st.binary(max_size=24)
)
TABLE_GUARDS = st.dictionaries(COLUMNS, GUARD_VALUES | COLUMN_VALUES, min_size=1, max_size=4)


@st.composite
def intents(draw: st.DrawFn) -> Intent:
    version = draw(st.none() | st.integers(0, 2**63 - 1))
    kind = draw(st.sampled_from(["collection", "table"]))
    guards = TABLE_GUARDS if kind == "table" else GUARDS
    guard = draw(guards) if version is None else draw(st.none() | guards)
    return Intent(
        id=draw(IDS),
        collection=draw(NAMES),
        key=draw(STR_KEYS | INT_KEYS),
        expected_version=version,
        transition=draw(NAMES),
        guard=guard,
        kind=kind,
        decided_at=draw(st.floats(allow_nan=False, allow_infinity=False)),
    )


JSON = st.recursive(
    SCALARS | st.floats(),  # NaN and infinities as well: json.dumps writes them as literals
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)
FIELDS = ["v", "id", "kind", "collection", "key", "expected_version", "transition", "guard",
          "decided_at"]  # fmt: skip


@given(intents())
def test_intent_json_round_trip(intent: Intent) -> None:
    text = intent.to_json()
    again = Intent.from_json(text)
    assert again == intent
    assert again.to_json() == text
    assert Intent.from_json(text.encode()) == intent
    assert Intent.from_dict(json.loads(text)) == intent


@given(intents())
def test_signed_intent_round_trip(intent: Intent) -> None:
    signer = Signer(keys={"k1": b"0123456789abcdef"}, current="k1")
    assert signer.verify(signer.sign(intent)) == intent


def _exactly(guard: Any) -> list[tuple[str, type, str]]:
    return [(f, type(v), repr(v)) for f, v in sorted(guard.items())] if guard else []


@given(intents())
def test_intent_guard_travels_losslessly(intent: Intent) -> None:
    """Equal is not enough (Decimal("9.5") == Decimal("9.50")): same types, same reprs."""
    signer = Signer(keys={"k1": b"0123456789abcdef"}, current="k1")
    for again in (Intent.from_json(intent.to_json()), signer.verify(signer.sign(intent))):
        assert _exactly(again.guard) == _exactly(intent.guard)
    tagged = intent.guard is not None and any(
        type(v) not in (str, int, float, bool, type(None)) for v in intent.guard.values()
    )
    assert json.loads(intent.to_json())["v"] == (2 if tagged else 1)


TAGS = ["$decimal", "$datetime", "$date", "$time", "$timedelta", "$uuid", "$bytes"]


@given(
    st.sampled_from([*TAGS, "$x", "decimal", "$Decimal"]),
    st.text(max_size=40) | st.integers() | st.none(),
)
def test_tag_objects_decode_canonically_or_are_refused(tag: str, text: Any) -> None:
    """A tag holding anything: it decodes to a value whose encoding is that very text,
    or the intent is refused; a format 1 intent never decodes a tag."""
    data = {"v": 2, "id": "i", "kind": "table", "collection": "t", "key": 1,
            "expected_version": None, "transition": "x", "guard": {"g": {tag: text}}}  # fmt: skip
    try:
        intent = Intent.from_dict(data)
    except InvalidIntent:
        pass
    else:
        assert json.loads(intent.to_json())["guard"] == {"g": {tag: text}}
    with pytest.raises(InvalidIntent):
        Intent.from_dict({**data, "v": 1})


@given(st.text(max_size=12) | st.sampled_from(TAGS), st.booleans())
def test_values_that_look_like_tags_are_plain(text: str, as_json: bool) -> None:
    """A guard value is never a JSON object except a tag, so nothing is escaped: a
    string that spells a tag, or a tag's JSON, stays a string."""
    value = json.dumps({text: "9.50"}) if as_json else text
    intent = Intent.new("t", 1, None, "x", guard={"g": value}, kind="table")
    assert Intent.from_json(intent.to_json()).guard == {"g": value}
    assert json.loads(intent.to_json())["v"] == 1


@given(
    st.dictionaries(
        st.sampled_from([*TAGS, "a"]),
        st.text(max_size=8)
        | st.dictionaries(st.sampled_from(TAGS), st.text(max_size=8), max_size=2),
        min_size=1,
        max_size=3,
    )
)
def test_collection_state_that_looks_tagged_is_data(state: dict[str, Any]) -> None:
    """A collection's state is a JSON document: tag-like objects in it are not decoded."""
    store = Store(MemoryBackend(), "memory://", StoreOptions(1 << 20, 3600.0))
    orders = store.collection("orders")
    made = orders.create("o", state)
    assert dict(orders.get("o").state) == state == dict(made.state)


@given(st.binary(max_size=12))
def test_bytes_tag_is_standard_base64(data: bytes) -> None:
    intent = Intent.new("t", 1, 1, "x", guard={"g": data}, kind="table")
    assert json.loads(intent.to_json())["guard"]["g"] == {"$bytes": base64.b64encode(data).decode()}


@given(st.text() | st.binary())
def test_from_json_of_any_text_raises_only_invalid_intent(text: str | bytes) -> None:
    with contextlib.suppress(InvalidIntent):
        Intent.from_json(text)


@given(st.dictionaries(st.sampled_from([*FIELDS, "extra"]), JSON))
def test_from_json_of_any_object_raises_only_invalid_intent(data: dict[str, Any]) -> None:
    with contextlib.suppress(InvalidIntent):
        Intent.from_json(json.dumps(data))


@given(intents(), st.sampled_from(FIELDS), JSON)
def test_one_field_changed_still_parses_or_is_refused(
    intent: Intent, name: str, value: Any
) -> None:
    data = intent.to_dict()
    data[name] = value
    try:
        parsed = Intent.from_json(json.dumps(data))
    except InvalidIntent:
        return
    # the guard may be decoded; the format is the oldest that holds the intent
    assert parsed.to_dict()[name] == value or name in ("guard", "v")


@given(intents(), st.integers(0, 200), st.text(string.printable, max_size=3))
def test_any_edit_of_intent_json_raises_only_invalid_intent(
    intent: Intent, at: int, insert: str
) -> None:
    text = intent.to_json()
    at = min(at, len(text))
    for edited in (text[:at] + insert + text[at:], text[:at] + text[at + 1 :], text[:at]):
        with contextlib.suppress(InvalidIntent):
            Intent.from_json(edited)


# -- commits against a model ---------------------------------------------------------------
KEYS = ["a", "b", "c"]


@dataclass
class Model:
    version: int
    state: dict[str, Any]


class CommitMachine(RuleBasedStateMachine):
    """Intents captured at various versions, committed in random order, redelivered,
    records deleted; the model predicts every outcome and every version exactly."""

    def __init__(self, store: Any) -> None:
        super().__init__()
        self.store = store
        self.coll = store.collection(f"props-{uuid.uuid4().hex[:12]}")
        self.model: dict[str, Model | None] = {}
        self.applied: set[str] = set()

    captured = Bundle("captured")

    @initialize()
    def create(self) -> None:
        for key in KEYS:
            rec = self.coll.create(key, {"g": 0, "by": None})
            assert rec.version == 1
            self.model[key] = Model(1, {"g": 0, "by": None})

    @rule(target=captured, key=st.sampled_from(KEYS), guarded=st.booleans())
    def capture(self, key: str, guarded: bool) -> Any:
        m = self.model[key]
        if m is None:
            with pytest.raises(fencing.RecordNotFound):
                self.coll.intent(key, "t")
            return multiple()
        guard = {"g": m.state["g"]} if guarded else None
        intent = self.coll.intent(key, "t", guard=guard)
        assert intent.expected_version == m.version
        return intent

    @rule(target=captured, key=st.sampled_from(KEYS), version=st.integers(0, 6))
    def capture_at_any_version(self, key: str, version: int) -> Intent:
        return Intent.new(self.coll.name, key, version, "t")

    def predict(self, intent: Intent) -> str:
        m = self.model[str(intent.key)]
        if m is None:
            return "missing"
        if intent.root_id in self.applied:  # a derivation of an applied intent is one too
            return "duplicate"
        if intent.expected_version != m.version:
            return "stale"
        if intent.guard is not None and m.state.get("g") != intent.guard["g"]:
            return "stale"
        return "committed"

    def check(self, intent: Intent, want: str, state: dict[str, Any], out: Outcome) -> None:
        event(f"outcome {want}")
        assert out.kind == want, (intent, want, out)
        m = self.model[str(intent.key)]
        if want == "missing":
            assert isinstance(out, Missing)
            return
        assert m is not None
        if want == "committed":
            assert isinstance(out, Committed)
            m.version += 1
            m.state = state
            self.applied.add(intent.root_id)
        assert out.current is not None
        assert out.current.version == m.version
        assert dict(out.current.state) == m.state

    @rule(intent=captured, g=st.integers(0, 3))
    def commit(self, intent: Intent, g: int) -> None:
        want = self.predict(intent)
        state = {"g": g, "by": intent.id}
        self.check(intent, want, state, self.coll.commit(intent, state))

    @rule(batch=st.lists(captured, max_size=4), g=st.integers(0, 3))
    def commit_many(self, batch: list[Intent], g: int) -> None:
        items = [(i, {"g": g, "by": i.id}) for i in batch]
        if len({i.id for i in batch}) < len(batch):
            with pytest.raises(InvalidIntent):
                self.coll.commit_many(items)
            return  # refused as a whole: nothing written (the invariant checks)
        outs = self.coll.commit_many(items)
        assert len(outs) == len(items)
        for (intent, state), out in zip(items, outs, strict=True):
            self.check(intent, self.predict(intent), state, out)

    @rule(intent=captured, attempts=st.integers(0, 3))
    def apply(self, intent: Intent, attempts: int) -> None:
        decided: list[int] = []

        def decide(record: fencing.Record) -> dict[str, Any]:
            decided.append(record.version)
            return {"g": (record.state["g"] + 1) % 4, "by": "apply"}

        policy = Recompute(attempts=attempts, backoff=0) if attempts else fencing.Drop()
        first = self.predict(intent)
        target = intent
        if first == "stale" and attempts:
            # recomputed against the current record, committed as <root>~1; had the root
            # been applied, the probe would have said duplicate already
            target = intent.derive(0, 1)
            want = "committed"
        else:
            want = first
        m = self.model[str(intent.key)]
        new_state = {"g": (m.state["g"] + 1) % 4, "by": "apply"} if m is not None else {}
        out = self.coll.apply(intent, decide, on_stale=policy)
        assert out.kind == want, (intent, first, attempts, out)
        assert len(decided) == (1 if want == "committed" else 0)
        if want == "committed":
            assert out.intent is not None and out.intent.id == target.id
            assert m is not None and decided == [m.version]
        self.check(target, want, new_state, out)

    @rule(key=st.sampled_from(KEYS))
    def delete(self, key: str) -> None:
        assert self.coll.delete(key) is (self.model[key] is not None)
        self.model[key] = None

    @invariant()
    def records_match_the_model(self) -> None:
        for key, m in self.model.items():
            got = self.coll.get(key)
            if m is None:
                assert got is None
            else:
                assert got is not None
                assert (got.version, dict(got.state)) == (m.version, m.state)


def machine_settings(max_examples: int, steps: int) -> settings:
    return settings(
        settings.default,
        max_examples=min(settings.default.max_examples, max_examples),
        stateful_step_count=steps,
        deadline=None,
    )


def test_commits_follow_the_model(store: Any, backend_name: str, api: str) -> None:
    # The async API is the same backend behind a thinner front: fewer examples there.
    embedded = backend_name in ("memory", "sqlite-memory", "sqlite-file")
    examples = (60 if embedded else 15) if api == "sync" else 8
    run_state_machine_as_test(
        lambda: CommitMachine(store), settings=machine_settings(examples, steps=25)
    )


def test_recreated_record_refuses_intents_of_the_deleted_one(store: Any) -> None:
    orders = store.collection("orders")
    old = orders.create("o-1", {"status": "new"}).intent("ship")
    orders.delete("o-1")
    orders.create("o-1", {"status": "new order, same key"})
    out = orders.commit(old, {"status": "shipped"})
    assert not out.committed, out


def test_records_handed_out_do_not_share_state_with_the_store(store: Any) -> None:
    orders = store.collection("orders")
    created = orders.create("o-1", {"items": [1], "meta": {"tags": ["a"]}})
    created.state["items"].append("created")
    out = orders.commit(orders.intent("o-1", "x"), {"items": [2], "meta": {"tags": ["b"]}})
    assert isinstance(out, Committed)
    out.record.state["items"].append("committed")
    read = orders.get("o-1")
    read.state["meta"]["tags"].append("read")
    again = orders.get("o-1")
    assert again.version == 2
    assert dict(again.state) == {"items": [2], "meta": {"tags": ["b"]}}


def test_a_records_state_is_written_by_json_dumps_as_it_is(store: Any) -> None:
    """Every record a store hands out (created, committed, read, a table's row) has a
    state ``json.dumps`` takes, and that refuses a change in place."""
    orders = store.collection("orders")
    state = {"items": [1, {"sku": "a"}], "meta": {"tags": ["b"], "none": None}}
    created = orders.create("o-1", state)
    out = orders.commit(created.intent("x"), {**created.state, "status": "packed"})
    assert isinstance(out, Committed)
    read = orders.get("o-1")
    assert read is not None
    for record, expected in [
        (created, state),
        (out.record, {**state, "status": "packed"}),
        (read, {**state, "status": "packed"}),
    ]:
        assert json.loads(json.dumps(record.state)) == expected
        with pytest.raises(TypeError):
            record.state["status"] = "changed"


# -- leases and fenced commits against a model, on a fake store clock ---------------------------
class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Row:
    owner: str | None
    token: int
    expires_at: float

    def held(self, now: float) -> bool:
        return self.owner is not None and self.expires_at > now


@dataclass
class Rec:
    version: int = 1
    fence: int = 0
    by: int | None = None


LEASE_NAMES = ["L/a", "L/b"]
OWNERS = ["w1", "w2", "w3"]
TTLS = st.sampled_from([0.5, 1.0, 1.5, 3.0])
RECORDS = ["r0", "r1"]


class LeaseMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock()
        self.store = Store(
            MemoryBackend(clock=self.clock), "memory://", StoreOptions(1 << 20, 86400.0)
        )
        self.coll = self.store.collection("fenced")
        self.rows: dict[str, Row] = {}
        self.granted: dict[str, list[int]] = {n: [] for n in LEASE_NAMES}
        self.recs: dict[str, Rec] = {}
        self.handed: list[fencing.Lease] = []
        self.applied: set[str] = set()

    leases = Bundle("leases")
    old_intents = Bundle("old_intents")

    @initialize()
    def create(self) -> None:
        for key in RECORDS:
            self.coll.create(key, {"by": None})
            self.recs[key] = Rec()

    def _grant(self, name: str, owner: str, ttl: float) -> bool:
        row = self.rows.get(name)
        return row is None or not row.held(self.clock.now)

    def _granted(self, lease: fencing.Lease, name: str, owner: str, ttl: float) -> None:
        previous = self.rows.get(name)
        token = (previous.token if previous else 0) + 1
        assert lease.token == token
        assert all(lease.token > t for t in self.granted[name])  # strictly increasing
        assert lease.expires_at == self.clock.now + ttl
        assert (lease.name, lease.owner, lease.lost, lease.released) == (name, owner, False, False)
        self.rows[name] = Row(owner, token, self.clock.now + ttl)
        self.granted[name].append(token)
        self.handed.append(lease)

    @rule(target=leases, name=st.sampled_from(LEASE_NAMES), owner=st.sampled_from(OWNERS),
          ttl=TTLS)  # fmt: skip
    def acquire(self, name: str, owner: str, ttl: float) -> Any:
        if self._grant(name, owner, ttl):
            lease = self.store.acquire(name, owner=owner, ttl=ttl)
            self._granted(lease, name, owner, ttl)
            return lease
        row = self.rows[name]
        with pytest.raises(LeaseHeld) as info:
            self.store.acquire(name, owner=owner, ttl=ttl)
        assert info.value.holder == row.owner
        assert info.value.expires_in == pytest.approx(row.expires_at - self.clock.now)
        return multiple()

    @rule(target=leases, name=st.sampled_from(LEASE_NAMES), owner=st.sampled_from(OWNERS),
          ttl=TTLS)  # fmt: skip
    def try_acquire(self, name: str, owner: str, ttl: float) -> Any:
        granted = self._grant(name, owner, ttl)
        lease = self.store.try_acquire(name, owner=owner, ttl=ttl)
        if not granted:
            assert lease is None
            return multiple()
        assert lease is not None
        self._granted(lease, name, owner, ttl)
        return lease

    def _expect_lost(self, lease: fencing.Lease, was_lost: str | None, reason: str) -> None:
        assert lease.lost
        # the first reason sticks: a lease that expired and was then taken over stays "expired"
        assert lease.lost_reason == (was_lost or reason)

    @rule(lease=leases, ttl=st.none() | TTLS)
    def renew(self, lease: fencing.Lease, ttl: float | None) -> None:
        row = self.rows[lease.name]
        was_lost = lease.lost_reason
        if lease.released:
            with pytest.raises(LeaseLost):
                lease.renew(ttl)
            return
        if row.token == lease.token and row.held(self.clock.now):
            lease.renew(ttl)
            row.expires_at = self.clock.now + (lease.ttl if ttl is None else ttl)
            assert lease.expires_at == row.expires_at
        else:
            with pytest.raises(LeaseLost):
                lease.renew(ttl)
            newer = row.token != lease.token
            self._expect_lost(lease, was_lost, "newer_owner" if newer else "expired")

    @rule(lease=leases)
    def release(self, lease: fencing.Lease) -> None:
        row = self.rows[lease.name]
        was_lost = lease.lost_reason
        if lease.released:
            lease.release()  # a second release is a no-op
            return
        if row.token == lease.token and row.held(self.clock.now):
            lease.release()
            row.owner, row.expires_at = None, 0.0
        else:
            with pytest.raises(LeaseLost):
                lease.release()
            newer = row.token != lease.token
            self._expect_lost(lease, was_lost, "newer_owner" if newer else "expired")
        assert lease.released

    @rule(dt=st.sampled_from([0.25, 0.5, 1.0, 2.0]))
    def advance(self, dt: float) -> None:
        self.clock.now += dt

    def predict(self, intent: Intent, lease: fencing.Lease | None) -> tuple[str, Any]:
        rec = self.recs[str(intent.key)]
        if intent.root_id in self.applied:
            return "duplicate", None
        if lease is not None:
            row = self.rows[lease.name]
            if rec.fence > lease.token or row.token != lease.token:
                return "fenced", FenceReason.NEWER_OWNER
            if not row.held(self.clock.now):
                return "fenced", FenceReason.EXPIRED
        if intent.expected_version != rec.version:
            return "stale", None
        return "committed", None

    def commit(self, intent: Intent, lease: fencing.Lease | None) -> None:
        key = str(intent.key)
        want, reason = self.predict(intent, lease)
        by = None if lease is None else lease.token
        was_lost = None if lease is None else lease.lost_reason
        out = self.coll.commit(intent, {"by": by}, lease=lease)
        event(f"{'fenced' if lease else 'plain'} commit: {want} {reason or ''}")
        assert out.kind == want, (want, reason, out)
        rec = self.recs[key]
        if isinstance(out, Fenced):
            assert out.reason is reason
            assert lease is not None
            self._expect_lost(lease, was_lost, reason.value)
        if isinstance(out, Committed):
            rec.version += 1
            rec.fence = max(rec.fence, lease.token) if lease is not None else rec.fence
            rec.by = by
            self.applied.add(intent.root_id)
        assert isinstance(out, Committed | Stale | Duplicate | Fenced)
        assert out.current is not None
        assert (out.current.version, out.current.fence) == (rec.version, rec.fence)
        assert out.current.state["by"] == rec.by

    @rule(lease=leases, key=st.sampled_from(RECORDS))
    def fenced_commit(self, lease: fencing.Lease, key: str) -> None:
        self.commit(self.coll.intent(key, "w"), lease)

    @rule(key=st.sampled_from(RECORDS))
    def plain_commit(self, key: str) -> None:
        self.commit(self.coll.intent(key, "w"), None)

    @rule(target=old_intents, key=st.sampled_from(RECORDS))
    def capture(self, key: str) -> Intent:
        return self.coll.intent(key, "late")

    @rule(intent=old_intents, lease=leases)
    def late_fenced_commit(self, intent: Intent, lease: fencing.Lease) -> None:
        self.commit(intent, lease)

    @invariant()
    def at_most_one_holder(self) -> None:
        for name in LEASE_NAMES:
            holders = [
                lease
                for lease in self.handed
                if lease.name == name and not lease.released and lease.expires_at > self.clock.now
            ]
            assert len(holders) <= 1, holders
            row = self.rows.get(name)
            if holders:
                assert row is not None and row.token == holders[0].token
                assert row.held(self.clock.now)

    @invariant()
    def store_matches_the_model(self) -> None:
        backend = self.store.backend
        for name in LEASE_NAMES:
            answer = backend.lease_state(name)
            row = self.rows.get(name)
            if row is None:
                assert answer.row is None
            else:
                assert answer.row is not None
                got = (answer.row.owner, answer.row.token, answer.row.expires_at)
                assert got == (row.owner, row.token, row.expires_at)
        for key, rec in self.recs.items():
            record = self.coll.get(key)
            assert record is not None
            assert (record.version, record.fence, record.state["by"]) == (
                rec.version,
                rec.fence,
                rec.by,
            )

    def teardown(self) -> None:
        self.store.close()


def test_leases_and_fencing_follow_the_model() -> None:
    run_state_machine_as_test(
        LeaseMachine,
        settings=settings(
            settings.default,
            max_examples=min(settings.default.max_examples, 150),
            stateful_step_count=40,
            deadline=None,
        ),
    )
