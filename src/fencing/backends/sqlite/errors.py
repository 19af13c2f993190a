"""SQLite's errors, translated at the boundary: a busy or locked database, or a failing
disk, is ``TransientStoreError``; a missing table or column ``SchemaError``; a guard
trigger's refusal (``guard``) ``GuardRefused``; anything else ``StoreError``."""

from __future__ import annotations

import sqlite3

from ..._checks import is_guard_refusal
from ..._errors import FencingError, GuardRefused, SchemaError, StoreError, TransientStoreError

__all__ = ["translate"]


def translate(exc: sqlite3.Error) -> FencingError:
    """The fencing error for a driver error (``raise translate(exc) from exc``)."""
    text = str(exc)
    if is_guard_refusal(text):
        return GuardRefused(f"sqlite: {text}")
    if isinstance(exc, sqlite3.OperationalError) and (
        "locked" in text or "busy" in text or "disk I/O" in text
    ):
        return TransientStoreError(f"sqlite: {text}")
    if "no such table" in text or "no such column" in text:
        return SchemaError(f"sqlite: {text} (run store.migrate() / fencing migrate URL?)")
    return StoreError(f"sqlite: {text}")
