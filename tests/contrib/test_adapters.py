"""Each queue's adapter, in process: how a report becomes the queue's own verb.

The end-to-end tests run the same code in real workers on real brokers; these pin
down the mapping and the argument checks without one (Celery's retry goes to its
in-process memory transport; Dramatiq's StubBroker only registers the actor).
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import fencing

STORE: list[fencing.Store] = []


@pytest.fixture
def store(tmp_path: Path) -> Iterator[fencing.Store]:
    s = fencing.open(f"sqlite:///{tmp_path / 'store.db'}")
    STORE.append(s)
    yield s
    STORE.clear()
    s.close()


def orders() -> fencing.Collection:
    """A target factory (tasks made in a test resolve it once, in that test)."""
    return STORE[-1].collection("orders")


def ship(record: fencing.Record) -> dict[str, Any]:
    return {**record.state, "status": "shipped"}


@contextlib.contextmanager
def write_locked(store: fencing.Store) -> Iterator[fencing.Collection]:
    """The same file through an impatient store, while another connection holds the lock."""
    path = store.url.removeprefix("sqlite:///")
    impatient = fencing.open(f"sqlite:///{path}?busy_timeout=0.01", migrate=False)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("BEGIN EXCLUSIVE")
    try:
        yield impatient.collection("orders")
    finally:
        conn.execute("ROLLBACK")
        conn.close()
        impatient.close()


# -- Celery ---------------------------------------------------------------------------------------
def test_celery_task_options_and_outcomes(store: fencing.Store) -> None:
    celery = pytest.importorskip("celery")
    from celery.exceptions import Reject

    from fencing.contrib.celery import FencedCeleryTask, fenced_task

    app = celery.Celery("unit", broker="memory://", set_as_current=False)
    task = fenced_task(app, target=orders, name="unit.ship", max_retries=3)(ship)
    late = fenced_task(app, target=orders, name="unit.early", acks_late=False)(ship)
    assert isinstance(task, FencedCeleryTask) and task.name == "unit.ship"
    assert task.acks_late and task.reject_on_worker_lost and task.max_retries == 3
    assert not late.acks_late  # options win over the defaults
    assert not getattr(task, "autoretry_for", ())  # stale outcomes are never auto-retried

    record = store.collection("orders").create("o-1", {"status": "packed"})
    payload = task.fencing.encode(record, "ship")
    result = task.apply(args=(payload,))
    assert result.successful() and result.result["outcome"] == "committed"
    assert task.apply(args=(payload,)).result["outcome"] == "duplicate"
    with pytest.raises(Reject):
        task.run("not an intent")
    app.close()


def test_celery_transient_error_asks_for_a_retry(store: fencing.Store) -> None:
    celery = pytest.importorskip("celery")
    from celery.exceptions import Retry

    from fencing.contrib.celery import fenced_task

    record = store.collection("orders").create("o-1", {"status": "packed"})
    app = celery.Celery("unit", broker="memory://", set_as_current=False)
    with write_locked(store) as impatient:
        task = fenced_task(app, target=impatient, name="unit.ship")(ship)
        payload = task.fencing.encode(record, "ship")
        # As a worker would run it: a request with the payload, not a direct call; the
        # retry message goes to the in-process memory transport.
        task.push_request(args=[payload], retries=0, called_directly=False, is_eager=False)
        try:
            with pytest.raises(Retry) as retry:
                task.run(payload)
        finally:
            task.pop_request()
    assert retry.value.when is not None and 0 < float(retry.value.when) <= 1.0
    app.close()


# -- RQ -------------------------------------------------------------------------------------------
@pytest.fixture
def rq_jobs() -> Any:
    pytest.importorskip("rq")
    from . import rq_unit_jobs

    return rq_unit_jobs


def test_rq_job_results(store: fencing.Store, rq_jobs: Any) -> None:
    from rq import Retry

    from fencing.contrib.rq import Backoff, fenced_job

    job = fenced_job(target=store.collection("orders"), name="unit.ship")(ship)
    record = store.collection("orders").create("o-1", {"status": "packed"})
    payload = job.fencing.encode(record, "ship")
    assert job(payload)["outcome"] == "committed"  # outside a worker: no current job
    assert job(payload)["outcome"] == "duplicate"
    with pytest.raises(fencing.InvalidIntent):
        job("tampered")
    fresh = store.collection("orders").create("o-2", {"status": "packed"})
    with write_locked(store) as impatient:
        slow = fenced_job(target=impatient, max_retries=2, backoff=Backoff(0.5, 2.0))(ship)
        answer = slow(slow.fencing.encode(fresh, "pack"))
    assert isinstance(answer, Retry) and answer.max == 2  # RQ's own retry, asked for
    assert answer.intervals and all(1 <= i <= 2 for i in answer.intervals)


def test_rq_enqueue_checks(rq_jobs: Any) -> None:
    import redis
    from rq import Queue

    from fencing.contrib.rq import enqueue_intent, fenced_job

    queue = Queue("never-used", connection=redis.Redis())  # refused before any command
    intent = fencing.Intent.new("orders", "o-1", 1, "ship")
    with pytest.raises(fencing.ConfigurationError, match="@fenced_job"):
        enqueue_intent(queue, ship, intent)  # type: ignore[arg-type]
    with pytest.raises(fencing.ConfigurationError, match="crash_retries"):
        enqueue_intent(queue, rq_jobs.ship, intent, crash_retries=-1)
    elsewhere = fenced_job(target=orders)(ship)  # RQ would import test_adapters.ship instead
    with pytest.raises(fencing.ConfigurationError, match="module level"):
        enqueue_intent(queue, elsewhere, intent)
    assert sys.modules[rq_jobs.ship.__module__].ship is rq_jobs.ship


# -- Dramatiq -------------------------------------------------------------------------------------
def test_dramatiq_actor_options_and_outcomes(store: fencing.Store) -> None:
    dramatiq = pytest.importorskip("dramatiq")
    from dramatiq.brokers.stub import StubBroker

    from fencing.contrib.dramatiq import FencedActor, fenced_actor

    broker = StubBroker()  # only to register the actor; nothing is sent here
    actor = fenced_actor(target=orders, broker=broker, max_retries=4)(ship)
    assert isinstance(actor, FencedActor) and actor.actor_name == "ship"
    assert actor.options["throws"] == (fencing.InvalidInput,)
    retry_when = actor.options["retry_when"]
    assert retry_when(0, dramatiq.Retry()) and retry_when(3, dramatiq.Retry())
    assert not retry_when(4, dramatiq.Retry())
    assert not retry_when(0, KeyError())  # a bug in decide is not retried
    with pytest.raises(fencing.InvalidInput, match="max_retries"):
        fenced_actor(target=orders, broker=broker, retry_when=lambda r, e: True)(ship)

    record = store.collection("orders").create("o-1", {"status": "packed"})
    payload = actor.fencing.encode(record, "ship")
    assert actor(payload)["outcome"] == "committed"
    with pytest.raises(fencing.InvalidIntent):
        actor("tampered")
    fresh = store.collection("orders").create("o-2", {"status": "packed"})
    with write_locked(store) as impatient:
        slow = fenced_actor(target=impatient, broker=broker, actor_name="slow")(ship)
        with pytest.raises(dramatiq.Retry):
            slow(slow.fencing.encode(fresh, "pack"))
    broker.close()


# -- arq ------------------------------------------------------------------------------------------
def test_arq_function_and_outcomes(tmp_path: Path) -> None:
    pytest.importorskip("arq")
    from arq.worker import Retry

    from fencing.contrib.arq import FencedFunction, enqueue_intent, fenced_function

    async def scenario() -> None:
        astore = await fencing.open_async("memory://")
        target = astore.collection("orders")
        job = fenced_function(target=target, max_retries=2, timeout=5)(ship)
        assert isinstance(job, FencedFunction) and job.name == "ship" and job.max_tries == 3
        assert job.timeout_s == 5
        record = await target.create("o-1", {"status": "packed"})
        payload = job.fencing.encode(record, "ship")  # type: ignore[union-attr]
        assert (await job.coroutine({"job_try": 1}, payload))["outcome"] == "committed"
        assert (await job.coroutine({"job_try": 2}, payload))["outcome"] == "duplicate"
        with pytest.raises(fencing.InvalidIntent):
            await job.coroutine({"job_try": 1}, "tampered")

        async def held(rec: fencing.Record) -> dict[str, Any]:
            return ship(rec)

        leased = fenced_function(
            target=target, lease=fencing.contrib.arq.LeaseSpec(ttl=5), name="leased"
        )(held)
        async with astore.lease("orders/o-1", owner="busy", ttl=5):
            with pytest.raises(Retry):
                await leased.coroutine({"job_try": 1}, leased.fencing.encode(record, "x"))  # type: ignore[union-attr]
        with pytest.raises(fencing.ConfigurationError):
            await enqueue_intent(None, object(), record, "ship")  # type: ignore[arg-type]
        await astore.close()

    asyncio.run(scenario())
