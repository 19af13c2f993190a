"""Fenced tasks on real brokers with real worker processes, each scenario against a naive twin.

For every queue and broker (Celery on Redis and on RabbitMQ, RQ on Redis, Dramatiq on
Redis and on RabbitMQ, arq on Redis) the workers are started once and run every
scenario; each scenario is judged by the store's final state and by
``fencing.testing.check_history`` on the recorded history (every fenced outcome,
every naive write, every write the test made itself). The same scenario run with the
naive task (read when it runs, decide, write unconditionally) must show the anomaly
fencing prevents, or the scenario would prove nothing.
"""

from __future__ import annotations

import base64
import contextlib
import sqlite3
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fencing.testing import Report, check_history, final_event, outcome_event

from .._backends import require_server
from ._e2e import AMQP_HOST, AMQP_PORT, HARNESSES, REDIS_HOST, REDIS_PORT, Harness
from .apps import _shared

pytestmark = pytest.mark.slow

CONTENDERS = 6


@pytest.fixture(scope="module", params=list(HARNESSES))
def harness(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Harness]:
    name: str = request.param
    pytest.importorskip(name.split("-")[0])  # the queue library (its fencing extra)
    require_server("Redis", REDIS_HOST, REDIS_PORT)
    if name.endswith("rabbitmq"):
        require_server("RabbitMQ", AMQP_HOST, AMQP_PORT)
    h = HARNESSES[name](tmp_path_factory.mktemp(name))
    try:
        h.start()
        yield h
    finally:
        h.stop()


def judge(h: Harness, *keys: str) -> Report:
    """The checker's verdict on these keys' history, once the history is complete.

    A worker logs its report, then records the outcome in the history: wait until
    every acknowledged report of these keys has its history event.
    """

    def complete() -> list[dict[str, Any]] | None:
        done = [
            r for r in h.reports() if r.get("fencing_key") in keys and r["fencing_action"] == "ack"
        ]
        events = [e for e in h.history() if e.get("key") in keys]
        recorded = [e for e in events if e["event"] == "outcome" and e["worker"] != "test"]
        return events if len(recorded) >= len(done) else None

    events = h.wait_for(complete, 30, f"the history of {keys}")
    events += [final_event("orders", key, h.orders.get(key)) for key in keys]
    return check_history(events)


def outcomes(reports: list[dict[str, Any]]) -> list[str]:
    return [r["fencing_outcome"] for r in reports]


def stays(h: Harness, check: Any, seconds: float = 1.5) -> None:
    """Assert ``check()`` holds for ``seconds``: nothing more arrives (a retry would)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert check(), f"[{h.name}] something arrived that must not\n{h.logs()}"
        time.sleep(0.05)


def msg_id() -> str:
    return f"m{uuid.uuid4().hex}"


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold SQLite's write lock on the store file (readers still read, in WAL mode)."""
    conn = sqlite3.connect(path, timeout=30, isolation_level=None)
    try:
        conn.execute("BEGIN EXCLUSIVE")
        yield
    finally:
        conn.execute("ROLLBACK")
        conn.close()


PACKED: dict[str, Any] = {"status": "packed", "log": []}


def test_task_delayed_past_a_newer_update_is_stale_and_not_retried(harness: Harness) -> None:
    h = harness
    record = h.create(PACKED)
    intent = record.intent("ship")  # decided against v1; the message is delayed...
    h.commit_direct(record.intent("cancel"), _shared.marked(record.state, "cancel"))
    h.enqueue("mark", intent)  # ... and runs after the cancellation

    (report,) = h.wait_reports(intent.id, 1)
    h.drain()
    stays(h, lambda: len(h.reports_for(intent.id)) == 1)
    assert report["fencing_outcome"] == "stale" and report["fencing_action"] == "ack"
    assert (report["fencing_expected_version"], report["fencing_current_version"]) == (1, 2)
    final = h.orders.get(record.key)
    assert final is not None and final.version == 2
    assert final.state["status"] == "cancel" and final.state["log"] == ["cancel"]
    assert judge(h, record.key).ok, judge(h, record.key).to_dict()

    naive = h.create(PACKED)
    h.commit_direct(naive.intent("cancel"), _shared.marked(naive.state, "cancel"))
    message = msg_id()
    h.send_naive_mark(naive.key, "ship", message, decided=1)
    h.wait_naive(message, 1)
    overwritten = h.orders.get(naive.key)
    assert overwritten is not None and overwritten.state["status"] == "ship"  # cancel lost
    assert judge(h, naive.key).counts["stale_write"] >= 1


