"""The history checker on hand-made histories, the recorder on a real store, and the format."""

from __future__ import annotations

import json
import multiprocessing
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import fencing
from fencing.testing import (
    ANOMALY_KINDS,
    HistoryError,
    HistoryWriter,
    MemoryHistory,
    Recorder,
    Report,
    check_file,
    check_history,
    write_final,
)

Event = dict[str, Any]


def commit(
    version: int,
    *,
    key: str | int = "k",
    expected: int | None = -1,
    over: int | None = None,
    intent: str | None = None,
    root: str | None = None,
    token: int | None = None,
    collection: str = "c",
) -> Event:
    """A committed outcome; by default a correct guarded write over ``version - 1``."""
    over = version - 1 if over is None else over
    intent_id = intent or f"i-{collection}-{key}-{version}-{token}"
    event: Event = {
        "event": "outcome",
        "t": 0.0,
        "worker": "w",
        "collection": collection,
        "key": key,
        "intent_id": intent_id,
        "transition": "t",
        "expected_version": version - 1 if expected == -1 else expected,
        "outcome": "committed",
        "version": version,
        "applied_over": over,
        "token": token,
        "fence": token or 0,
    }
    if root is not None:
        event["root_id"] = root
    return event


def refused(outcome: str, version: int, *, key: str | int = "k", intent: str = "r") -> Event:
    return {
        "event": "outcome",
        "collection": "c",
        "key": key,
        "intent_id": intent,
        "expected_version": version - 1,
        "outcome": outcome,
        "version": version,
        "applied_over": None,
        "token": None,
        "fence": 0,
    }


def final(version: int | None, *, key: str | int = "k", collection: str = "c") -> Event:
    return {
        "event": "final",
        "collection": collection,
        "key": key,
        "version": version,
        "fence": 0,
        "state": {},
    }


def only(report: Report, **expected: int) -> None:
    """The report's anomaly counts are exactly ``expected`` (others zero)."""
    want = {kind: expected.get(kind, 0) for kind in ANOMALY_KINDS}
    assert report.counts == want, [a.message for found in report.anomalies.values() for a in found]


# -- each anomaly kind on a hand-made history ------------------------------------------
def test_clean_history_passes() -> None:
    events = [
        commit(2, token=1),
        refused("stale", 2, intent="late"),
        commit(3, token=1),
        refused("duplicate", 3, intent="i-c-k-3-1"),
        refused("fenced", 3, intent="zombie"),
        commit(4),  # no lease: the chain keeps the highest token seen
        commit(5, token=4),
        {"event": "lease", "name": "c/k", "action": "acquire", "token": 4, "owner": "w"},
        refused("missing", 0, key="gone"),
        final(5),
    ]
    report = check_history(events)
    assert report.ok and report.total == 0
    only(report)
    assert report.events == len(events) and report.keys == 2 and report.leases == 1
    assert report.outcomes["committed"] == 4
    assert report.outcomes["stale"] == report.outcomes["duplicate"] == 1
    assert report.outcomes["fenced"] == report.outcomes["missing"] == 1
    assert "no anomaly" in report.summary()


def test_empty_history_is_clean() -> None:
    report = check_history([])
    assert report.ok and report.events == 0 and report.keys == 0


def test_stale_write() -> None:
    # v3 was decided against v1 but replaced v2: a stale write, and v2's update is lost
    events = [commit(2), commit(3, expected=1, over=2), final(3)]
    report = check_history(events)
    only(report, stale_write=1, lost_update=1)
    stale = report.anomalies["stale_write"][0]
    assert stale.lines == (2,) and stale.events[0]["version"] == 3
    assert "decided against v1, applied over v2" in stale.message
    assert report.anomalies["lost_update"][0].events[0]["version"] == 2


def test_lost_update_two_commits_produce_the_same_version() -> None:
    events = [commit(2, intent="a"), commit(2, intent="b"), commit(3), final(3)]
    report = check_history(events)
    only(report, lost_update=1)
    lost = report.anomalies["lost_update"][0]
    assert "2 commits produced v2" in lost.message
    assert lost.lines == (1, 4)  # the lost commit and the final event


def test_lost_update_final_version_below_an_acknowledged_one() -> None:
    events = [commit(2), commit(3), commit(4), final(3)]
    report = check_history(events)
    only(report, lost_update=1)
    lost = report.anomalies["lost_update"][0]
    assert lost.events[0]["version"] == 4 and "rolled back" in lost.message


