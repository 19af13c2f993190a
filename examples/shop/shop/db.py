"""Where the shop keeps its data: one database for the shop's tables and fencing's.

``SHOP_DATABASE_URL`` is a SQLAlchemy URL (default ``sqlite:///shop.db``;
``postgresql+psycopg://user@host/shop``, ``mysql+pymysql://user@host/shop``); fencing
opens the same URL on connections of its own. Its tables come from the Alembic
migrations (``alembic upgrade head``), so the store is opened without migrating.
"""

from __future__ import annotations

import os
import threading

from sqlalchemy import create_engine
from sqlalchemy.orm import sessionmaker

import fencing

DATABASE_URL = os.environ.get("SHOP_DATABASE_URL", "sqlite:///shop.db")

engine = create_engine(DATABASE_URL)  # connects on first use (after a worker's fork)
Session = sessionmaker(engine)

_store: fencing.Store | None = None
_lock = threading.Lock()


def store() -> fencing.Store:
    """fencing's store on the shop's database, opened once per process."""
    global _store
    with _lock:
        if _store is None:
            _store = fencing.open(DATABASE_URL, migrate="check")  # the migrations made it
        return _store