def test_same_message_delivered_twice_is_a_duplicate(harness: Harness) -> None:
    h = harness
    record = h.create(PACKED)
    intent = record.intent("ship")
    h.enqueue("mark", intent)
    h.enqueue("mark", intent)

    reports = h.wait_reports(intent.id, 2)
    assert sorted(outcomes(reports)) == ["committed", "duplicate"]
    assert {r["fencing_action"] for r in reports} == {"ack"}
    final = h.orders.get(record.key)
    assert final is not None and final.version == 2 and final.state["log"] == ["ship"]
    assert judge(h, record.key).ok, judge(h, record.key).to_dict()

    naive = h.create(PACKED)
    message = msg_id()
    h.send_naive_mark(naive.key, "ship", message, decided=1)
    h.send_naive_mark(naive.key, "ship", message, decided=1)
    h.wait_naive(message, 2)
    twice = h.orders.get(naive.key)
    assert twice is not None and twice.version == 3  # one message, written twice
    assert judge(h, naive.key).counts["double_applied"] >= 1


def test_worker_killed_after_commit_before_ack_is_redelivered_as_duplicate(
    harness: Harness,
) -> None:
    h = harness
    record = h.create(PACKED)
    intent = record.intent("ship")
    naive = h.create(PACKED)
    message = msg_id()
    h.flag(f"hang-{intent.id}")  # hang after the commit, before returning to the queue
    h.flag(f"hang-{message}")
    h.enqueue("mark", intent)
    h.send_naive_mark(naive.key, "ship", message, decided=1)
    pids = [h.wait_pid(f"hung-{intent.id}"), h.wait_pid(f"hung-{message}")]
    committed = h.orders.get(record.key)
    assert committed is not None and committed.version == 2  # landed, never acknowledged

    h.kill_task_processes(pids)  # SIGKILL
    h.recover()
    reports = h.wait_reports(intent.id, 2, timeout=90)
    assert outcomes(reports) == ["committed", "duplicate"]
    final = h.orders.get(record.key)
    assert final is not None and final.version == 2 and final.state["log"] == ["ship"]
    assert judge(h, record.key).ok, judge(h, record.key).to_dict()

    h.wait_naive(message, 2, timeout=90)
    twice = h.orders.get(naive.key)
    assert twice is not None and twice.state["log"] == ["ship", "ship"]
    assert judge(h, naive.key).counts["double_applied"] >= 1


def test_worker_paused_past_its_lease_is_fenced(harness: Harness) -> None:
    h = harness
    record = h.create(PACKED)
    first, second = record.intent("first"), record.intent("second")
    h.flag(f"pause-{first.id}")
    h.enqueue("mark_leased", first)
    pid = h.wait_pid(f"paused-{first.id}")  # holds the lease, has decided, about to commit
    with h.stopped(pid):  # SIGSTOP: heartbeats stop too; the lease runs out
        h.enqueue("mark_leased", second)
        (taken,) = h.wait_reports(second.id, 1)  # another worker takes the lease over
        assert taken["fencing_outcome"] == "committed", taken
    h.flag(f"resume-{first.id}")
    (late,) = h.wait_reports(first.id, 1)
    assert late["fencing_outcome"] == "fenced", late
    assert late["fencing_fence_reason"] == "newer_owner", late  # another worker did it
    assert late["fencing_token"] < taken["fencing_token"]
    final = h.orders.get(record.key)
    assert final is not None and final.state["log"] == ["second"] and final.version == 2
    assert final.fence == taken["fencing_token"]
    assert judge(h, record.key).ok, judge(h, record.key).to_dict()

    naive = h.create(PACKED)
    slow, fast = msg_id(), msg_id()
    h.flag(f"pause-{slow}")
    h.send_naive_mark(naive.key, "first", slow, decided=None, locked=True)
    pid = h.wait_pid(f"paused-{slow}")
    with h.stopped(pid):
        h.send_naive_mark(naive.key, "second", fast, decided=None, locked=True)
        h.wait_naive(fast, 1)
    h.flag(f"resume-{slow}")
    h.wait_naive(slow, 1)
    lost = h.orders.get(naive.key)
    assert lost is not None and lost.state["log"] == [
        "first"
    ]  # "second" was acknowledged, then lost
    assert judge(h, naive.key).counts["lost_update"] >= 1


