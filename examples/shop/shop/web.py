"""The web app: create, pay, cancel and show orders (``flask --app shop.web run``).

Paying is one SQLAlchemy transaction: the order becomes ``paid`` (its version moves on)
and ``ship``'s message is written to fencing's outbox in the same transaction, with the
version the order has once it commits. Cancelling moves the version on again, so a
``ship`` decided before it is refused as ``Stale`` when it runs.
"""

from __future__ import annotations

from typing import Any

from flask import Flask, abort, request
from sqlalchemy import select

from . import db
from .models import Notification, Order, Shipment
from .tasks import ship

app = Flask(__name__)


def _order(session: Any, order_id: int) -> Order:
    order = session.get(Order, order_id)
    if order is None:
        abort(404)
    return order


@app.post("/orders")
def create() -> tuple[dict[str, Any], int]:
    total = int((request.get_json(silent=True) or {}).get("total", 0))
    with db.Session.begin() as session:
        order = Order(status="new", total=total)
        session.add(order)
        session.flush()
        return order.to_dict(), 201


@app.post("/orders/<int:order_id>/pay")
def pay(order_id: int) -> tuple[dict[str, Any], int]:
    with db.Session.begin() as session:  # one business transaction
        order = _order(session, order_id)
        if order.status != "new":
            return {"error": f"order {order_id} is {order.status}"}, 409
        order.status = "paid"
        fenced = db.store().using(session)  # fencing inside this transaction
        intent = fenced.table(Order).intent_for(order, "ship")  # the version once committed
        fenced.outbox.send(ship, intent)  # the relay publishes it once this commits
        return order.to_dict(), 200


@app.post("/orders/<int:order_id>/cancel")
def cancel(order_id: int) -> tuple[dict[str, Any], int]:
    with db.Session.begin() as session:
        order = _order(session, order_id)
        if order.status not in ("new", "paid"):
            return {"error": f"order {order_id} is {order.status}"}, 409
        order.status = "cancelled"  # the version moves on: a ship decided before is Stale
        session.flush()
        return order.to_dict(), 200


@app.get("/orders/<int:order_id>")
def show(order_id: int) -> dict[str, Any]:
    with db.Session() as session:
        order = _order(session, order_id)
        shipments = session.scalars(select(Shipment).where(Shipment.order_id == order_id))
        notes = session.scalars(select(Notification).where(Notification.order_id == order_id))
        return {
            **order.to_dict(),
            "shipments": [s.carrier for s in shipments],
            "notifications": [n.message for n in notes],
        }
