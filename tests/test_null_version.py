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


@pytest.mark.backends(only=lambda name: name.startswith(("memory", "sqlite", "postgres")))
def test_a_null_or_non_integer_version_says_which_row_and_column(
    store: Any, make_table: Any
) -> None:
    make_table("orders_t", [{"id": 1, "status": "new"}], version=None)
    with pytest.raises(fencing.SchemaError) as null:
        store.table("orders_t", key="id", version="total").get(1)
    assert str(null.value) == (
        "table 'orders_t' row 1 has NULL in its version column 'total': a guarded table's"
        " version column must be an integer, NOT NULL (fencing migrate URL --guard-table"
        " adds the guard)"
    )
    with pytest.raises(fencing.SchemaError) as text:
        store.table("orders_t", key="id", version="status").get(1)
    assert str(text.value) == "table 'orders_t' row 1 has a non-integer version in column 'status'"
