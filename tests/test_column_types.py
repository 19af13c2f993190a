"""Real column types on guarded tables (issue 12, item 4), on every backend, sync and async:
``Decimal``, ``datetime`` (naive and aware), ``date``, ``time``, ``timedelta``, ``UUID``,
``bytes`` and enum members are written through ``table.commit``, read back as the driver
gives them, guarded on (an intent through ``to_json``/``from_json`` and a ``Signer``, a
guard taken from the row, ``apply``'s probe), and written back as read (``{**state}``).
What a backend cannot hold it refuses with ``InvalidState`` before anything is written.
"""

from __future__ import annotations

import datetime as dt
import enum
import uuid
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pytest

import fencing
from fencing import Committed, Intent, InvalidState, Stale

from ._backends import CASES


class Colour(enum.Enum):
    RED = "red"
    BLUE = "blue"


TZ2 = dt.timezone(dt.timedelta(hours=2))
UID = uuid.UUID("0f8fad5b-d9cb-469f-a165-70867728950e")

# column -> (the value written, another value of the same type)
VALUES: dict[str, tuple[Any, Any]] = {
    "total": (Decimal("9.50"), Decimal("12.25")),
    "at": (dt.datetime(2026, 12, 3, 10, 0, 0, 123456), dt.datetime(2026, 12, 4, 8, 30)),
    "at_tz": (dt.datetime(2026, 12, 3, 10, tzinfo=TZ2), dt.datetime(2026, 1, 1, tzinfo=dt.UTC)),
    "day": (dt.date(2026, 12, 3), dt.date(1999, 1, 31)),
    "clock": (dt.time(10, 30, 15, 5), dt.time(23, 59, 59)),
    "span": (dt.timedelta(hours=5, minutes=3, seconds=2), dt.timedelta(hours=1)),
    "uid": (UID, uuid.UUID(int=1)),
    "raw": (b"\x00\xffbin", b""),
    "colour": (Colour.RED, Colour.BLUE),
}  # fmt: skip

# per backend: column -> SQL type (what the backend refuses: REFUSED)
SQL_TYPES: dict[str, dict[str, str]] = {
    "sqlite": {
        "total": "NUMERIC(12,2)",
        "at": "DATETIME",
        "at_tz": "TEXT",
        "day": "DATE",
        "clock": "TIME",
        "span": "TEXT",
        "uid": "CHAR(32)",
        "raw": "BLOB",
        "colour": "VARCHAR(10)",
    },
    "postgresql": {
        "total": "NUMERIC(12,2)",
        "at": "TIMESTAMP",
        "at_tz": "TIMESTAMPTZ",
        "day": "DATE",
        "clock": "TIME",
        "span": "INTERVAL",
        "uid": "UUID",
        "raw": "BYTEA",
        "colour": "VARCHAR(10)",
    },
    "mysql": {
        "total": "DECIMAL(12,2)",
        "at": "DATETIME(6)",
        "at_tz": "DATETIME(6)",
        "day": "DATE",
        "clock": "TIME(6)",
        "span": "TIME(6)",
        "uid": "UUID",
        "raw": "VARBINARY(64)",
        "colour": "VARCHAR(10)",
    },
}
# what each backend refuses, with the reason its error gives
REFUSED: dict[str, dict[str, str]] = {
    "sqlite": {"span": "SQLite has no such type"},
    "mysql": {"at_tz": "time zone"},
}


def _family(backend_name: str) -> str:
    if backend_name.startswith("sqlite"):
        return "sqlite"
    return backend_name


def _typed_columns(backend_name: str) -> bool:
    """The backends whose guarded tables hold these types (Redis's rule is its own)."""
    return _family(backend_name) == "memory" or _family(backend_name) in SQL_TYPES


def _columns(backend_name: str) -> dict[str, str]:
    family = _family(backend_name)
    if family == "memory":
        return dict.fromkeys(VALUES, "")
    return SQL_TYPES[family]


def _meaning(backend_name: str, column: str, read: Any) -> Any:
    """What a value read back means, as the Python value that was written."""
    written = VALUES[column][0]
    family = _family(backend_name)
    if family == "sqlite":
        # SQLite gives text (ISO forms, 32 hex digits), a number or bytes
        parse: dict[str, Callable[[Any], Any]] = {
            "total": lambda v: Decimal(str(v)),
            "at": lambda v: dt.datetime.fromisoformat(v),
            "at_tz": lambda v: dt.datetime.fromisoformat(v),
            "day": dt.date.fromisoformat,
            "clock": dt.time.fromisoformat,
            "uid": uuid.UUID,
        }
        read = parse.get(column, lambda v: v)(read)
    elif family == "mysql" and column == "clock":
        # PyMySQL reads a TIME column as a timedelta
        assert isinstance(read, dt.timedelta)
        read = (dt.datetime.min + read).time()
    elif family == "mysql" and column == "uid":
        read = uuid.UUID(read)  # MariaDB's UUID type reads back as text
    if isinstance(written, enum.Enum):
        return Colour(read)
    return read


