"""``store.table(MappedClass)`` binds what the mapped column would bind (issue 18, item 12).

SQLAlchemy's ``Enum`` stores a member's *name* (or its ``values_callable``'s value), not
its ``.value``. A fenced commit through a mapped class writes the same, so the ORM loads
the row back as the member: on SQLite (a non-native enum: VARCHAR), PostgreSQL (a native
ENUM type) and MariaDB/MySQL (a native ENUM column); a guard's values bind the same way.
A ``TypeDecorator`` is not applied (a state read back holds the stored form: binding it
again would encode it twice); its column takes the stored form, as by name.
"""

from __future__ import annotations

import enum
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import fencing

sqlalchemy = pytest.importorskip("sqlalchemy")
orm = pytest.importorskip("sqlalchemy.orm")


class Status(enum.Enum):
    NEW = "new"
    SHIPPED = "sent"  # the name and the value differ (also case-insensitively)


class Size(enum.Enum):
    SMALL = "s"
    LARGE = "l"


class JSONText(sqlalchemy.types.TypeDecorator):  # type: ignore[misc]
    """A JSON document kept as text: what the ORM writes is ``json.dumps``'s."""

    impl = sqlalchemy.Text
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Any) -> Any:
        return None if value is None else json.dumps(value, sort_keys=True)

    def process_result_value(self, value: Any, dialect: Any) -> Any:
        return None if value is None else json.loads(value)


def _model(schema: str | None) -> Any:
    class Base(orm.DeclarativeBase):
        metadata = sqlalchemy.MetaData(schema=schema)

    suffix = uuid.uuid4().hex[:8]  # PostgreSQL's enum types are named per test

    class Order(Base):
        __tablename__ = "enum_orders"
        id: orm.Mapped[int] = orm.mapped_column(primary_key=True)
        version: orm.Mapped[int] = orm.mapped_column()
        status: orm.Mapped[Status] = orm.mapped_column(
            sqlalchemy.Enum(Status, name=f"status_{suffix}")
        )
        size: orm.Mapped[Size | None] = orm.mapped_column(
            sqlalchemy.Enum(
                Size,
                name=f"size_{suffix}",
                values_callable=lambda kind: [m.value for m in kind],
                validate_strings=True,
            ),
            nullable=True,
        )
        meta: orm.Mapped[Any] = orm.mapped_column(JSONText, nullable=True)
        __mapper_args__ = {"version_id_col": version}  # noqa: RUF012

    return Order


@pytest.fixture(params=["sqlite", "postgresql", "mysql"])
def setup(request: Any, tmp_path: Path) -> Iterator[tuple[Any, Any, Any]]:
    """(a store, a SQLAlchemy engine on its database, the Order model), with row 1 of
    ``enum_orders`` made by the ORM (NEW, SMALL, {"n": 1})."""
    from ._backends import CASES

    name = request.param
    schema = None
    if name == "sqlite":
        url = f"sqlite:///{tmp_path / 'shop.sqlite'}"
        engine = sqlalchemy.create_engine(url.replace("sqlite:", "sqlite+pysqlite:", 1))
    else:
        if name not in CASES:
            pytest.skip(f"the {name} test case is not registered (driver not installed)")
        url = CASES[name].url(tmp_path)
        if name == "postgresql":
            from .backends_postgres import BASE_URL, schema_of

            schema = schema_of(url)
            driver = "postgresql+psycopg"
            base = BASE_URL.split("?")[0].split("://", 1)[1]
        else:
            driver = "mysql+pymysql"
            base = url.split("?")[0].split("://", 1)[1]
        engine = sqlalchemy.create_engine(f"{driver}://{base}")
    store = fencing.open(url)  # migrates (on PostgreSQL: makes the schema)
    Order = _model(schema)
    try:
        Order.metadata.create_all(engine)
        with orm.Session(engine) as session:
            session.add(Order(id=1, version=1, status=Status.NEW, size=Size.SMALL, meta={"n": 1}))
            session.commit()
        yield store, engine, Order
    finally:
        store.close()
        engine.dispose()
        if name != "sqlite" and CASES[name].cleanup is not None:
            CASES[name].cleanup(url)


def _loaded(engine: Any, Order: Any) -> Any:
    with orm.Session(engine) as session:
        order = session.get(Order, 1)
        session.expunge_all()
        return order


