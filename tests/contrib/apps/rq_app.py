"""The RQ jobs the end-to-end tests run: ``rq worker --with-scheduler QUEUE``.

Job functions are module attributes, imported by name in each forked work horse, so
each fenced job is defined here (RQ imports ``tests.contrib.apps.rq_app.mark``).
"""

from __future__ import annotations

from typing import Any

import fencing
from fencing.contrib.rq import Backoff, fenced_job

from . import _shared

_common: dict[str, Any] = {
    "signer": _shared.SIGNER,
    "on_outcome": _shared.after_run,
    "backoff": Backoff(0.5, 1.0),
}


@fenced_job(target=_shared.orders, name="e2e.mark", **_common)
def mark(record: fencing.Record) -> dict[str, Any]:
    return _shared.mark(record)


@fenced_job(target=_shared.orders, lease=_shared.LEASE, name="e2e.mark_leased", **_common)
def mark_leased(record: fencing.Record) -> dict[str, Any]:
    return _shared.mark(record)


@fenced_job(
    target=_shared.orders,
    on_stale=fencing.Recompute(attempts=30, backoff=0.01, max_backoff=0.2),
    name="e2e.bump",
    **_common,
)
def bump(record: fencing.Record) -> dict[str, Any]:
    return _shared.bump(record)


@fenced_job(target=_shared.impatient_orders, max_retries=8, name="e2e.mark_impatient", **_common)
def mark_impatient(record: fencing.Record) -> dict[str, Any]:
    return _shared.mark(record)


@fenced_job(
    target=_shared.orders,
    on_stale=fencing.Reconcile(_shared.refund),
    name="e2e.charge",
    **_common,
)
def charge(record: fencing.Record) -> dict[str, Any]:
    return _shared.charge(record)


naive_mark = _shared.naive_mark
naive_bump = _shared.naive_bump
ping = _shared.ping
