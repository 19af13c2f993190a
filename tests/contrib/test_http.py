"""fencing.contrib.http without a server: the headers, the ETag, the plan a request comes
to, and the answer to each outcome (issue 22, item 3). The servers: test_http_servers.py."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import fencing
from fencing.contrib.http import (
    Answer,
    BadRequest,
    Conditional,
    HeaderError,
    IfMatch,
    Plan,
    parse_idempotency_key,
    parse_if_match,
)

SIGNER = fencing.Signer({"k1": b"k1-secret-0123456789abcdef"}, current="k1")
memory_only = pytest.mark.backends(only=lambda n: n == "memory")


def merge(record: fencing.Record, body: Any) -> dict[str, Any]:
    return {**record.state, **body}


@pytest.fixture
def orders() -> Any:
    store = fencing.open("memory://")
    orders = store.collection("orders")
    orders.create("o-1", {"status": "new"})
    orders.create("o-2", {"status": "new"})
    yield orders
    store.close()


# -- headers ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("value", "parsed"),
    [
        (None, None),
        ([], None),
        ("*", IfMatch(any=True)),
        (" * ", IfMatch(any=True)),
        ('"v1"', IfMatch(tags=((False, "v1"),))),
        ('W/"v1"', IfMatch(tags=((True, "v1"),))),
        ('"v1", W/"v2" ,,"a,b"', IfMatch(tags=((False, "v1"), (True, "v2"), (False, "a,b")))),
        (['"v1"', '"v2"'], IfMatch(tags=((False, "v1"), (False, "v2")))),  # two header lines
        ('""', IfMatch(tags=((False, ""),))),
        (",".join(['"v1"'] * 64), IfMatch(tags=((False, "v1"),) * 64)),
    ],
)
def test_if_match_parses_as_rfc_9110_says(value: Any, parsed: IfMatch | None) -> None:
    assert parse_if_match(value) == parsed


@pytest.mark.parametrize(
    "value",
    ["v1", '"v1" x', '"v1', ",", "", '"v1" "v2"', 'w/"v1"', "*, *", ",".join(['"v1"'] * 65)],
)
def test_a_malformed_if_match_is_refused(value: str) -> None:
    with pytest.raises(HeaderError, match="If-Match"):
        parse_if_match(value)


@pytest.mark.parametrize(
    ("value", "key"),
    [
        (None, None),
        ('"8e03978e-40d5"', "8e03978e-40d5"),
        (' "a b" ', "a b"),
        (r'"say \"hi\" \\ o"', 'say "hi" \\ o'),
        ("bare-token_1", "bare-token_1"),
        ('"' + "x" * 255 + '"', "x" * 255),
    ],
)
def test_an_idempotency_key_is_a_structured_string_or_a_bare_token(
    value: str | None, key: str | None
) -> None:
    assert parse_idempotency_key(value) == key


@pytest.mark.parametrize(
    "value",
    ['""', '"' + "x" * 256 + '"', '"a" b', '"a', r'"a\n"', '"é"', "a b", "a,b", '"a"b"', "\t"],
)
def test_a_malformed_idempotency_key_is_refused(value: str) -> None:
    with pytest.raises(HeaderError, match="Idempotency-Key"):
        parse_idempotency_key(value)


# -- ETags -----------------------------------------------------------------------------
def test_an_unsigned_etag_is_the_version(orders: Any) -> None:
    cond = Conditional(orders, "edit")
    assert cond.etag(orders.get("o-1")) == '"v1"'
    assert cond.version_of("o-1", "v7") == 7
    assert cond.version_of("o-1", "v0") == 0
    assert cond.version_of("o-1", f"v{2**63 - 1}") == 2**63 - 1
    for other in ("v07", "7", "V7", "v", "v7.k1.x", "v-1", "v" + "9" * 20, f"v{2**63}"):
        assert cond.version_of("o-1", other) is None, other


def test_a_signed_etag_names_its_version_for_its_record_only(orders: Any) -> None:
    cond = Conditional(orders, "edit", signer=SIGNER)
    tag = cond.etag(orders.get("o-1"))
    assert tag.startswith('"v1.k1.') and tag.endswith('"')
    opaque = tag.strip('"')
    assert cond.version_of("o-1", opaque) == 1
    assert cond.version_of("o-2", opaque) is None  # another record's
    assert cond.version_of("o-1", "v1") is None  # unsigned
    assert cond.version_of("o-1", opaque.replace("v1.", "v2.")) is None  # another version
    # another collection's record of the same key and version
    store = orders._store
    assert (
        Conditional(store.collection("carts"), "edit", signer=SIGNER).version_of("o-1", opaque)
        is None
    )
    # verified with any key the signer holds: a rotated signer reads the old tags
    rotated = fencing.Signer({"k1": b"k1-secret-0123456789abcdef", "k2": b"k2" * 8}, current="k2")
    assert Conditional(orders, "edit", signer=rotated).version_of("o-1", opaque) == 1


# -- plans -----------------------------------------------------------------------------
def test_a_required_precondition_missing_is_428(orders: Any) -> None:
    cond = Conditional(orders, "edit")
    for header in (None, "*"):
        answer = cond.plan("o-1", if_match=header, body={})
        assert isinstance(answer, Answer) and answer.status == 428
        assert answer.media_type == "application/problem+json"
        assert answer.body["status"] == 428
    assert isinstance(Conditional(orders, "edit", allow_any=True).plan("o-1", if_match="*"), Plan)
    assert isinstance(Conditional(orders, "edit", require=False).plan("o-1", if_match=None), Plan)
    star = Conditional(orders, "edit", require=False).plan("o-1", if_match="*")
    assert isinstance(star, Answer) and star.status == 428  # '*' is a blind write


def test_one_tag_is_an_intent_at_its_version_for_the_routes_record_and_transition(
    orders: Any,
) -> None:
    cond = Conditional(orders, "edit", signer=SIGNER)
    tag = cond.etag(orders.get("o-1"))
    plan = cond.plan("o-1", if_match=f'W/"v9", {tag}', idempotency_key='"k"', body={"a": 1})
    assert isinstance(plan, Plan) and plan.intent is not None and plan.client_version
    intent = plan.intent
    assert (intent.collection, intent.key, intent.transition) == ("orders", "o-1", "edit")
    assert intent.expected_version == 1 and intent.kind == "collection"
    assert intent.id == plan.intent_id == cond.intent_id("o-1", "k", {"a": 1}, None)
    fresh = cond.plan("o-1", if_match=tag, body={"a": 1})
    assert isinstance(fresh, Plan) and fresh.intent is not None and fresh.intent_id is None
    assert fresh.intent.id != intent.id


@pytest.mark.parametrize(
    ("if_match", "idem", "status"),
    [('"v1', None, 400), ('"v1"', '"a', 400), ('"v1"', None, 404)],
)
def test_a_malformed_header_is_400_and_an_impossible_key_404(
    orders: Any, if_match: str, idem: str | None, status: int
) -> None:
    key = "o-1" if status == 400 else "x" * 513
    answer = Conditional(orders, "edit").plan(key, if_match=if_match, idempotency_key=idem)
    assert isinstance(answer, Answer) and answer.status == status
    wrong_type = Conditional(orders, "edit").plan(1, if_match='"v1"')
    assert isinstance(wrong_type, Answer) and wrong_type.status == 404


def test_the_intent_id_names_the_key_with_record_transition_client_and_body(orders: Any) -> None:
    cond = Conditional(orders, "edit")
    base = cond.intent_id("o-1", "k", {"a": 1, "b": [1, 2]}, None)
    assert base.startswith("http.") and len(base) == 45
    assert cond.intent_id("o-1", "k", {"b": [1, 2], "a": 1}, None) == base  # same JSON
    others = {
        cond.intent_id("o-2", "k", {"a": 1, "b": [1, 2]}, None),
        cond.intent_id("o-1", "k2", {"a": 1, "b": [1, 2]}, None),
        cond.intent_id("o-1", "k", {"a": 2, "b": [1, 2]}, None),
        cond.intent_id("o-1", "k", {"a": 1, "b": [1, 2]}, "alice"),
        Conditional(orders, "ship").intent_id("o-1", "k", {"a": 1, "b": [1, 2]}, None),
    }
    assert base not in others and len(others) == 5
    with pytest.raises(fencing.InvalidInput, match="not JSON"):
        cond.intent_id("o-1", "k", {"a": object()}, None)


def test_a_target_function_is_called_once_on_first_use(orders: Any) -> None:
    calls: list[int] = []

    def later() -> Any:
        calls.append(1)
        return orders

    cond = Conditional(later, "edit")
    assert calls == []  # an async store may not be open yet
    assert cond.get("o-1").status == 200 and cond.get("o-2").status == 200
    assert calls == [1] and cond.target is orders
    wrong = Conditional(lambda: "orders", "edit")
    with pytest.raises(fencing.ConfigurationError, match="returned a str"):
        wrong.get("o-1")


def test_a_route_needs_a_store_target_with_versions(orders: Any, tmp_path: Any) -> None:
    with pytest.raises(fencing.ConfigurationError, match="collection or table"):
        Conditional(object(), "edit")
    with pytest.raises(fencing.ConfigurationError, match="Signer"):
        Conditional(orders, "edit", signer=b"secret")  # type: ignore[arg-type]
    with pytest.raises(fencing.InvalidIdentifier):
        Conditional(orders, "no spaces")
    store = fencing.open(f"sqlite:///{tmp_path / 't.db'}")
    try:
        store.backend.conn.execute("CREATE TABLE carts (id INTEGER PRIMARY KEY, status TEXT)")
        carts = store.table("carts", key="id", version=None)
        with pytest.raises(fencing.ConfigurationError, match="no version column"):
            Conditional(carts, "edit")
        with pytest.raises(fencing.ConfigurationError, match="no version column"):
            Conditional(lambda: carts, "edit").get(1)
    finally:
        store.close()


# -- answers ---------------------------------------------------------------------------
def record(version: int, **state: Any) -> fencing.Record:
    return fencing.Record("orders", "o-1", version, 0, state)


@pytest.fixture
def plan(orders: Any) -> Plan:
    found = Conditional(orders, "edit").plan("o-1", if_match='"v1"', idempotency_key="k")
    assert isinstance(found, Plan)
    return found


def test_each_outcome_is_answered_with_its_status(orders: Any, plan: Plan) -> None:
    cond = Conditional(orders, "edit", retry_after=7)
    at2 = record(2, status="packed")
    cases: list[tuple[fencing.Outcome, int, Any]] = [
        (fencing.Committed(at2), 200, {"status": "packed"}),
        (fencing.Skipped(at2), 200, {"status": "packed"}),
        (fencing.Stale(at2), 412, {"status": "packed"}),
        (fencing.Fenced(at2, fencing.FenceReason.NEWER_OWNER), 409, {"status": "packed"}),
    ]
    for outcome, status, body in cases:
        answer = cond.answer(outcome, plan)
        assert (answer.status, answer.body, answer.header("etag")) == (status, body, '"v2"')
    for outcome in (fencing.Fenced(at2, fencing.FenceReason.EXPIRED), fencing.Contended(at2, 3)):
        answer = cond.answer(outcome, plan)
        assert answer.status == 503 and answer.header("Retry-After") == "7"
        assert answer.header("ETag") is None and answer.body["status"] == 503
    assert cond.answer(fencing.Missing(), plan).status == 404
    assert cond.answer(fencing.Skipped(None), plan).status == 404
    no_content = Conditional(orders, "edit", no_content=True)
    answer = no_content.answer(fencing.Committed(at2), plan)
    assert (answer.status, answer.body, answer.content()) == (204, None, b"")
    assert answer.header("ETag") == '"v2"'


def test_a_duplicate_is_answered_as_the_first_time(orders: Any, plan: Plan) -> None:
    cond = Conditional(orders, "edit")
    first = cond.answer(fencing.Committed(record(2, status="packed")), plan)
    assert cond.answer(fencing.Duplicate(record(2, status="packed")), plan) == first
    # the record moved on since: a 200 shows it as it is now, as a GET would
    moved = cond.answer(fencing.Duplicate(record(3, status="shipped")), plan)
    assert (moved.status, moved.body, moved.header("ETag")) == (200, {"status": "shipped"}, '"v3"')
    # a 204 names the version the write made, always
    quiet = Conditional(orders, "edit", no_content=True)
    first = quiet.answer(fencing.Committed(record(2, status="packed")), plan)
    assert quiet.answer(fencing.Duplicate(record(3, status="shipped")), plan) == first
    # unless the client listed several versions: which one it made is not known
    listed = Plan("o-1", None, plan.intent, plan.intent_id, frozenset({1, 2}), True)
    later = quiet.answer(fencing.Duplicate(record(3, status="shipped")), listed)
    assert later.header("ETag") == '"v3"'


def test_canonical_json_bodies() -> None:
    assert Answer(200, (), {"b": 1, "a": "é"}).content() == '{"a":"é","b":1}'.encode()


# -- the drivers on a store -------------------------------------------------------------
def test_a_read_answers_200_304_and_404(orders: Any) -> None:
    cond = Conditional(orders, "edit", signer=SIGNER)
    shown = cond.get("o-1")
    tag = shown.header("ETag")
    assert shown.status == 200 and shown.body == {"status": "new"} and tag is not None
    for header in (tag, "W/" + tag, f'"x", {tag}', "*"):
        cached = cond.get("o-1", if_none_match=header)
        assert (cached.status, cached.body, cached.headers) == (304, None, (("ETag", tag),))
    assert cond.get("o-1", if_none_match='"v1"').status == 200
    assert cond.get("o-1", if_none_match='"v1').status == 400
    assert cond.get("nope").status == 404


@memory_only
def test_without_if_match_the_server_reads_the_version_and_a_retry_is_a_duplicate(
    store: Any,
) -> None:
    orders = store.collection("orders")
    orders.create("o-1", {"n": 0})
    cond = Conditional(orders, "count", update=lambda r, b: {"n": r.state["n"] + 1}, require=False)
    first = cond.write("o-1", if_match=None, idempotency_key="once", body=None)
    again = cond.write("o-1", if_match=None, idempotency_key="once", body=None)
    assert first.status == again.status == 200 and first == again and first.body == {"n": 1}
    other = cond.write("o-1", if_match=None, idempotency_key="twice", body=None)
    assert other.body == {"n": 2} and other.header("ETag") == '"v3"'
    assert cond.write("nope", if_match=None, body=None).status == 404


@memory_only
def test_a_list_of_tags_commits_at_the_listed_current_one(store: Any) -> None:
    orders = store.collection("orders")
    orders.create("o-1", {"n": 0})
    orders.commit(orders.intent("o-1", "bump"), {"n": 1})  # now at version 2
    cond = Conditional(orders, "edit", update=merge)
    assert cond.write("o-1", if_match='"v1", "v2"', body={"a": 1}).status == 200
    stale = cond.write("o-1", if_match='"v1", "v2"', body={"a": 2})
    assert (stale.status, stale.header("ETag"), stale.body) == (412, '"v3"', {"n": 1, "a": 1})
    assert cond.write("o-1", if_match='W/"v3", "x"', body={"a": 3}).status == 412
    assert orders.get("o-1").version == 3


@memory_only
def test_a_server_read_version_follows_on_stale_up_to_contended(store: Any) -> None:
    orders = store.collection("orders")
    orders.create("o-1", {"n": 0})

    def racing(record: fencing.Record, body: Any) -> dict[str, Any]:
        orders.commit(orders.intent("o-1", "race"), {"n": -1})  # every decision goes stale
        return {"n": 1}

    cond = Conditional(
        orders, "edit", update=racing, require=False, on_stale=fencing.Recompute(attempts=2)
    )
    answer = cond.write("o-1", if_match=None, body=None)
    assert answer.status == 503 and answer.header("Retry-After") == "1"
    # a client's version is final: no recompute behind its back
    cond.on_stale = fencing.Recompute(attempts=5)
    tag = cond.etag(orders.get("o-1"))
    assert cond.write("o-1", if_match=tag, body=None).status == 412


def test_the_async_driver() -> None:
    async def main() -> None:
        store = await fencing.open_async("memory://")
        orders = store.collection("orders")
        await orders.create("o-1", {"status": "new"})
        cond = Conditional(orders, "edit", update=merge, signer=SIGNER)
        shown = await cond.aget("o-1")
        assert shown.status == 200
        tag = shown.header("ETag")
        first = await cond.awrite("o-1", if_match=tag, idempotency_key="k", body={"a": 1})
        again = await cond.awrite("o-1", if_match=tag, idempotency_key="k", body={"a": 1})
        assert first == again and first.body == {"status": "new", "a": 1}
        assert (await cond.awrite("o-1", if_match=tag, body={"a": 2})).status == 412
        assert (await cond.awrite("o-1", if_match=None, body={})).status == 428
        star = Conditional(orders, "edit", allow_any=True)
        assert (await star.awrite("o-1", if_match="*", body={"b": 1})).status == 200
        await store.close()

    asyncio.run(main())


def test_a_request_the_client_must_change_is_400_and_an_unknown_outcome_503(
    orders: Any,
) -> None:
    tag = '"v1"'
    replace = Conditional(orders, "edit")
    assert replace.write("o-1", if_match=tag, body=[1, 2]).status == 400  # not an object
    assert replace.write("o-1", if_match=tag, body={"x": "y" * 2_000_000}).status == 400  # oversize

    def picky(record: fencing.Record, body: Any) -> dict[str, Any]:
        raise BadRequest("carrier must be dhl or ups")

    answer = Conditional(orders, "edit", update=picky).write("o-1", if_match=tag, body={})
    assert answer.status == 400 and answer.body["detail"] == "carrier must be dhl or ups"
    assert orders.get("o-1").version == 1
    unknown = replace.failed(fencing.TransientStoreError("connection dropped"))
    assert unknown.status == 503 and unknown.header("Retry-After") == "1"
    with pytest.raises(ZeroDivisionError):
        replace.failed(ZeroDivisionError())
    assert replace.get("x" * 513).status == 404
    assert replace.get(7).status == 404


@pytest.mark.backends(only=lambda n: n in {"memory", "sqlite-file"})
def test_a_guarded_table_row_is_edited_by_its_version(make_table: Any) -> None:
    rows = make_table("orders_t", [{"id": 42, "status": "new", "total": 5}])
    cond = Conditional(rows, "edit", update=lambda r, b: b, signer=SIGNER)
    shown = cond.get(42)
    tag = shown.header("ETag")
    assert shown.status == 200 and shown.body["status"] == "new" and tag.startswith('"v1.k1.')
    done = cond.write(42, if_match=tag, idempotency_key="k", body={"status": "packed"})
    assert done.status == 200 and done.body["status"] == "packed"
    assert cond.write(42, if_match=tag, idempotency_key="k", body={"status": "packed"}) == done
    stale = cond.write(42, if_match=tag, body={"status": "lost"})
    assert stale.status == 412 and stale.header("ETag") == done.header("ETag")
    # the collection's tag of the same key and version is not this table's
    collection = Conditional(rows._store.collection("orders_t"), "edit", signer=SIGNER)
    assert collection.version_of(42, tag.strip('"')) is None  # kind: table
    assert cond.version_of(42, tag.strip('"')) == 1
