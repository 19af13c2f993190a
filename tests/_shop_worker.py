"""The example shop's worker as tests/test_example_shop.py runs it:
``celery -A tests._shop_worker worker``, that is ``shop.tasks`` with three test hooks.

Configured through the environment: ``SHOP_TEST_CONTROL`` is a directory for control
files. Every task's report (what the task returns) is appended to ``reports.jsonl``
there. ``ship`` runs under a 1 s lease (the shop's is 30 s), so a pause outlives it;
``ship`` of an order with a ``pause-<id>`` file writes ``paused-<id>`` (its pid) once it
holds the lease and has started deciding, then waits for ``resume-<id>`` (the test
SIGSTOPs it meanwhile); one with a ``hang-<id>`` file hangs right after its committed
run, before Celery acknowledges the message, until the test SIGKILLs it (the first
time only: the redelivery runs to the end).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from celery.signals import task_postrun
from shop.tasks import app, ship

import fencing
from fencing.contrib.celery import LeaseSpec

__all__ = ["app"]

CONTROL = Path(os.environ["SHOP_TEST_CONTROL"])
WAIT_LIMIT = 60.0  # no control wait lasts longer, whatever happens

ship.fencing.lease = LeaseSpec(ttl=1.0, heartbeat=True)
_decide = ship.fencing.decide


def _announce(name: str) -> None:
    tmp = CONTROL / f".{name}.{os.getpid()}"
    tmp.write_text(str(os.getpid()))
    tmp.rename(CONTROL / name)  # appears whole


def _pausable(order: fencing.Record) -> Any:
    if (CONTROL / f"pause-{order.key}").exists():
        _announce(f"paused-{order.key}")
        deadline = time.monotonic() + WAIT_LIMIT
        while not (CONTROL / f"resume-{order.key}").exists() and time.monotonic() < deadline:
            time.sleep(0.01)
    return _decide(order)


ship.fencing.decide = _pausable


@task_postrun.connect
def _after(task: Any = None, retval: Any = None, **_: Any) -> None:
    if not isinstance(retval, dict) or "outcome" not in retval:
        return
    with open(CONTROL / "reports.jsonl", "a") as out:
        out.write(json.dumps({**retval, "pid": os.getpid()}) + "\n")
    key = retval["key"]
    if (
        retval["task"] == "shop.ship"
        and retval["outcome"] == "committed"
        and (CONTROL / f"hang-{key}").exists()
        and not (CONTROL / f"hung-{key}").exists()
    ):
        _announce(f"hung-{key}")
        time.sleep(WAIT_LIMIT)  # the test SIGKILLs this process long before