@pytest.fixture
def typed(store: Any, backend_name: str) -> Any:
    """A guarded table with a column of each type the backend takes, holding row 1."""
    columns = _columns(backend_name)
    target = store.unwrapped if hasattr(store, "unwrapped") else store
    create = CASES[backend_name].create_table
    assert create is not None
    create(target, "typed_t", "id", "version", {**columns, "note": "VARCHAR(40)"}, [{"id": 1}])
    return store.table("typed_t", key="id", version="version")


def _taken(backend_name: str) -> dict[str, Any]:
    refused = REFUSED.get(_family(backend_name), {})
    return {
        c: v for c, (v, _) in VALUES.items() if c in _columns(backend_name) and c not in refused
    }


@pytest.mark.backends(only=_typed_columns)
def test_each_type_written_read_back_and_guarded(typed: Any, backend_name: str) -> None:
    taken = _taken(backend_name)
    out = typed.commit(typed.intent(1, "fill"), taken)
    assert isinstance(out, Committed), out
    rec = typed.get(1)
    assert rec == out.record and rec.version == 2
    for column, value in taken.items():
        expected = value.value if isinstance(value, enum.Enum) else value
        meant = _meaning(backend_name, column, rec.state[column])
        assert meant == (Colour(expected) if column == "colour" else expected), column
    signer = fencing.Signer(keys={"k1": b"k" * 32}, current="k1")
    for column, value in taken.items():
        other = VALUES[column][1]
        # a guard on the value written: through JSON and a signed token, it holds
        intent = typed.intent(1, f"g-{column}", guard={column: value})
        carried = signer.verify(signer.sign(Intent.from_json(intent.to_json())))
        assert carried == intent and carried.guard is not None
        assert type(carried.guard[column]) is type(intent.guard[column])
        assert isinstance(typed.commit(carried, {"note": column}), Committed), column
        # a guard on another value of the type: Stale, nothing written (the commit's
        # refusal, and apply()'s probe)
        wrong = Intent.from_json(typed.intent(1, f"w-{column}", guard={column: other}).to_json())
        assert isinstance(typed.commit(wrong, {"note": "x"}), Stale), column
        wrong = Intent.from_json(typed.intent(1, f"p-{column}", guard={column: other}).to_json())
        assert isinstance(typed.apply(wrong, lambda rec: {"note": "never"}), Stale), column
        # the value written, through apply()'s probe, then a guard taken from the row
        for guard in ({column: value}, {column: typed.get(1).state[column]}):
            again = Intent.from_json(typed.intent(1, f"a-{column}", guard=guard).to_json())
            out = typed.apply(again, lambda rec, c=column: {"note": f"r-{c}"})
            assert isinstance(out, Committed), (column, guard, out)
    assert typed.get(1).state["note"] == f"r-{list(taken)[-1]}"


@pytest.mark.backends(only=_typed_columns)
def test_state_as_read_is_written_back(typed: Any, backend_name: str) -> None:
    """The README's ``{**record.state, "status": ...}`` on a real table."""
    typed.commit(typed.intent(1, "fill"), _taken(backend_name))
    rec = typed.get(1)
    out = typed.commit(rec.intent("ship"), {**rec.state, "note": "shipped"})
    assert isinstance(out, Committed), out
    assert {k: v for k, v in out.record.state.items() if k != "note"} == {
        k: v for k, v in rec.state.items() if k != "note"
    }
    # and the whole row as a guard (every value as read), carried as JSON
    guard = {k: v for k, v in out.record.state.items() if k != "note"}
    intent = Intent.from_json(out.record.intent("again", guard=guard).to_json())
    assert isinstance(typed.commit(intent, {"note": "again"}), Committed)


@pytest.mark.backends(only=lambda name: _family(name) in REFUSED)
def test_refused_types_write_nothing(typed: Any, backend_name: str) -> None:
    refused = REFUSED[_family(backend_name)]
    before = typed.get(1)
    for column, reason in refused.items():
        value = VALUES[column][0]
        with pytest.raises(InvalidState, match=reason):
            typed.commit(typed.intent(1, "x"), {"note": "x", column: value})
        with pytest.raises(InvalidState, match=reason):
            typed.commit(typed.intent(1, "x", guard={column: value}), {"note": "x"})
    assert typed.get(1) == before


