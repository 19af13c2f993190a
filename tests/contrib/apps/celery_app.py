"""The Celery app the end-to-end tests run: ``celery -A tests.contrib.apps.celery_app worker``.

``build(broker_url, queue)`` makes an app with the fenced tasks and their naive twins;
the worker builds it from ``FENCING_E2E_BROKER`` and ``FENCING_E2E_QUEUE``, the test
process builds its own for the same broker and queue to send with.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from celery import Celery

import fencing
from fencing.contrib.celery import Backoff, FencedCeleryTask, fenced_task

from . import _shared


@dataclass
class CeleryTasks:
    app: Celery
    mark: FencedCeleryTask
    mark_leased: FencedCeleryTask
    bump: FencedCeleryTask
    mark_impatient: FencedCeleryTask
    charge: FencedCeleryTask
    ship_order: FencedCeleryTask
    naive_mark: Any
    naive_bump: Any
    ping: Any


def build(broker_url: str, queue: str, prefix: str) -> CeleryTasks:
    app = Celery("fencing_e2e", broker=broker_url, set_as_current=False)
    app.conf.update(
        task_default_queue=queue,
        task_serializer="json",
        accept_content=["json"],
        task_ignore_result=True,
        worker_prefetch_multiplier=1,
        worker_hijack_root_logger=False,
        broker_connection_retry_on_startup=True,
        worker_enable_remote_control=False,
        worker_send_task_events=False,
    )
    if broker_url.startswith("redis"):
        app.conf.broker_transport_options = {"global_keyprefix": f"{prefix}:"}
    else:  # RabbitMQ: the outbox relay's publisher requires confirms
        app.conf.broker_transport_options = {"confirm_publish": True}
    common: dict[str, Any] = {
        "signer": _shared.SIGNER,
        "on_outcome": _shared.after_run,
        "backoff": Backoff(0.2, 1.0),
    }
    mark = fenced_task(app, target=_shared.orders, name="e2e.mark", **common)(_shared.mark)
    mark_leased = fenced_task(
        app, target=_shared.orders, lease=_shared.LEASE, name="e2e.mark_leased", **common
    )(_shared.mark)
    bump = fenced_task(
        app,
        target=_shared.orders,
        on_stale=fencing.Recompute(attempts=30, backoff=0.01, max_backoff=0.2),
        name="e2e.bump",
        **common,
    )(_shared.bump)
    mark_impatient = fenced_task(
        app, target=_shared.impatient_orders, max_retries=8, name="e2e.mark_impatient", **common
    )(_shared.mark)
    charge = fenced_task(
        app,
        target=_shared.orders,
        on_stale=fencing.Reconcile(_shared.refund),
        name="e2e.charge",
        **common,
    )(_shared.charge)
    ship_order = fenced_task(app, target=_shared.shop_orders, name="e2e.ship_order", **common)(
        _shared.ship_order
    )
    naive = {"acks_late": True, "reject_on_worker_lost": True}
    naive_mark = app.task(name="e2e.naive_mark", **naive)(_shared.naive_mark)
    naive_bump = app.task(name="e2e.naive_bump", **naive)(_shared.naive_bump)
    ping = app.task(name="e2e.ping")(_shared.ping)
    return CeleryTasks(
        app,
        mark,
        mark_leased,
        bump,
        mark_impatient,
        charge,
        ship_order,
        naive_mark,
        naive_bump,
        ping,
    )


if "FENCING_E2E_BROKER" in os.environ:
    tasks = build(
        os.environ["FENCING_E2E_BROKER"],
        os.environ["FENCING_E2E_QUEUE"],
        os.environ["FENCING_E2E_PREFIX"],
    )
    app = tasks.app
