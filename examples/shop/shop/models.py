"""The shop's tables: orders (versioned), shipments, notifications."""

from __future__ import annotations

from sqlalchemy import ForeignKey, String
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "orders"
    id: Mapped[int] = mapped_column(primary_key=True)
    version: Mapped[int] = mapped_column(nullable=False)
    status: Mapped[str] = mapped_column(String(20))  # new, paid, cancelled, shipped
    total: Mapped[int]  # in cents
    notified: Mapped[bool] = mapped_column(default=False)
    # the ORM bumps the version on every flush, as a fenced commit does: each guards the other
    __mapper_args__ = {"version_id_col": version}  # noqa: RUF012

    def to_dict(self) -> dict[str, object]:
        return {
            "id": self.id,
            "version": self.version,
            "status": self.status,
            "total": self.total,
            "notified": self.notified,
        }


class Shipment(Base):
    __tablename__ = "shipments"
    id: Mapped[int] = mapped_column(primary_key=True)
    order_id: Mapped[int] = mapped_column(ForeignKey("orders.id"))
    carrier: Mapped[str] = mapped_column(String(20))


class Notification(Base):
    __tablename__ = "notifications"
    id: Mapped[int] = mapped_column(primary_key=True)
    order_id: Mapped[int] = mapped_column(ForeignKey("orders.id"))
    message: Mapped[str] = mapped_column(String(200))
