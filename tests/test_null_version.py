"""A NULL in a guarded table's version column is a ``SchemaError`` (not a bare
``TypeError``) on every read, probe and commit, every backend, sync and async.
Nothing is written."""

from __future__ import annotations

from typing import Any

import pytest

import fencing


def test_a_null_version_is_a_schema_error(store: Any, make_table: Any) -> None:
    # "total" is a nullable INTEGER column, used here as the version column
    make_table("orders_t", [{"id": 1, "status": "new"}], version=None)
    plain = store.table("orders_t", key="id", version=None)
    assert plain.get(1).state.get("total") is None  # Redis keeps no field for None
    table = store.table("orders_t", key="id", version="total")
    with pytest.raises(fencing.SchemaError, match="NULL"):
        table.get(1)
    with pytest.raises(fencing.SchemaError, match="NULL"):
        table.intent(1, "ship")
    intent = fencing.Intent.new("orders_t", 1, 1, "ship", kind="table")
    with pytest.raises(fencing.SchemaError, match="NULL"):
        table.commit(intent, {"status": "shipped"})
    with pytest.raises(fencing.SchemaError, match="NULL"):
        table.commit_many([(intent, {"status": "shipped"})])
    with pytest.raises(fencing.SchemaError, match="NULL"):
        table.apply(intent, lambda r: {"status": "shipped"})
    assert plain.get(1).state["status"] == "new"
