"""The Redis key layout is injective: no name or key reaches another kind's key.

Guarded table rows are the user's hashes, named ``<table_prefix><table>:<key>`` with any
key; with the default empty ``table_prefix`` the table named like the prefix addressed
all of fencing's own keys (a commit to its row ``lease:{name}`` set that lease's token
back to 0; one to ``c:...:rec`` replaced a record's raw state). Such a table is refused.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

import fencing
from fencing import InvalidIdentifier
from fencing._request import Target
from fencing.backends.redis.layout import Layout

from ._backends import require_server
from .backends_redis import HOST, PORT, cleanup, redis_url

# names and keys chosen to break a layout that splits on ':', '/', '{' or '}'
COLLECTIONS = ["a", "a:b", "a/b", "c", "lease", "t", "fx", "a:b/c"]
KEYS: list[str | int] = ["b", "b/c", "c:b", "x}:rec", "{y}", "c:{a/b}:rec", ":", "}", "{", 7]
LEASES = ["a/b", "a:b", "lease", "c/b", "b/c", "fencing"]
TABLES = ["t", "a", "orders", "schema", "lease_x"]


def _all_keys(layout: Layout) -> Iterator[tuple[str, tuple[Any, ...]]]:
    """Every key the layout names for these inputs, with what it is the key of."""
    yield layout.schema, ("schema",)
    yield layout.effect_rows, ("effect rows",)
    yield layout.effects_open, ("effects open",)
    for collection, key in itertools.product(COLLECTIONS, KEYS):
        target = Target("collection", collection)
        yield layout.record(target, key), ("record", collection, str(key))
        yield layout.applied(target, key), ("applied", collection, str(key))
        yield layout.tombstone(target, key), ("tombstone", collection, str(key))
    for name in LEASES:
        yield layout.lease(name), ("lease", name)
    for table in TABLES:
        try:
            layout.check_table(table)
        except InvalidIdentifier:
            continue
        target = Target("table", table, "id", "version")
        yield layout.table(table), ("table", table)
        for key in KEYS:
            yield layout.row(table, key), ("row", table, str(key))
            yield layout.applied(target, key), ("table applied", table, str(key))
            yield layout.fence(target, key), ("fence", table, str(key))


@pytest.mark.parametrize(
    ("prefix", "table_prefix"),
    [
        ("fencing", ""),
        ("fencing", "fencing:"),
        ("fencing", "fencing:tables:"),
        ("a", ""),
        ("a:b", ""),
        ("t", "t:"),
    ],
)
def test_no_two_things_share_a_key(prefix: str, table_prefix: str) -> None:
    layout = Layout(prefix, table_prefix)
    owner: dict[str, tuple[Any, ...]] = {}
    for key, what in _all_keys(layout):
        # (an integer key and its decimal text name the same record: one thing)
        assert owner.setdefault(key, what) == what, f"{key!r}: {owner[key]} and {what}"


@pytest.mark.parametrize(
    ("prefix", "table_prefix", "table"),
    [
        ("fencing", "", "fencing"),  # the default: every internal key was a row
        ("orders", "", "orders"),
        ("fencing", "fencing:c:", "x"),  # rows among the records
        ("fencing", "fencing:", "lease"),  # rows among the leases
        ("fencing", "fencing:", "t"),
        ("fencing", "fencing:", "fx"),
        ("fencing", "fencing:", "table"),
        ("a:b", "", "a"),  # rows named 'b:schema', 'b:c:...': all of a:b's keys
        ("a:b:c", "a:", "b"),
    ],
)
def test_a_table_whose_rows_would_be_internal_keys_is_refused(
    prefix: str, table_prefix: str, table: str
) -> None:
    layout = Layout(prefix, table_prefix)
    with pytest.raises(InvalidIdentifier, match="fencing's own keys"):
        layout.check_table(table)
    with pytest.raises(InvalidIdentifier):
        layout.row(table, "lease:{x}")


@pytest.mark.parametrize(
    ("prefix", "table_prefix", "table"),
    [
        ("fencing", "", "orders"),
        ("fencing", "fencing:tables:", "fencing"),
        ("fencing", "fencing:", "orders"),  # 'fencing:orders:...' is no kind of ours
        ("fencing", "fencing:", "schema"),  # 'fencing:schema:K' is never 'fencing:schema'
        ("fencing", "app:", "fencing"),
    ],
)
def test_other_tables_are_allowed(prefix: str, table_prefix: str, table: str) -> None:
    assert Layout(prefix, table_prefix).check_table(table) == table


@pytest.fixture
def colliding_url() -> Iterator[str]:
    """A store whose prefix ends like a table name right after its table_prefix: the
    default layout's collision (table_prefix empty, table named like the prefix)."""
    require_server("redis", HOST, PORT)
    base = f"fencing-test-{uuid.uuid4().hex[:12]}"
    url = redis_url(prefix=f"{base}:ledger", table_prefix=f"{base}:")
    yield url
    cleanup(url)


def test_the_table_named_like_the_prefix_cannot_reset_a_lease(colliding_url: str) -> None:
    with fencing.open(colliding_url) as store:
        for expected in (1, 2, 3):
            with store.lease("job", owner="w", ttl=30) as lease:
                assert lease.token == expected
        ledger = store.table("ledger", key="id", version="token", columns=["owner"])
        # its row "lease:{job}" is the lease's hash: refused before anything is sent
        with pytest.raises(InvalidIdentifier, match="fencing's own keys"):
            ledger.intent("lease:{job}", "reset")
        with pytest.raises(InvalidIdentifier, match="fencing's own keys"):
            ledger.get("schema")
        records = store.collection("orders")
        records.create("o-1", {"status": "new"})
        with store.lease("job", owner="w", ttl=30) as lease:
            assert lease.token == 4
        got = records.get("o-1")
        assert got is not None and dict(got.state) == {"status": "new"}
