"""A module-level fenced RQ job for the metrics test (RQ imports jobs by ``module.name``):
its store is the SQLite file named by ``FENCING_OBS_DB``."""

from __future__ import annotations

import os
from typing import Any

import fencing
from fencing.contrib.rq import fenced_job


def _orders() -> fencing.Collection:
    return fencing.open(f"sqlite:///{os.environ['FENCING_OBS_DB']}").collection("obs_orders")


@fenced_job(target=_orders, name="obs.ship")
def ship(record: fencing.Record) -> dict[str, Any]:
    return {**record.state, "status": "shipped"}
