"""Alembic's environment for the shop: the URL from ``SHOP_DATABASE_URL`` (as the app),
the shop's models as the target, and fencing's tables left out of autogenerate."""

from __future__ import annotations

from alembic import context
from shop.db import DATABASE_URL
from shop.models import Base
from sqlalchemy import create_engine

from fencing.contrib.alembic import exclude_fencing


def run_migrations_offline() -> None:
    context.configure(url=DATABASE_URL, target_metadata=Base.metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    engine = create_engine(DATABASE_URL)
    with engine.connect() as connection:
        context.configure(connection=connection, target_metadata=Base.metadata, **exclude_fencing())
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