def test_worker_paused_past_its_lease_with_nobody_taking_over_commits(harness: Harness) -> None:
    """SIGSTOPped past its lease while nobody takes over: the work is not obsolete (the
    record has not moved). The worker takes the lease again and commits; it used to
    ack ``Fenced(EXPIRED)`` and the order stayed unshipped for good."""
    h = harness
    record = h.create(PACKED)
    first = record.intent("first")
    h.flag(f"pause-{first.id}")
    h.enqueue("mark_leased", first)
    pid = h.wait_pid(f"paused-{first.id}")  # holds the lease, has decided, about to commit
    with h.stopped(pid):  # heartbeats stop too; the lease runs out, nobody takes it
        time.sleep(_shared.LEASE.ttl * 2.5)
    h.flag(f"resume-{first.id}")
    (late,) = h.wait_reports(first.id, 1)
    assert (late["fencing_outcome"], late["fencing_action"]) == ("committed", "ack"), late
    final = h.orders.get(record.key)
    assert final is not None and final.state["log"] == ["first"] and final.version == 2
    assert final.fence == late["fencing_token"]
    assert judge(h, record.key).ok, judge(h, record.key).to_dict()


def test_recompute_converges_under_contention(harness: Harness) -> None:
    h = harness
    record = h.create({"count": 0})
    intents = [record.intent("bump") for _ in range(CONTENDERS)]  # all decided against v1
    for intent in intents:
        h.enqueue("bump", intent)
    reports = [h.wait_reports(i.id, 1, timeout=60)[0] for i in intents]
    assert outcomes(reports) == ["committed"] * CONTENDERS
    assert any("~" in r["fencing_intent_id"] for r in reports), "no task had to recompute"
    final = h.orders.get(record.key)
    assert final is not None and final.state["count"] == CONTENDERS
    assert final.version == CONTENDERS + 1
    assert judge(h, record.key).ok, judge(h, record.key).to_dict()

    naive = h.create({"count": 0})
    messages = [msg_id() for _ in range(CONTENDERS)]
    for message in messages:
        h.send_naive_bump(naive.key, message)
    for message in messages:
        h.wait_naive(message, 1, timeout=60)
    counted = h.orders.get(naive.key)
    assert counted is not None and counted.state["count"] < CONTENDERS
    assert judge(h, naive.key).counts["lost_update"] >= 1


def test_transient_store_error_is_retried_with_the_same_payload(harness: Harness) -> None:
    h = harness
    record = h.create(PACKED)
    intent = record.intent("ship")
    with locked(h.store_path):  # the worker's commit finds the database locked
        h.enqueue("mark_impatient", intent)
        h.wait_for(
            lambda: any(r["fencing_action"] == "retry" for r in h.reports_for(intent.id)),
            30,
            "a retried transient error",
        )
    reports = h.wait_for(
        lambda: (
            (rs := h.reports_for(intent.id)) and rs[-1]["fencing_outcome"] == "committed" and rs
        ),
        60,
        "the retry to commit",
    )
    assert reports[0]["fencing_outcome"] == "transient"
    assert {r["fencing_intent_id"] for r in reports} == {intent.id}  # the same payload
    attempts = [r["fencing_attempt"] for r in reports]
    assert attempts == sorted(attempts) and len(reports) >= 2
    final = h.orders.get(record.key)
    assert final is not None and final.version == 2 and final.state["log"] == ["ship"]
    assert judge(h, record.key).ok, judge(h, record.key).to_dict()


def _tamper(token: str) -> str:
    kid, body, mac = token.split(".")
    data = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
    forged = data.replace(b'"ship"', b'"free"')
    return ".".join([kid, base64.urlsafe_b64encode(forged).rstrip(b"=").decode(), mac])


def test_unsigned_or_tampered_message_is_refused_and_not_retried(harness: Harness) -> None:
    h = harness
    record = h.create(PACKED)

    def refused() -> list[dict[str, Any]]:
        return [r for r in h.reports() if r["fencing_outcome"] == "invalid"]

    h.send("mark", record.intent("ship").to_json())  # unsigned
    h.send("mark", _tamper(_shared.SIGNER.sign(record.intent("ship"))))
    h.wait_for(lambda: len(refused()) >= 2, 30, "two refusals")
    h.drain()
    stays(h, lambda: len(refused()) == 2)
    assert {r["fencing_action"] for r in refused()} == {"refuse"}
    unchanged = h.orders.get(record.key)
    assert unchanged is not None and unchanged.version == 1


