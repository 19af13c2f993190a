"""A fenced commit to a mapped class applies its columns' ``onupdate`` as the ORM's flush
would (a scalar, a callable, a SQL expression the database evaluates in the commit's own
UPDATE), leaves a column the state sets as set, and calls the ``on_committed`` hooks: on
the store's own connections and on ``store.using(session)``, sync and async, on SQLite
(a file), PostgreSQL and MySQL/MariaDB."""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Iterator
from typing import Any

import pytest

import fencing
from fencing import Committed, ConfigurationError, Duplicate, Stale

from ._lenders import LENDERS

sqlalchemy = pytest.importorskip("sqlalchemy")
orm = pytest.importorskip("sqlalchemy.orm")
func, text = sqlalchemy.func, sqlalchemy.text

pytestmark = pytest.mark.backends(only=lambda name: name in LENDERS)
OLD = datetime.datetime(2000, 1, 1)
LATER = datetime.datetime(2031, 2, 3, 4, 5, 6)


def _model() -> Any:
    class Base(orm.DeclarativeBase):
        pass

    def at(**rule: Any) -> Any:
        return orm.mapped_column(sqlalchemy.DateTime, nullable=True, **rule)

    class Order(Base):
        __tablename__ = "orders_ou"
        id: orm.Mapped[int] = orm.mapped_column(primary_key=True)
        version: orm.Mapped[int] = orm.mapped_column()
        status: orm.Mapped[str] = orm.mapped_column(sqlalchemy.String(20))
        updated_at: orm.Mapped[datetime.datetime] = at(onupdate=func.now())
        stamped_at: orm.Mapped[datetime.datetime] = at(onupdate=func.current_timestamp())
        texted_at: orm.Mapped[datetime.datetime] = at(onupdate=text("CURRENT_TIMESTAMP"))
        called_at: orm.Mapped[datetime.datetime] = at(onupdate=datetime.datetime.now)
        later_at: orm.Mapped[datetime.datetime] = at(onupdate=lambda: LATER)
        server_at: orm.Mapped[datetime.datetime] = at(server_onupdate=sqlalchemy.FetchedValue())
        # the database reads the row's own value: no Python clock or value could do it
        revision: orm.Mapped[int] = orm.mapped_column(onupdate=text("revision + 10"))
        note: orm.Mapped[str] = orm.mapped_column(sqlalchemy.String(20), onupdate="touched")
        __mapper_args__ = {"version_id_col": version}  # noqa: RUF012

    return Order


DATES = ("updated_at", "stamped_at", "texted_at", "called_at")


def _engine(backend_name: str, url: str, Order: Any) -> Any:
    lender = LENDERS[backend_name]
    engine = sqlalchemy.create_engine(lender.sa_url(url), **lender.sa_options(url))
    Order.metadata.create_all(engine)
    with orm.Session(engine) as session:
        session.add(Order(id=1, version=1, status="new", revision=1, note="n", **_old()))
        session.add(Order(id=2, version=1, status="new", revision=1, note="n", **_old()))
        session.commit()
    return engine


def _old() -> dict[str, Any]:
    return dict.fromkeys((*DATES, "later_at", "server_at"), OLD)


def _moved(state: dict[str, Any], revision: int = 11) -> None:
    """Every onupdate rule applied (the dates as read from the row: datetimes, or on
    SQLite text), the server's own left alone."""
    for column in DATES:
        assert _at(state[column]) > _at(OLD), column
    assert _at(state["later_at"]) == _at(LATER)
    assert state["revision"] == revision and state["note"] == "touched"
    assert _at(state["server_at"]) == _at(OLD)  # no trigger here: nothing wrote it


def _at(value: object) -> str:
    """A date and time as read (SQLite: text, with or without microseconds) to seconds."""
    return str(value)[:19]


@pytest.fixture
def shop(backend_name: str, store_url: str) -> Iterator[tuple[Any, Any]]:
    """(the Order model, a SQLAlchemy engine on the store's database) with rows 1 and 2."""
    Order = _model()
    with fencing.open(store_url) as store:  # the store's schema first, as the engine finds it
        store.migrate()
    engine = _engine(backend_name, store_url, Order)
    yield Order, engine
    engine.dispose()