def test_lost_update_version_not_reachable() -> None:
    # v5 was decided against v3 (and recorded as replacing v3): v4 is not in the chain
    events = [commit(2), commit(3), commit(4), commit(5, expected=3, over=3), final(5)]
    report = check_history(events)
    only(report, lost_update=1)
    assert report.anomalies["lost_update"][0].events[0]["version"] == 4


def test_lost_updates_are_counted_per_commit() -> None:
    events = [commit(v) for v in range(2, 7)] + [final(3)]
    only(check_history(events), lost_update=3)


def test_without_a_final_event_the_highest_version_is_the_head() -> None:
    only(check_history([commit(2), commit(3), commit(4)]))
    only(check_history([commit(2), commit(3), commit(4, expected=2)]), stale_write=1, lost_update=1)


def test_deleted_record_is_not_traced() -> None:
    only(check_history([commit(2), commit(3), final(None)]))


def test_double_applied() -> None:
    events = [
        commit(2, intent="x"),
        commit(3, intent="x~1"),  # a derived intent shares its root (from the id)
        commit(4, intent="y"),
        commit(5, intent="z~2", root="y"),  # an explicit root_id
        commit(6, intent="y~3", root="y"),
        final(6),
    ]
    report = check_history(events)
    only(report, double_applied=2)
    by_root = {a.message.split()[1]: a for a in report.anomalies["double_applied"]}
    assert by_root["x"].lines == (1, 2)
    assert by_root["y"].lines == (3, 4, 5) and "3 times" in by_root["y"].message


def test_same_intent_on_different_keys_is_not_double_applied() -> None:
    events = [commit(2, key="a", intent="x"), commit(2, key="b", intent="x")]
    only(check_history(events))


def test_fence_regression() -> None:
    events = [commit(2, token=5), commit(3, token=3), final(3)]
    report = check_history(events)
    only(report, fence_regression=1)
    found = report.anomalies["fence_regression"][0]
    assert found.lines == (1, 2) and found.message == "token 3 wrote v3 after token 5 wrote v2"


def test_fence_regression_across_writes_without_a_lease() -> None:
    events = [commit(2, token=5), commit(3), commit(4), commit(5, token=2), commit(6, token=7)]
    only(check_history(events), fence_regression=1)


def test_increasing_and_equal_tokens_are_fine() -> None:
    events = [commit(2, token=1), commit(3, token=1), commit(4, token=2), commit(5, token=9)]
    only(check_history(events))


def test_zombie_overwrite_as_a_naive_writer_records_it() -> None:
    # the new owner (token 6) wrote v3; the zombie (token 5) read v2, paused, and then
    # wrote unconditionally over v3: what a naive writer's history shows
    events = [
        commit(2, token=5, intent="a"),
        commit(3, token=6, intent="b"),
        commit(4, token=5, intent="c", expected=2, over=3),
        final(4),
    ]
    report = check_history(events)
    only(report, fence_regression=1, stale_write=1, lost_update=1)
    assert report.anomalies["lost_update"][0].events[0]["intent_id"] == "b"


def test_out_of_order_recording_is_still_clean() -> None:
    # several processes append after their commit returned: the file order can differ
    events = [commit(3, token=2), commit(2, token=1), commit(5, token=3), commit(4, token=3)]
    only(check_history([*events, final(5)]))


def test_keys_are_judged_separately_and_int_keys_differ_from_strings() -> None:
    events = [commit(2, key=1), commit(2, key="1"), final(2, key=1), final(2, key="1")]
    report = check_history(events)
    only(report)
    assert report.keys == 2


def test_tables_without_versions_are_judged_for_double_apply_only() -> None:
    events = [
        {**commit(2, intent="x"), "version": None, "applied_over": None},
        {**commit(2, intent="x"), "version": None, "applied_over": None},
    ]
    only(check_history(events), double_applied=1)


def test_report_to_dict_is_json_with_limited_examples() -> None:
    events = [commit(2, intent=f"x~{n}") for n in range(10)]
    report = check_history(events)
    data = json.loads(json.dumps(report.to_dict(examples=2)))
    assert data["ok"] is False
    assert data["anomalies"]["lost_update"] == 9 and data["anomalies"]["double_applied"] == 1
    assert len(data["examples"]["lost_update"]) == 2
    assert set(data["anomalies"]) == set(ANOMALY_KINDS)
    assert "9 lost update" in report.summary()


