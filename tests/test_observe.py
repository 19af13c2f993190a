"""Logging in the core (issue 14, item 3): the ``fencing`` logger records every refused
commit at INFO and every committed one at DEBUG, with the task records' fields; and no
secret (a URL's password, a Signer's key) shows in any record, repr or error of a run
with failures, on a real PostgreSQL store opened with a password.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

import fencing
from fencing._observe import HUB
from fencing.contrib._common import FencedTask
from fencing.contrib._outcomes import Action, TaskReport

from . import backends_postgres as pg
from ._backends import require_server

SECRET = "Obs-s3cret_PW-4711"
KEY = b"obs-signing-key-0123456789abcdef"
SIGNER = fencing.Signer(keys={"k1": KEY}, current="k1")


@pytest.fixture
def store(tmp_path: Path) -> Iterator[fencing.Store]:
    s = fencing.open(f"sqlite:///{tmp_path / 'store.db'}")
    yield s
    s.close()


def core(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "fencing"]


def test_committed_at_debug_refused_at_info_with_the_task_fields(
    store: fencing.Store, caplog: pytest.LogCaptureFixture
) -> None:
    assert not HUB.on  # nothing switched on: the logger alone
    caplog.set_level(logging.DEBUG, "fencing")
    orders = store.collection("orders")
    record = orders.create("o-1", {"n": 0})
    intent = record.intent("ship")
    assert orders.commit(intent, {"n": 1}).committed
    orders.commit(intent, {"n": 1})  # duplicate
    orders.commit(record.intent("late"), {"n": 2})  # stale
    orders.apply(fencing.Intent.new("orders", "nope", 1, "x"), lambda r: {"n": 9})  # missing
    with store.lease("obs-l", owner="a", ttl=30) as lease:
        orders.commit(orders.intent("o-1", "leased"), {"n": 3}, lease=lease)
    logs = core(caplog)
    commits = [r for r in logs if vars(r)["fencing_operation"] in ("commit", "apply")]
    assert [(vars(r)["fencing_outcome"], r.levelno) for r in commits] == [
        ("committed", logging.DEBUG),
        ("duplicate", logging.INFO),
        ("stale", logging.INFO),
        ("missing", logging.INFO),
        ("committed", logging.DEBUG),
    ]
    first = vars(commits[0])
    assert first["fencing_collection"] == "orders" and first["fencing_key"] == "o-1"
    assert first["fencing_intent_id"] == intent.id == first["fencing_root_id"]
    assert first["fencing_expected_version"] == 1 and first["fencing_current_version"] == 2
    assert first["fencing_store"] == "sqlite" and first["fencing_kind"] == "collection"
    assert vars(commits[-1])["fencing_token"] == lease.token
    # the same field names as the fencing.task records (less what only a task knows)
    report = TaskReport("t", Action.ACK, "committed", 1, intent)
    task_only = {"fencing_task", "fencing_action", "fencing_attempt"}
    assert set(report.log_fields()) - task_only <= set(first)
    leases = [vars(r)["fencing_operation"] for r in logs if vars(r)["fencing_kind"] == "lease"]
    assert leases == ["lease.acquire", "lease.release"]


def test_the_fence_reason_is_in_the_record(
    store: fencing.Store, caplog: pytest.LogCaptureFixture
) -> None:
    """An operator tells "another worker did it" from "nobody did it" (issue 18, item 2)."""
    caplog.set_level(logging.DEBUG, logger="fencing")
    orders = store.collection("orders")
    orders.create("o-1", {"n": 0})
    old = store.acquire("orders/o-1", owner="a", ttl=0.05)
    intent = orders.intent("o-1", "x")
    time.sleep(0.1)
    assert isinstance(orders.commit(intent, {"n": 1}, lease=old), fencing.Fenced)
    newer = store.acquire("orders/o-1", owner="b", ttl=30)
    assert isinstance(orders.commit(intent, {"n": 1}, lease=old), fencing.Fenced)
    newer.release()
    fenced = [r for r in core(caplog) if vars(r)["fencing_outcome"] == "fenced"]
    assert [vars(r)["fencing_fence_reason"] for r in fenced] == ["expired", "newer_owner"]
    assert [r.getMessage().rsplit(" ", 1)[-1] for r in fenced] == [
        "fenced=expired",
        "fenced=newer_owner",
    ]
    committed = [r for r in core(caplog) if vars(r)["fencing_outcome"] == "committed"]
    assert all(vars(r)["fencing_fence_reason"] is None for r in committed)


def test_info_level_logs_refusals_only(
    store: fencing.Store, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "fencing")
    orders = store.collection("orders")
    record = orders.create("o-1", {"n": 0})
    batch = [(record.intent("a"), {"n": 1}), (record.intent("b"), {"n": 2})]
    outcomes = orders.commit_many(batch)  # one row, two intents at version 1
    assert [o.kind for o in outcomes] == ["committed", "stale"]
    assert [vars(r)["fencing_outcome"] for r in core(caplog)] == ["stale"]


def test_async_store_logs_the_same(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, "fencing")

    async def run() -> None:
        async with await fencing.open_async(f"sqlite:///{tmp_path / 'a.db'}") as s:
            orders = s.collection("orders")
            record = await orders.create("o-1", {"n": 0})
            await orders.commit(record.intent("a"), {"n": 1})
            await orders.commit(record.intent("b"), {"n": 2})

    asyncio.run(run())
    assert [vars(r)["fencing_outcome"] for r in core(caplog)] == ["committed", "stale"]


# -- no secret anywhere ------------------------------------------------------------------------
def _secrets(password: str) -> list[str]:
    b64 = base64.urlsafe_b64encode(KEY).decode().rstrip("=")
    return [password, KEY.decode(), KEY.hex(), repr(KEY), b64]


def _texts(exc: BaseException) -> list[str]:
    out: list[str] = []
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        out += [str(e), repr(e), repr(e.args)]
        e = e.__cause__ or e.__context__
    return out


def test_no_secret_in_records_reprs_or_errors_of_a_failing_run(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """PostgreSQL trusts local connections here, so a URL with a password opens: the
    password is then in the store's hands for the whole run."""
    require_server("PostgreSQL", pg.HOST, pg.PORT)
    prometheus = pytest.importorskip("fencing.contrib.prometheus")
    from prometheus_client import CollectorRegistry, generate_latest

    schema = "fencing_t_" + uuid.uuid4().hex[:16]
    base = pg.url_for(schema)
    parts = urlsplit(base)
    password = parts.password or SECRET  # a server that trusts us takes any password
    if parts.password is None:
        user = parts.username or "root"
        netloc = f"{user}:{SECRET}@{parts.hostname}:{parts.port or 5432}"
        parts = parts._replace(netloc=netloc)
    url = urlunsplit(parts)
    assert password in url
    caplog.set_level(logging.DEBUG)  # every logger, every level
    registry = CollectorRegistry()
    prometheus.enable(registry)
    texts: list[str] = []
    store = fencing.open(url)
    try:
        store.migrate()
        prometheus.watch(store, registry=registry)
        orders = store.collection("obs_orders")
        record = orders.create("o-1", {"n": 0})
        payload = SIGNER.sign(record.intent("ship"))
        task = FencedTask(name="obs.ship", target=orders, decide=lambda r: {"n": 1}, signer=SIGNER)
        reports = [task.run(payload), task.run(payload, attempt=2)]  # committed, duplicate
        reports.append(task.run(SIGNER.sign(record.intent("late"))))  # stale
        reports.append(task.run(payload[:-4] + "AAAA"))  # tampered: refused
        other = fencing.Signer(keys={"k2": b"another-key-0123456789"}, current="k2")
        reports.append(task.run(other.sign(record.intent("forged"))))  # unknown key
        assert [r.kind for r in reports] == [
            "committed",
            "duplicate",
            "stale",
            "invalid",
            "invalid",
        ]
        texts += [repr(r) for r in reports] + [repr(r.to_dict()) for r in reports]
        lease = store.acquire("obs-lease", owner="a", ttl=30)
        for call in (
            lambda: store.acquire("obs-lease", owner="b", ttl=30),  # held
            lambda: orders.commit(record.intent("x"), {"bad": float("nan")}),  # invalid
            lambda: orders.create("o-1", {}),  # already exists
            lambda: SIGNER.verify("k1.e30.AAAA"),
            lambda: fencing.Signer(keys={"k1": KEY}, current=KEY.decode()),
        ):
            with pytest.raises(fencing.FencingError) as caught:
                call()
            texts += _texts(caught.value)
        short = store.acquire("obs-fenced", owner="a", ttl=0.2)
        time.sleep(0.3)
        store.acquire("obs-fenced", owner="b", ttl=30)  # a newer owner
        fenced = orders.commit(orders.intent("o-1", "y"), {"n": 2}, lease=short)
        assert fenced.kind == "fenced"
        texts += [repr(fenced), repr(lease), repr(store), repr(orders), repr(SIGNER)]
        texts += [repr(store.backend), repr(store.outbox), str(store.options)]
        texts.append(generate_latest(registry).decode())
    finally:
        prometheus.disable(registry)
        store.close()
        pg.cleanup(base)
    records = caplog.records
    assert any(r.name == "fencing" for r in records) and any(
        r.name == "fencing.task" for r in records
    )
    texts += [r.getMessage() for r in records] + [repr(vars(r)) for r in records]
    texts += [r.exc_text or "" for r in records]
    leaks = [(s, t) for t in texts for s in _secrets(password) if s in t]
    assert leaks == []


def test_observer_errors_are_logged_not_raised(
    store: fencing.Store, caplog: pytest.LogCaptureFixture
) -> None:
    class Broken:
        def observe(self, event: Any) -> None:
            raise RuntimeError("observer bug")

    from fencing._observe import add_observer, remove_observer

    broken = Broken()
    add_observer(broken)
    try:
        orders = store.collection("orders")
        record = orders.create("o-1", {"n": 0})
        assert orders.commit(record.intent("a"), {"n": 1}).committed
    finally:
        remove_observer(broken)
    assert not HUB.on
    assert any("observer" in r.getMessage() and r.exc_info for r in caplog.records)
    with pytest.raises(fencing.InvalidInput, match="observe"):
        add_observer(object())  # type: ignore[arg-type]