def test_onupdate_rules_apply_to_a_fenced_commit(store: Any, shop: tuple[Any, Any]) -> None:
    Order, engine = shop
    orders = store.table(Order)
    seen: list[tuple[int, object]] = []
    assert orders.on_committed(lambda out, via: seen.append((out.record.version, via)))
    out = orders.commit(orders.intent(1, "pay"), {"status": "paid"})
    assert isinstance(out, Committed) and out.record.version == 2
    _moved(dict(out.record.state))
    with orm.Session(engine) as session:  # as the ORM reads the row back
        order = session.get(Order, 1)
        assert order.updated_at > OLD and order.later_at == LATER and order.revision == 11
    # a column the state sets is left as set
    set_at = datetime.datetime(2020, 5, 6, 7, 8, 9)
    out = orders.commit(out.record.intent("ship"), {"status": "shipped", "updated_at": set_at})
    assert _at(out.record.state["updated_at"]) == _at(set_at) and out.record.state["revision"] == 21
    # Stale and Duplicate call no hook; apply and commit_many do
    assert isinstance(orders.commit(orders.intent(2, "x"), {"status": "a"}), Committed)
    assert isinstance(orders.commit(out.intent, {"status": "shipped"}), Duplicate)
    late = orders.intent(2, "late")
    assert isinstance(orders.apply(orders.intent(2, "y"), lambda r: {"status": "b"}), Committed)
    assert isinstance(orders.commit(late, {"status": "c"}), Stale)
    many = orders.commit_many([(orders.intent(k, "z"), {"status": "z"}) for k in (1, 2)])
    assert [type(o) for o in many] == [Committed, Committed]
    assert seen == [(2, None), (3, None), (2, None), (3, None), (4, None), (4, None)]
    # the table by its name is not the mapped class: no rule of the class applies
    plain = store.table("orders_ou").commit(store.table("orders_ou").intent(1, "n"), {"note": "x"})
    assert plain.record.state["revision"] == 31 and plain.record.state["note"] == "x"
    assert len(seen) == 6


def test_through_the_session_in_its_transaction(
    backend_name: str, store_url: str, shop: tuple[Any, Any]
) -> None:
    Order, engine = shop
    with fencing.open(store_url) as store:
        orders = store.table(Order)

        @orders.on_committed
        def audit(out: Committed, session: Any) -> None:  # as after_update would
            session.add(
                Order(id=100 + out.record.version, version=1, status="audit", revision=0, note="a")
            )

        intent = orders.intent(1, "ship")
        with orm.Session(engine) as session:
            out = store.using(session).table(Order).commit(intent, {"status": "shipped"})
            assert isinstance(out, Committed)
            session.rollback()  # neither the fenced commit nor the hook's row remains
        assert orders.get(1).state["revision"] == 1 and orders.get(102) is None
        with orm.Session(engine) as session:
            if backend_name == "postgresql":  # now(): the transaction's start, the database's
                db_now = session.execute(text("SELECT now()::timestamp")).scalar_one()
            out = store.using(session).table(Order).commit(intent, {"status": "shipped"})
            assert isinstance(out, Committed)
            _moved(dict(out.record.state))
            if backend_name == "postgresql":
                assert out.record.state["updated_at"] == db_now
            session.commit()
        record = orders.get(1)
        assert record.version == 2 and record.state["revision"] == 11
        assert orders.get(102).state["status"] == "audit"


def test_async_through_the_session(
    backend_name: str, store_url: str, shop: tuple[Any, Any]
) -> None:
    from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

    Order, _engine = shop
    lender = LENDERS[backend_name]
    assert lender.sa_async_url is not None

    async def main() -> None:
        store = await fencing.open_async(store_url)
        engine = create_async_engine(lender.sa_async_url(store_url), **lender.sa_options(store_url))
        seen: list[object] = []

        async def hook(out: Committed, via: object) -> None:
            seen.append(via)

        store.table(Order).on_committed(hook)
        try:
            async with AsyncSession(engine) as session:
                view = store.using(session).table(Order)
                out = await view.commit(await view.intent(1, "ship"), {"status": "shipped"})
                assert isinstance(out, Committed)
                _moved(dict(out.record.state))
                await session.commit()
            assert seen == [session]
            out = await store.table(Order).commit(
                await store.table(Order).intent(2, "ship"), {"status": "shipped"}
            )
            _moved(dict(out.record.state))
            assert seen == [session, None]
        finally:
            await engine.dispose()
            await store.close()

    asyncio.run(main())


#: a database-side update of ``touched_at`` on every UPDATE, per backend
_SERVER_UPDATES = {
    "postgresql": (
        "CREATE FUNCTION touch_parcel() RETURNS trigger LANGUAGE plpgsql AS"
        " $t$ BEGIN NEW.touched_at := now(); RETURN NEW; END $t$",
        "CREATE TRIGGER touch_parcel BEFORE UPDATE ON parcels_ou FOR EACH ROW"
        " EXECUTE FUNCTION touch_parcel()",
    ),
    "mysql": (
        "ALTER TABLE parcels_ou MODIFY touched_at DATETIME NULL"
        " DEFAULT CURRENT_TIMESTAMP ON UPDATE CURRENT_TIMESTAMP",
    ),
    "sqlite-file": (
        "CREATE TRIGGER touch_parcel AFTER UPDATE ON parcels_ou FOR EACH ROW"
        " BEGIN UPDATE parcels_ou SET touched_at = CURRENT_TIMESTAMP WHERE id = NEW.id; END",
    ),
}


