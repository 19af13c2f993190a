"""The SQLAlchemy adoption scenario, with a real Celery worker (issue: inside the
application's own transaction).

An ORM model with ``version_id_col``; a service function that changes the order and,
in the same session, reads the intent through ``store.using(session)`` and enqueues it
with ``on_commit``; a fenced Celery task (prefork worker processes on Redis) that ships
the order. Committed: the intent arrives fresh and the worker commits it; rolled back:
nothing is sent and nothing changed; a stale ORM object flushed after the worker's
commit raises ``StaleDataError`` instead of overwriting it; and the same service reading
its intent on the store's own connections (beside the transaction) sends one that
arrives stale, which is why ``using`` exists.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from typing import Any

import pytest

import fencing
from fencing.contrib.tx import on_commit

from .._backends import require_server
from ._e2e import HARNESSES, REDIS_HOST, REDIS_PORT, Harness
from .apps import _shared

sqlalchemy = pytest.importorskip("sqlalchemy")
pytest.importorskip("celery")

from sqlalchemy import Integer, String  # noqa: E402
from sqlalchemy.orm import DeclarativeBase, Session, mapped_column  # noqa: E402
from sqlalchemy.orm.exc import StaleDataError  # noqa: E402

pytestmark = pytest.mark.slow


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = _shared.SHOP_TABLE
    id = mapped_column(Integer, primary_key=True)
    version = mapped_column(Integer, nullable=False)
    status = mapped_column(String(40))
    __mapper_args__ = {"version_id_col": version}  # noqa: RUF012


@pytest.fixture(scope="module")
def h(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    require_server("Redis", REDIS_HOST, REDIS_PORT)
    harness = HARNESSES["celery-redis"](tmp_path_factory.mktemp("celery-sqlalchemy"))
    conn = sqlite3.connect(harness.store_path)
    conn.execute(
        f"CREATE TABLE {_shared.SHOP_TABLE} (id INTEGER PRIMARY KEY,"
        " version INTEGER NOT NULL, status VARCHAR(40))"
    )
    conn.executemany(
        f"INSERT INTO {_shared.SHOP_TABLE} VALUES (?, 1, 'new')", [(k,) for k in range(1, 6)]
    )
    conn.commit()
    conn.close()
    try:
        harness.start()
        yield harness
    finally:
        harness.stop()


@pytest.fixture
def engine(h: Harness) -> Iterator[Any]:
    engine = sqlalchemy.create_engine(f"sqlite:///{h.store_path}")
    yield engine
    engine.dispose()


def pay_and_ship(h: Harness, session: Session, order_id: int) -> fencing.Intent:
    """The service function: one business step, the shipment enqueued on commit."""
    order = session.get(Order, order_id)
    assert order is not None
    order.status = "paid"  # version_id_col bumps the version when the session flushes
    intent = h.store.using(session).table(Order).intent_for(order, "ship")
    on_commit(session, h.tasks.ship_order.enqueue, intent)  # type: ignore[attr-defined]
    return intent


def row(h: Harness, order_id: int) -> fencing.Record:
    found = h.store.table(_shared.SHOP_TABLE).get(order_id)
    assert found is not None
    return found


def test_committed_the_intent_arrives_fresh_and_the_worker_ships(h: Harness, engine: Any) -> None:
    with Session(engine) as session:
        intent = pay_and_ship(h, session, 1)
        assert intent.expected_version == 2  # the version the row has once committed
        session.commit()
    (report,) = h.wait_reports(intent.id, 1)
    assert report["fencing_outcome"] == "committed", h.logs()
    shipped = row(h, 1)
    assert (shipped.version, shipped.state["status"]) == (3, "shipped")


def test_rolled_back_nothing_is_sent_and_nothing_changed(h: Harness, engine: Any) -> None:
    with Session(engine) as session:
        intent = pay_and_ship(h, session, 2)
        session.rollback()
    h.drain()  # what was sent before the ping has been taken
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        assert h.reports_for(intent.id) == []
        time.sleep(0.05)
    assert row(h, 2).version == 1 and row(h, 2).state["status"] == "new"


def test_a_stale_orm_object_cannot_overwrite_the_workers_commit(h: Harness, engine: Any) -> None:
    with Session(engine, expire_on_commit=False) as stale_session:
        stale = stale_session.get(Order, 3)  # loaded at version 1
        assert stale is not None and stale.version == 1
        stale_session.commit()  # its transaction ends; the object is kept, at version 1
        with Session(engine) as session:
            intent = pay_and_ship(h, session, 3)
            session.commit()
        (report,) = h.wait_reports(intent.id, 1)
        assert report["fencing_outcome"] == "committed", h.logs()
        stale.status = "cancelled"  # a blind save of what it saw
        with pytest.raises(StaleDataError):
            stale_session.commit()
    assert row(h, 3).state["status"] == "shipped" and row(h, 3).version == 3


def test_an_intent_read_beside_the_transaction_arrives_stale(h: Harness, engine: Any) -> None:
    with Session(engine) as session:
        order = session.get(Order, 4)
        assert order is not None
        order.status = "paid"
        session.flush()
        beside = h.store.table(_shared.SHOP_TABLE).intent(4, "ship")  # version 1: before
        on_commit(session, h.tasks.ship_order.enqueue, beside)  # type: ignore[attr-defined]
        session.commit()
    (report,) = h.wait_reports(beside.id, 1)
    assert report["fencing_outcome"] == "stale" and report["fencing_action"] == "ack"
    assert row(h, 4).state["status"] == "paid" and row(h, 4).version == 2
