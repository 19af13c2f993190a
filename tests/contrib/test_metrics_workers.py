"""The workers' helpers of ``fencing.contrib.prometheus``, each with a real worker of its
queue on the local Redis: an RQ worker of ``rq_worker_class``, a Dramatiq worker with
``dramatiq_middleware``, an arq worker with ``arq_startup``. Each serves the metrics on a
port of its own, and a scrape of it shows the worker's commits counted. (Celery's
``celery_metrics`` runs under ``fencing demo --queue celery`` in tests/test_demo_metrics.py.)
And a trace context that travels to a real arq worker in the intent of its message.
"""

from __future__ import annotations

import asyncio
import signal
import socket
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import fencing
from fencing._observe import HUB

from .._backends import require_server

prometheus = pytest.importorskip("fencing.contrib.prometheus")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

REDIS = "redis://127.0.0.1:6379"


@pytest.fixture(autouse=True)
def _metrics_off_after() -> Iterator[None]:
    require_server("Redis", "127.0.0.1", 6379)
    yield
    prometheus.disable()
    assert not HUB.on


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def scraped(port: int, collection: str) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "fencing_outcomes_total" and s.labels["collection"] == collection:
                found[s.labels["outcome"]] = found.get(s.labels["outcome"], 0.0) + s.value
    return found


def ship(record: fencing.Record) -> dict[str, Any]:
    return {**record.state, "status": "shipped"}


def test_rq_worker_class(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("rq")
    import redis
    from rq import Queue, SimpleWorker

    from fencing.contrib.rq import enqueue_intent

    from . import obs_jobs

    db = tmp_path / "rq.db"
    monkeypatch.setenv("FENCING_OBS_DB", str(db))
    with fencing.open(f"sqlite:///{db}") as store:
        record = store.collection("obs_orders").create("o-1", {"status": "new"})
    conn = redis.Redis.from_url(f"{REDIS}/12")
    queue = Queue(f"obs-{uuid.uuid4().hex[:8]}", connection=conn)
    port = _port()
    try:
        intent = record.intent("ship")
        enqueue_intent(queue, obs_jobs.ship, intent)
        enqueue_intent(queue, obs_jobs.ship, intent)  # a second delivery: Duplicate
        worker = prometheus.rq_worker_class(SimpleWorker, port=port)([queue], connection=conn)
        handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGALRM)}
        worker.work(burst=True)
        assert scraped(port, "obs_orders") == {"committed": 1.0, "duplicate": 1.0}
        # RQ's request_stop (SIGINT, SIGTERM) and its job timeout (SIGALRM) are gone
        assert {s: signal.getsignal(s) for s in handlers} == handlers
    finally:
        queue.delete(delete_jobs=True)
        conn.close()


def test_dramatiq_middleware(tmp_path: Path) -> None:
    pytest.importorskip("dramatiq")
    from dramatiq import Worker
    from dramatiq.brokers.redis import RedisBroker

    from fencing.contrib.dramatiq import fenced_actor

    store = fencing.open(f"sqlite:///{tmp_path / 'dq.db'}")
    orders = store.collection("dq_orders")
    record = orders.create("o-1", {"status": "new"})
    broker = RedisBroker(url=f"{REDIS}/13", namespace=f"obs-{uuid.uuid4().hex[:8]}")
    port = _port()
    broker.add_middleware(prometheus.dramatiq_middleware(port=port))
    actor = fenced_actor(target=orders, broker=broker, max_retries=0)(ship)
    worker = Worker(broker, worker_threads=1)
    try:
        actor.enqueue(record, "ship")
        actor.enqueue(record, "late")  # decided at version 1 too: Stale
        worker.start()
        broker.join(actor.queue_name, timeout=30_000)
        worker.join()
        assert scraped(port, "dq_orders") == {"committed": 1.0, "stale": 1.0}
    finally:
        worker.stop()
        broker.flush_all()
        broker.close()
        store.close()


def test_arq_startup(tmp_path: Path) -> None:
    pytest.importorskip("arq")
    from arq import create_pool
    from arq.connections import RedisSettings
    from arq.worker import Worker

    from fencing.contrib.arq import enqueue_intent, fenced_function

    settings = RedisSettings.from_dsn(f"{REDIS}/14")
    queue = f"obs-{uuid.uuid4().hex[:8]}"
    port = _port()
    started: list[str] = []

    async def mine(ctx: dict[str, Any]) -> None:
        started.append("mine")

    async def scenario() -> dict[str, float]:
        store = await fencing.open_async(f"sqlite:///{tmp_path / 'arq.db'}")
        orders = store.collection("arq_orders")
        record = await orders.create("o-1", {"status": "new"})
        job = fenced_function(target=orders, name="obs_ship")(ship)
        pool = await create_pool(settings)
        try:
            await enqueue_intent(pool, job, record, "ship", _queue_name=queue)
            worker = Worker(
                functions=[job],
                redis_settings=settings,
                queue_name=queue,
                burst=True,
                on_startup=prometheus.arq_startup(port=port, then=mine),
                handle_signals=False,
            )
            try:
                await worker.main()
            finally:  # what worker.close() does, without redis-py's deprecated close()
                await asyncio.gather(*worker.tasks.values())
                await worker.pool.delete(worker.health_check_key)
                await worker.pool.aclose(close_connection_pool=True)
            return await asyncio.to_thread(scraped, port, "arq_orders")
        finally:
            await pool.delete(queue)
            await pool.aclose()
            await store.close()

    assert asyncio.run(scenario()) == {"committed": 1.0}
    assert started == ["mine"]


def test_arq_worker_span_links_to_the_deciding_span(tmp_path: Path) -> None:
    """The trace context travels in the queue message (the intent's JSON) to a real arq
    worker, whose apply span links to the span the producer decided in."""
    pytest.importorskip("arq")
    otel = pytest.importorskip("fencing.contrib.otel")
    from arq import create_pool
    from arq.connections import RedisSettings
    from arq.worker import Worker
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from fencing.contrib.arq import enqueue_intent, fenced_function

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("producer")
    settings = RedisSettings.from_dsn(f"{REDIS}/14")
    queue = f"obs-{uuid.uuid4().hex[:8]}"

    async def scenario() -> Any:
        store = await fencing.open_async(f"sqlite:///{tmp_path / 'trace.db'}")
        orders = store.collection("traced_orders")
        record = await orders.create("o-1", {"status": "new"})
        job = fenced_function(target=orders, name="obs_traced")(ship)
        pool = await create_pool(settings)
        try:
            with tracer.start_as_current_span("decide") as decide:
                await enqueue_intent(pool, job, record.intent("ship"), _queue_name=queue)
            worker = Worker(
                functions=[job],
                redis_settings=settings,
                queue_name=queue,
                burst=True,
                handle_signals=False,
            )
            try:
                await worker.main()
            finally:
                await asyncio.gather(*worker.tasks.values())
                await worker.pool.delete(worker.health_check_key)
                await worker.pool.aclose(close_connection_pool=True)
            return decide.get_span_context()
        finally:
            await pool.delete(queue)
            await pool.aclose()
            await store.close()

    otel.enable(provider)
    try:
        decided = asyncio.run(scenario())
    finally:
        otel.disable()
    (applied,) = [s for s in exporter.get_finished_spans() if s.name == "apply traced_orders"]
    assert dict(applied.attributes or {})["fencing.outcome"] == "committed"
    (link,) = applied.links
    assert (link.context.trace_id, link.context.span_id) == (decided.trace_id, decided.span_id)
