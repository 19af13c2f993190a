"""The worker's tasks: ``ship`` (under the order's lease, in the worker's own
transaction) and ``notify``, chained through the outbox.

Run it with ``celery -A shop.tasks worker``. Each task is sent as a row of fencing's
outbox, written in the transaction that decided it, and published by ``fencing relay``.
"""

from __future__ import annotations

import os
from typing import Any

from celery import Celery

import fencing
from fencing.contrib.celery import LeaseSpec, Step, fenced_task

from . import db
from .models import Notification, Order, Shipment

app = Celery("shop", broker=os.environ.get("SHOP_BROKER_URL", "redis://localhost:6379/0"))
app.conf.update(
    task_ignore_result=True,
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
)
if os.environ.get("SHOP_BROKER_PREFIX"):  # share a Redis database: every key prefixed
    app.conf.broker_transport_options = {"global_keyprefix": os.environ["SHOP_BROKER_PREFIX"]}


def orders() -> fencing.Table:
    """The guarded table, once per worker process (called after Celery's fork)."""
    return db.store().table(Order)


def write_notification(step: Step) -> None:
    """After ``notify``'s fenced commit, in its transaction: the message to send."""
    order_id = int(step.record.key)
    step.connection.add(Notification(order_id=order_id, message=f"order {order_id} shipped"))


@fenced_task(
    app, target=orders, name="shop.notify", transaction=db.Session, then=write_notification
)
def notify(order: fencing.Record) -> dict[str, Any]:
    return {"notified": True}


def carrier_for(order: fencing.Record) -> str:
    return "freight" if order.state["total"] >= 100_00 else "post"


def book_shipment(step: Step) -> None:
    """After ``ship``'s fenced commit, in its transaction: the shipment row and the next
    step's message, taken at the version the commit produced (it arrives fresh)."""
    order_id = int(step.record.key)
    step.connection.add(Shipment(order_id=order_id, carrier=carrier_for(step.record)))
    step.send(notify, step.record, "notify")


@fenced_task(
    app,
    target=orders,
    name="shop.ship",
    lease=LeaseSpec(ttl=30),  # a worker paused past it is fenced if another took over
    transaction=db.Session,  # the order, its shipment and notify's row: all or nothing
    then=book_shipment,
)
def ship(order: fencing.Record) -> dict[str, Any]:
    # decided against the version the payment committed; a cancellation since then
    # makes the commit Stale, and nothing of this run is written
    return {"status": "shipped"}
