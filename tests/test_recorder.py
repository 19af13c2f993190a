"""Recording a history (``fencing.testing``): the bytes a line holds, the file a writer
creates, what a :class:`Recorder` writes for each call and each failure, and which sink it
closes. The history checker's side is in tests/test_checker.py."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import fencing
from fencing.testing import (
    HistoryError,
    HistoryWriter,
    MemoryHistory,
    Recorder,
    _history,
    final_event,
    write_final,
)


@pytest.fixture
def store() -> Iterator[fencing.Store]:
    store = fencing.open("memory://")
    orders = store.collection("orders")
    for key in ("a", "b"):
        orders.create(key, {"n": 0})
    yield store
    store.close()


# -- the writer -----------------------------------------------------------------------------
def test_a_line_is_compact_json_and_memory_holds_the_same_json(tmp_path: Path) -> None:
    event = {"event": "final", "key": "k", "state": {"a": [1, 2]}, "pair": (3, None)}
    path = tmp_path / "h.jsonl"
    with HistoryWriter(path) as writer:
        writer.write(event)
        writer.write({"event": "final", "key": 2})
    assert path.read_bytes() == (
        b'{"event":"final","key":"k","state":{"a":[1,2]},"pair":[3,null]}\n'
        b'{"event":"final","key":2}\n'
    )
    memory = MemoryHistory()
    memory.write(event)
    assert memory.events == [
        {"event": "final", "key": "k", "state": {"a": [1, 2]}, "pair": [3, None]}
    ]
    assert repr(writer) == f"<HistoryWriter {str(path)!r}>"


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_a_value_json_cannot_hold_is_refused_and_nothing_is_written(
    tmp_path: Path, value: float
) -> None:
    path = tmp_path / "h.jsonl"
    with HistoryWriter(path) as writer, pytest.raises(HistoryError) as raised:
        writer.write({"event": "outcome", "t": value})
    # the rest of the message is json's own (Python 3.13 names the value)
    prefix = "event is not JSON-serialisable: Out of range float values are not JSON compliant"
    assert str(raised.value).startswith(prefix)
    with pytest.raises(HistoryError) as raised:
        MemoryHistory().write({"t": value})
    assert str(raised.value).startswith(prefix)
    assert path.read_bytes() == b""


def test_the_writer_creates_its_file_rw_r_r(tmp_path: Path) -> None:
    old = os.umask(0)  # the mode as asked, not as this machine's umask trims it
    try:
        HistoryWriter(tmp_path / "h.jsonl").close()
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "h.jsonl").stat().st_mode) == 0o644


def test_the_writer_appends_to_what_the_file_holds(tmp_path: Path) -> None:
    path = tmp_path / "h.jsonl"
    path.write_bytes(b'{"event":"final"}\n')
    with HistoryWriter(path) as writer:
        writer.write({"event": "lease"})
    assert path.read_bytes() == b'{"event":"final"}\n{"event":"lease"}\n'


def test_a_short_write_is_finished(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``os.write`` may write less than asked (a signal, a full disk): the rest follows."""
    path = tmp_path / "h.jsonl"
    real = os.write
    calls: list[int] = []

    def short(fd: int, data: bytes) -> int:
        calls.append(len(data))
        if len(calls) > 10:  # a writer that never finishes: stop here, not hang
            raise AssertionError(calls)
        return real(fd, bytes(data[:7]))

    event = {"event": "final", "key": "k"}  # 27 bytes with its newline
    with HistoryWriter(path) as writer:
        monkeypatch.setattr(_history.os, "write", short)
        writer.write(event)
        monkeypatch.undo()
    assert path.read_bytes() == b'{"event":"final","key":"k"}\n'
    assert calls == [28, 21, 14, 7]


def test_a_closed_writer_refuses_to_write(tmp_path: Path) -> None:
    writer = HistoryWriter(tmp_path / "h.jsonl")
    writer.close()
    writer.close()  # twice is fine
    with pytest.raises(HistoryError) as raised:
        writer.write({"event": "final"})
    assert str(raised.value) == f"history {str(tmp_path / 'h.jsonl')!r} is closed"


# -- the recorder: what it wraps, what it owns --------------------------------------------
def test_the_recorder_refuses_what_it_cannot_wrap(store: fencing.Store) -> None:
    with pytest.raises(fencing.InvalidInput) as raised:
        Recorder(store, MemoryHistory())  # type: ignore[arg-type]
    assert str(raised.value) == "Recorder wraps a Collection or a Table, not Store"
    with pytest.raises(fencing.InvalidInput) as raised:
        Recorder(store.collection("orders"), object())  # type: ignore[arg-type]
    assert str(raised.value) == "sink must be a path or have write(event), not object"
    with pytest.raises(fencing.InvalidInput) as raised:
        Recorder(store.collection("orders"), 3)  # type: ignore[arg-type]
    assert str(raised.value) == "sink must be a path or have write(event), not int"