def test_a_fenced_commit_of_members_loads_back_as_members(setup: tuple[Any, Any, Any]) -> None:
    store, engine, Order = setup
    orders = store.table(Order)
    state = {"status": Status.SHIPPED, "size": Size.LARGE, "meta": '{"n": 2}'}
    out = orders.commit(orders.intent(1, "ship"), state)
    assert isinstance(out, fencing.Committed) and out.record.version == 2
    # what the row holds: what the ORM itself writes
    assert out.record.state["status"] == "SHIPPED" and out.record.state["size"] == "l"
    order = _loaded(engine, Order)
    assert (order.version, order.status, order.size) == (2, Status.SHIPPED, Size.LARGE)
    assert order.meta == {"n": 2}  # a TypeDecorator's column: its stored form, as given


def test_the_text_the_orm_takes_and_a_state_read_back(setup: tuple[Any, Any, Any]) -> None:
    store, engine, Order = setup
    orders = store.table(Order)
    assert orders.commit(orders.intent(1, "ship"), {"status": "SHIPPED"}).committed
    assert _loaded(engine, Order).status == Status.SHIPPED
    record = orders.get(1)  # read back as the driver gives it: names, JSON text
    again = {k: v for k, v in record.state.items() if k not in ("id", "version")}
    assert orders.commit(record.intent("again"), {**again, "status": Status.NEW}).committed
    order = _loaded(engine, Order)
    assert (order.status, order.size, order.meta) == (Status.NEW, Size.SMALL, {"n": 1})


def test_a_guard_binds_as_a_write(setup: tuple[Any, Any, Any]) -> None:
    store, _engine, Order = setup
    orders = store.table(Order)
    intent = orders.intent(1, "ship", guard={"status": Status.NEW, "size": Size.SMALL})
    assert dict(intent.guard or {}) == {"status": "NEW", "size": "s"}
    assert orders.commit(intent, {"status": Status.SHIPPED}).committed
    late = orders.intent(1, "ship", guard={"status": Status.NEW})
    assert isinstance(orders.commit(late, {"status": Status.SHIPPED}), fencing.Stale)


def test_a_value_the_column_type_refuses_is_refused_before_writing(
    setup: tuple[Any, Any, Any],
) -> None:
    store, engine, Order = setup
    orders = store.table(Order)
    intent = orders.intent(1, "ship")
    with pytest.raises(fencing.InvalidState, match="'size'"):
        orders.commit(intent, {"size": "huge"})  # validate_strings: not one of its values
    with pytest.raises(fencing.InvalidState, match="'status'"):
        orders.commit(intent, {"status": Size.LARGE})  # a member of another enum
    with pytest.raises(fencing.InvalidState, match="'meta'"):
        orders.commit(intent, {"meta": {"n": 3}})  # a TypeDecorator is not applied
    assert _loaded(engine, Order).version == 1


def test_a_table_by_name_binds_as_fencing_does(tmp_path: Path) -> None:
    """Without the mapped class, fencing knows no column type: a member is its value."""
    url = f"sqlite:///{tmp_path / 'plain.sqlite'}"
    engine = sqlalchemy.create_engine(url.replace("sqlite:", "sqlite+pysqlite:", 1))
    Order = _model(None)
    Order.metadata.create_all(engine)
    with orm.Session(engine) as session:
        session.add(Order(id=1, version=1, status=Status.NEW))
        session.commit()
    with fencing.open(url) as store:
        plain = store.table("enum_orders")
        out = plain.commit(plain.intent(1, "x"), {"status": Status.SHIPPED})
        assert out.record.state["status"] == "sent"
    engine.dispose()


def test_through_the_session_and_async(setup: tuple[Any, Any, Any], tmp_path: Path) -> None:
    store, engine, Order = setup
    with orm.Session(engine) as session:
        view = store.using(session).table(Order)  # the bound path: the same binding
        out = view.commit(view.intent(1, "ship"), {"status": Status.SHIPPED})
        assert out.committed
        session.commit()
    assert _loaded(engine, Order).status == Status.SHIPPED
    if store.url.startswith("sqlite"):  # the async front binds the same (its source)
        import asyncio

        async def main() -> None:
            astore = await fencing.open_async(store.url)
            try:
                orders = astore.table(Order)
                intent = await orders.intent(1, "back")
                assert (await orders.commit(intent, {"status": Status.NEW})).committed
            finally:
                await astore.close()

        asyncio.run(main())
        assert _loaded(engine, Order).status == Status.NEW
