"""The Dramatiq actors of the end-to-end tests.

Run as ``dramatiq tests.contrib.apps.dramatiq_app:broker``.

``make_broker`` and ``build`` are shared by the worker (configured from the
environment) and the test process (which sends through its own broker object).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import dramatiq
from dramatiq.brokers.rabbitmq import RabbitmqBroker
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import CurrentMessage

import fencing
from fencing.contrib.dramatiq import Backoff, FencedActor, fenced_actor

from . import _shared

#: A worker whose heartbeat is older than this is dead: its unacknowledged messages
#: go back to the queue at the next maintenance (which every command runs here).
HEARTBEAT_TIMEOUT_MS = 6000


def make_broker(url: str, namespace: str) -> dramatiq.Broker:
    broker: dramatiq.Broker
    if url.startswith("redis"):
        broker = RedisBroker(
            url=url,
            namespace=namespace,
            heartbeat_timeout=HEARTBEAT_TIMEOUT_MS,
            maintenance_chance=1_000_000,
        )
    else:
        broker = RabbitmqBroker(url=url, confirm_delivery=True)
    broker.add_middleware(CurrentMessage())
    return broker


@dataclass
class DramatiqActors:
    mark: FencedActor
    mark_leased: FencedActor
    bump: FencedActor
    mark_impatient: FencedActor
    charge: FencedActor
    naive_mark: Any
    naive_bump: Any
    ping: Any


def build(broker: dramatiq.Broker, queue: str) -> DramatiqActors:
    common: dict[str, Any] = {
        "broker": broker,
        "queue_name": queue,
        "signer": _shared.SIGNER,
        "on_outcome": _shared.after_run,
        "backoff": Backoff(0.2, 1.0),
    }
    mark = fenced_actor(target=_shared.orders, actor_name="e2e_mark", **common)(_shared.mark)
    mark_leased = fenced_actor(
        target=_shared.orders, lease=_shared.LEASE, actor_name="e2e_mark_leased", **common
    )(_shared.mark)
    bump = fenced_actor(
        target=_shared.orders,
        on_stale=fencing.Recompute(attempts=30, backoff=0.01, max_backoff=0.2),
        actor_name="e2e_bump",
        **common,
    )(_shared.bump)
    mark_impatient = fenced_actor(
        target=_shared.impatient_orders, max_retries=8, actor_name="e2e_mark_impatient", **common
    )(_shared.mark)
    charge = fenced_actor(
        target=_shared.orders,
        on_stale=fencing.Reconcile(_shared.refund),
        actor_name="e2e_charge",
        **common,
    )(_shared.charge)
    # The naive twins: Dramatiq's defaults (retries on any exception), the same queue.
    naive_mark = dramatiq.actor(
        broker=broker, queue_name=queue, actor_name="e2e_naive_mark", max_retries=3, min_backoff=200
    )(_shared.naive_mark)
    naive_bump = dramatiq.actor(
        broker=broker, queue_name=queue, actor_name="e2e_naive_bump", max_retries=3, min_backoff=200
    )(_shared.naive_bump)
    ping = dramatiq.actor(broker=broker, queue_name=queue, actor_name="e2e_ping")(_shared.ping)
    return DramatiqActors(
        mark, mark_leased, bump, mark_impatient, charge, naive_mark, naive_bump, ping
    )


if "FENCING_E2E_BROKER" in os.environ:
    broker = make_broker(os.environ["FENCING_E2E_BROKER"], os.environ["FENCING_E2E_PREFIX"])
    dramatiq.set_broker(broker)
    actors = build(broker, os.environ["FENCING_E2E_QUEUE"])
