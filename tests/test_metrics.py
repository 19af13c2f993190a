"""Prometheus metrics and OpenTelemetry traces (issue 14, items 1 and 2): what
``fencing.contrib.prometheus`` counts, the gauges ``watch`` reads, and the spans
``fencing.contrib.otel`` makes, with the link from the span that judged an intent to
the span that decided it (the SDK's in-memory exporter), carried in the intent's JSON.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import fencing
from fencing._observe import HUB

prometheus = pytest.importorskip("fencing.contrib.prometheus")
otel = pytest.importorskip("fencing.contrib.otel")

from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (  # noqa: E402
    InMemorySpanExporter,
)
from prometheus_client import CollectorRegistry, generate_latest  # noqa: E402


@pytest.fixture
def store(tmp_path: Path) -> Iterator[fencing.Store]:
    s = fencing.open(f"sqlite:///{tmp_path / 'store.db'}")
    yield s
    s.close()


@pytest.fixture
def registry() -> Iterator[CollectorRegistry]:
    reg = CollectorRegistry()
    prometheus.enable(reg)
    yield reg
    prometheus.disable(reg)
    assert not HUB.on


def value(reg: CollectorRegistry, metric: str, **labels: str) -> float:
    found = reg.get_sample_value(metric, labels)
    return 0.0 if found is None else found


def test_outcomes_latency_and_leases_are_counted(
    store: fencing.Store, registry: CollectorRegistry
) -> None:
    orders = store.collection("orders")
    record = orders.create("o-1", {"n": 0})
    intent = record.intent("a")
    orders.commit(intent, {"n": 1})
    orders.commit(intent, {"n": 1})
    orders.commit(record.intent("b"), {"n": 2})
    orders.apply(orders.intent("o-1", "c"), lambda r: {"n": 3})
    short = store.acquire("m-lease", owner="a", ttl=0.2)
    time.sleep(0.3)
    with store.lease("m-lease", owner="b", ttl=30) as lease:
        lease.renew()
        orders.commit(orders.intent("o-1", "d"), {"n": 4}, lease=short)
    with pytest.raises(fencing.LeaseHeld):
        store.acquire("m-held", owner="x", ttl=30) and store.acquire("m-held", owner="y", ttl=30)

    where = {"store": "sqlite", "kind": "collection", "collection": "orders"}
    for operation, outcome, count in [
        ("commit", "committed", 1),
        ("commit", "duplicate", 1),
        ("commit", "stale", 1),
        ("commit", "fenced", 1),
        ("apply", "committed", 1),
    ]:
        reason = "newer_owner" if outcome == "fenced" else ""
        got = value(
            registry,
            "fencing_outcomes_total",
            operation=operation,
            outcome=outcome,
            fence_reason=reason,
            **where,
        )
        assert got == count, (operation, outcome)
    assert value(registry, "fencing_fenced_commits_total", fence_reason="newer_owner", **where) == 1
    commits = value(registry, "fencing_operation_seconds_count", operation="commit", **where)
    assert commits == 4
    assert value(registry, "fencing_operation_seconds_sum", operation="commit", **where) > 0
    lease = {"store": "sqlite"}  # no lease name: it is per record (issue 18, item 8)
    assert (
        value(
            registry,
            "fencing_lease_operations_total",
            operation="lease.acquire",
            outcome="acquired",
            **lease,
        )
        == 3  # m-lease twice, m-held once: the series are per store, not per lease
    )
    assert (
        value(
            registry,
            "fencing_lease_operations_total",
            operation="lease.renew",
            outcome="renewed",
            **lease,
        )
        == 1
    )
    assert (
        value(
            registry,
            "fencing_lease_operations_total",
            operation="lease.release",
            outcome="released",
            **lease,
        )
        == 1
    )
    held = {"store": "sqlite"}
    assert (
        value(
            registry,
            "fencing_lease_operations_total",
            operation="lease.acquire",
            outcome="held",
            **held,
        )
        == 1
    )

    prometheus.disable(registry)  # off: nothing more is counted
    orders.commit(orders.intent("o-1", "e"), {"n": 5})
    assert (
        value(
            registry,
            "fencing_outcomes_total",
            operation="commit",
            outcome="committed",
            fence_reason="",
            **where,
        )
        == 1
    )


def test_lease_waits_are_counted(store: fencing.Store, registry: CollectorRegistry) -> None:
    store.acquire("w-lease", owner="a", ttl=0.3)
    store.acquire("w-lease", owner="b", ttl=30, wait=5)  # sleeps until a's lease expires
    assert value(registry, "fencing_lease_waits_total", store="sqlite") >= 1


def test_a_fenced_outcome_says_why(store: fencing.Store, registry: CollectorRegistry) -> None:
    """Issue 18, item 2: "another worker did it" (newer_owner) and "nobody did it"
    (expired) are two values of the fence_reason label, on both counters."""
    orders = store.collection("orders")
    orders.create("o-1", {"n": 0})
    orders.create("o-2", {"n": 0})
    expired = store.acquire(orders.lease_name("o-1"), owner="a", ttl=0.2)
    lost = store.acquire(orders.lease_name("o-2"), owner="a", ttl=0.2)
    time.sleep(0.3)
    store.acquire(orders.lease_name("o-2"), owner="b", ttl=30)  # a newer owner of o-2's
    one = orders.commit(orders.intent("o-1", "x"), {"n": 1}, lease=expired)
    two = orders.commit(orders.intent("o-2", "x"), {"n": 1}, lease=lost)
    assert isinstance(one, fencing.Fenced) and one.reason is fencing.FenceReason.EXPIRED
    assert isinstance(two, fencing.Fenced) and two.reason is fencing.FenceReason.NEWER_OWNER
    orders.commit(orders.intent("o-1", "y"), {"n": 2})
    where = {"store": "sqlite", "kind": "collection", "collection": "orders"}
    for reason in ("expired", "newer_owner"):
        assert value(registry, "fencing_fenced_commits_total", fence_reason=reason, **where) == 1
        fenced = {"operation": "commit", "outcome": "fenced", "fence_reason": reason}
        assert value(registry, "fencing_outcomes_total", **fenced, **where) == 1
    committed = {"operation": "commit", "outcome": "committed", "fence_reason": ""}
    assert value(registry, "fencing_outcomes_total", **committed, **where) == 1


def _series(registry: CollectorRegistry) -> list[str]:
    text = generate_latest(registry).decode()
    return [line for line in text.splitlines() if line and not line.startswith("#")]


@pytest.mark.parametrize("names", [3, 200])
def test_series_do_not_grow_with_lease_names(
    store: fencing.Store, registry: CollectorRegistry, names: int
) -> None:
    """Issue 18, item 8: a lease name is per record (``collection.lease_name(key)``), so
    it is no label value: leasing, renewing, releasing, being refused and committing
    under 3 or 200 distinct names make the same series, none naming a lease or a key."""
    orders = store.collection("orders")
    for i in range(names):
        key = f"key-{i}"
        orders.create(key, {"n": 0})
        with store.lease(orders.lease_name(key), owner="a", ttl=30) as lease:
            lease.renew()
            with pytest.raises(fencing.LeaseHeld):
                store.acquire(orders.lease_name(key), owner="b", ttl=30)
            orders.commit(orders.intent(key, "x"), {"n": 1}, lease=lease)
    series = _series(registry)
    assert not [line for line in series if "key-" in line]
    assert len(series) == EXPECTED_SERIES


#: the series of test_series_do_not_grow_with_lease_names, whatever the number of names:
#: outcomes (committed) 2 (total, created), latency 2 x (11 + 6 buckets + inf + count +
#: sum + created) for commit and 3 lease operations, lease operations 4 x 2, waits 1 x 2
EXPECTED_SERIES = 2 + 4 * (len(prometheus.BUCKETS) + len(prometheus.BUCKETS_MORE) + 4) + 4 * 2 + 2


def test_watch_reads_effects_to_reconcile_and_the_outbox(
    store: fencing.Store, registry: CollectorRegistry
) -> None:
    prometheus.watch(store, registry=registry, label="shop")
    assert value(registry, "fencing_effects_to_reconcile", store="shop") == 0
    assert value(registry, "fencing_outbox_pending", store="shop") == 0
    orders = store.collection("orders")
    record = orders.create("o-1", {"n": 0})
    late = record.intent("late")
    orders.effect(late, "charge")
    orders.commit(record.intent("first"), {"n": 1})
    assert orders.commit(late, {"n": 2}).kind == "stale"  # its effect needs reconciling
    assert value(registry, "fencing_effects_to_reconcile", store="shop") == 1
    pytest.importorskip("rq")
    from tests.contrib import rq_unit_jobs  # a fenced RQ job on a collection "orders"

    store.outbox.send(rq_unit_jobs.ship, orders.get("o-1"), "ship")
    assert value(registry, "fencing_outbox_pending", store="shop") == 1
    assert value(registry, "fencing_outbox_oldest_age_seconds", store="shop") >= 0
    assert value(registry, "fencing_outbox_dead", store="shop") == 0
    claim = store.outbox.claim("relay", "rq")
    assert store.outbox.bury(claim, claim.rows, "poison") == 1  # a relay gave it up
    assert value(registry, "fencing_outbox_dead", store="shop") == 1
    assert value(registry, "fencing_outbox_pending", store="shop") == 0
    with pytest.raises(fencing.InvalidInput):
        prometheus.watch(object(), registry=registry)
    with pytest.raises(fencing.InvalidInput):
        prometheus.watch(store, registry=registry, limit=0)


def test_enable_checks_its_registry() -> None:
    with pytest.raises(fencing.InvalidInput):
        prometheus.enable(registry="default")  # type: ignore[arg-type]
    with pytest.raises(fencing.InvalidInput):
        prometheus.serve(port=-1)


# -- traces -------------------------------------------------------------------------------------
@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    otel.enable(provider)
    yield exporter
    otel.disable()
    assert not HUB.on and HUB.trace is None


def test_the_judging_span_links_to_the_deciding_one(
    store: fencing.Store, spans: InMemorySpanExporter
) -> None:
    from opentelemetry import trace

    provider_tracer = otel._on[0].tracer  # the same provider as fencing's spans
    orders = store.collection("orders")
    orders.create("o-1", {"n": 0})
    with provider_tracer.start_as_current_span("decide") as decide:
        payload = orders.intent("o-1", "ship").to_json()  # the producer: enqueue it
    message = json.loads(payload)
    assert message["v"] == 3 and message["trace"].startswith("00-")
    assert trace.get_current_span().get_span_context().is_valid is False

    with provider_tracer.start_as_current_span("worker") as worker:  # another process, say
        intent = fencing.Intent.from_json(payload)
        assert orders.commit(intent, {"n": 1}).committed
    (commit,) = [s for s in spans.get_finished_spans() if s.name == "commit orders"]
    assert commit.parent is not None
    assert commit.parent.span_id == worker.get_span_context().span_id
    (link,) = commit.links
    assert link.context.trace_id == decide.get_span_context().trace_id
    assert link.context.span_id == decide.get_span_context().span_id
    attributes = dict(commit.attributes or {})
    assert attributes["db.system"] == "sqlite"
    assert attributes["db.operation.name"] == "commit"
    assert attributes["db.collection.name"] == "orders"
    assert attributes["fencing.outcome"] == "committed"
    assert attributes["fencing.expected_version"] == 1
    assert attributes["fencing.current_version"] == 2
    assert attributes["fencing.intent_id"] == intent.id
    assert commit.start_time is not None and commit.end_time is not None
    assert commit.start_time <= commit.end_time


def test_lease_and_apply_spans(store: fencing.Store, spans: InMemorySpanExporter) -> None:
    orders = store.collection("orders")
    orders.create("o-1", {"n": 0})
    with store.lease("t-lease", owner="a", ttl=30) as lease:
        orders.apply(orders.intent("o-1", "x"), lambda r: {"n": 1}, lease=lease)
    names = [s.name for s in spans.get_finished_spans()]
    # a lease name is per record by default: an attribute, never in the span's name
    assert names == ["lease.acquire", "apply orders", "lease.release"]
    acquired = dict(spans.get_finished_spans()[0].attributes or {})
    assert acquired["fencing.lease_name"] == "t-lease"
    apply_span = spans.get_finished_spans()[1]
    assert dict(apply_span.attributes or {})["fencing.lease_token"] == lease.token


def test_a_fenced_span_says_why(store: fencing.Store, spans: InMemorySpanExporter) -> None:
    """Issue 18, item 2: a fenced commit's span carries ``fencing.fence_reason``; the
    other outcomes' spans carry none."""
    orders = store.collection("orders")
    orders.create("o-1", {"n": 0})
    lease = store.acquire(orders.lease_name("o-1"), owner="a", ttl=0.2)
    time.sleep(0.3)
    store.acquire(orders.lease_name("o-1"), owner="b", ttl=30)  # a newer owner
    assert not orders.commit(orders.intent("o-1", "x"), {"n": 1}, lease=lease).committed
    assert orders.commit(orders.intent("o-1", "y"), {"n": 1}).committed
    fenced, committed = [s for s in spans.get_finished_spans() if s.name == "commit orders"]
    assert dict(fenced.attributes or {})["fencing.outcome"] == "fenced"
    assert dict(fenced.attributes or {})["fencing.fence_reason"] == "newer_owner"
    assert "fencing.fence_reason" not in dict(committed.attributes or {})