def test_the_recorder_closes_the_writer_it_opened_and_no_other(
    store: fencing.Store, tmp_path: Path
) -> None:
    orders = store.collection("orders")
    with Recorder(orders, tmp_path / "own.jsonl", worker="w") as rec:
        assert isinstance(rec.sink, HistoryWriter)
    with pytest.raises(HistoryError, match=r"is closed$"):
        rec.sink.write({"event": "final"})  # closed with the recorder

    given = HistoryWriter(tmp_path / "given.jsonl")
    with Recorder(orders, given, worker="w") as rec:
        assert rec.sink is given
    given.write({"event": "final"})  # still open: its owner closes it
    given.close()
    assert (tmp_path / "given.jsonl").read_bytes() == b'{"event":"final"}\n'


def test_the_recorder_names_its_worker(store: fencing.Store) -> None:
    orders = store.collection("orders")
    rec = Recorder(orders, MemoryHistory())
    assert rec.worker == f"pid{os.getpid()}"
    assert repr(rec) == f"<Recorder {orders!r} worker='pid{os.getpid()}'>"
    assert Recorder(orders, MemoryHistory(), worker="w7").worker == "w7"
    assert rec.name == "orders"


def test_the_recorder_reads_through(store: fencing.Store) -> None:
    orders = store.collection("orders")
    rec = Recorder(orders, MemoryHistory())
    assert rec.get("a") == orders.get("a") and rec.get("a") is not None
    assert rec.get("nope") is None
    intent = rec.intent("a", "ship", guard={"n": 0})
    assert (intent.key, intent.transition, intent.guard, intent.expected_version) == (
        "a",
        "ship",
        {"n": 0},
        1,
    )
    assert rec.intent("b", "ship").guard is None


