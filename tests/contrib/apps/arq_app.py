"""The arq functions the end-to-end tests run: ``arq tests.contrib.apps.arq_app.WorkerSettings``."""

from __future__ import annotations

import os
from typing import Any, ClassVar

from arq.connections import RedisSettings
from arq.worker import Function, func

import fencing
from fencing.contrib.arq import Backoff, fenced_function

from . import _shared

#: arq re-runs a job a killed worker held once its "in progress" key expires: the
#: job's timeout plus 10 s. Keep the timeout short (it must outlast a paused task).
JOB_TIMEOUT = 6.0

_common: dict[str, Any] = {
    "signer": _shared.SIGNER,
    "on_outcome": _shared.aafter_run,
    "backoff": Backoff(0.2, 1.0),
    "timeout": JOB_TIMEOUT,
    "keep_result": 60,
}

mark = fenced_function(target=_shared.async_orders, name="e2e.mark", **_common)(_shared.amark)
mark_leased = fenced_function(
    target=_shared.async_orders, lease=_shared.LEASE, name="e2e.mark_leased", **_common
)(_shared.amark)
bump = fenced_function(
    target=_shared.async_orders,
    on_stale=fencing.Recompute(attempts=30, backoff=0.01, max_backoff=0.2),
    name="e2e.bump",
    **_common,
)(_shared.abump)
mark_impatient = fenced_function(
    target=_shared.async_impatient_orders, max_retries=8, name="e2e.mark_impatient", **_common
)(_shared.amark)

charge = fenced_function(
    target=_shared.async_orders,
    on_stale=fencing.Reconcile(_shared.refund),
    name="e2e.charge",
    **_common,
)(_shared.acharge)


async def naive_mark(
    ctx: dict[str, Any], key: str, label: str, msg_id: str, decided: int | None, locked: bool
) -> str:
    return await _shared.anaive_mark(key, label, msg_id, decided, locked)


async def naive_bump(ctx: dict[str, Any], key: str, msg_id: str) -> str:
    return await _shared.anaive_bump(key, msg_id)


async def ping(ctx: dict[str, Any], token: str) -> str:
    return _shared.ping(token)


def redis_settings(url: str) -> RedisSettings:
    return RedisSettings.from_dsn(url)


class WorkerSettings:
    functions: ClassVar[list[Function]] = [
        mark,
        mark_leased,
        bump,
        mark_impatient,
        charge,
        func(naive_mark, name="e2e.naive_mark", timeout=JOB_TIMEOUT, max_tries=2),
        func(naive_bump, name="e2e.naive_bump", timeout=JOB_TIMEOUT, max_tries=2),
        func(ping, name="e2e.ping"),
    ]
    redis_settings = redis_settings(
        os.environ.get("FENCING_E2E_BROKER", "redis://127.0.0.1:6379/14")
    )
    queue_name = os.environ.get("FENCING_E2E_QUEUE", "fencing-e2e")
    job_timeout = JOB_TIMEOUT  # also bounds the "in progress" expiry (the longest timeout + 10 s)
    max_jobs = 4
    poll_delay = 0.05
    handle_signals = True
