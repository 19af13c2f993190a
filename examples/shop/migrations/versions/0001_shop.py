"""the shop's tables: orders, shipments, notifications"""

import sqlalchemy as sa
from alembic import op

revision = "0001_shop"
down_revision = None


def upgrade() -> None:
    op.create_table(
        "orders",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("status", sa.String(20), nullable=False),
        sa.Column("total", sa.Integer, nullable=False),
        sa.Column("notified", sa.Boolean, nullable=False),
    )
    op.create_table(
        "shipments",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("order_id", sa.Integer, sa.ForeignKey("orders.id"), nullable=False),
        sa.Column("carrier", sa.String(20), nullable=False),
    )
    op.create_table(
        "notifications",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("order_id", sa.Integer, sa.ForeignKey("orders.id"), nullable=False),
        sa.Column("message", sa.String(200), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("notifications")
    op.drop_table("shipments")
    op.drop_table("orders")