# -- the recorder: what it writes ---------------------------------------------------------
def _without_t(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    for event in events:
        assert isinstance(event.pop("t"), float)
    return events


def _error(intent: fencing.Intent, error: str, worker: str = "w") -> dict[str, Any]:
    return {
        "event": "error",
        "worker": worker,
        "collection": intent.collection,
        "key": intent.key,
        "intent_id": intent.id,
        "root_id": intent.root_id,
        "error": error,
    }


@pytest.mark.parametrize("call", ["commit", "apply"])
def test_a_commit_that_raises_is_an_error_event(
    store: fencing.Store, monkeypatch: pytest.MonkeyPatch, call: str
) -> None:
    orders = store.collection("orders")
    sink = MemoryHistory()
    rec = Recorder(orders, sink, worker="w")
    intent = orders.intent("a", "ship").derive(1, 2)  # a retry: its own id, its root's root

    def down(*args: Any, **kwargs: Any) -> Any:
        raise fencing.TransientStoreError("the store went away")

    monkeypatch.setattr(orders, call, down)
    calls = {
        "commit": lambda: rec.commit(intent, {"n": 1}),
        "apply": lambda: rec.apply(intent, lambda r: {"n": 1}),
    }
    with pytest.raises(fencing.TransientStoreError):
        calls[call]()
    assert intent.id != intent.root_id
    assert _without_t(sink.events) == [_error(intent, "TransientStoreError: the store went away")]

    # something that is not an intent: refused before anything was written, not recorded
    with pytest.raises(fencing.TransientStoreError):
        getattr(rec, call)("not an intent", {"n": 1})
    assert len(sink.events) == 1


def test_a_refusal_that_is_not_a_store_error_is_not_recorded(store: fencing.Store) -> None:
    sink = MemoryHistory()
    rec = Recorder(store.collection("orders"), sink)
    with pytest.raises(fencing.InvalidInput):
        rec.commit(rec.intent("a", "x"), {"n": object()})
    assert sink.events == []


def test_a_batch_that_raises_is_an_error_event_per_intent(
    store: fencing.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    orders = store.collection("orders")
    sink = MemoryHistory()
    rec = Recorder(orders, sink, worker="w")
    intents = [orders.intent(key, "inc") for key in ("a", "b")]

    def down(*args: Any, **kwargs: Any) -> Any:
        raise fencing.StoreClosed("closed")

    monkeypatch.setattr(orders, "commit_many", down)
    with pytest.raises(fencing.StoreClosed):
        rec.commit_many([(i, {"n": 1}) for i in intents])
    assert _without_t(sink.events) == [_error(i, "StoreClosed: closed") for i in intents]


def test_a_batch_answered_short_is_refused(
    store: fencing.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One outcome per intent, or the recorder would pair outcomes with the wrong intents."""
    orders = store.collection("orders")
    sink = MemoryHistory()
    rec = Recorder(orders, sink, worker="w")
    real = orders.commit_many
    monkeypatch.setattr(orders, "commit_many", lambda pairs, lease=None: real(pairs)[:1])
    with pytest.raises(ValueError, match="zip"):
        rec.commit_many([(orders.intent(key, "inc"), {"n": 1}) for key in ("a", "b")])


def test_a_batch_under_a_lease_commits_and_records_under_it(store: fencing.Store) -> None:
    orders = store.collection("orders")
    sink = MemoryHistory()
    rec = Recorder(orders, sink, worker="w")
    with store.lease("orders/batch", owner="w", ttl=30) as lease:
        rec.commit_many([(orders.intent(key, "inc"), {"n": 1}) for key in ("a", "b")], lease=lease)
    assert [(e["key"], e["token"], e["fence"]) for e in sink.events] == [
        ("a", lease.token, lease.token),
        ("b", lease.token, lease.token),
    ]
    assert (orders.get("a") or fencing.Record("", "", 0, 0, {})).fence == lease.token


@pytest.mark.parametrize("call", ["commit", "apply", "commit_many"])
def test_each_call_records_the_intent_it_was_given(store: fencing.Store, call: str) -> None:
    """An outcome that does not name its intent (a store's answer may not): the event
    names the intent the recorder was given."""
    orders = store.collection("orders")
    sink = MemoryHistory()
    rec = Recorder(orders, sink, worker="w")
    intent = orders.intent("a", "ship")
    bare = fencing.Committed(fencing.Record("orders", "a", 2, 0, {"n": 1}))
    answers = {"commit": bare, "apply": bare, "commit_many": [bare]}
    setattr(orders, call, lambda *args, **kwargs: answers[call])
    if call == "commit":
        assert rec.commit(intent, {"n": 1}) is bare
    elif call == "apply":
        assert rec.apply(intent, lambda r: {"n": 1}) is bare
    else:
        assert rec.commit_many([(intent, {"n": 1})]) == [bare]
    (event,) = _without_t(sink.events)
    assert (event["intent_id"], event["root_id"], event["transition"]) == (
        intent.id,
        intent.id,
        "ship",
    )
    assert (event["version"], event["applied_over"], event["expected_version"]) == (2, 1, 1)


def test_a_table_without_versions_records_none(store: fencing.Store) -> None:
    store.backend.create_table("items", key="id", version=None, columns=["id", "status"])  # type: ignore[attr-defined]
    store.backend.insert_row("items", {"id": 7, "status": "new"})  # type: ignore[attr-defined]
    items = store.table("items", key="id", version=None)
    sink = MemoryHistory()
    rec = Recorder(items, sink, worker="w")
    out = rec.commit(rec.intent(7, "ship", guard={"status": "new"}), {"status": "shipped"})
    assert out.committed
    (event,) = sink.events
    assert (event["version"], event["applied_over"], event["expected_version"]) == (
        None,
        None,
        None,
    )
    assert rec.write_final([7]) == 1
    final = sink.events[-1]
    assert final == {
        "event": "final",
        "collection": "items",
        "key": 7,
        "version": None,
        "fence": 0,
        "state": {"status": "shipped"},
    }


# -- final events ---------------------------------------------------------------------------
def test_a_final_event_exactly() -> None:
    record = fencing.Record("orders", "a", 4, 9, {"n": 2})
    assert final_event("orders", "a", record) == {
        "event": "final",
        "collection": "orders",
        "key": "a",
        "version": 4,
        "fence": 9,
        "state": {"n": 2},
    }
    assert final_event("orders", 3, None) == {
        "event": "final",
        "collection": "orders",
        "key": 3,
        "version": None,
        "fence": None,
        "state": None,
    }


@pytest.mark.parametrize(
    ("source", "keys", "message"),
    [
        ("store", ["a"], "with a store, keys must be (collection, key) pairs"),
        ("store", [("orders",)], "with a store, keys must be (collection, key) pairs"),
        ("store", [("orders", "a", "b")], "with a store, keys must be (collection, key) pairs"),
        ("orders", [("orders", "a")], "with a collection or table, keys must be plain keys"),
    ],
)
def test_write_final_refuses_keys_of_the_wrong_shape(
    store: fencing.Store, source: str, keys: list[Any], message: str
) -> None:
    target = store if source == "store" else store.collection(source)
    sink = MemoryHistory()
    with pytest.raises(fencing.InvalidInput) as raised:
        write_final(sink, target, keys)
    assert str(raised.value) == message
    assert sink.events == []
