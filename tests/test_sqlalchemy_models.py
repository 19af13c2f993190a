"""``store.table(Order)`` for SQLAlchemy mapped classes and ``Table`` objects, and the
interplay of fenced commits with the ORM's ``version_id_col`` (each SQL backend)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import fencing
from fencing import Committed, InvalidIdentifier, Stale

from .test_schema_tables import _schemas

sqlalchemy = pytest.importorskip("sqlalchemy")
orm = pytest.importorskip("sqlalchemy.orm")


def _model(schema: str | None) -> Any:
    class Base(orm.DeclarativeBase):
        pass

    class Order(Base):
        __tablename__ = "orders"
        __table_args__ = {"schema": schema} if schema else {}
        id: orm.Mapped[int] = orm.mapped_column(primary_key=True)
        version: orm.Mapped[int] = orm.mapped_column()
        status: orm.Mapped[str] = orm.mapped_column(sqlalchemy.String(20))
        __mapper_args__ = {"version_id_col": version}  # noqa: RUF012

    return Order


@pytest.fixture(params=["sqlite", "postgresql", "mysql"])
def setup(request: Any, tmp_path: Path) -> Iterator[tuple[str, Any, Any]]:
    """(store URL, SQLAlchemy engine on the same database, the Order model), with row 1
    of ``orders`` at version 1."""
    from ._backends import CASES

    name = request.param
    if name == "sqlite":
        db = tmp_path / "shop.sqlite"
        engine = sqlalchemy.create_engine(f"sqlite+pysqlite:///{db}")
        with engine.begin() as conn:
            conn.exec_driver_sql(
                "CREATE TABLE orders (id INTEGER PRIMARY KEY, version INTEGER NOT NULL,"
                " status TEXT)"
            )
            conn.exec_driver_sql("INSERT INTO orders VALUES (1, 1, 'new')")
        yield f"sqlite:///{db}", engine, _model(None)
        engine.dispose()
        return
    if name not in CASES:
        pytest.skip(f"the {name} test case is not registered (driver not installed)")
    url = CASES[name].url(tmp_path)
    if name == "postgresql":
        from .backends_postgres import BASE_URL
    else:
        from .backends_mysql import BASE_URL
    base = BASE_URL.split("?")[0]
    driver = "postgresql+psycopg" if name == "postgresql" else "mysql+pymysql"
    engine = sqlalchemy.create_engine(driver + "://" + base.split("://", 1)[1])
    try:
        for (a, _b), _run in _schemas(name):
            yield url, engine, _model(a)
    finally:
        engine.dispose()
        if CASES[name].cleanup is not None:
            CASES[name].cleanup(url)


def test_table_of_a_mapped_class(setup: tuple[str, Any, Any]) -> None:
    url, _engine, Order = setup
    with fencing.open(url) as store:
        orders = store.table(Order, version="not_this_one")
        schema = Order.__table__.schema
        assert orders.name == (f"{schema}.orders" if schema else "orders")
        out = orders.commit(orders.intent(1, "pay"), {"status": "paid"})
        assert isinstance(out, Committed) and out.record.version == 2
        assert store.table(Order.__table__).get(1).version == 2  # a Table: version= default


def test_fenced_commit_makes_a_loaded_orm_object_stale(setup: tuple[str, Any, Any]) -> None:
    url, engine, Order = setup
    with fencing.open(url) as store, orm.Session(engine, expire_on_commit=False) as session:
        order = session.get(Order, 1)
        assert order.version == 1
        session.commit()  # ends the read; the object stays loaded at version 1
        orders = store.table(Order)
        out = orders.commit(orders.intent(1, "pay"), {"status": "paid"})
        assert isinstance(out, Committed) and out.record.version == 2
        order.status = "overwritten"  # the stale object, flushed
        with pytest.raises(orm.exc.StaleDataError):
            session.flush()
        session.rollback()
        assert orders.get(1).state["status"] == "paid"


def test_orm_flush_makes_a_decided_intent_stale(setup: tuple[str, Any, Any]) -> None:
    url, engine, Order = setup
    with fencing.open(url) as store:
        orders = store.table(Order)
        decided = orders.intent(1, "pay")  # decided at version 1
        with orm.Session(engine) as session:
            order = session.get(Order, 1)
            order.status = "cancelled"
            session.commit()  # the mapper bumps the version to 2
        assert orders.get(1).version == 2
        assert isinstance(orders.commit(decided, {"status": "paid"}), Stale)
        assert orders.get(1).state["status"] == "cancelled"


def test_composite_keys_and_non_tables_refused() -> None:
    meta = sqlalchemy.MetaData()
    lines = sqlalchemy.Table(
        "lines",
        meta,
        sqlalchemy.Column("order_id", sqlalchemy.Integer, primary_key=True),
        sqlalchemy.Column("n", sqlalchemy.Integer, primary_key=True),
    )
    with fencing.open("memory://") as store:
        with pytest.raises(InvalidIdentifier, match="2 primary key columns"):
            store.table(lines)
        with pytest.raises(InvalidIdentifier, match="mapped class or Table"):
            store.table(42)
        plain = sqlalchemy.Table(
            "items", meta, sqlalchemy.Column("sku", sqlalchemy.String(9), primary_key=True)
        )
        items = store.table(plain, version=None)
        assert items.name == "items"