@pytest.mark.backends(only=lambda name: name.startswith("redis"))
def test_redis_refuses_them(store: Any, backend_name: str) -> None:
    """A Redis row is a hash of text: a column value beyond JSON is refused, typed,
    before anything is sent (an enum member is written as its value)."""
    target = store.unwrapped if hasattr(store, "unwrapped") else store
    create = CASES[backend_name].create_table
    assert create is not None
    create(target, "typed_t", "id", "version", {"v": "", "note": ""}, [{"id": 1, "note": "a"}])
    table = store.table("typed_t", key="id", version="version")
    before = table.get(1)
    for column, (value, _) in VALUES.items():
        if column == "colour":
            continue
        with pytest.raises(InvalidState, match="Redis"):
            table.commit(table.intent(1, "x"), {"v": value})
        with pytest.raises(InvalidState, match="Redis"):
            table.commit(table.intent(1, "x", guard={"v": value}), {"note": "b"})
    assert table.get(1) == before
    out = table.commit(table.intent(1, "x"), {"v": Colour.RED})
    assert out.committed and out.record.state["v"] == "red"


def test_collections_refuse_what_json_cannot_hold(store: Any) -> None:
    orders = store.collection("orders")
    rec = orders.create("o-1", {"status": "new"})
    for value in (Decimal("1"), dt.date(2026, 1, 1), UID, b"x", Colour.RED):
        with pytest.raises(InvalidState, match=r"field 'lines\[1\]\.price'"):
            orders.commit(rec.intent("x"), {"lines": [{"price": 1}, {"price": value}]})
        with pytest.raises(InvalidState, match="field 'total'"):
            orders.create("o-2", {"total": value})
        if not isinstance(value, enum.Enum):
            with pytest.raises(fencing.InvalidIntent, match="collection holds JSON"):
                rec.intent("x", guard={"total": value})
    assert orders.get("o-1") == rec and orders.get("o-2") is None
    # a JSON object that looks like a tag is plain data in a collection
    looks = {"total": {"$decimal": "9.50"}, "$uuid": "x", "g": "$decimal"}
    made = orders.create("o-3", looks)
    assert dict(orders.get("o-3").state) == looks == dict(made.state)
    intent = Intent.from_json(made.intent("x", guard={"g": "$decimal"}).to_json())
    assert intent.guard == {"g": "$decimal"}
    assert orders.commit(intent, {"ok": True}).committed


# made by fencing before intent format 2 (format 1), with this key: it must still verify
V1_TOKEN = (
    "k1.eyJjb2xsZWN0aW9uIjoib3JkZXJzIiwiZGVjaWRlZF9hdCI6MTc5NjI5MjAwMC4wLCJleHBlY3RlZF92ZXJ"
    "zaW9uIjozLCJndWFyZCI6eyJzdGF0dXMiOiJwYWNrZWQiLCJ0b3RhbCI6OS41fSwiaWQiOiIwMTkwZjAwZGZlZW"
    "QiLCJrZXkiOjQyLCJraW5kIjoidGFibGUiLCJ0cmFuc2l0aW9uIjoic2hpcCIsInYiOjF9"
    ".3PZFE6jZauJwDi-D2oZ_S8U10r5NOfWCaNfqGyNc9pk"
)


def test_signed_intent_verifies_across_the_format_change() -> None:
    signer = fencing.Signer(keys={"k1": b"0123456789abcdef"}, current="k1")
    old = signer.verify(V1_TOKEN)
    assert old == Intent(
        id="0190f00dfeed",
        collection="orders",
        key=42,
        expected_version=3,
        transition="ship",
        guard={"status": "packed", "total": 9.5},
        kind="table",
        decided_at=1796292000.0,
    )
    # re-signed today it is the very same token: an intent without tagged values stays v1
    assert signer.sign(old) == V1_TOKEN
    tagged = Intent.new("orders", 42, 3, "ship", guard={"total": Decimal("9.50")}, kind="table")
    again = signer.verify(signer.sign(tagged))
    assert again == tagged and repr(again.guard) == repr(tagged.guard)


@pytest.mark.parametrize(
    "value", [b"x" * 2000, Decimal("9" * 2000), bytearray(2000), Colour.RED, dt.date.today()]
)
def test_table_state_size_counts_every_value(value: Any) -> None:
    """The state size limit counts a value beyond JSON as its text (bytes as base64)."""
    with fencing.open("sqlite://:memory:", max_state_bytes=1000) as store:
        store.backend.conn.execute(
            "CREATE TABLE t (id INTEGER PRIMARY KEY, version INTEGER NOT NULL DEFAULT 1, v)"
        )
        store.backend.conn.execute("INSERT INTO t (id) VALUES (1)")
        table = store.table("t", key="id", version="version")
        big = isinstance(value, bytes | bytearray | Decimal)
        if big:
            with pytest.raises(InvalidState, match="above 1000"):
                table.commit(table.intent(1, "x"), {"v": value})
            assert table.get(1).version == 1
        else:
            assert table.commit(table.intent(1, "x"), {"v": value}).committed