# -- the intent's format 3 ------------------------------------------------------------------------
TRACE = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def _intent_json(**fields: Any) -> str:
    data = {"v": 1, "id": "i-1", "kind": "collection", "collection": "orders", "key": "o-1"}
    data |= {"expected_version": 1, "transition": "ship", "guard": None, "decided_at": 0.0}
    return json.dumps(data | fields)


def test_trace_is_format_3_and_optional() -> None:
    old = fencing.Intent.from_json(_intent_json())
    assert old.trace is None and '"v":1' in old.to_json()  # old intents load, unchanged
    traced = fencing.Intent.from_json(_intent_json(v=3, trace=TRACE))
    assert traced.trace == TRACE and traced == old  # the trace is not the intent's identity
    assert fencing.Intent.from_json(traced.to_json()).trace == TRACE
    assert traced.derive(2, 1).trace == TRACE  # a Recompute attempt links to the decision
    assert fencing.Intent.from_json(_intent_json(v=3)).trace is None
    signer = fencing.Signer(keys={"k": b"0123456789abcdef0123"}, current="k")
    assert signer.verify(signer.sign(traced)).trace == TRACE


@pytest.mark.parametrize(
    "fields",
    [
        {"v": 2, "trace": TRACE},  # a trace needs format 3
        {"v": 3, "trace": "not-a-traceparent"},
        {"v": 3, "trace": "00-" + "0" * 32 + "-b7ad6b7169203331-01"},  # an invalid trace id
        {"v": 3, "trace": 7},
        {"v": 4},
    ],
)
def test_bad_trace_fields_are_refused(fields: dict[str, Any]) -> None:
    with pytest.raises(fencing.InvalidIntent):
        fencing.Intent.from_json(_intent_json(**fields))