# -- malformed input -------------------------------------------------------------------
@pytest.mark.parametrize(
    ("event", "problem"),
    [
        ("not a dict", "must be a JSON object"),
        ({"event": "nope"}, "'event' must be one of"),
        ({**commit(2), "outcome": "won"}, "'outcome' must be one of"),
        ({k: v for k, v in commit(2).items() if k != "key"}, "'key' is missing"),
        ({**commit(2), "key": True}, "'key' must be a string or an integer"),
        ({**commit(2), "key": 1.5}, "'key' must be a string or an integer"),
        ({**commit(2), "collection": ""}, "'collection' must be a non-empty string"),
        ({**commit(2), "intent_id": None}, "'intent_id' must be a non-empty string"),
        ({**commit(2), "root_id": 3}, "'root_id' must be a non-empty string"),
        ({**commit(2), "version": "2"}, "'version' must be an integer"),
        ({**commit(2), "token": 1.0}, "'token' must be an integer"),
        ({**commit(2), "expected_version": False}, "'expected_version' must be an integer"),
        ({**commit(2), "applied_over": None}, "needs 'applied_over'"),
        ({**commit(2), "version": None}, "needs its 'version'"),
        ({**commit(2), "t": "noon"}, "'t' must be a finite number"),
        ({"event": "lease", "name": "n", "action": "steal", "token": 1}, "lease 'action'"),
        ({"event": "lease", "name": "n", "action": "acquire"}, "integer 'token'"),
        ({"event": "error", "collection": "c", "key": "k"}, "'intent_id'"),
        ({**final(2), "version": 2.5}, "'version' must be an integer"),
    ],
)
def test_malformed_event_names_its_line(event: object, problem: str) -> None:
    with pytest.raises(HistoryError, match=f"line 3: .*{problem}"):
        check_history([commit(2), commit(3), event])  # type: ignore[list-item]


def test_a_second_final_event_for_a_key_is_refused() -> None:
    with pytest.raises(HistoryError, match="line 2: a second 'final'"):
        check_history([final(2), final(3)])


def test_history_error_is_a_fencing_input_error() -> None:
    assert issubclass(HistoryError, fencing.InvalidInput)
    assert issubclass(HistoryError, fencing.FencingError)


def _write_lines(path: Path, lines: list[str]) -> None:
    path.write_text("".join(line + "\n" for line in lines))


def test_check_file_reads_jsonl_and_skips_blank_lines(tmp_path: Path) -> None:
    path = tmp_path / "h.jsonl"
    _write_lines(path, [json.dumps(commit(2)), "", "   ", json.dumps(final(2))])
    report = check_file(path)
    assert report.ok and report.events == 2


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ("{not json", "not JSON"),
        ('{"event": "final", "version": NaN}', "not JSON"),
        ("[1, 2]", "must be a JSON object"),
        (json.dumps({**commit(3), "outcome": "yes"}), "'outcome' must be one of"),
    ],
)
def test_check_file_malformed_line(tmp_path: Path, line: str, problem: str) -> None:
    path = tmp_path / "h.jsonl"
    _write_lines(path, [json.dumps(commit(2)), "", line, json.dumps(final(3))])
    with pytest.raises(HistoryError, match=f"h.jsonl: line 3: .*{problem}"):
        check_file(path)


def test_check_file_invalid_utf8(tmp_path: Path) -> None:
    path = tmp_path / "h.jsonl"
    path.write_bytes(json.dumps(final(2)).encode() + b"\n\xff\xfe\n")
    with pytest.raises(HistoryError, match="line 2: not JSON"):
        check_file(path)