def test_server_onupdate_is_the_databases_own(backend_name: str, store_url: str) -> None:
    """``server_onupdate`` (a trigger, MySQL's ON UPDATE CURRENT_TIMESTAMP): fencing
    writes nothing to the column, the database moves it, the record shows it."""

    class Base(orm.DeclarativeBase):
        pass

    class Parcel(Base):
        __tablename__ = "parcels_ou"
        id: orm.Mapped[int] = orm.mapped_column(primary_key=True)
        version: orm.Mapped[int] = orm.mapped_column()
        status: orm.Mapped[str] = orm.mapped_column(sqlalchemy.String(20))
        touched_at: orm.Mapped[datetime.datetime] = orm.mapped_column(
            sqlalchemy.DateTime, nullable=True, server_onupdate=sqlalchemy.FetchedValue()
        )
        __mapper_args__ = {"version_id_col": version}  # noqa: RUF012

    with fencing.open(store_url) as store:
        store.migrate()
        engine = _engine_for(backend_name, store_url)
        try:
            Base.metadata.create_all(engine)
            with engine.begin() as conn:
                for statement in _SERVER_UPDATES[backend_name]:
                    conn.exec_driver_sql(statement)
                conn.exec_driver_sql(
                    "INSERT INTO parcels_ou (id, version, status, touched_at)"
                    " VALUES (1, 1, 'new', '2000-01-01 00:00:00')"
                )
            parcels = store.table(Parcel)
            out = parcels.commit(parcels.intent(1, "ship"), {"status": "shipped"})
            assert isinstance(out, Committed) and out.record.version == 2
            assert _at(out.record.state["touched_at"]) > _at(OLD)
        finally:
            engine.dispose()


def _engine_for(backend_name: str, url: str) -> Any:
    lender = LENDERS[backend_name]
    return sqlalchemy.create_engine(lender.sa_url(url), **lender.sa_options(url))


def test_what_a_fenced_commit_cannot_do_is_refused(
    backend_name: str, store_url: str, shop: tuple[Any, Any]
) -> None:
    Order, _engine = shop
    table = Order.__table__
    with fencing.open(store_url) as store:
        # a callable taking SQLAlchemy's execution context: refused when it would run
        table.c.note.onupdate = sqlalchemy.ColumnDefault(lambda context: "ctx")
        orders = store.table(Order)
        with pytest.raises(ConfigurationError, match=r"'note'.*execution context"):
            orders.commit(orders.intent(1, "pay"), {"status": "paid"})
        out = orders.commit(orders.intent(1, "pay"), {"status": "paid", "note": "given"})
        assert out.record.state["note"] == "given"
        assert store.table(Order.__table__).get(1).version == 2


def test_a_store_without_sql_refuses_a_sql_onupdate() -> None:
    Order = _model()
    columns = [c.name for c in Order.__table__.columns if c.name not in ("id", "version")]
    with fencing.open("memory://") as memory:
        memory.backend.create_table("orders_ou", key="id", version="version", columns=columns)
        memory.backend.insert_row("orders_ou", {"id": 1, "version": 1, **dict.fromkeys(columns)})
        orders = memory.table(Order)
        with pytest.raises(ConfigurationError, match=r"'updated_at'.*memory store cannot"):
            orders.commit(orders.intent(1, "pay"), {"status": "paid"})
        sql_set = dict.fromkeys(("updated_at", "stamped_at", "texted_at"), OLD)
        out = orders.commit(orders.intent(1, "pay"), {"status": "paid", "revision": 2, **sql_set})
        assert out.record.state["note"] == "touched" and out.record.state["later_at"] == LATER


def test_a_statement_separator_is_refused() -> None:
    meta = sqlalchemy.MetaData()
    odd = sqlalchemy.Table(
        "odd",
        meta,
        sqlalchemy.Column("id", sqlalchemy.Integer, primary_key=True),
        sqlalchemy.Column("version", sqlalchemy.Integer),
        sqlalchemy.Column("s", sqlalchemy.String(9), onupdate=text("'a;b'")),
    )
    with fencing.open("sqlite://:memory:") as store, pytest.raises(ConfigurationError, match=";"):
        store.table(odd)