def test_charged_then_stale_task_reconciles_once_and_is_listed_until_marked(
    harness: Harness, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from fencing._cli import main

    h = harness
    record = h.create({"status": "packed", "log": [], "total": 42})
    intent = record.intent("charge")
    h.flag(f"pause-{intent.id}")
    h.enqueue("charge", intent)
    h.wait_pid(f"paused-{intent.id}")  # charged (effect recorded, made, done); not committed
    h.commit_direct(record.intent("cancel"), _shared.marked(record.state, "cancel"))
    h.flag(f"resume-{intent.id}")

    (report,) = h.wait_reports(intent.id, 1)
    assert report["fencing_outcome"] == "stale" and report["fencing_action"] == "ack", report
    refunds = h.wait_for(
        lambda: [r for r in read(h, "refunds.jsonl") if r["root_id"] == intent.id],
        30,
        "the Reconcile handler",
    )
    h.drain()
    stays(h, lambda: len(h.reports_for(intent.id)) == 1)
    (charge,) = [c for c in read(h, "charges.jsonl") if c["key"] in str(refunds)]
    (refund,) = [r for r in read(h, "refunds.jsonl") if r["root_id"] == intent.id]  # once
    assert refund["version"] == 2
    assert refund["effects"] == [[charge["key"], "done", "stale"]]
    final = h.orders.get(record.key)
    assert final is not None and final.state["status"] == "cancel" and final.version == 2
    assert judge(h, record.key).ok, judge(h, record.key).to_dict()

    # `fencing reconcile` lists the charge until it is marked, then never again
    def listed() -> list[dict[str, Any]]:
        assert main(["reconcile", h.store_url, "--json", "--limit", "1000"]) == 0
        lines = capsys.readouterr().out.splitlines()
        return [e for e in map(json.loads, lines) if e.get("intent_id") == intent.id]

    (effect,) = listed()
    assert (effect["idempotency_key"], effect["status"]) == (charge["key"], "done")
    assert (effect["outcome"], effect["detail"]["charge_id"]) == (
        "stale",
        f"ch-{charge['key'][3:11]}",
    )
    assert listed() == [effect]
    assert main(["reconcile", h.store_url, "--mark", charge["key"]]) == 0
    assert "marked reconciled" in capsys.readouterr().out
    assert listed() == []
    assert main(["reconcile", h.store_url, "--mark", charge["key"]]) == 0  # idempotent
    assert "already reconciled" in capsys.readouterr().out
    assert listed() == []

    # the naive twin charges and then overwrites the cancellation
    naive = h.create({"status": "packed", "log": [], "total": 42})
    h.commit_direct(naive.intent("cancel"), _shared.marked(naive.state, "cancel"))
    message = msg_id()
    h.send_naive_mark(naive.key, "charge", message, decided=1)
    h.wait_naive(message, 1)
    overwritten = h.orders.get(naive.key)
    assert overwritten is not None and overwritten.state["status"] == "charge"
    assert judge(h, naive.key).counts["stale_write"] >= 1


def read(h: Harness, name: str) -> list[dict[str, Any]]:
    from ._e2e import read_jsonl

    return read_jsonl(h.control / name)


def test_enqueued_after_commit_an_intent_read_in_the_transaction_arrives_fresh(
    harness: Harness,
) -> None:
    """The business transaction bumps the record, then enqueues after it commits: an
    intent read through ``store.using(conn)`` carries the version the record has once
    the transaction commits, and the worker commits it; one read on the store's own
    connection while the transaction was open predates the bump and arrives stale."""
    h = harness
    record = h.create(PACKED)
    conn = sqlite3.connect(h.store_path, timeout=30)
    try:
        view = h.store.using(conn).collection("orders")
        paid = view.commit(record.intent("pay"), _shared.marked(record.state, "pay"))
        assert paid.committed and paid.record.version == 2
        fresh = view.intent(record.key, "ship")  # inside the transaction: version 2
        early = h.orders.intent(record.key, "ship")  # the store's own connection: version 1
        conn.commit()  # the business transaction commits; then enqueue
        h.writer.write(outcome_event(paid, paid.intent, worker="test"))
    finally:
        conn.close()
    assert (fresh.expected_version, early.expected_version) == (2, 1)
    h.enqueue("mark", fresh)
    (report,) = h.wait_reports(fresh.id, 1)
    assert report["fencing_outcome"] == "committed", h.logs()
    h.enqueue("mark", early)
    (stale,) = h.wait_reports(early.id, 1)
    assert stale["fencing_outcome"] == "stale" and stale["fencing_action"] == "ack"
    h.drain()
    final = h.orders.get(record.key)
    assert final is not None and final.version == 3
    assert final.state["log"] == ["pay", "ship"]
    assert judge(h, record.key).ok, judge(h, record.key).to_dict()
