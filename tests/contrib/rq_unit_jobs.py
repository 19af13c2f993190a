"""A module-level fenced RQ job, as RQ needs it (imported by ``module.name``)."""

from __future__ import annotations

from typing import Any

import fencing
from fencing.contrib.rq import fenced_job


def _orders() -> fencing.Collection:
    return fencing.open("memory://").collection("orders")


@fenced_job(target=_orders)
def ship(record: fencing.Record) -> dict[str, Any]:
    return {**record.state, "status": "shipped"}