# -- scale: linear by construction -------------------------------------------------------
def test_checker_handles_200k_events() -> None:
    n = 200_000

    def events() -> Iterator[Event]:
        # one key with a 100k-long chain (no recursion anywhere), and 1000 short keys
        for v in range(2, 100_002):
            yield commit(v, token=v // 1000)
        for i in range(99_000):
            key = f"k{i % 1000}"
            yield commit(2 + i // 1000, key=key)
        yield final(100_001)
        for i in range(999):
            yield final(100, key=f"k{i}")

    report = check_history(events())
    assert report.events == n and report.keys == 1001
    assert report.ok, report.summary()
    # a zombie write at the end of a long chain is found
    chain = [commit(v, token=v // 100) for v in range(2, 20_002)]
    dirty = check_history([*chain, commit(20_002, token=3), final(20_001)])
    assert dirty.counts["fence_regression"] == 1
    assert dirty.counts["lost_update"] == 1  # version 20002 is above the final 20001


# -- hypothesis: a correct model is clean; one injected anomaly is always found ----------
Op = tuple[str, int, int]


@st.composite
def correct_histories(draw: st.DrawFn) -> tuple[list[Event], dict[str, int], dict[str, int]]:
    """A history produced by a correct guarded store, plus each key's version and token."""
    keys = ["a", "b", "c"][: draw(st.integers(1, 3))]
    version = dict.fromkeys(keys, 1)
    token = dict.fromkeys(keys, 0)
    committed: dict[str, list[str]] = {k: [] for k in keys}
    events: list[Event] = []
    ops = draw(
        st.lists(
            st.tuples(
                st.sampled_from(["commit", "leased", "stale", "duplicate", "fenced"]),
                st.integers(0, len(keys) - 1),
                st.integers(0, 3),
            ),
            max_size=40,
        )
    )
    for n, (op, k, bump) in enumerate(ops):
        key = keys[k]
        if op in ("commit", "leased"):
            lease: int | None = None
            if op == "leased":
                token[key] += bump  # tokens never go backwards
                lease = token[key]
            version[key] += 1
            intent = f"i{n}~{bump}" if bump else f"i{n}"
            committed[key].append(intent)
            events.append(commit(version[key], key=key, intent=intent, token=lease))
        elif op == "duplicate" and committed[key]:
            events.append(refused("duplicate", version[key], key=key, intent=committed[key][-1]))
        elif op in ("stale", "fenced"):
            events.append(refused(op, version[key], key=key, intent=f"r{n}"))
    return events, version, token


def _with_finals(events: list[Event], versions: dict[str, int]) -> list[Event]:
    return [*events, *(final(v, key=k) for k, v in versions.items())]


@given(correct_histories())
def test_correct_model_histories_are_clean(
    history: tuple[list[Event], dict[str, int], dict[str, int]],
) -> None:
    events, versions, _ = history
    report = check_history(_with_finals(events, versions))
    assert report.ok, report.summary()


@given(
    correct_histories(),
    st.sampled_from(["stale_write", "lost_rollback", "lost_collision", "double", "fence"]),
    st.data(),
)
def test_one_injected_anomaly_is_always_detected(
    history: tuple[list[Event], dict[str, int], dict[str, int]],
    injection: str,
    data: st.DataObject,
) -> None:
    events, versions, tokens = history
    key = data.draw(st.sampled_from(sorted(versions)))
    f = versions[key]
    extra: list[Event] = []
    kind = {"lost_rollback": "lost_update", "lost_collision": "lost_update"}.get(injection)
    if injection == "stale_write":
        kind = "stale_write"
        versions[key] = f + 1
        extra = [commit(f + 1, key=key, intent="inj", expected=f - 1, over=f)]
    elif injection == "lost_rollback":
        extra = [commit(f + 1, key=key, intent="inj")]  # acknowledged, but the final stays f
    elif injection == "lost_collision":
        extra = [commit(f, key=key, intent="inj")]  # a second commit producing version f
        if f == 1:  # version 1 is the created record: make the collision between two commits
            versions[key] = 2
            extra = [commit(2, key=key, intent="inj0"), commit(2, key=key, intent="inj")]
    elif injection == "double":
        kind = "double_applied"
        versions[key] = f + 2
        extra = [commit(f + 1, key=key, intent="dup"), commit(f + 2, key=key, intent="dup~1")]
    else:
        kind = "fence_regression"
        high = tokens[key] + 2
        versions[key] = f + 2
        extra = [commit(f + 1, key=key, token=high), commit(f + 2, key=key, token=high - 1)]
    assert kind is not None
    at = data.draw(st.integers(0, len(events)))
    report = check_history(_with_finals(events[:at] + extra + events[at:], versions))
    assert not report.ok
    assert report.counts[kind] == 1, report.summary()


# -- the recorder on a real store ----------------------------------------------------------
@pytest.fixture
def sqlite_store(tmp_path: Path) -> Iterator[fencing.Store]:
    store = fencing.open(f"sqlite:///{tmp_path / 'rec.db'}")
    yield store
    store.close()


def test_recorder_records_each_outcome_and_the_history_is_clean(
    sqlite_store: fencing.Store,
) -> None:
    orders = sqlite_store.collection("orders")
    orders.create("o-1", {"n": 0})
    orders.create("o-2", {"n": 0})
    sink = MemoryHistory()
    rec = Recorder(orders, sink, worker="w1")
    first = rec.intent("o-1", "bump")
    assert rec.commit(first, {"n": 1}).committed
    assert isinstance(rec.commit(first, {"n": 1}), fencing.Duplicate)
    late = fencing.Intent.new("orders", "o-1", 1, "bump")  # decided before the commit above
    assert isinstance(rec.commit(late, {"n": 9}), fencing.Stale)
    with sqlite_store.lease("orders/o-2", owner="w1", ttl=30) as lease:
        token = lease.token
        out = rec.apply(rec.intent("o-2", "bump"), lambda r: {"n": r.state["n"] + 1}, lease=lease)
        assert out.committed
    batch = rec.commit_many([(rec.intent("o-1", "bump"), {"n": 2})])
    assert batch[0].committed
    skipped = rec.apply(rec.intent("o-1", "noop"), lambda r: fencing.SKIP)
    assert isinstance(skipped, fencing.Skipped)
    assert rec.write_final(["o-1", "o-2"]) == 2
    kinds = [e["outcome"] for e in sink.events if e["event"] == "outcome"]
    assert kinds == ["committed", "duplicate", "stale", "committed", "committed", "skipped"]
    leased = sink.events[3]
    assert leased["token"] == token and leased["fence"] == token
    assert leased["version"] == 2 and leased["applied_over"] == 1
    assert leased["expected_version"] == 1 and leased["worker"] == "w1"
    finals = {e["key"]: e for e in sink.events if e["event"] == "final"}
    assert finals["o-1"]["version"] == 3 and finals["o-1"]["state"] == {"n": 2}
    report = check_history(sink.events)
    assert report.ok, report.summary()
    assert report.outcomes["committed"] == 3


def test_recorder_records_the_derived_intent_of_a_recompute(sqlite_store: fencing.Store) -> None:
    accounts = sqlite_store.collection("accounts")
    accounts.create("a", {"n": 0})
    sink = MemoryHistory()
    rec = Recorder(accounts, sink, worker="w")
    intent = rec.intent("a", "credit")
    accounts.commit(accounts.intent("a", "other"), {"n": 100})  # the intent is now stale
    out = rec.apply(intent, lambda r: {"n": r.state["n"] + 1}, on_stale=fencing.Recompute())
    assert out.committed
    (event,) = sink.events
    assert event["intent_id"] != intent.id and event["root_id"] == intent.id
    assert event["expected_version"] == 2 and event["applied_over"] == 2
    write_final(sink, sqlite_store, [("accounts", "a")])
    assert check_history(sink.events).ok


def test_recorder_records_fenced_with_its_reason(sqlite_store: fencing.Store) -> None:
    orders = sqlite_store.collection("orders")
    orders.create("o", {"n": 0})
    sink = MemoryHistory()
    rec = Recorder(orders, sink)
    old = sqlite_store.acquire("orders/o", owner="old", ttl=0.01)
    intent = rec.intent("o", "ship")
    threading.Event().wait(0.05)  # the old lease expires
    with sqlite_store.lease("orders/o", owner="new", ttl=30) as new:
        assert rec.commit(orders.intent("o", "x"), {"n": 1}, lease=new).committed
        out = rec.commit(intent, {"n": 2}, lease=old)
    assert isinstance(out, fencing.Fenced)
    fenced = sink.events[-1]
    assert fenced["outcome"] == "fenced" and fenced["reason"] == "newer_owner"
    assert fenced["token"] == old.token and fenced["applied_over"] is None


def test_recorder_refuses_what_is_not_a_collection(sqlite_store: fencing.Store) -> None:
    with pytest.raises(fencing.InvalidInput, match="Collection or a Table"):
        Recorder(sqlite_store, MemoryHistory())  # type: ignore[arg-type]
    with pytest.raises(fencing.InvalidInput, match="sink"):
        Recorder(sqlite_store.collection("c"), object())  # type: ignore[arg-type]


def test_recorder_with_a_path_owns_its_writer(sqlite_store: fencing.Store, tmp_path: Path) -> None:
    orders = sqlite_store.collection("orders")
    orders.create("o", {"n": 0})
    path = tmp_path / "h.jsonl"
    with Recorder(orders, path, worker="w") as rec:
        rec.commit(rec.intent("o", "x"), {"n": 1})
        rec.write_final(["o"])
    assert len(path.read_text().splitlines()) == 2
    assert check_file(path).ok


def test_write_final_of_a_missing_record(sqlite_store: fencing.Store) -> None:
    sink = MemoryHistory()
    write_final(sink, sqlite_store.collection("c"), ["nope"])
    assert sink.events == [
        {
            "event": "final",
            "collection": "c",
            "key": "nope",
            "version": None,
            "fence": None,
            "state": None,
        }
    ]
    with pytest.raises(fencing.InvalidInput):
        write_final(sink, sqlite_store, ["not-a-pair"])


def test_history_writer_refuses_what_is_not_json(tmp_path: Path) -> None:
    with HistoryWriter(tmp_path / "h.jsonl") as writer:
        with pytest.raises(HistoryError, match="not JSON-serialisable"):
            writer.write({"event": "final", "state": object()})
        with pytest.raises(HistoryError):
            writer.write({"event": "final", "t": float("nan")})
    with pytest.raises(HistoryError, match="closed"):
        writer.write({"event": "final"})


def test_history_writer_threads_write_whole_lines(tmp_path: Path) -> None:
    path = tmp_path / "h.jsonl"
    padding = "x" * 3000  # longer than a pipe buffer's atomic size would matter

    def write(n: int) -> None:
        with HistoryWriter(path) as writer:
            for i in range(200):
                writer.write(
                    {
                        "event": "lease",
                        "name": f"n{n}",
                        "action": "acquire",
                        "token": i,
                        "owner": padding,
                    }
                )

    threads = [threading.Thread(target=write, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    report = check_file(path)  # every line parses
    assert report.leases == 1200


def _append_events(path: str, name: str) -> None:
    with HistoryWriter(path) as writer:
        for i in range(300):
            writer.write(
                {
                    "event": "lease",
                    "name": name,
                    "action": "acquire",
                    "token": i,
                    "owner": "y" * 2000,
                }
            )


def test_history_writer_processes_write_whole_lines(tmp_path: Path) -> None:
    path = str(tmp_path / "h.jsonl")
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_append_events, args=(path, f"p{n}")) for n in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    lines = Path(path).read_text().splitlines()
    assert len(lines) == 900
    assert {json.loads(line)["name"] for line in lines} == {"p0", "p1", "p2"}


def test_outcome_event_fields_exactly() -> None:
    """``outcome_event``: every field of the event a history records for an outcome."""
    from fencing import Committed, Contended, Fenced, FenceReason, Intent, Missing, Record
    from fencing.testing import outcome_event

    intent = Intent("i-1", "orders", "o-1", 3, "ship", decided_at=123.5)
    derived = intent.derive(4, 1)
    record = Record("orders", "o-1", 5, 2, {"s": 1})
    committed = outcome_event(Committed(record, derived), intent, worker="w1", token=2, t=9.0)
    assert committed == {
        "event": "outcome",
        "t": 9.0,
        "worker": "w1",
        "collection": "orders",
        "key": "o-1",
        "intent_id": derived.id,  # the derived intent that committed
        "root_id": "i-1",
        "transition": "ship",
        "expected_version": 4,
        "outcome": "committed",
        "version": 5,
        "applied_over": 4,
        "token": 2,
        "fence": 2,
        "decided_at": derived.decided_at,
    }
    table = outcome_event(Committed(record), intent, worker="w", versioned=False, t=1.0)
    assert (table["version"], table["applied_over"], table["fence"]) == (None, None, 2)
    assert table["intent_id"] == "i-1" and table["expected_version"] == 3
    fenced = outcome_event(Fenced(record, FenceReason.EXPIRED), intent, worker="w", t=1.0)
    assert (fenced["outcome"], fenced["reason"], fenced["applied_over"]) == (
        "fenced",
        "expired",
        None,
    )
    contended = outcome_event(Contended(record, 3), intent, worker="w", t=1.0)
    assert (contended["outcome"], contended["attempts"], contended["version"]) == (
        "contended",
        3,
        5,
    )
    missing = outcome_event(Missing(), Intent("i-2", "orders", "o-2", 1, "x"), worker="w")
    assert (missing["version"], missing["fence"], missing["token"]) == (None, None, None)
    assert "decided_at" not in missing and "reason" not in missing
    assert isinstance(missing["t"], float) and missing["t"] > 1.6e9  # now, by default


def test_a_report_as_json_exactly() -> None:
    from fencing.testing import Report
    from fencing.testing._checker import Anomaly

    report = Report(events=9, keys=2, errors=1, leases=3)
    report.outcomes["committed"] = 4
    event = {"event": "outcome", "key": "k"}
    found = [
        Anomaly("stale_write", "orders", f"k{i}", f"stale {i}", (event,), (i, i + 1))
        for i in range(6)
    ]
    report.anomalies["stale_write"] = found
    out = report.to_dict(examples=2)
    assert out == {
        "ok": False,
        "events": 9,
        "keys": 2,
        "outcomes": report.outcomes,
        "errors": 1,
        "leases": 3,
        "anomalies": {
            "lost_update": 0,
            "stale_write": 6,
            "double_applied": 0,
            "fence_regression": 0,
        },
        "examples": {
            "lost_update": [],
            "stale_write": [
                {
                    "kind": "stale_write",
                    "collection": "orders",
                    "key": f"k{i}",
                    "message": f"stale {i}",
                    "lines": [i, i + 1],
                    "events": [event],
                }
                for i in range(2)
            ],
            "double_applied": [],
            "fence_regression": [],
        },
    }
    assert out["outcomes"]["committed"] == 4 and out["outcomes"] is not report.outcomes
    assert len(report.to_dict()["examples"]["stale_write"]) == 5  # five by default
    json.dumps(out)


def test_write_final_takes_keys_as_its_source_needs_them() -> None:
    store = fencing.open("sqlite://:memory:")
    try:
        orders = store.collection("orders")
        orders.create("a", {"n": 1})
        sink = MemoryHistory()
        assert write_final(sink, store, [("orders", "a"), ("orders", "b")]) == 2
        assert [(e["key"], e["version"]) for e in sink.events] == [("a", 1), ("b", None)]
        assert write_final(sink, orders, ["a"]) == 1 and sink.events[-1]["version"] == 1
        for bad in (["a"], [("orders", "a", 3)], [("orders",)]):
            with pytest.raises(
                fencing.InvalidInput, match=r"^with a store, keys must be \(collection"
            ):
                write_final(sink, store, bad)
        with pytest.raises(
            fencing.InvalidInput, match=r"^with a collection or table, keys must be plain"
        ):
            write_final(sink, orders, [("orders", "a")])
        backend = store.backend
        with backend._lock:
            backend.conn.execute("CREATE TABLE items (id INTEGER PRIMARY KEY, status TEXT)")
            backend.conn.execute("INSERT INTO items VALUES (7, 'new')")
        items = store.table("items", key="id", version=None)
        assert write_final(sink, items, [7]) == 1
        last = sink.events[-1]
        assert last["version"] is None and "version" in last  # nothing to chain
    finally:
        store.close()


def test_a_recorded_batch_writes_each_outcome_and_each_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = fencing.open("memory://")
    try:
        orders = store.collection("orders")
        for key in ("a", "b"):
            orders.create(key, {"n": 0})
        sink = MemoryHistory()
        recorder = Recorder(orders, sink, worker="w9")
        intents = [orders.intent(key, "inc") for key in ("a", "b")]
        with store.lease("orders/batch", owner="w9", ttl=30) as lease:
            outs = recorder.commit_many([(i, {"n": 1}) for i in intents], lease=lease)
        assert [o.committed for o in outs] == [True, True]
        assert [(e["intent_id"], e["token"], e["fence"], e["worker"]) for e in sink.events] == [
            (i.id, lease.token, lease.token, "w9") for i in intents
        ]
        late = [orders.intent(key, "inc") for key in ("a", "b")]

        def down(*args: Any, **kwargs: Any) -> Any:
            raise fencing.TransientStoreError("the store went away")

        monkeypatch.setattr(orders, "commit_many", down)
        with pytest.raises(fencing.TransientStoreError):
            recorder.commit_many([(i, {"n": 2}) for i in late])
        errors = sink.events[2:]
        assert [(e["event"], e["intent_id"], e["key"]) for e in errors] == [
            ("error", i.id, i.key) for i in late
        ]
        assert errors[0]["error"] == "TransientStoreError: the store went away"
    finally:
        store.close()
