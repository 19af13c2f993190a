"""A record's own lease, as its store names it (``target.lease_name(key)``), is what a
fenced task takes by default, and a fenced commit under it works on every store: on a
Redis Cluster a table row's lease must live in the row's hash slot, so there it is the
row's own key (``<table_prefix><table>:<key>``), not ``<table>/<key>``."""

from __future__ import annotations

from typing import Any

import pytest

import fencing
from fencing._url import StoreURL
from fencing.contrib._common import FencedTask, LeaseSpec


def _ship(record: fencing.Record) -> dict[str, Any]:
    return {"status": "shipped"}


@pytest.mark.apis(only=["sync"])  # the task runner is sync here; the name is shared code
def test_a_tasks_default_lease_fences_a_table_row(
    store: Any, store_url: str, backend_name: str, make_table: Any
) -> None:
    table = make_table("lease_names_t", [{"id": 1, "status": "new"}])
    name = table.lease_name(1)
    if backend_name.startswith("redis"):
        prefix = StoreURL.parse(store_url).options.get("table_prefix", "")
        assert name == f"{prefix}lease_names_t:1"
    else:
        assert name == "lease_names_t/1"
    spec = FencedTask(name="t.ship", target=table, decide=_ship, lease=LeaseSpec(ttl=5))
    report = spec.run(spec.encode(table.intent(1, "ship")))
    assert report.kind == "committed", report.error
    assert report.token is not None
    row = table.get(1)
    assert row is not None and row.state["status"] == "shipped"
    with store.lease(name, owner="busy", ttl=5):  # the task's lease is that one
        held = spec.run(spec.encode(table.intent(1, "ship")))
    assert held.kind == "lease_held"


@pytest.mark.apis(only=["sync"])
def test_a_collection_records_lease_is_collection_slash_key(store: Any) -> None:
    orders = store.collection("orders")
    assert orders.lease_name("o-1") == "orders/o-1"
    with pytest.raises(fencing.InvalidIdentifier):
        orders.lease_name(7)  # collection keys are strings
